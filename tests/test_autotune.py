"""gpt_tf/speed/autotune.py and resolve.py: a run's speed choices, from the per-machine settings (oneDNN rewrites,
fused kernels, thread pools) decided from fake timings and cached, and the per-shape fields of its model; overridden
by variables set by hand; a command line's TensorFlow started under them (gpt_tf/restart.py).

No timing is asserted and nothing is measured: the timings are fakes, and the subprocesses read a cache
written here. What each asserts holds on any x86 CPU: the pick's oneDNN setting is the other one than TensorFlow's
own default on the CPU where it must be, so an AVX-512 machine and an AVX2-only one take the same paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt_tf.speed import autotune, choices, resolve
from gpt_tf.speed.autotune import FUSED, INTER, INTRA, ONEDNN
from gpt_tf.speed.choices import SpeedChoices
from gpt_tf.speed.kernels.build import kernel_dir
from tests.small_runs import ENV

ROOT = Path(__file__).resolve().parents[1]
ON = autotune.candidate_name({ONEDNN: "1", FUSED: "1", INTRA: "0", INTER: "0"})
OFF = autotune.candidate_name(autotune.BASE)
SLOW = {OFF: 0.30, ON: 0.20, autotune.candidate_name({ONEDNN: "1", FUSED: "0", INTRA: "0", INTER: "0"}): 0.25}


def _no_measuring():
    raise AssertionError("measured although the cache holds this machine")


def test_the_fastest_candidate_is_picked_and_a_near_tie_keeps_the_first_listed():
    assert autotune.pick(SLOW) == ON
    assert autotune.pick({OFF: 0.200, ON: 0.192}) == OFF  # within 5%: the settings that ran before


def test_the_pick_is_measured_once_per_machine_then_read_from_the_cache(tmp_path):
    path, calls = str(tmp_path / "settings.json"), []
    entry, how = autotune.decide(path, lambda: calls.append(1) or SLOW)
    assert how == "measured now" and calls == [1]
    assert entry["pick"] == ON and entry["settings"] == {ONEDNN: "1", FUSED: "1", INTRA: "0", INTER: "0"}
    assert list(json.loads(Path(path).read_text())) == [autotune.cache_key()]
    again, how = autotune.decide(path, _no_measuring)
    assert again == entry and how.startswith("cached")


def test_the_cache_key_is_the_machine_and_tensorflow_version():
    info = {"model": "AMD EPYC", "flags": ["avx2", "fma", "sse4_2"]}
    key = autotune.cache_key(info, cores=2, version="2.21.0")
    assert key.startswith("AMD EPYC x2 | avx2+fma flags#") and key.endswith("| tf 2.21.0")
    assert key != autotune.cache_key({**info, "flags": [*info["flags"], "avx512f"]}, cores=2, version="2.21.0")
    assert key != autotune.cache_key(info, cores=2, version="2.22.0")


def test_the_pick_is_given_as_speed_choices_with_why(tmp_path):
    picked, how = autotune.process_choices(str(tmp_path / "s.json"), lambda: SLOW)
    assert picked == SpeedChoices(fused_kernels=True, onednn=True)
    assert how.startswith("CPU settings measured now: 200 ms per 1-layer tiny 4x64 training step, 1.50x the speed "
                          "with oneDNN off, ") and how.endswith("s.json")


def test_a_failed_probe_gives_the_defaults_and_caches_nothing(tmp_path):
    def broken():
        raise RuntimeError("settings probe worker failed: boom")

    picked, how = autotune.process_choices(str(tmp_path / "s.json"), broken)
    assert picked == SpeedChoices()
    assert how == ("the CPU settings probe failed (settings probe worker failed: boom): TensorFlow's defaults, "
                   "nothing cached")
    assert not (tmp_path / "s.json").exists()


def test_serving_takes_tensorflows_own_onednn_choice_per_cpu():
    avx2 = {"model": "AMD EPYC", "flags": ["avx2", "fma"]}
    avx512 = {"model": "Intel Xeon", "flags": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "fma"]}
    assert autotune.serving_default(avx2) == {ONEDNN: "0"} and autotune.serving_default(avx512) == {ONEDNN: "1"}
    assert autotune.serving_choices(avx2) == SpeedChoices(fused_kernels=False, onednn=False)  # stock ops only
    assert autotune.serving_choices(avx512) == SpeedChoices(fused_kernels=False, onednn=True)


# ----------------------------------------------------------------------------- a run's choices (resolve.py)


def _plant(cache_home: Path, pick: dict) -> None:
    """This machine's settings.json entry under ``cache_home``, as the probe would have written it."""
    cache = cache_home / "gpt_tf" / "settings.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    name = autotune.candidate_name(pick)
    cache.write_text(json.dumps({autotune.cache_key(): {"pick": name, "settings": pick, "s_per_step": {name: 0.1},
                                                      "measured": "2026-11-26T00:00:00+00:00"}}))


