"""gpt-tf installs as a package (pyproject.toml) and runs from any folder; its dependencies are honest.

Dependencies both ways: every third-party import of gpt_tf/, pipelines/ and serving/ is declared where that code
is installed (runtime, or the `serving` extra for serving/), and every declared dependency is imported (or its
reason is stated); each range has a pin in constraints.txt that meets it, and scripts/setup.sh installs with it.

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
LICENSE_FILES = ("LICENSE", "NOTICE")


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
    for name in ("pyproject.toml", "README.md", *LICENSE_FILES):
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
    for data in ("gpt_tf/text/spacy_en_rules.json", "gpt_tf/speed/kernels/fused_ops.cc", "gpt_tf/speed/kernels/common.h", PROBE,
                 "gpt_tf/presets/gpt1_tiny_books_en/README.md"):  # the shipped preset's model card
        assert data in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == set(PACKAGES), f"the wheel holds other top-level folders: {sorted(top_level - set(PACKAGES))}"


def test_the_wheel_carries_the_licence_the_notice_and_the_packages_version(installed):
    names, site = installed
    (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    for name in LICENSE_FILES:
        assert f"{info}/licenses/{name}" in names, sorted(n for n in names if n.startswith(info))
        assert (site / info / "licenses" / name).read_bytes() == (ROOT / name).read_bytes()
    metadata = (site / info / "METADATA").read_text()
    init = (ROOT / "gpt_tf" / "__init__.py").read_text()
    version = re.search(r'^__version__ = "([^"]+)"$', init, re.M).group(1)
    assert re.search(rf"^Version: {re.escape(version)}$", metadata, re.M), metadata[:500]
    assert info == f"gpt_tf-{version}.dist-info"
    assert re.search(r"^License-Expression: Apache-2\.0$", metadata, re.M), metadata[:800]
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()


def test_the_notice_names_every_file_it_attributes():
    """NOTICE says which files derive from whose work: each path it names exists (a moved file would leave it stale)."""
    notice = (ROOT / "NOTICE").read_text()
    paths = set(re.findall(r"\b((?:gpt_tf|bench|pipelines|serving)/[\w/.{}-]+)", notice))
    assert {"gpt_tf/text/spacy_en_rules.json", "gpt_tf/text/word_split.py", "gpt_tf/text/fix_encoding_rules.py",
            "gpt_tf/text/tf_fix_encoding.py", "gpt_tf/text/text_clean.py", "gpt_tf/presets/gpt1_tiny_books_en/",
            "gpt_tf/presets/gpt1_small_books_en/"} <= paths, paths  # each shipped preset: its books and BPE
    missing = [p for p in sorted(paths) if "{" not in p and not (ROOT / p.rstrip(".")).exists()]
    assert not missing, f"NOTICE names files that do not exist: {missing}"


def test_the_kernel_sources_compile_from_the_installed_package(installed):
    """build.py compiles fused_ops.cc from the package folder: every header it includes is shipped beside it."""
    _, site = installed
    kernels = site / "gpt_tf" / "speed" / "kernels"
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


def test_requirements_files_only_point_at_the_project_and_its_constraints():
    """Dependencies are declared once (pyproject.toml) and pinned once (constraints.txt): the requirements files
    install the project through them and list nothing of their own."""
    for name, target in (("requirements.txt", "-e .[serving]"), ("requirements-dev.txt", "-e .[dev]")):
        lines = [x.strip() for x in (ROOT / name).read_text().splitlines() if x.strip() and not x.startswith("#")]
        assert lines == ["-c constraints.txt", target], f"{name}: expected `-c constraints.txt`, `{target}`; got {lines}"


def _constraints() -> dict[str, str]:
    """``{normalised name: version}`` of constraints.txt, every line an exact pin."""
    pins = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        found = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==([^\s;]+)", line)
        assert found, f"constraints.txt:{number}: {line!r} is not an exact `name==version` pin"
        assert _name(found.group(1)) not in pins, f"constraints.txt:{number}: {found.group(1)} pinned twice"
        pins[_name(found.group(1))] = found.group(2)
    return pins


def _requirements() -> dict[str, list[str]]:
    """``{"runtime" or extra name: [requirement strings]}``, the extras' references to the project itself left out."""
    project = _pyproject()["project"]
    groups = {"runtime": project["dependencies"], **project["optional-dependencies"]}
    return {group: [r for r in reqs if _name(r) != _name(project["name"])] for group, reqs in groups.items()}


