"""bench/experiments/study.py: which runs the study makes (arms → flags), the LSTM recipe, the report and figures from records.

No model runs here (the runs are the CLIs tested elsewhere); the report is built from synthetic records
whose expected numbers are known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.experiments.reproduction import recipe_flags
from bench.experiments.study import (coarse_to_fine, finetune_specs, lstm_pretrain_cmd, parse_args, parse_part, part_of,
                                     resolve_plan, reused_run)
from bench.experiments.study_report import write_report

TRAIN_CONFIG = {"data_dir": "data/books_tiny", "batch_size": 32, "grad_accum_steps": 1, "learning_rate": 3e-4,
                "lr_decay": "cosine", "weight_decay": 0.01, "clip_norm": 1.0, "precision": "mixed_bfloat16", "seed": 0,
                "keep_checkpoints": 8, "eval_batches": 20, "train_steps": 2000, "warmup_steps": 100,
                "checkpoint_every": 250}
MODEL_CONFIG = {"n_layer": 4, "n_embd": 256, "n_ctx": 128, "vocab_size": 8000}


def _plan(*argv):
    args = parse_args(["--pretrained=runs/pre", "--tasks_dir=data/t", "--lstm_run=runs/lstm", *argv])
    plan = resolve_plan(args, n_layer=4, pretrain_steps=2000)
    plan["n_layer"] = 4
    return args, plan


def _flags(spec):
    return dict(f.partition("=")[::2] for f in spec["cmd"][3:])  # {"--flag": "value"}; "--json": ""


def test_arms_become_the_right_flags():
    args, plan = _plan("--tasks=rte,cola", "--transfer_tasks=rte,sst2", "--seeds=0,1", "--layers=all", "--epochs=2")
    specs = finetune_specs(plan, args, "data/t", "tiny", "runs/lstm")
    by = {(s["task"], s["arm"], s["seed"]): _flags(s) for s in specs}
    assert len(by) == len(specs) == 2 * (2 * 4 + 1 + 2 * 4)  # per seed: 2 tasks × 4 arms, sst2 full, 2 × transfer0..3
    full, lm0, scratch, lstm = (by[("rte", arm, 1)] for arm in ("full", "lm0", "scratch", "lstm"))
    assert full["--init_checkpoint"] == "runs/pre" and "--lm_coef" not in full and "--transfer_layers" not in full
    assert lm0["--lm_coef"] == "0" and lm0["--init_checkpoint"] == "runs/pre"
    assert scratch["--model"] == "tiny" and "--init_checkpoint" not in scratch
    assert lstm["--init_checkpoint"] == "runs/lstm"
    assert by[("sst2", "transfer0", 0)]["--transfer_layers"] == "0" and ("sst2", "transfer4", 0) not in by
    assert ("cola", "transfer0", 0) not in by and ("sst2", "full", 1) in by
    assert all(f["--epochs"] == "2" and f["--seed"] == str(seed) for (_, _, seed), f in by.items())
    assert by[("rte", "full", 0)]["--flagfile"] == "configs/finetune_rte.flags"


def test_books_scale_uses_the_small_model_recipes_and_reuses_matching_reproduction_runs():
    args, plan = _plan("--scale=books", "--precision=float32")
    specs = finetune_specs(plan, args, "data/t", "tiny", "runs/lstm")
    by = {(s["task"], s["arm"], s["seed"]): s for s in specs}
    flags = _flags(by[("cola", "full", 0)])
    assert flags["--flagfile"] == "configs/finetune_cola_tiny.flags" and "--epochs" not in flags
    recipe = recipe_flags("cola", "_tiny")
    assert recipe["epochs"] and recipe["learning_rate"] and "flagfile" not in recipe and "n_ctx" not in recipe
    base = "python -m gpt_tf.train --flagfile=configs/finetune_cola.flags --data_dir=data/t/cola --n_ctx=64 --precision=float32"
    ledger = [{"task": "cola", "arm": "pretrained", "seed": 0, "recipe": recipe, "cmd": base + " --init_checkpoint=runs/pre",
               "run_dir": "r/pre"},
              {"task": "cola", "arm": "scratch", "seed": 0, "recipe": {**recipe, "learning_rate": "9"},
               "cmd": base + " --model=tiny", "run_dir": "r/other_recipe"},
              {"task": "cola", "arm": "scratch", "seed": 0, "recipe": recipe, "cmd": base.replace("float32", "mixed_bfloat16")
               + " --model=tiny", "run_dir": "r/other_precision"}]
    assert reused_run(by[("cola", "full", 0)], plan, ledger)["run_dir"] == "r/pre"
    assert reused_run(by[("cola", "scratch", 0)], plan, ledger) is None  # another recipe, another precision
    assert reused_run(by[("cola", "lm0", 0)], plan, ledger) is None and reused_run(by[("rte", "full", 0)], plan, ledger) is None
    _, paper = _plan("--scale=books", "--epochs=2")  # the study's own epochs: not the reproduction's runs
    assert reused_run(by[("cola", "full", 0)], paper, ledger) is None


def test_scale_defaults_and_overrides():
    _, plan = _plan("--scale=smoke", "--seeds=3")
    assert plan["seeds"] == [3] and plan["train_subsample"] == 64 and plan["layers"] == [0, 2]
    _, plan = _plan()
    assert plan["layers"] == [0, 1, 2, 3, 4] and plan["seeds"] == [0, 1, 2] and plan["lstm_steps"] == 2000
    with pytest.raises(SystemExit, match="unknown task 'qnli'"):
        _plan("--tasks=qnli")


def test_lstm_is_pretrained_with_the_transformer_recipe_scaled_to_its_steps():
    args, _ = _plan("--runs_root=runs/s")
    run_dir, cmd = lstm_pretrain_cmd(args, TRAIN_CONFIG, "tiny", 200)
    flags = _flags({"cmd": cmd})
    assert run_dir == "runs/s/lstm_tiny" and flags["--model"] == "lstm_tiny" and flags["--train_steps"] == "200"
    assert flags["--warmup_steps"] == "10" and flags["--checkpoint_every"] == "25"
    assert "--json" in flags  # the study reads the run's result from its last stdout line
    for key in ("data_dir", "batch_size", "learning_rate", "precision", "keep_checkpoints"):
        assert flags[f"--{key}"] == str(TRAIN_CONFIG[key])


def _record(task, arm, seed, score, metric="accuracy"):
    return {"kind": "finetune", "task": task, "arm": arm, "seed": seed, "cmd": f"python -m gpt_tf.train --task={task}",
            "seconds": 10.0, "metrics": {"dev": {metric: score / 100, "examples": 100}}}


def test_report_tables_checks_and_figures(tmp_path):
    pre = tmp_path / "pre"
    pre.mkdir()
    (pre / "train_config.json").write_text(json.dumps(TRAIN_CONFIG))
    (pre / "model_config.json").write_text(json.dumps(MODEL_CONFIG))
    for task, n in (("rte", 2490), ("sst2", 4000)):
        (tmp_path / "tasks" / task).mkdir(parents=True)
        (tmp_path / "tasks" / task / "manifest.json").write_text(json.dumps({"counts": {"train": n, "dev": 10}}))
    records = [_record("rte", "full", s, 60 + s) for s in (0, 1, 2)] + [_record("rte", "scratch", 0, 50)]
    records += [_record("sst2", "full", 0, 80), _record("sst2", "scratch", 0, 76), _record("sst2", "lm0", 0, 79),
                _record("rte", "lm0", 0, 62), _record("rte", "transfer0", 0, 52), _record("rte", "transfer2", 0, 55)]
    csv_path = tmp_path / "zs.csv"
    csv_path.write_text("step,task,split,metric,score,chance,reference,normalized,examples,threshold\n"
                        "0,sst2,dev,accuracy,0.5,0.5,,,8,\n250,sst2,dev,accuracy,0.59,0.5,,,8,\n"
                        "250,cola,dev,matthews,0.1,0.0,,,8,0.3\n")
    records.append({"kind": "zero_shot", "model": "transformer", "csv": str(csv_path), "cmd": "python -m gpt_tf.analysis.zero_shot",
                    "seconds": 5.0})
    config = {"pretrained": str(pre), "preset": "tiny", "tasks_dir": str(tmp_path / "tasks"), "tasks": ["rte", "sst2"],
              "transfer_tasks": ["rte"], "layers": [0, 2], "n_layer": 4, "epochs": 3, "seeds": [0, 1, 2],
              "train_subsample": 0, "precision": "mixed_bfloat16", "lstm_steps": 2000,
              "zero_shot_tasks": ["cola", "sst2"], "zero_shot_max_examples": 0}
    out = tmp_path / "docs"
    write_report(records, config, out, "python -m bench.experiments.study --scale=cpu", 42.0, str(tmp_path / "tasks"))
    md = (out / "results.md").read_text()
    assert "| Transformer w/ aux LM (full) | 70.5 | 61.0 (60.0–62.0) | 80.0 [1 of 3 seeds] |" in md
    assert "mean Δ = **+7.5** points over 2 tasks (better on 2 of 2)" in md  # rte 61 − 50, sst2 80 − 76
    assert "| rte | 2,490 | 61.0 | 62.0 | -1.0 |" in md and "| 4 (all) | 61.0 (60.0–62.0) |" in md
    assert "rte: 4 vs 0 blocks +9.0 points" in md
    assert "| transformer | 250 | 0.100 [+0.10] | 0.590 [+0.30] |" in md  # sst2 (0.59 − 0.5) / (0.80 − 0.5)
    assert "cola 1.000 (perfect score" in md and "python -m bench.experiments.study --scale=cpu" in md
    for name in ("results.md", "ablations.png", "layer_transfer.png", "zero_shot.png"):
        assert (out / name).is_file()
    assert all((out / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in ("ablations.png", "zero_shot.png"))
    # A section another command wrote between its markers survives the next rewrite; the old text does not.
    section = ("<!-- reference_finetune: written by python -m bench.experiments.reference_finetune --stage=report -->\n"
               "| task | ours | reference |\n<!-- /reference_finetune -->")
    (out / "results.md").write_text("stale study text\n\n" + section + "\n")
    write_report(records, config, out, "python -m bench.experiments.study --scale=cpu", 42.0, str(tmp_path / "tasks"))
    md = (out / "results.md").read_text()
    assert md.count(section) == 1 and "stale study text" not in md and md.index("## Configuration") < md.index(section)


def test_a_runs_root_keeps_one_configuration(tmp_path):
    from bench.experiments.study import _check_configuration

    _check_configuration(Path(tmp_path), {"epochs": 3, "seeds": [0]})
    _check_configuration(Path(tmp_path), {"epochs": 3, "seeds": [0]})
    with pytest.raises(SystemExit, match="epochs differ"):
        _check_configuration(Path(tmp_path), {"epochs": 1, "seeds": [0]})


def test_parts_split_the_runs_without_overlap():
    specs = [{"index": i} for i in range(1, 24)]
    parts = [part_of(specs, i, 3) for i in range(3)]
    assert sorted(s["index"] for p in parts for s in p) == list(range(1, 24))
    assert [len(p) for p in parts] == [8, 8, 7]
    assert parse_part("1/2") == (1, 2)
    for bad in ("2/2", "x", "1"):
        with pytest.raises(SystemExit, match="--part"):
            parse_part(bad)


def test_layer_transfer_runs_coarse_to_fine_after_the_ablations():
    assert coarse_to_fine([0, 1, 2, 3, 4], 4) == [0, 2, 1, 3]
    assert coarse_to_fine([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 12)[:3] == [0, 6, 3]
    args, plan = _plan("--tasks=rte", "--transfer_tasks=rte", "--seeds=0,1", "--layers=all")
    arms = [(s["arm"], s["seed"]) for s in finetune_specs(plan, args, "data/t", "tiny", "runs/lstm")]
    assert arms[:8] == [(a, s) for s in (0, 1) for a in ("full", "scratch", "lm0", "lstm")]
    assert arms[8:12] == [("transfer0", 0), ("transfer0", 1), ("transfer2", 0), ("transfer2", 1)]
