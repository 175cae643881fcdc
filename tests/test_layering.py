"""The package's layers only point down, and no two files import each other in a circle.

The layers are WORKSPACE.md's table under ``<!-- layers -->``: each row a layer, bottom up, the modules in it
(the longest name that is the module or a package above it decides) and the layers it may import. This test
reads that table, so the map and the check are one. The packages in ``SPLIT`` have files in several layers
(the keras-hub family is the model, the weight conversions sit where their imports put them), so each of their
files is named in the table. No import goes up (``LAZY`` would name one, each inside a function: none today).
``gpt_tf/__init__.py`` loads the family by name, lazily (no import
statement: it is how ``import gpt_tf`` stays light). Every other import counts, those inside functions too (they
are how heavy modules are loaded lazily, not a way around the layers).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpt_tf", "pipelines", "serving")
TOP = ("bench", "tools")  # on top of the package: they may import any of it, and no module of it imports them
SPLIT = ("gpt_tf.gpt1", "gpt_tf.convert")  # packages whose files sit in several layers: each file named
# Imports that go up a layer, each inside a function (never at module level): (importer, imported).
LAZY: set[tuple[str, str]] = set()


def read_layers(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """WORKSPACE.md's layers table: {module or package: layer}, {layer: the layers it may import}."""
    table = text.split("<!-- layers -->", 1)[1].strip().split("\n\n", 1)[0]
    where, allowed = {}, {}
    for row in table.splitlines()[2:]:
        layer, modules, imports = (cell.strip() for cell in row.strip().strip("|").split("|"))
        layer = layer.strip("*`")
        for name in re.findall(r"`([\w.]+)`", modules):
            assert name not in where, f"WORKSPACE.md's layers table names {name} twice"
            where[name] = layer
        allowed[layer] = {layer} | {x.strip("`") for x in re.findall(r"[\w`]+", imports) if x != "everything"}
        if "everything" in imports:
            allowed[layer] = {"*"}
    return where, allowed


WHERE, ALLOWED = read_layers((ROOT / "WORKSPACE.md").read_text())


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


def layer(module: str) -> str:
    for package in SPLIT:
        if module.startswith(package + "."):
            assert module in WHERE, f"{module}: name it in WORKSPACE.md's layers table (its package is split)"
    names = [n for n in WHERE if module == n or module.startswith(n + ".")]
    assert names, f"{module}: no row of WORKSPACE.md's layers table holds it"
    return WHERE[max(names, key=len)]


def may_import(importer: str, imported: str) -> bool:
    allowed = ALLOWED[layer(importer)]
    return "*" in allowed or layer(imported) in allowed


def test_the_layers_table_is_whole():
    """Every layer a row names as importable is a row, and each name in the table is a module or package here."""
    modules = set(graph())
    assert set().union(*ALLOWED.values()) - {"*"} <= set(ALLOWED)
    assert not set(WHERE) - modules, f"WORKSPACE.md's layers table names what is not here: {set(WHERE) - modules}"


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
                    if not may_import(m, d) and (m, d) not in LAZY)
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
    """A test file's helpers live in ``tests/small_runs.py`` and ``tests/offline_hubs.py`` (or a conftest):
    importing another test file couples the two (its fixtures run under the importer's name, its module-level
    set-up runs again)."""
    importers = {str(path.relative_to(ROOT)): sorted(found) for path in sorted((ROOT / "tests").rglob("*.py"))
                 if (found := {m for m in _imports(path, ("tests",)) if m.split(".")[-1].startswith("test_")})}
    assert importers == {}