def test_every_dependency_has_a_pin_in_the_constraints_that_meets_its_range():
    from packaging.requirements import Requirement

    pins = _constraints()
    problems = []
    build = {"build-system": _pyproject()["build-system"]["requires"]}  # setuptools: tensorboard needs it too
    for group, reqs in {**_requirements(), **build}.items():
        for text in reqs:
            req = Requirement(text)
            assert req.specifier, f"{group}: {text} has no version range"
            pin = pins.get(_name(req.name))
            if pin is None:
                problems.append(f"{group}: {text} has no pin in constraints.txt")
            elif not req.specifier.contains(pin, prereleases=True):
                problems.append(f"{group}: {text} is not met by constraints.txt's {req.name}=={pin}")
    assert not problems, "\n".join(problems)
    assert _name("gpt-tf") not in pins, "constraints.txt pins the project itself"
    assert "+" not in pins["torch"], "torch's pin must be met by PyPI's build too: no local label (+cpu)"


def test_the_extras_a_user_needs_are_there():
    """`serving` covers export, the server and the client; `docs` builds the site; `dev` (the tests export, serve
    and build the site) includes both."""
    extras = _pyproject()["project"]["optional-dependencies"]
    assert {_name(r) for r in extras["serving"]} >= {"tensorflow-serving-api", "grpcio"}, extras["serving"]
    assert {_name(r) for r in extras["docs"]} >= {"mkdocs", "mkdocs-material", "mkdocstrings"}, extras["docs"]
    assert "gpt-tf[serving,docs]" in extras["dev"], extras["dev"]


def _fake_venv(top: Path) -> Path:
    """A copy of setup.sh beside pyproject.toml and constraints.txt, with a .venv whose python logs its arguments."""
    (top / "scripts").mkdir()
    for name in ("pyproject.toml", "constraints.txt", "scripts/setup.sh"):
        shutil.copy(ROOT / name, top / name)
    python = top / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/../../calls.log"\n')
    python.chmod(0o755)
    return top / "calls.log"


def _setup(top: Path, *args: str) -> list[str]:
    log = top / "calls.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(["bash", "scripts/setup.sh", *args], cwd=top, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_setup_sh_installs_the_extras_at_the_constraints_and_again_only_when_they_change(tmp_path):
    _fake_venv(tmp_path)
    installs = [c for c in _setup(tmp_path) if c.startswith("-m pip install") and "--upgrade pip" not in c]
    assert len(installs) == 1 and installs[0].endswith("-c constraints.txt -e .[serving]"), installs
    assert _setup(tmp_path) == ["-m gpt_tf.speed.kernels"]  # the stamp: nothing to install again
    dev = [c for c in _setup(tmp_path, "dev") if c.startswith("-m pip install") and "--upgrade pip" not in c]
    assert dev[-1].endswith("-c constraints.txt -e .[dev]"), dev
    if os.uname().sysname == "Linux" and os.uname().machine == "x86_64":
        torch = f"torch=={_constraints()['torch']}+cpu"
        assert len(dev) == 2 and "-c constraints.txt" in dev[0] and dev[0].endswith(torch), dev
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in dev[0], dev
    assert _setup(tmp_path, "dev") == _setup(tmp_path) == ["-m gpt_tf.speed.kernels"]
    for changed in ("constraints.txt", "pyproject.toml"):
        with open(tmp_path / changed, "a") as f:
            f.write("# changed\n")
        again = _setup(tmp_path)
        assert any(c.endswith("-c constraints.txt -e .[serving]") for c in again), (changed, again)


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


# A Keras backend's own package, imported only once ``keras.config.backend()`` names that backend: installed
# wherever that code runs (Keras on JAX imports JAX first), so no dependency of the package. PyTorch also where a
# transformers checkpoint comes as pytorch_model.bin alone (gpt_tf/convert/hf.py: without it, one line naming
# `pip install torch`; model.safetensors needs no PyTorch).
BACKEND_IMPORTS = {("gpt_tf/backend.py", "jax"), ("gpt_tf/convert/hf.py", "torch")}


