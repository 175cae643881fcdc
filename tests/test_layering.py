"""The package's layers only point down, and no two files import each other in a circle.

Layers, bottom up: the core (``gpt_tf/*.py`` but the CLI), ``pipelines/``, ``gpt_tf/runs/`` (the run folder: it
reads data manifests, so it sits on ``pipelines``), ``gpt_tf/training/``, ``gpt_tf/analysis/`` (§5), then the
command lines on top (``gpt_tf/train.py`` and its flags), and above them ``bench/`` (the measuring scripts) and
``tools/`` (tools run by hand), which nothing below imports; ``serving/`` stands beside training on the core,
``pipelines`` and the run folder only. The weight conversions ``gpt_tf/convert/`` sit where their imports put
them (``CONVERT``): the formats in the core, the pre-trained weights a path names beside the run folders it
reads, the presets written from runs on ``training`` (the family's tasks), the command line on top. The
keras-hub family ``gpt_tf/gpt1/`` *is* the model, so its files sit in those layers (``FAMILY``): its backbone
(and the LSTM baseline's), causal LM, tokenizer, builders, keras-hub adapter and shipped presets' registration
at the bottom with the core (the training code, serving and §5 build on them); its task preprocessor and
``fit``'s batching on ``pipelines`` (the §3.3 transformations, the length buckets); its tasks, whose ``fit``
shares the loop's update, on ``training``. One import goes up, named in ``LAZY``: the tasks' ``export`` loads
``serving.export`` inside the method (the SavedModel the command line exports); ``serving.export.export_task``
takes the tasks without importing them. ``gpt_tf/__init__.py`` loads the family by name, lazily (no import
statement: it is how ``import gpt_tf`` stays light). Every other import counts, those inside functions too (they
are how heavy modules are loaded lazily, not a way around the layers).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpt_tf", "pipelines", "serving")
TOP = ("bench", "tools")  # on top of the package: they may import any of it, and no module of it imports them


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, packages: tuple = PACKAGES) -> set[str]:
    """The modules of ``packages`` that ``path`` imports (``from a.b import c`` counts c when it is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found.update(n for n in names if n.split(".")[0] in packages)
    return found


def graph() -> dict[str, set[str]]:
    files = {_module(p): p for pkg in PACKAGES + TOP for p in (ROOT / pkg).rglob("*.py")}
    return {m: {d for d in _imports(p, PACKAGES + TOP) if d in files and d != m} for m, p in files.items()}


# The keras-hub family's files, each in its layer (a new file of the family needs its row).
FAMILY = {
    "gpt_tf.gpt1.backbone": "core", "gpt_tf.gpt1.lstm": "core", "gpt_tf.gpt1.causal_lm": "core",
    "gpt_tf.gpt1.causal_lm_preprocessor": "core", "gpt_tf.gpt1.tokenizer": "core", "gpt_tf.gpt1.build": "core",
    "gpt_tf.gpt1.keras_hub_adapter": "core",
    "gpt_tf.gpt1.preprocessor": "pipelines", "gpt_tf.gpt1.batching": "pipelines",
    "gpt_tf.gpt1.presets": "core",  # the shipped presets' registration (their conversions: gpt_tf/convert)
    "gpt_tf.gpt1.task": "training", "gpt_tf.gpt1.text_classifier": "training",
    "gpt_tf.gpt1": "training",  # the package: importing it registers every class and the shipped presets
}
# The weight conversions' files, each in its layer (a new file of gpt_tf/convert needs its row).
CONVERT = {
    "gpt_tf.convert": "core", "gpt_tf.convert.layout": "core", "gpt_tf.convert.release": "core",
    "gpt_tf.convert.state_dicts": "core",
    "gpt_tf.convert.pretrained": "runs",  # a run's checkpoints (gpt_tf.runs); the run folder reads its model config
    "gpt_tf.convert.presets": "training",  # a fine-tuning run becomes the family's task (gpt_tf/gpt1/text_classifier)
    "gpt_tf.convert.__main__": "cli",
}
# Imports that go up a layer, each inside a function (never at module level): (importer, imported).
LAZY = {("gpt_tf.gpt1.task", "serving.export")}


def layer(module: str) -> str:
    if module.split(".")[0] in TOP:
        return "top"
    if module in ("gpt_tf.train", "gpt_tf.train_flags"):
        return "cli"
    for package, table in (("gpt_tf.gpt1", FAMILY), ("gpt_tf.convert", CONVERT)):
        if module == package or module.startswith(package + "."):
            assert module in table, f"{module}: give it its layer in {'FAMILY' if table is FAMILY else 'CONVERT'}"
            return table[module]
    for prefix, name in (("gpt_tf.training", "training"), ("gpt_tf.analysis", "analysis"), ("gpt_tf.runs", "runs"),
                         ("gpt_tf", "core"), ("pipelines", "pipelines"), ("serving", "serving")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    raise AssertionError(module)


# What each layer may import (itself included).
ALLOWED = {"core": {"core"}, "pipelines": {"core", "pipelines"}, "runs": {"core", "pipelines", "runs"},
           "training": {"core", "pipelines", "runs", "training"},
           "analysis": {"core", "pipelines", "runs", "training", "analysis"},
           "serving": {"core", "pipelines", "runs", "serving"},
           "cli": {"core", "pipelines", "runs", "training", "analysis", "cli"},
           "top": {"core", "pipelines", "runs", "training", "analysis", "serving", "cli", "top"}}


def _module_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports outside any function or class (at import time)."""
    tree = ast.parse(path.read_text(), str(path))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    found, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, functions):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return found


def test_every_import_points_down_a_layer():
    g = graph()
    assert {"gpt_tf.training.loop", "gpt_tf.analysis.zero_shot", "gpt_tf.runs.checkpoints", "serving.export",
            "gpt_tf.gpt1.backbone", "gpt_tf.gpt1.task", "bench.harness", "bench.experiments.study",
            "tools.torch_pretrain.convert"} <= set(g)
    upward = sorted(f"{m} ({layer(m)}) -> {d} ({layer(d)})" for m, deps in g.items() for d in deps
                    if layer(d) not in ALLOWED[layer(m)] and (m, d) not in LAZY)
    assert not upward, "\n".join(upward)
    for importer, imported in sorted(LAZY):
        assert imported in g[importer], f"{importer} no longer imports {imported}: drop it from LAZY"
        path = ROOT / (importer.replace(".", "/") + ".py")
        assert imported not in _module_level_imports(path), f"{importer} imports {imported} at module level"


def test_the_model_is_the_keras_hub_family():
    """One backbone and one language model: the core and the training code build the family's classes, and the
    model files the family replaced are gone."""
    g = graph()
    assert not {"gpt_tf.model", "gpt_tf.backbone", "gpt_tf.lstm"} & set(g)
    assert "gpt_tf.gpt1.build" in g["gpt_tf.training.lm_objective"]
    assert "gpt_tf.gpt1.build" in g["gpt_tf.runs.checkpoints"]


def test_run_folders_and_weight_conversions_each_have_one_home():
    """The run folder is ``gpt_tf/runs`` and the weight formats ``gpt_tf/convert``: the modules they replaced are
    gone, and training, export, zero-shot and the §5 study read runs through the one package."""
    g = graph()
    assert not {"gpt_tf.run_dir", "gpt_tf.checkpoints", "pipelines.run_folder", "gpt_tf.training.finetune_io",
                "gpt_tf.weights", "gpt_tf.gpt1.convert"} & set(g)
    assert "gpt_tf.convert.state_dicts" in g["tools.torch_pretrain.convert"]  # the tool reads its files, no arrays
    for reader in ("serving.export", "gpt_tf.analysis.zero_shot", "bench.experiments.study"):
        assert "gpt_tf.runs.folder" in g[reader], reader
    assert {"gpt_tf.runs.lock", "gpt_tf.runs.files", "gpt_tf.runs.submissions"} <= g["gpt_tf.train"]
    assert "gpt_tf.runs.checkpoints" in g["gpt_tf.training.loop"]


def test_no_circle_of_files():
    g = graph()
    state, circles = {}, []

    def visit(m, path):
        state[m] = "open"
        for d in sorted(g[m]):
            if state.get(d) == "open":
                circles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    # a package's __init__ importing its own modules is not a circle between files
    circles = [c for c in circles if not any(len(set(c)) == 2 and c[0] == m.rsplit(".", 1)[0] for m in c)]
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_no_test_file_imports_another():
    """A test file's helpers live in ``tests/small_runs.py`` (or a conftest): importing another test file couples
    the two (its fixtures run under the importer's name, its module-level set-up runs again)."""
    importers = {str(path.relative_to(ROOT)): sorted(found) for path in sorted((ROOT / "tests").rglob("*.py"))
                 if (found := {m for m in _imports(path, ("tests",)) if m.split(".")[-1].startswith("test_")})}
    assert importers == {}
