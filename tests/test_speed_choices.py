"""gpt_tf/speed/choices.py: the speed choices as one value (JSON both ways, one-line errors), the process's choices
(set, read, a block's), the environment read in one place only, and no library module writing the environment."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpt_tf.speed import choices
from gpt_tf.speed.choices import EVERY, SpeedChoices

ROOT = Path(__file__).resolve().parents[1]
PICKED = SpeedChoices(fused_kernels=False, padded_grads=("256x1024 float32", "1024x256 float32"),
                      inference_gelu=("256x1024 bfloat16",), onednn=True, intra_op_threads=2, inter_op_threads=1)


def test_the_choices_round_trip_through_json(tmp_path):
    text = json.dumps(PICKED.to_dict())
    assert SpeedChoices.from_dict(json.loads(text)) == PICKED
    (tmp_path / "speed_choices.json").write_text(text)
    assert SpeedChoices.load(str(tmp_path / "speed_choices.json")) == PICKED
    assert SpeedChoices.from_dict({}) == SpeedChoices()  # a field left out keeps its default
    assert SpeedChoices.from_dict({"onednn": None}).onednn is None  # TensorFlow's default for the CPU


@pytest.mark.parametrize("fields, message", [
    ({"fused": True}, "unknown field 'fused'"),
    ({"padded_grads": "256x1024 float32"}, "padded_grads must list shapes"),
    ({"inference_gelu": ["256 x 1024"]}, "inference_gelu must list shapes"),
    ({"onednn": "yes"}, "onednn must be true or false or null"),
    ({"fused_kernels": 1}, "fused_kernels must be true or false"),
    ({"inter_op_threads": -1}, "inter_op_threads must be a whole number"),
])
def test_a_wrong_field_is_one_line_naming_it(fields, message):
    with pytest.raises(ValueError, match=message) as caught:
        SpeedChoices.from_dict(fields)
    assert "\n" not in str(caught.value)


def test_a_file_that_holds_no_choices_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=f"{bad} is not JSON"):
        SpeedChoices.load(str(bad))
    bad.write_text('{"threads": 2}')
    with pytest.raises(ValueError, match=f"unknown field 'threads'.* in {bad}"):
        SpeedChoices.load(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        SpeedChoices.load(str(tmp_path / "missing.json"))


def test_shapes_are_matched_by_inputs_units_and_dtype():
    assert PICKED.pads(256, 1024, "float32") and not PICKED.pads(256, 1024, "bfloat16")
    assert PICKED.gelu_kernel(256, 1024, "bfloat16") and not PICKED.gelu_kernel(256, 1024, "float32")
    every = SpeedChoices(padded_grads=(EVERY,), inference_gelu=(EVERY,))
    assert every.pads(768, 3072, "float32") and every.gelu_kernel(768, 3072, "bfloat16")
    assert SpeedChoices(padded_grads=["256x1024 float32", "1024x256 float32"]) == \
        SpeedChoices(padded_grads=("1024x256 float32", "256x1024 float32"))  # kept sorted: equal choices are equal
    assert PICKED.describe() == ("oneDNN on, fused kernels off, threads intra 2/inter 1, padded weight gradients: "
                                 "1024x256 float32, 256x1024 float32, GELU kernel in evaluation: 256x1024 bfloat16")


def test_the_environment_sets_fields_by_hand():
    env = choices.environment({"GPT_TF_FUSED_KERNELS": "off", "GPT_TF_PAD_WEIGHT_GRADS": "1",
                               "GPT_TF_INFERENCE_GELU": "0", "TF_ENABLE_ONEDNN_OPTS": "0",
                               "TF_NUM_INTRAOP_THREADS": "3", "TF_NUM_INTEROP_THREADS": "many", "GPT_TF_AUTOTUNE": ""})
    assert env.overrides == {"fused_kernels": False, "padded_grads": (EVERY,), "inference_gelu": (), "onednn": False,
                             "intra_op_threads": 3}  # a thread count that is no number is ignored
    assert env.spelled["onednn"] == "TF_ENABLE_ONEDNN_OPTS=0" and env.measuring and env.handed_over is None
    assert env.apply(PICKED) == PICKED.replace(fused_kernels=False, padded_grads=(EVERY,), inference_gelu=(),
                                                onednn=False, intra_op_threads=3)
    assert not choices.environment({"GPT_TF_AUTOTUNE": "0"}).measuring
    assert choices.environment({"TF_ENABLE_ONEDNN_OPTS": " "}).overrides == {}  # empty: unset
    assert choices.onednn_in_effect({"TF_ENABLE_ONEDNN_OPTS": "1"}) is True
    assert choices.onednn_in_effect({"TF_ENABLE_ONEDNN_OPTS": "false"}) is False


def test_the_process_choices_are_set_read_and_taken_for_a_block(fresh_choices, monkeypatch):
    fresh_choices()
    monkeypatch.setenv("GPT_TF_FUSED_KERNELS", "0")
    assert choices.current() == SpeedChoices(fused_kernels=False)  # none set: the defaults, as set by hand
    monkeypatch.setenv("GPT_TF_FUSED_KERNELS", "1")
    assert choices.current() == SpeedChoices(fused_kernels=False)  # read once, not at every trace
    with choices.using(PICKED) as inside:
        assert choices.current() is inside is PICKED
    assert choices.current() == SpeedChoices(fused_kernels=False)
    choices.set_current(PICKED)
    assert choices.current() is PICKED
    with pytest.raises(TypeError, match="SpeedChoices"):
        choices.set_current({"fused_kernels": True})


def test_the_thread_pools_are_sized_as_chosen():
    calls = []

    class Threading:
        set_intra_op_parallelism_threads = staticmethod(lambda n: calls.append(("intra", n)))
        set_inter_op_parallelism_threads = staticmethod(lambda n: calls.append(("inter", n)))

    class FakeTF:
        class config:
            threading = Threading

    choices.apply_threads(FakeTF, SpeedChoices(inter_op_threads=1))
    choices.apply_threads(FakeTF, SpeedChoices())  # 0: TensorFlow's default, nothing set
    assert calls == [("inter", 1)]


# ----------------------------------------------------------------------------- the environment in one place

SCANNED = ("gpt_tf", "pipelines", "serving")
THE_ONE_PLACE = "gpt_tf/speed/choices.py"
# Variables of the project that choose no computation, read where they act: TensorFlow's start-up lines on the
# console (console.py), the fused kernels' build folder (speed/kernels/build.py).
NOT_A_CHOICE = {"GPT_TF_VERBOSE": "gpt_tf/console.py", "GPT_TF_KERNEL_DIR": "gpt_tf/speed/kernels/build.py"}
CHOICE_VARIABLES = {"TF_ENABLE_ONEDNN_OPTS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"}
MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _is_environ(node) -> bool:
    """``os.environ``, or a name ``environ`` (a parameter defaulting to it)."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
             and node.value.id == "os") or (isinstance(node, ast.Name) and node.id == "environ"))