def _third_party_imports() -> dict[str, list[str]]:
    """``{top-level module: [files importing it]}`` over the runtime packages, imports inside functions too."""
    found = {}
    for path in _runtime_files():
        if path.relative_to(ROOT).as_posix() in DATA_GENERATORS:
            continue
        for top in sorted({n.split(".")[0] for n in _imports(path)}):
            if top not in sys.stdlib_module_names and top not in PACKAGES and top != "__future__":
                found.setdefault(top, []).append(path.relative_to(ROOT).as_posix())
    return found


def test_every_package_the_runtime_code_imports_is_declared_where_that_code_is_installed():
    """gpt_tf/ and pipelines/ import only what `pip install gpt-tf` installs by name; serving/ only that and its
    `serving` extra; nothing imports a `dev`-only package."""
    reqs = _requirements()
    runtime, serving = {_name(r) for r in reqs["runtime"]}, {_name(r) for r in reqs["serving"]}
    dev = {_name(r) for r in reqs["dev"]}
    assert not runtime & (dev | serving), f"runtime and an extra: {sorted(runtime & (dev | serving))}"
    distributions = packages_distributions()
    problems = []
    for module, files in sorted(_third_party_imports().items()):
        names = {_name(d) for d in distributions.get(module, [])}
        for where in files:
            if (where, module) in BACKEND_IMPORTS:
                continue
            allowed = runtime | serving if where.startswith("serving/") else runtime
            if not names & allowed:
                kind = ("the serving extra's (serving/ alone may import it)" if names & serving
                        else "a dev-only package" if names & dev else "not a declared dependency")
                problems.append(f"{where} imports {module} ({', '.join(sorted(names)) or 'not installed'}): {kind}")
    assert not problems, "\n".join(problems)


# Declared dependencies that no import names, and why they are needed anyway.
NEEDED_WITHOUT_IMPORT = {
    "pytest-xdist": "scripts/test.sh runs the suite on two workers (-n 2)",
    "accelerate": "transformers.Trainer needs it (bench/finetune_speed.py's reference)",
    "grain": "keras-hub's test harness imports it (tests/test_gpt1_harness.py)",
    "pydot": "keras.utils.model_to_dot draws the family's graph with it (tests/test_gpt1_keras_features.py)",
    "mkdocs-material": "mkdocs.yml's theme, which mkdocs loads by name (tests/test_docs.py builds the site)",
}


def _used_modules(folders: tuple[str, ...]) -> set[str]:
    """Top-level modules imported under ``folders``, ``pytest.importorskip("x.y")`` included."""
    used = set()
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            used |= {n.split(".")[0] for n in _imports(path)}
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    used.add(node.args[0].value.split(".")[0])
    return used


def test_every_declared_dependency_is_imported_or_needed_for_a_stated_reason():
    """The other direction: runtime dependencies are imported by the runtime code, the serving extra's by
    serving/, dev's by tests/ or bench/, or NEEDED_WITHOUT_IMPORT says why they are listed."""
    by_distribution = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            by_distribution.setdefault(_name(dist), set()).add(module)
    where = {"runtime": PACKAGES, "serving": ("serving",), "docs": ("tests",), "dev": ("tests", "bench")}
    reqs = _requirements()
    assert set(reqs) == set(where), f"an extra the test does not know: {sorted(set(reqs) - set(where))}"
    problems = []
    for group, folders in where.items():
        used = _used_modules(folders)
        for name in (_name(r) for r in reqs[group]):
            modules = by_distribution.get(name)
            assert modules, f"{name} ({group}) is not installed here: cannot tell what it provides"
            imported = bool(modules & used)
            if imported and name in NEEDED_WITHOUT_IMPORT:
                problems.append(f"{name} is imported ({sorted(modules & used)}): drop it from NEEDED_WITHOUT_IMPORT")
            elif not imported and name not in NEEDED_WITHOUT_IMPORT:
                problems.append(f"{name} ({group}) is imported nowhere in {', '.join(folders)}: drop it or say why")
    declared = {_name(r) for group in reqs.values() for r in group}
    problems += [f"NEEDED_WITHOUT_IMPORT names {n}, which is not declared" for n in NEEDED_WITHOUT_IMPORT
                 if n not in declared]
    assert not problems, "\n".join(problems)


