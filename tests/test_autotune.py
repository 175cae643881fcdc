"""gpt_tf/speed/autotune.py: the per-machine settings (oneDNN rewrites, fused kernels, thread pools) decided from
fake timings, cached, applied before TensorFlow's import, and overridden by variables set by hand.

No timing is asserted and nothing is measured: ``measure_fn`` is a fake, and the subprocesses read a
cache written here. What each asserts holds on any x86 CPU: the settings are set explicitly, so an
AVX-512 machine (where TensorFlow turns the rewrites on by itself) gives the same answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt_tf.speed import autotune
from gpt_tf.speed.autotune import FUSED, INTER, INTRA, ONEDNN
from tests.small_runs import ENV

ROOT = Path(__file__).resolve().parents[1]
ON = autotune.candidate_name({ONEDNN: "1", FUSED: "1", INTRA: "0", INTER: "0"})
OFF = autotune.candidate_name(autotune.BASE)
SLOW = {OFF: 0.30, ON: 0.20, autotune.candidate_name({ONEDNN: "1", FUSED: "0", INTRA: "0", INTER: "0"}): 0.25}


@pytest.fixture(autouse=True)
def _before_tensorflow(monkeypatch):
    """``apply`` acts only before TensorFlow's import (after it, it says so and changes nothing); other test
    files in this worker imported it, so these tests see the process as a command's start would."""
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)


def _no_measuring():
    raise AssertionError("measured although the cache holds this machine")


def test_the_fastest_candidate_is_picked_and_a_near_tie_keeps_the_first_listed():
    assert autotune.pick(SLOW) == ON
    assert autotune.pick({OFF: 0.200, ON: 0.192}) == OFF  # within 5%: the settings that ran before


def test_the_pick_is_measured_once_per_machine_then_read_from_the_cache(tmp_path):
    path, calls = str(tmp_path / "settings.json"), []
    entry, how = autotune.decide(path, lambda: calls.append(1) or SLOW, environ={})
    assert how == "measured now" and calls == [1]
    assert entry["pick"] == ON and entry["settings"] == {ONEDNN: "1", FUSED: "1", INTRA: "0", INTER: "0"}
    assert list(json.loads(Path(path).read_text())) == [autotune.cache_key()]
    again, how = autotune.decide(path, _no_measuring, environ={})
    assert again == entry and how.startswith("cached")


def test_the_cache_key_is_the_machine_and_tensorflow_version():
    info = {"model": "AMD EPYC", "flags": ["avx2", "fma", "sse4_2"]}
    key = autotune.cache_key(info, cores=2, version="2.21.0")
    assert key.startswith("AMD EPYC x2 | avx2+fma flags#") and key.endswith("| tf 2.21.0")
    assert key != autotune.cache_key({**info, "flags": [*info["flags"], "avx512f"]}, cores=2, version="2.21.0")
    assert key != autotune.cache_key(info, cores=2, version="2.22.0")


def test_apply_sets_the_pick_and_says_so_in_one_line(tmp_path):
    environ = {}
    line = autotune.apply(environ, str(tmp_path / "s.json"), lambda: SLOW)
    assert {k: environ[k] for k in autotune.SETTINGS} == {ONEDNN: "1", FUSED: "1", INTRA: "0", INTER: "0"}
    assert "\n" not in line and line.startswith(f"settings auto: {ON} (pick measured now: 200 ms per ")
    assert "1.50x the speed with oneDNN off" in line and "--precision=auto" in line


def test_a_variable_set_by_hand_wins(tmp_path):
    environ = {ONEDNN: "0", INTER: "3"}
    line = autotune.apply(environ, str(tmp_path / "s.json"), lambda: SLOW)
    assert environ[ONEDNN] == "0" and environ[INTER] == "3" and environ[FUSED] == "1"
    assert line.startswith("settings auto: oneDNN off, fused kernels on, threads intra 0/inter 3; set by hand: "
                           f"{ONEDNN}=0, {INTER}=3 (")


