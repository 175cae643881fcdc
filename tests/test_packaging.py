"""gpt-tf installs as a package (pyproject.toml) and runs from any folder; its dependencies are honest.

The wheel is built from a copy of the packaged sources (nothing is written into the checkout) without build
isolation or downloads, unpacked into a temporary folder, and run from another temporary folder with only that
folder on PYTHONPATH: the checkout is nowhere on sys.path, so a file the package needs but does not ship, or a
path resolved from the current folder, fails here.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpt_tf", "pipelines", "serving")
# Examples for commands run from a checkout (paths relative to it), read only when a flag names them.
NOT_SHIPPED = {"serving/models.config", "serving/models.docker.config", "serving/batching_parameters.txt"}
PROBE = "gpt_tf/presets/zz_packaging_probe/assets/tokenizer/probe.txt"  # a preset-like file, nested
# Generators of package data, run by hand with the dev extra (``python -m gpt_tf.text.make_spacy_rules`` needs
# spaCy); they sit beside the data they write, and no runtime module imports them.
DATA_GENERATORS = {"gpt_tf/text/make_spacy_rules.py": "gpt_tf.text.make_spacy_rules"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``"grpcio==1.2"`` -> ``grpcio``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


def _source_files() -> set[str]:
    """The packages' files as the wheel should hold them (paths relative to the root, no bytecode)."""
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(wheel names, site folder)``: the project's wheel, built from a copy of its sources and unpacked."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("setuptools is not installed in this environment (tensorboard requires it); cannot build the wheel")
    top = tmp_path_factory.mktemp("packaging")
    src = top / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (src / PROBE).parent.mkdir(parents=True)
    (src / PROBE).write_text("probe\n")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(top / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"pip wheel failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
    (wheel,) = (top / "dist").glob("*.whl")
    site = top / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(site)
    shutil.rmtree(site / Path(PROBE).parents[2], ignore_errors=True)  # it shows the glob; it is no preset to load
    return names, site


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_every_package_file_and_the_package_data(installed):
    names, _ = installed
    missing = sorted(_source_files() - NOT_SHIPPED - names)
    assert not missing, f"files of the packages missing from the wheel (pyproject.toml's package-data): {missing}"
    for data in ("gpt_tf/text/spacy_en_rules.json", "gpt_tf/kernels/fused_ops.cc", "gpt_tf/kernels/common.h", PROBE,
                 "gpt_tf/presets/gpt1_tiny_books_en/README.md"):  # the shipped preset's model card
        assert data in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == set(PACKAGES), f"the wheel holds other top-level folders: {sorted(top_level - set(PACKAGES))}"


def test_the_kernel_sources_compile_from_the_installed_package(installed):
    """build.py compiles fused_ops.cc from the package folder: every header it includes is shipped beside it."""
    _, site = installed
    kernels = site / "gpt_tf" / "kernels"
    local = set()
    for path in (kernels / "fused_ops.cc", *kernels.glob("*.h")):
        local |= set(re.findall(r'^#include "([^"/]+)"', path.read_text(), re.M))  # not TensorFlow's (a/b.h)
    assert local and all((kernels / h).is_file() for h in local), sorted(h for h in local if not (kernels / h).is_file())
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler here: the kernels fall back to TensorFlow's ops; the includes were checked above")
    tf_include = Path(importlib.util.find_spec("tensorflow").submodule_search_locations[0]) / "include"
    pre = subprocess.run([cxx, "-E", "-std=c++17", f"-I{tf_include}", str(kernels / "fused_ops.cc"), "-o", os.devnull],
                         capture_output=True, text=True, timeout=120)
    assert pre.returncode == 0, pre.stderr[-2000:]


def test_the_installed_package_imports_and_its_commands_answer_from_any_folder(installed, tmp_path):
    _, site = installed
    probe = _run(site, tmp_path, "-c", "import gpt_tf, pipelines, serving, gpt_tf.train, serving.server; "
                 "print(gpt_tf.__file__, pipelines.__file__, serving.__file__, sep='\\n')")
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert all(Path(f).is_relative_to(site) for f in probe.stdout.split()), probe.stdout
    for module, flag, expected in (("gpt_tf.train", "--helpfull", "--run_dir"),
                                   ("serving.server", "--help", "--model_config_file")):
        done = _run(site, tmp_path, "-m", module, flag)
        assert done.returncode in (0, 1), f"{module} {flag} exited {done.returncode}:\n{done.stderr[-3000:]}"
        assert expected in done.stdout + done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_requirements_files_only_point_at_pyproject():
    """One list of dependencies: the requirements files install the project, they pin nothing of their own."""
    for name, line in (("requirements.txt", "-e ."), ("requirements-dev.txt", "-e .[dev]")):
        lines = [x.strip() for x in (ROOT / name).read_text().splitlines() if x.strip() and not x.startswith("#")]
        assert lines == [line], f"{name} must hold only `{line}` (pins live in pyproject.toml), not {lines}"


def test_setup_sh_takes_torchs_cpu_build_at_the_dev_extras_pin():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pattern = re.search(r"grep -oE '([^']+)' pyproject.toml", setup).group(1)
    found = subprocess.run(["grep", "-oE", pattern, str(ROOT / "pyproject.toml")], capture_output=True, text=True)
    pins = [r for r in _pyproject()["project"]["optional-dependencies"]["dev"] if _name(r) == "torch"]
    assert found.stdout.split() == [f'"{p}"' for p in pins] and len(pins) == 1, (found.stdout, pins)


def _imports(path: Path) -> list[str]:
    """The absolute module names ``path`` imports, inside functions too (``from a import b``: ``a`` and ``a.b``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return names


def _runtime_files() -> list[Path]:
    return [path for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))]


def _third_party_imports() -> dict[str, str]:
    """``{top-level module: first file importing it}`` over the runtime packages, imports inside functions too."""
    found = {}
    for path in _runtime_files():
        if path.relative_to(ROOT).as_posix() in DATA_GENERATORS:
            continue
        for top in (n.split(".")[0] for n in _imports(path)):
            if top not in sys.stdlib_module_names and top not in PACKAGES and top != "__future__":
                found.setdefault(top, path.relative_to(ROOT).as_posix())
    return found


def test_every_package_the_runtime_code_imports_is_a_runtime_dependency():
    """gpt_tf/, pipelines/ and serving/ import only what `pip install gpt-tf` installs by name, nothing of `dev`."""
    project = _pyproject()["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    dev = {_name(r) for r in project["optional-dependencies"]["dev"]}
    assert not runtime & dev, f"both runtime and dev: {sorted(runtime & dev)}"
    distributions = packages_distributions()
    problems = []
    for module, where in sorted(_third_party_imports().items()):
        names = {_name(d) for d in distributions.get(module, [])}
        if not names & runtime:
            kind = "a dev-only package" if names & dev else "not a declared dependency"
            problems.append(f"{where} imports {module} ({', '.join(sorted(names)) or 'not installed'}): {kind}")
    assert not problems, "\n".join(problems)


def test_no_runtime_module_imports_a_data_generator():
    """The generators may import dev packages (spaCy) because nothing that runs after `pip install` imports them."""
    generators = set(DATA_GENERATORS.values())
    importers = [f"{path.relative_to(ROOT).as_posix()} imports {name}" for path in _runtime_files()
                 for name in _imports(path) if name in generators]
    assert not importers, importers
    assert all((ROOT / path).is_file() for path in DATA_GENERATORS), DATA_GENERATORS