def test_no_runtime_module_imports_a_data_generator():
    """The generators may import dev packages (spaCy) because nothing that runs after `pip install` imports them."""
    generators = set(DATA_GENERATORS.values())
    importers = [f"{path.relative_to(ROOT).as_posix()} imports {name}" for path in _runtime_files()
                 for name in _imports(path) if name in generators]
    assert not importers, importers
    assert all((ROOT / path).is_file() for path in DATA_GENERATORS), DATA_GENERATORS


# Started first in every process of the test below (a sitecustomize on PYTHONPATH): the serving extra's modules
# look not installed, as after `pip install gpt-tf` alone.
WITHOUT_EXTRA = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("blocked, named", [(("grpc",), "grpcio"), (("tensorflow_serving",), "tensorflow-serving-api"),
                                            (("grpc", "tensorflow_serving"), "grpcio, tensorflow-serving-api")])
def test_the_serving_commands_name_the_extra_in_one_line_when_it_is_missing(tmp_path, blocked, named):
    (tmp_path / "sitecustomize.py").write_text(WITHOUT_EXTRA.format(blocked=blocked))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "TF_CPP_MIN_LOG_LEVEL": "2"}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)

    blocker = run("-c", f"import {blocked[0]}")
    assert blocker.returncode == 1 and "ModuleNotFoundError" in blocker.stderr, blocker.stderr  # the stand-in works
    for command in ("serving.server", "serving.client", "serving.export"):
        done = run("-m", command, "--help")
        expected = (f'{command} needs gpt-tf\'s serving extra ({named} not installed): '
                    'pip install ".[serving]" from the repository root')
        assert (done.returncode, done.stderr.strip(), done.stdout) == (1, expected, ""), (command, done)
    # Imported by other code (a task's export() imports serving.export): an ImportError saying the same.
    imported = run("-c", "import serving.export")
    assert imported.returncode == 1, imported.stderr
    assert imported.stderr.strip().splitlines()[-1] == ("ModuleNotFoundError: serving.export needs gpt-tf's serving "
                                                       f'extra ({named} not installed): pip install ".[serving]" '
                                                       "from the repository root")


def test_the_console_scripts_resolve_and_answer(installed, tmp_path):
    """pyproject's [project.scripts]: each names a function of a shipped module, and each answers --help from a
    folder without the sources (the wheel alone on the path)."""
    names, site = installed
    (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    entry_points = (site / info / "entry_points.txt").read_text()
    scripts = dict(re.findall(r"^(gpt-tf-[\w-]+) = ([\w.]+:\w+)$", entry_points, re.M))
    assert set(scripts) == {"gpt-tf-train", "gpt-tf-convert", "gpt-tf-export", "gpt-tf-serve", "gpt-tf-client"}, scripts
    assert "gpt_tf/py.typed" in names
    for script, target in scripts.items():
        module, function = target.split(":")
        code = (f"import sys; sys.argv = [{script!r}, '--helpshort']; import {module} as m; m.{function}()")
        done = _run(site, tmp_path, "-c", code)
        assert done.returncode in (0, 1), f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr and "--" in done.stdout + done.stderr, (script, done.stderr[-2000:])


def test_the_source_distribution_holds_what_pyproject_says(tmp_path):
    """The sdist carries the packages, the docs, the flagfiles the commands' help names and the pinned stack."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("setuptools is not installed in this environment; cannot build the sdist")
    src = tmp_path / "src"
    skip = {ROOT: {".git", ".venv", "data", "runs", ".pytest_cache", ".hypothesis"}, ROOT / "gpt_tf": {"presets"}}

    def ignore(folder, names):  # the checkout's outputs, and the presets' 54 MB (package data, checked in the wheel)
        return [n for n in names if n in skip.get(Path(folder), ()) or n == "__pycache__" or n.endswith((".pyc", ".egg-info"))]

    shutil.copytree(ROOT, src, ignore=ignore)
    build = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; import sys; "
                            "print(b.build_sdist(sys.argv[1]))", str(tmp_path / "dist")],
                           cwd=src, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    import tarfile

    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for must in ("README.md", "LICENSE", "NOTICE", "WORKSPACE.md", "constraints.txt", "pyproject.toml",
                 "docs/training.md", "configs/gpt1_pretrain.flags", "configs/finetune_sst2.flags",
                 "gpt_tf/train.py", "gpt_tf/data/transforms.py", "pipelines/finetune_data.py", "serving/server.py"):
        assert must in names, must
    assert not any(n.endswith(".pyc") for n in names)
