"""Every flag of ``gpt_tf.train`` checked before anything runs (issue 15, item 5).

Table-driven: every integer and float flag has a rule in ``gpt_tf.flag_checks.NUMERIC`` and a
value that breaks it is one line of the error; every enum flag refuses a value outside its list.
End to end: bad values give exit status 2, one line per problem, before TensorFlow is imported
and before anything is written.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from absl import flags

from gpt_tf import flag_checks
from gpt_tf import train_flags
from tests.small_runs import ENV, ROOT

FLAGS = flags.FLAGS
train_flags.define_flags()  # the CLI's flags on absl's FLAGS, as `python -m gpt_tf.train` defines them
NUMERIC_TYPES = (flags.IntegerParser, flags.FloatParser)
OWN = {flag.name for flag in FLAGS.flags_by_module_dict()["gpt_tf.train_flags"]}


def numeric_flags():
    return sorted(n for n in OWN if isinstance(FLAGS[n].parser, NUMERIC_TYPES))


def enum_flags():
    return sorted(n for n in OWN if isinstance(FLAGS[n].parser, flags.EnumParser))


def bad_values(rule: flag_checks.Rule) -> list:
    """Values just outside the rule (below, above), and NaN for a float."""
    values = []
    if rule.lo is not None:
        values.append(rule.lo - 1 if rule.lo - 1 != rule.sentinel else rule.lo - 2)
    if rule.hi is not None:
        values.append(rule.hi if rule.hi_open else rule.hi + 1)
    return values


@pytest.fixture
def parsed():
    FLAGS.unparse_flags()
    FLAGS(["gpt_tf.train"])
    yield FLAGS
    FLAGS.unparse_flags()


def test_every_numeric_flag_has_a_rule():
    assert len(numeric_flags()) > 20
    missing = [n for n in numeric_flags() if n not in flag_checks.NUMERIC]
    assert not missing, f"add a rule to gpt_tf.flag_checks.NUMERIC for {missing}"
    assert not [n for n in flag_checks.NUMERIC if n not in OWN], "a rule for a flag the CLI no longer has"


def test_the_defaults_break_no_rule(parsed):
    assert flag_checks.problems(parsed) == []


@pytest.mark.parametrize("name", sorted(flag_checks.NUMERIC))
def test_each_numeric_rule_refuses_values_outside_it(parsed, name):
    rule = flag_checks.NUMERIC[name]
    cases = bad_values(rule) + ([math.nan, math.inf] if isinstance(FLAGS[name].parser, flags.FloatParser) else [])
    assert cases, name
    for value in cases:
        parsed[name].value = value
        found = flag_checks.problems(parsed)
        assert len(found) == 1 and found[0].startswith(f"--{name}={value} must be"), (value, found)
    if rule.sentinel is not None:
        parsed[name].value = rule.sentinel
        assert flag_checks.problems(parsed) == []


@pytest.mark.parametrize("name", enum_flags())
def test_each_enum_flag_refuses_a_value_outside_its_list(name):
    FLAGS.unparse_flags()
    with pytest.raises(SystemExit) as stop:
        flag_checks.lenient_parser("gpt_tf.train")(["gpt_tf.train", f"--{name}=no_such_value"])
    FLAGS.unparse_flags()
    assert stop.value.code == 2


@pytest.mark.parametrize("name, value", [("model", "huge"), ("task", "no_such_task")])
def test_string_flags_that_name_a_registry_entry(parsed, name, value):
    parsed[name].value = value
    (found,) = flag_checks.problems(parsed)
    assert found.startswith(f"--{name}={value} is not one of ")


def run_train(*args, cwd=ROOT):
    """The CLI as a user runs it; stderr ends with whether TensorFlow was imported."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('tensorflow imported:', 'tensorflow' in sys.modules, file=sys.stderr))\n"
            f"sys.argv = ['gpt_tf.train', *{list(args)!r}]\n"
            "from gpt_tf import train\ntrain.run()\n")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)