@pytest.fixture
def machine(fresh_choices, monkeypatch):
    """Measuring on, a fresh cache folder holding a planted pick (oneDNN on, fused kernels on, one inter-op thread),
    no variable set by hand, and the per-shape timings faked: every aliased weight shape padded, no GELU kernel."""
    home = fresh_choices()
    for name in (*choices.BY_HAND, choices.HANDED_OVER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(choices.AUTOTUNE, "1")
    _plant(home, {ONEDNN: "1", FUSED: "1", INTRA: "0", INTER: "1"})
    from gpt_tf.speed import aliased_grads, inference_gelu

    monkeypatch.setattr(aliased_grads, "measure", lambda *a: {"plain": 1.0, "padded": 0.5})
    monkeypatch.setattr(inference_gelu, "measure", lambda *a: {"stock": 1.0, "kernel": 2.0})
    return home


PICKED = SpeedChoices(fused_kernels=True, onednn=True, inter_op_threads=1)


def test_auto_takes_the_machines_pick_then_the_model_shapes(machine):
    from gpt_tf.config import get_size

    speed = resolve.for_command("auto")
    assert speed.choices == PICKED and speed.measuring and speed.by_hand == {}
    assert speed.how.startswith("auto: CPU settings cached 2026-11-26")
    tiny = resolve.for_model(speed, get_size("tiny"), "float32")
    assert tiny.choices == PICKED.replace(padded_grads=("1024x256 float32", "256x1024 float32"))
    assert not tiny.measuring and tiny.how.endswith(f"; per shape: {machine / 'gpt_tf'}")
    assert resolve.for_model(speed, get_size("tiny"), "bfloat16").choices == PICKED  # 2 KiB rows: nothing aliased
    assert resolve.for_model(tiny, get_size("small"), "float32") is tiny  # decided once
    line = resolve.line(tiny, "fused CPU kernels: on (...)")
    assert "\n" not in line and line.startswith("speed choices (auto: CPU settings cached ")
    assert line.endswith("): oneDNN on, fused kernels on, threads intra 0/inter 1, padded weight gradients: "
                         "1024x256 float32, 256x1024 float32, GELU kernel in evaluation: none; fused CPU kernels: on (...)")
    assert resolve.autotune(get_size("tiny")) == tiny.choices  # the Python API's


def test_a_variable_set_by_hand_wins_and_is_not_measured(machine, monkeypatch):
    from gpt_tf.config import get_size
    from gpt_tf.speed import aliased_grads

    monkeypatch.setenv(ONEDNN, "0")
    monkeypatch.setenv("GPT_TF_PAD_WEIGHT_GRADS", "0")
    monkeypatch.setattr(aliased_grads, "measure", lambda *a: pytest.fail("measured a choice set by hand"))
    speed = resolve.for_command("auto")
    assert speed.choices == PICKED.replace(onednn=False)
    assert speed.by_hand == {"onednn": f"{ONEDNN}=0", "padded_grads": "GPT_TF_PAD_WEIGHT_GRADS=0"}
    assert resolve.for_model(speed, get_size("tiny"), "float32").choices == PICKED.replace(onednn=False)
    assert resolve.line(speed).endswith(f"; set by hand: GPT_TF_PAD_WEIGHT_GRADS=0, {ONEDNN}=0")


def test_default_a_file_and_gpt_tf_autotune_0_measure_nothing(machine, monkeypatch, tmp_path):
    from gpt_tf.config import get_size

    monkeypatch.setattr(autotune, "measure", _no_measuring)
    monkeypatch.setattr(autotune, "decide", lambda *a: pytest.fail("read the machine's pick"))
    default = resolve.for_command("default")
    assert default.choices == SpeedChoices() and default.how == "--speed=default" and not default.measuring
    assert resolve.for_model(default, get_size("tiny"), "float32") is default
    saved = tmp_path / "speed_choices.json"
    saved.write_text(json.dumps(PICKED.replace(padded_grads=("256x1024 float32",)).to_dict()))
    assert resolve.for_command(str(saved)).choices == PICKED.replace(padded_grads=("256x1024 float32",))
    assert resolve.spec_problem(str(saved)) == "" and resolve.spec_problem("auto") == ""
    assert resolve.spec_problem("fastest") == "--speed=fastest: neither auto, default nor a JSON file of speed choices"
    monkeypatch.setenv(choices.AUTOTUNE, "0")
    off = resolve.for_command("auto")
    assert off.choices == SpeedChoices() and off.how == "auto, nothing measured: GPT_TF_AUTOTUNE=0"
    assert resolve.for_model(off, get_size("tiny"), "float32") is off
    assert resolve.for_command("auto", serving=True).choices == autotune.serving_choices()


def test_a_restarted_command_takes_the_choices_handed_over_and_its_children_do_not(machine, monkeypatch):
    speed = resolve.Resolution(PICKED, "auto: handed over", True, {"onednn": f"{ONEDNN}=1"})
    monkeypatch.setenv(choices.HANDED_OVER, json.dumps({**speed.to_dict(), "pid": os.getpid()}))
    monkeypatch.setattr(autotune, "decide", lambda *a: pytest.fail("resolved twice"))
    assert resolve.for_command("default") == speed
    monkeypatch.setenv(choices.HANDED_OVER, json.dumps({**speed.to_dict(), "pid": os.getpid() + 1}))  # a parent's
    assert resolve.for_command("default") == resolve.Resolution(SpeedChoices(), "--speed=default")


def test_a_command_restarts_only_where_tensorflow_or_keras_must_start_otherwise(machine, monkeypatch):
    from gpt_tf import restart

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    other = not choices.onednn_in_effect()
    speed = resolve.Resolution(SpeedChoices(onednn=other), "auto: planted")
    assert restart.changes_for(speed)[0] == {ONEDNN: str(int(other))}
    assert restart.changes_for(resolve.Resolution(SpeedChoices(onednn=not other), "x")) == ({}, [])
    assert restart.changes_for(resolve.Resolution(SpeedChoices(), "x")) == ({}, [])  # TensorFlow's own default
    monkeypatch.setenv(ONEDNN, str(int(other)))
    assert restart.changes_for(speed) == ({}, [])  # the environment gives it already
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert restart.changes_for(speed) == ({}, [])  # Keras runs on TensorFlow in this process already
    monkeypatch.delitem(sys.modules, "keras")  # as a command line's process sees it before Keras starts
    changes, lines = restart.changes_for(speed)
    assert changes == {"KERAS_BACKEND": "tensorflow"} and "KERAS_BACKEND=jax" in lines[0]
    restart.restart_if_needed(speed, verbose=False)  # this process (pytest) is no command line: it goes on
    assert os.environ["KERAS_BACKEND"] == "jax"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # TensorFlow's INFO lines on: a command turns them off
    assert restart.quiet_log({}, verbose=False) == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    assert restart.quiet_log({}, verbose=True) == {}  # unless asked for (GPT_TF_VERBOSE=1)


COMMAND = [sys.executable, "-m", "gpt_tf.speed.kernels"]  # a command line: TensorFlow started as the CLIs start it


def _run_command(cache_home: Path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in (*choices.BY_HAND, choices.HANDED_OVER,
                                                              "TF_CPP_MIN_LOG_LEVEL", "KERAS_BACKEND")}
    clean.update({choices.AUTOTUNE: "1", "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": ENV["PYTHONPATH"],
                  "GPT_TF_VERBOSE": "1", "GPT_TF_KERNEL_DIR": str(kernel_dir()), **env})
    return subprocess.run(COMMAND, cwd=ROOT, env=clean, capture_output=True, text=True, timeout=240, check=True)


def test_a_command_starts_tensorflow_under_the_picked_onednn_setting(tmp_path):
    """The pick's oneDNN setting is the other one than TensorFlow's default on this CPU: the command starts again
    under it, in one line, and TensorFlow runs it (it announces the rewrites where they are on); the fused kernels are
    off as picked, and the choices' line is printed once."""
    other = "0" if choices.onednn_in_effect({}) else "1"
    _plant(tmp_path, {ONEDNN: other, FUSED: "0", INTRA: "0", INTER: "1"})
    done = _run_command(tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.startswith(("gpt_tf.speed.kernels: ", "speed choices"))]
    assert lines[-2] == f"gpt_tf.speed.kernels: starting again with {ONEDNN}={other} (TensorFlow and Keras read them when they start)"
    assert sum(line.startswith("speed choices (auto: CPU settings cached ") for line in lines) == 1, lines
    assert lines[-1].endswith(f": oneDNN {'on' if other == '1' else 'off'}, fused kernels off, threads intra 0/inter 1, "
                              "padded weight gradients: none, GELU kernel in evaluation: none"), lines
    assert ("oneDNN custom operations are on" in done.stderr) == (other == "1"), done.stderr
    assert done.stdout.strip() == "fused CPU kernels: off (the speed choices); TensorFlow's stock ops run"


def test_onednn_set_by_hand_beats_the_pick_and_nothing_restarts(tmp_path):
    mine = "1" if choices.onednn_in_effect({}) else "0"  # TensorFlow's default here, set by hand; the pick the other
    _plant(tmp_path, {ONEDNN: str(1 - int(mine)), FUSED: "1", INTRA: "0", INTER: "0"})
    done = _run_command(tmp_path, TF_ENABLE_ONEDNN_OPTS=mine)
    assert "starting again" not in done.stderr and f"set by hand: {ONEDNN}={mine}" in done.stderr
    assert ("oneDNN custom operations are on" in done.stderr) == (mine == "1"), done.stderr
