"""`python -m bench.train_throughput --mode=profile`: the pre-training step's time by kind, three stacks."""

import json
import subprocess
import sys

from bench._profiles import KINDS
from tests.small_runs import ENV, ROOT


def test_the_profile_puts_each_stacks_step_time_in_kinds_and_names_the_costliest_ops(tmp_path):
    out = tmp_path / "profile.json"
    cmd = [sys.executable, "-m", "bench.train_throughput", "--mode=profile", "--presets=test", "--precisions=float32",
           "--warmup=1", "--steps=2", f"--out={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "GPT_TF_AUTOTUNE=0" in report["settings"]  # the suite's setting, recorded as such
    (key, rows), = report["rows"].items()
    assert key == "test|float32|8|32"
    assert set(rows) == {"ours", "keras_hub", "torch"}
    for stack, row in rows.items():
        # Every stack's step multiplies matrices, drops out (dropout is on) and updates with AdamW: each kind
        # is found in its profile, and the kinds add up to the step's wall time.
        for kind in ("matmul", "optimizer", "dropout"):
            assert row[kind] > 0, (stack, kind, row)
        assert abs(sum(row[k] for k in KINDS) - row["total"]) <= 0.01 * row["total"] + 0.01, (stack, row)
        assert row["matmul GFLOP/s"] > 0 and row["tokens/s"] > 0
        assert 0 < len(row["top ops"]) <= 6
    assert any("MatMul" in op for op in rows["ours"]["top ops"])
    assert any(op.startswith("aten::") for op in rows["torch"]["top ops"])
    text = out.with_suffix(".md").read_text()
    assert "| ours |" in text and "| keras-hub stack |" in text and "| PyTorch HF |" in text