def environment_writes(tree) -> list:
    """``(line, what)`` of each write to the process's environment in a module's syntax tree."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else node.targets if isinstance(node, ast.Delete) else []
        found += [(node.lineno, "an item assigned or deleted") for t in targets
                  if isinstance(t, ast.Subscript) and _is_environ(t.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATORS and _is_environ(node.func.value):
                found.append((node.lineno, f"environ.{node.func.attr}"))
            if node.func.attr in ("putenv", "unsetenv") and getattr(node.func.value, "id", "") == "os":
                found.append((node.lineno, f"os.{node.func.attr}"))
    return found


def choice_variable_names(tree) -> list:
    """``(line, name)`` of each string naming a speed choice's variable (``GPT_TF_*``, TensorFlow's oneDNN and thread
    variables) in a module's syntax tree."""
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (node.value.startswith("GPT_TF_") and node.value.isupper() or node.value in CHOICE_VARIABLES)]


def _modules():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def test_the_scan_finds_what_it_looks_for():
    tree = ast.parse("import os\nfrom os import environ\nos.environ['A'] = '1'\nos.environ.setdefault('B', '2')\n"
                     "os.putenv('C', '3')\ndel environ['D']\nenviron.update(E='4')\nx = os.environ.get('GPT_TF_X')\n"
                     "y = {**os.environ, 'F': '5'}\nz = 'TF_ENABLE_ONEDNN_OPTS'\n")
    assert sorted(line for line, _ in environment_writes(tree)) == [3, 4, 5, 6, 7]  # a copy (line 9) is no write
    assert sorted(choice_variable_names(tree)) == [(8, "GPT_TF_X"), (10, "TF_ENABLE_ONEDNN_OPTS")]


def test_no_library_module_writes_the_environment():
    writes = [f"{path}:{line}: {what}" for path, tree in _modules() for line, what in environment_writes(tree)]
    assert not writes, writes


def test_the_speed_choices_variables_are_named_in_one_place_only():
    stray = [f"{path}:{line}: {name}" for path, tree in _modules() for line, name in choice_variable_names(tree)
             if path != THE_ONE_PLACE and NOT_A_CHOICE.get(name) != path]
    assert not stray, stray
    tree = ast.parse((ROOT / THE_ONE_PLACE).read_text())
    readers = {function.name for function in ast.walk(tree) if isinstance(function, ast.FunctionDef)
               for node in ast.walk(function) if isinstance(node, ast.Attribute) and node.attr == "get"
               and _is_environ(node.value)}
    assert readers == {"environment"}, readers  # the one function that reads them