def test_bad_values_exit_2_with_one_line_each_before_tensorflow(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_train("--model=huge", "--learning_rate=-1", "--checkpoint_every=0", "--lr_decay=cosin",
                     "--no_such_flag=1", f"--data_dir={tmp_path}", f"--run_dir={run_dir}")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "gpt_tf.train: invalid flags:" and lines[-1] == "tensorflow imported: False"
    problems = lines[1:-1]
    assert len(problems) == 5, problems
    for fragment in ("--lr_decay=cosin", "no_such_flag", "--model=huge", "--learning_rate=-1.0", "--checkpoint_every=0"):
        assert sum(fragment in line for line in problems) == 1, (fragment, problems)
    assert not run_dir.exists()


def test_combinations_are_checked_too_and_exit_2(tmp_path):
    proc = run_train("--batch_size=6", "--grad_accum_steps=4", f"--data_dir={tmp_path}", f"--run_dir={tmp_path / 'r'}")
    assert proc.returncode == 2 and "not divisible" in proc.stderr and "tensorflow imported: False" in proc.stderr


@pytest.mark.parametrize("flagfile", sorted(p.name for p in (ROOT / "configs").glob("*.flags")))
def test_the_shipped_flagfiles_break_no_rule(monkeypatch, flagfile):
    monkeypatch.chdir(ROOT)  # the flagfiles they include are named from the repository root
    FLAGS.unparse_flags()
    try:
        flag_checks.lenient_parser("gpt_tf.train")(["gpt_tf.train", f"--flagfile={ROOT / 'configs' / flagfile}"])
        assert flag_checks.problems(FLAGS) == []
    finally:
        FLAGS.unparse_flags()


# The paper's fine-tuning recipe (§4.1), as configs/finetune_paper.flags holds it for every task flagfile.
PAPER_RECIPE = {"learning_rate": 6.25e-5, "batch_size": 32, "epochs": 3, "lr_decay": "linear", "warmup_fraction": 0.002,
                "lm_coef": 0.5, "clf_pdrop": 0.1, "weight_decay": 0.01, "clip_norm": 1.0, "log_every": 20}
TASK_FLAGFILES = sorted(p.name for p in (ROOT / "configs").glob("finetune_*.flags")
                        if p.name != "finetune_paper.flags" and not p.stem.endswith(("_tiny", "_gpt1")))
# GPT-1 itself (117M, docs/real_gpt1.md): the paper's recipe, each task's context holding its longest example
GPT1_FLAGFILES = {"finetune_rte_gpt1.flags": 320, "finetune_mrpc_gpt1.flags": 128, "finetune_stsb_gpt1.flags": 128,
                  "finetune_cola_gpt1.flags": 48, "finetune_sst2_gpt1.flags": 64, "finetune_story_cloze_gpt1.flags": 80}


def test_the_code_and_the_flagfile_hold_the_same_recipe():
    """gpt_tf/nn/recipes.py (FinetuneConfig's and --task's defaults) == configs/finetune_paper.flags == the paper."""
    from gpt_tf.nn.recipes import PAPER_FINETUNE

    assert PAPER_FINETUNE == {k: PAPER_RECIPE[k] for k in PAPER_FINETUNE}
    assert set(PAPER_FINETUNE) == {"learning_rate", "batch_size", "epochs", "lr_decay", "warmup_fraction", "lm_coef",
                                   "clf_pdrop", "weight_decay", "clip_norm"}


def resolved(flagfile: str) -> dict:
    """The flags a flagfile sets, with the flagfiles it includes (their paths are from the repository root)."""
    FLAGS.unparse_flags()
    try:
        flag_checks.lenient_parser("gpt_tf.train")(["gpt_tf.train", f"--flagfile=configs/{flagfile}"])
        return {name: FLAGS[name].value for name in FLAGS if FLAGS[name].present and name != "flagfile"}
    finally:
        FLAGS.unparse_flags()


def own_lines(flagfile: str) -> dict:
    lines = (ROOT / "configs" / flagfile).read_text().splitlines()
    return dict(line[2:].partition("=")[::2] for line in lines if line.startswith("--") and "flagfile" not in line)


def test_every_task_flagfile_is_the_paper_recipe_plus_its_task(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert len(TASK_FLAGFILES) == 12 and resolved("finetune_paper.flags") == PAPER_RECIPE
    for flagfile in TASK_FLAGFILES:
        task = flagfile[len("finetune_"):-len(".flags")]
        assert resolved(flagfile) == {**PAPER_RECIPE, "task": task, "data_dir": f"data/tasks/{task}",
                                      "run_dir": f"runs/finetune_{task}"}, flagfile
        assert own_lines(flagfile).keys() == {"task", "data_dir", "run_dir"}, "the recipe belongs in finetune_paper.flags"


def test_the_gpt1_flagfiles_are_the_paper_recipe_at_gpt1s_size_on_gpt1s_bpe_data(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert sorted(GPT1_FLAGFILES) == sorted(p.name for p in (ROOT / "configs").glob("finetune_*_gpt1.flags"))
    for flagfile, n_ctx in GPT1_FLAGFILES.items():
        task = flagfile[len("finetune_"):-len("_gpt1.flags")]
        assert resolved(flagfile) == {**PAPER_RECIPE, "task": task, "data_dir": f"data/tasks_gpt1/{task}",
                                      "run_dir": f"runs/finetune_{task}_gpt1", "n_ctx": n_ctx}, flagfile
        assert "--tokenizer_dir=../shared/data/gpt1_bpe" in (ROOT / "configs" / flagfile).read_text(), flagfile


@pytest.mark.parametrize("flagfile", sorted(p.name for p in (ROOT / "configs").glob("finetune_*_tiny.flags")))
def test_each_small_model_recipe_is_its_task_flagfile_with_its_own_lines_on_top(monkeypatch, flagfile):
    monkeypatch.chdir(ROOT)
    parsed = {name: FLAGS[name].parser.parse(value) for name, value in own_lines(flagfile).items()}
    assert resolved(flagfile) == {**resolved(flagfile.replace("_tiny", "")), **parsed}
