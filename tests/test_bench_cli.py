"""Every speed benchmark's command still starts (its flags parse, its imports resolve): the commands quoted in
README.md, docs/ and WORKSPACE.md keep running. ``--help`` only: the benchmarks themselves take minutes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEED = ("speed_table", "train_throughput", "pretrain_throughput", "finetune_speed", "optimizer_speed",
         "tokenizer_speed", "zero_shot_speed", "serving_latency")


@pytest.mark.parametrize("script", SPEED)
def test_speed_benchmark_help_runs(script):
    done = subprocess.run([sys.executable, "-m", f"bench.{script}", "--help"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr[-2000:]  # absl's --help exits 1
    assert f"bench.{script}:" in done.stdout or f"bench/{script}.py:" in done.stdout, done.stdout[-2000:]


def test_finetune_speed_has_the_ab_and_profile_modes():
    done = subprocess.run([sys.executable, "-m", "bench.finetune_speed", "--helpfull"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert "<speed|padding|ab|profile>" in done.stdout and "--base" in done.stdout


def test_the_speed_table_goals_file_name_and_table():
    from bench.speed_table import cpu_slug, goals, markdown

    assert cpu_slug({"cpu": "AMD EPYC 9B45", "isa": ["avx2", "fma", "avx512f", "avx512_bf16"]}) == "amd_epyc_9b45_avx512_bf16"
    rows = [{"preset": "tiny", "stack": s, "precision": "float32", "tokens_per_s": t, "batch": 8, "seq": 128,
             "others_cpu_share": 0.5, "vs_keras_hub": 1.5, "vs_torch": 3.0}
            for s, t in (("ours", 300.0), ("keras_hub", 200.0), ("torch", 100.0))]
    report = {"pretraining": rows, "finetuning": {"summary": {"rows": {
        "ours_bucketed_lm0": {"train": 150.0, "eval": 400.0, "others_cpu_share": 0.1},
        "hf_float32": {"train": 100.0, "eval": 400.0, "others_cpu_share": 0.1}}}}}
    assert [(what.split(":")[0], round(r, 2), g) for what, r, g in goals(report)] == [
        ("pre-training tiny", 1.5, 1.25), ("pre-training tiny", 3.0, 1.5), ("fine-tuning train", 1.5, 1.5),
        ("fine-tuning eval", 1.0, 1.5)]
    report.update(command="python -m bench.speed_table", date="2026-11-26T01:00+00:00", header="AMD EPYC",
                  settings="settings auto: ...", goals=goals(report))
    table = markdown(report)
    assert "| tiny | float32 | 8 × 128 | 300 | 200 | 100 | 1.50× | 3.00× | 50% |" in table
    assert "| fine-tuning eval: ours_bucketed_lm0 / hf_float32 | 1.00× | ≥ 1.5× | no |" in table
