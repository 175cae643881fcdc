"""The console: TensorFlow's start-up lines kept off it (and back with GPT_TF_VERBOSE=1), plain progress lines
where stderr is not a terminal, readable metric summaries. The walk-through test checks every command's
output the same way (tests/test_walkthrough.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from gpt_tf.console import PlainProgress, format_metrics, line_every, progress
from tests.small_runs import ENV

ROOT = Path(__file__).resolve().parents[1]
TF_START_UP = ("oneDNN custom operations", "cuInit", "absl::InitializeLog")
SCRIPT = ("from gpt_tf.console import import_tensorflow\n"
          "tf = import_tensorflow()\n"
          "from tensorflow.python.util import _pywrap_util_port\n"
          "print(float(tf.reduce_sum(tf.constant([1.0, 2.0]))), _pywrap_util_port.IsMklEnabled())\n")


def _run(extra_env: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "GPT_TF_VERBOSE")}
    return subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env={**env, "PYTHONPATH": ENV["PYTHONPATH"], **extra_env},
                          capture_output=True, text=True, timeout=180, check=True)


def test_tensorflow_start_up_lines_are_off_by_default_and_back_with_gpt_tf_verbose():
    quiet = _run({})
    assert quiet.stdout.split()[0] == "3.0"
    assert quiet.stderr == "", quiet.stderr
    loud = _run({"GPT_TF_VERBOSE": "1"})  # TensorFlow's own lines: the ones the quiet import hides
    value, onednn = loud.stdout.split()
    assert value == "3.0"
    assert "absl::InitializeLog" in loud.stderr, loud.stderr  # every CPU: logged before absl's set-up
    # TensorFlow announces oneDNN's rewrites only where they are on: by default on CPUs with AVX-512,
    # off on AVX2-only ones (such as an AMD EPYC Zen 3) unless TF_ENABLE_ONEDNN_OPTS=1.
    assert ("oneDNN custom operations" in loud.stderr) == (onednn == "True"), (onednn, loud.stderr)


def test_plain_progress_prints_a_line_every_n_steps_and_at_the_end():
    out = io.StringIO()
    bar = PlainProgress(total=25, initial=0, desc="pre-training", unit="step", every=10, file=out)
    for step in range(1, 26):
        bar.set_postfix(loss=f"{1 / step:.3f}")
        bar.update(1)
    bar.close()
    bar.close()
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == ["pre-training: 10/25 step (40%)", "pre-training: 20/25 step (80%)",
                                                     "pre-training: 25/25 step (100%)"]
    assert lines[-1].endswith("loss=0.040") and "\r" not in out.getvalue()


def test_plain_progress_counts_from_a_resumed_step_and_wraps_iterables(capsys):
    out = io.StringIO()
    bar = PlainProgress(total=100, initial=60, desc="fine-tuning rte", unit="step", every=20, file=out)
    bar.update(15)  # 75: no multiple of 20 passed since 60
    bar.update(10)  # 85: past 80
    bar.update(15)
    bar.close()
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == [
        "fine-tuning rte: 85/100 step (85%)", "fine-tuning rte: 100/100 step (100%)"]
    # Under pytest stderr is not a terminal: progress() gives plain lines; without `every`, one every
    # 15 s (none in this fast loop) and one at the end.
    items = list(progress(range(8), desc="write", unit="rec"))
    assert items == list(range(8))
    assert capsys.readouterr().err.startswith("write: 8/8 rec (100%), 0 s")


def test_line_every_is_a_multiple_of_the_logging_period():
    assert line_every(900, multiple_of=10) == 50  # about 20 lines over the demo's 900 updates
    assert line_every(4, multiple_of=10) == 10
    assert line_every(375, multiple_of=20, lines=20) == 20


def test_format_metrics_reads_as_a_sentence():
    results = {"step": 12, "dev": {"accuracy": 0.50917, "examples": 872},
               "stsb/dev": {"pearson": 0.1, "spearman": 0.12, "examples": 1500}}
    assert format_metrics(results) == ("dev accuracy 0.5092 (872 examples); "
                                       "stsb/dev pearson 0.1000, spearman 0.1200 (1,500 examples)")


def test_plain_progress_without_a_period_prints_on_a_timer_and_at_the_end():
    out = io.StringIO()
    bar = PlainProgress(total=3, desc="tokenize", unit="text", seconds=0.0, file=out)
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == [
        "tokenize: 1/3 text (33%)", "tokenize: 2/3 text (67%)", "tokenize: 3/3 text (100%)"]