def test_gpt_tf_autotune_0_measures_nothing_and_changes_nothing(tmp_path):
    environ = {"GPT_TF_AUTOTUNE": "0"}
    assert autotune.apply(environ, str(tmp_path / "s.json"), _no_measuring) is None
    assert environ == {"GPT_TF_AUTOTUNE": "0"} and not (tmp_path / "s.json").exists()
    assert os.environ["GPT_TF_AUTOTUNE"] == "0"  # the suite's own setting (tests/conftest.py)
    assert autotune.apply_serving(environ) is None and environ == {"GPT_TF_AUTOTUNE": "0"}


def test_a_failed_probe_leaves_the_defaults_and_caches_nothing(tmp_path):
    def broken():
        raise RuntimeError("settings probe worker failed: boom")

    environ = {}
    line = autotune.apply(environ, str(tmp_path / "s.json"), broken)
    assert line == ("settings auto: the probe failed (settings probe worker failed: boom); TensorFlow's defaults "
                    "run, nothing cached")
    assert environ == {} and not (tmp_path / "s.json").exists()


def test_serving_takes_tensorflows_own_onednn_choice_per_cpu_unless_set_by_hand():
    avx2 = {"model": "AMD EPYC", "flags": ["avx2", "fma"]}
    avx512 = {"model": "Intel Xeon", "flags": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "fma"]}
    environ = {}
    assert autotune.apply_serving(environ, avx2) == "settings auto: oneDNN off (the serving default, gpt_tf/speed/autotune.py)"
    assert environ == {ONEDNN: "0"}
    environ = {}
    assert autotune.apply_serving(environ, avx512).startswith("settings auto: oneDNN on ")
    assert environ == {ONEDNN: "1"}
    environ = {ONEDNN: "1"}
    assert "set by hand" in autotune.apply_serving(environ, avx2) and environ == {ONEDNN: "1"}


PROBE = """
import json, os
from gpt_tf.console import import_tensorflow
tf = import_tensorflow()
from tensorflow.python.util import _pywrap_util_port
from gpt_tf.speed import kernels
print(json.dumps({"mkl": bool(_pywrap_util_port.IsMklEnabled()), "fused": kernels.ops() is not None,
                  "inter": tf.config.threading.get_inter_op_parallelism_threads()}))
"""


def _run_cli_import(tmp_path, pick: dict, **hand) -> subprocess.CompletedProcess:
    cache = tmp_path / "gpt_tf" / "settings.json"
    cache.parent.mkdir(exist_ok=True)
    name = autotune.candidate_name(pick)
    cache.write_text(json.dumps({autotune.cache_key(): {"pick": name, "settings": pick, "s_per_step": {name: 0.1},
                                                      "measured": "2026-11-26T00:00:00+00:00"}}))
    env = {k: v for k, v in os.environ.items() if k not in (*autotune.SETTINGS, "TF_CPP_MIN_LOG_LEVEL")}
    env.update({"GPT_TF_AUTOTUNE": "1", "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": ENV["PYTHONPATH"],
                "GPT_TF_KERNEL_DIR": str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                         / "gpt_tf" / "kernels"), **hand})
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240, check=True)


def test_the_cached_pick_is_in_force_before_tensorflow_starts(tmp_path, dnn="1"):
    """A command's TensorFlow runs with the rewrites the cache says (IsMklEnabled reads the variable once,
    at import), the fused kernels off as picked, one inter-op thread; stderr holds the one line."""
    done = _run_cli_import(tmp_path, {ONEDNN: dnn, FUSED: "0", INTRA: "0", INTER: "1"})
    assert json.loads(done.stdout) == {"mkl": dnn == "1", "fused": False, "inter": 1}
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"settings auto: oneDNN {'on' if dnn == '1' else 'off'}, "
                                                   "fused kernels off, threads intra 0/inter 1 (pick cached "), lines


def test_onednn_set_by_hand_beats_the_cache_in_a_command(tmp_path):
    done = _run_cli_import(tmp_path, {ONEDNN: "1", FUSED: "0", INTRA: "0", INTER: "0"}, TF_ENABLE_ONEDNN_OPTS="0")
    assert json.loads(done.stdout)["mkl"] is False
    assert f"set by hand: {ONEDNN}=0" in done.stderr
