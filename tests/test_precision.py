"""--precision=auto (gpt_tf/speed/precision.py): timed once per machine and model shape, cached, reported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpt_tf.speed import precision
from gpt_tf.config import get_size
from gpt_tf.speed.kernels.build import kernel_dir
from tests.small_runs import ENV, ROOT


def test_explicit_precision_is_kept_without_measuring(monkeypatch, tmp_path):
    monkeypatch.setattr(precision, "measure", lambda *a: pytest.fail("measured although a precision was given"))
    for name in precision.PRECISIONS:
        assert precision.resolve_precision(name, get_size("test"), 8, 32, str(tmp_path / "c.json"))[0] == name
    assert not (tmp_path / "c.json").exists()


def test_auto_measures_once_then_reads_the_cache(monkeypatch, tmp_path):
    path, config = str(tmp_path / "gpt_tf" / "precision.json"), get_size("test")
    pick, reason = precision.resolve_precision("auto", config, 8, 32, path)
    entry = json.loads(open(path).read())[precision.cache_key(config, 8, 32)]
    assert pick == entry["pick"] == min(entry["s_per_step"], key=entry["s_per_step"].get)  # the faster one
    assert set(entry["s_per_step"]) == set(precision.PRECISIONS) and "measured now" in reason
    monkeypatch.setattr(precision, "measure", lambda *a: pytest.fail("measured again"))
    again, reason = precision.resolve_precision("auto", config, 8, 32, path)
    assert again == pick and "cached" in reason and precision.cpu_name() in reason
    # Another shape is another entry; a planted entry decides for its key.
    other = get_size("test", n_layer=1)
    cache = json.loads(open(path).read())
    cache[precision.cache_key(other, 8, 32)] = {"pick": "mixed_bfloat16", "measured": "then",
                                                "s_per_step": {"float32": 2.0, "mixed_bfloat16": 1.0}}
    open(path, "w").write(json.dumps(cache))
    assert precision.resolve_precision("auto", other, 8, 32, path)[0] == "mixed_bfloat16"


def test_cli_says_what_auto_picked(shared_data, tmp_path):
    from pipelines.finetune_data import build_task_data

    data = tmp_path / "sst2"
    build_task_data("sst2", shared_data / "glue" / "SST-2", shared_data / "gpt1_bpe", data, max_examples=16,
                    show_progress=False)
    flags = ["--task=sst2", f"--data_dir={data}", "--model=test", "--n_ctx=32", "--batch_size=8", "--epochs=1",
             "--progress=false", "--precision=auto"]
    env = {**ENV, "XDG_CACHE_HOME": str(tmp_path / "cache"), "GPT_TF_KERNEL_DIR": str(kernel_dir())}  # built once
    first, second = (subprocess.run([sys.executable, "-m", "gpt_tf.train", *flags, f"--run_dir={tmp_path / run}"],
                                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True)
                     for run in ("a", "b"))
    assert "precision auto: " in first.stderr and "measured now" in first.stderr
    assert "fused CPU kernels: " in first.stderr  # on, or off with the reason
    line = next(x for x in second.stderr.splitlines() if x.startswith("precision auto: "))
    assert "cached" in line and str(tmp_path / "cache" / "gpt_tf" / "precision.json") in line
    picked = line.split()[2]
    assert json.loads((tmp_path / "a" / "finetune_config.json").read_text())["precision"] == picked
