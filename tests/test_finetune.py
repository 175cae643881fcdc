"""Fine-tuning CLI end to end on real task data: from a pre-trained run, from scratch, eval/predict modes.

A `test`-size LM is pre-trained for a few steps on two real books with GPT-1's BPE; tasks are
small slices of the real RTE, STS-B and Story Cloze files in ../shared/data. The data are built in this
process by the functions behind `pipelines.pretrain_data` and `pipelines.finetune_data` (their command
lines run in test_pipelines.py, test_task_data.py and the walk-through): a process each would only add
its start-up; the fine-tuning itself runs as the CLI.
"""

from __future__ import annotations

import csv
import json

import pytest

from pipelines.finetune_data import build_task_data
from pipelines.pretrain_data import PretrainConfig, build_pretraining_data
from tests.small_runs import BASE_FLAGS, ENV, finish, free_ports, model_weights, run_cli, run_clis, start

FT_FLAGS = ["--batch_size=8", "--epochs=2", "--log_every=1", "--seed=1", "--progress=false", "--json", "--deterministic"]


@pytest.fixture(scope="module")
def pretrained(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("pre")
    for split in ("train", "valid"):
        (root / "books" / split).mkdir(parents=True)
    src = shared_data / "books" / "train"
    for name in sorted(p.name for p in src.glob("*.txt"))[:2]:
        (root / "books" / "train" / name).write_bytes((src / name).read_bytes())
    valid = sorted((shared_data / "books" / "valid").glob("*.txt"))[0]
    (root / "books" / "valid" / valid.name).write_bytes(valid.read_bytes())
    bpe = shared_data / "gpt1_bpe"
    build_pretraining_data(PretrainConfig(input_dir=str(root / "books" / "train"), valid_dir=str(root / "books" / "valid"),
                                          output_dir=str(root / "lm_data"), tokenizer_dir=str(bpe), n_ctx=64,
                                          show_progress=False))
    flags = [*BASE_FLAGS, f"--data_dir={root / 'lm_data'}", "--train_steps=10", "--checkpoint_every=10", "--n_ctx=64"]
    run_cli("gpt_tf.train", *flags, f"--run_dir={root / 'lm_run'}")
    return root / "lm_run", bpe


def build_task(task, data_dir, bpe, out, **options):
    """``pipelines.finetune_data --task=task ...`` in this process; ``options``: ``build_task_data``'s."""
    build_task_data(task, data_dir, bpe, out, show_progress=False, **options)
    return out


@pytest.fixture(scope="module")
def rte16(pretrained, shared_data, tmp_path_factory):
    """16 RTE rows (train and dev) with GPT-1's BPE, built once by the CLI for the three tests that fine-tune on
    them (they only read it)."""
    _, bpe = pretrained
    return build_task("rte", shared_data / "glue" / "RTE", bpe, tmp_path_factory.mktemp("rte16") / "rte",
                      max_examples=16)


def test_rte_from_pretrained_then_eval_and_predict(pretrained, shared_data, tmp_path):
    lm_run, bpe = pretrained
    data = build_task("rte", shared_data / "glue" / "RTE", bpe, tmp_path / "rte", max_examples=48)
    run_dir = tmp_path / "run"
    flags = ["--task=rte", f"--data_dir={data}", f"--run_dir={run_dir}", *FT_FLAGS]
    proc = run_cli("gpt_tf.train", *flags, f"--init_checkpoint={lm_run}", "--transfer_layers=1", "--n_ctx=48")
    assert "embeddings + 1 of 2 blocks" in proc.stderr
    assert json.loads((run_dir / "model_config.json").read_text())["n_ctx"] == 48  # shorter than the LM's 64
    trained = json.loads(proc.stdout.strip().splitlines()[-1])
    assert trained["dev"]["examples"] == 48 and 0.0 <= trained["dev"]["accuracy"] <= 1.0
    evaluated = json.loads(run_cli("gpt_tf.train", *flags, "--mode=eval").stdout.strip().splitlines()[-1])
    assert evaluated["dev"] == trained["dev"] and evaluated["step"] == 12
    path = json.loads(run_cli("gpt_tf.train", *flags, "--mode=predict").stdout.strip().splitlines()[-1])["path"]
    rows = list(csv.reader(open(path), delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 49
    assert {r[1] for r in rows[1:]} <= {"entailment", "not_entailment"}
    # Rows are keyed by the file's own index column, in file order.
    own = [line.split("\t")[0] for line in (shared_data / "glue" / "RTE" / "dev.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows[1:]] == own[:48]


def test_submission_keys():
    from gpt_tf.runs.submissions import submission_key

    assert submission_key("test-17", "test") == "17"  # GLUE: the file's index column
    assert submission_key("b929f263-1dcd", "test") == "b929f263-1dcd"  # Story Cloze: InputStoryid
    assert submission_key("dev_matched-3", "dev_matched") == "3"


def test_pretrained_layers_are_transferred(pretrained, rte16, tmp_path):
    lm_run, _ = pretrained
    flags = ["--task=rte", f"--data_dir={rte16}", *FT_FLAGS[:-1], "--epochs=1", "--learning_rate=0", "--lm_coef=0"]
    run_cli("gpt_tf.train", *flags, f"--run_dir={tmp_path / 'ft'}", f"--init_checkpoint={lm_run}")
    lm, ft = model_weights(lm_run, 10), model_weights(tmp_path / "ft", 2)
    # With lr 0 the fine-tuned backbone equals the pre-trained one (keys differ only by the model prefix).
    lm_vals = {k.split(".", 1)[1].lstrip("."): v for k, v in lm.items()}
    ft_vals = {k.split(".", 1)[1].lstrip("."): v for k, v in ft.items()}
    shared = [k for k in lm_vals if k in ft_vals and ("positions_embed" in k or k.startswith(("h0.", "h1.")))]
    assert len(shared) == 1 + 2 * 12, (list(lm_vals)[:5], list(ft_vals)[:5])
    for key in shared:  # copied, then updates of learning rate 0 (they subtract exactly 0): bit for bit on every CPU
        assert (lm_vals[key] == ft_vals[key]).all(), key


@pytest.mark.parametrize("task, folder, metric, extra", [
    ("stsb", "glue/STS-B", "pearson", {"max_examples": 40}),
    ("story_cloze", "story_cloze", "accuracy", {"max_examples": 60, "holdout_fraction": 0.3}),
])
def test_from_scratch_other_task_types(pretrained, shared_data, tmp_path, task, folder, metric, extra):
    _, bpe = pretrained
    data = build_task(task, shared_data / folder, bpe, tmp_path / task, **extra)
    flags = [f"--task={task}", f"--data_dir={data}", f"--run_dir={tmp_path / 'run'}", *FT_FLAGS, "--model=test",
             "--n_ctx=64", "--epochs=1"]
    result = json.loads(run_cli("gpt_tf.train", *flags).stdout.strip().splitlines()[-1])
    split = result[next(iter(result))]
    assert metric in split and -1.0 <= split[metric] <= 1.0


def test_multitask_heads_share_one_backbone(pretrained, rte16, shared_data, tmp_path):
    _, bpe = pretrained
    stsb = build_task("stsb", shared_data / "glue" / "STS-B", bpe, tmp_path / "stsb", max_examples=16)
    flags = ["--task=rte", f"--data_dir={rte16}", *FT_FLAGS, "--model=test", "--n_ctx=64", "--epochs=1"]
    last_json = lambda proc: json.loads(proc.stdout.strip().splitlines()[-1])
    # With STS-B's weight at 0 the multi-task run must be exactly the single-task run, plus an idle head.
    # Proportional mixture of 16 + 16 examples: one RTE epoch (2 batches) is 4 updates in expectation.
    single, idle, proc = run_clis(("gpt_tf.train", *flags, f"--run_dir={tmp_path / 'single'}"),
                                  ("gpt_tf.train", *flags, f"--aux_data_dirs={stsb}", "--task_mixture=1,0",
                                   f"--run_dir={tmp_path / 'idle'}"),
                                  ("gpt_tf.train", *flags, f"--aux_data_dirs={stsb}", f"--run_dir={tmp_path / 'both'}"))
    single, idle = last_json(single), last_json(idle)
    assert idle["dev"] == single["dev"] and "stsb/dev" in idle
    w_single, w_idle = model_weights(tmp_path / "single", 2), model_weights(tmp_path / "idle", 2)
    assert len(w_idle) == len(w_single) + 2  # W_y and its bias for STS-B
    for key, value in w_single.items():  # the same updates, op for op (STS-B is never drawn): bit for bit on every CPU
        assert (w_idle[key] == value).all(), key
    assert "multi-task: 4 updates drawn from rte 0.500, stsb 0.500" in proc.stderr
    both = last_json(proc)
    assert -1.0 <= both["stsb/dev"]["pearson"] <= 1.0 and both["stsb/dev"]["examples"] == 16
    w_both = model_weights(tmp_path / "both", 4)
    assert any((w_both[k] != v).any() for k, v in w_single.items())
    evaluated = last_json(run_cli("gpt_tf.train", *flags, f"--aux_data_dirs={stsb}", f"--run_dir={tmp_path / 'both'}",
                                  "--mode=eval"))
    assert evaluated["stsb/dev"] == both["stsb/dev"] and evaluated["dev"] == both["dev"]


def test_two_workers_fine_tune_together_and_only_the_chief_writes(rte16, tmp_path):
    run_dir, scratch = tmp_path / "run", tmp_path / "scratch"
    scratch.mkdir()
    workers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    args = ["--task=rte", f"--data_dir={rte16}", f"--run_dir={run_dir}", *FT_FLAGS, "--model=test", "--n_ctx=64",
            "--epochs=1", "--strategy=multi_worker", f"--workers={workers}"]
    results = finish([start([*args, f"--worker_index={i}"], {**ENV, "TMPDIR": str(scratch)}) for i in range(2)])
    for code, _, err in results:
        assert code == 0, err[-3000:]
    finals = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]
    assert finals[0] == finals[1] and finals[0]["dev"]["examples"] == 16  # the eval is gathered from both
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "checkpoints", "data.json", "finetune_config.json",
                                                         "metrics.json", "model_config.json", "speed_choices.json", "tb"]
    assert not list(scratch.glob("gpt_tf_worker*")), "the non-chief worker left its scratch checkpoints"


@pytest.mark.parametrize("args, message", [
    (["--task=rte", "--data_dir=/nonexistent", "--run_dir=/tmp/x"], "has no manifest.json"),
    (["--task=rte", "--data_dir=/tmp", "--run_dir=/tmp/x", "--transfer_layers=2"], "--transfer_layers needs"),
    (["--task=rte", "--data_dir=/tmp", "--run_dir=/tmp/x", "--init_checkpoint=/nope"], "does not exist"),
    (["--task=rte", "--data_dir=/tmp", "--run_dir=/tmp/x", "--aux_data_dirs=/nope"], "/nope has no manifest.json"),
    (["--task=rte", "--data_dir=/tmp", "--run_dir=/tmp/x", "--task_mixture=1,x"], "--task_mixture=1,x needs 1"),
])
def test_bad_finetune_flags(args, message):
    proc = run_cli("gpt_tf.train", *args, check=False, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr + proc.stdout
