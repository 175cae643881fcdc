"""gpt-tf's dependencies are honest, both ways: every third-party import of gpt_tf/, pipelines/ and serving/ is
declared where that code is installed (runtime, or the `serving` extra for serving/), and every declared dependency
is imported (or its reason is stated); each range has a pin in constraints.txt that meets it, and scripts/setup.sh
installs with it; without the `serving` extra, the serving commands say so in one line.

(The wheel and the sdist themselves: tests/test_packaging.py.)
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpt_tf", "pipelines", "serving")
# Generators of package data, run by hand with the dev extra (``python -m gpt_tf.text.make_spacy_rules`` needs
# spaCy); they sit beside the data they write, and no runtime module imports them.
DATA_GENERATORS = {"gpt_tf/text/make_spacy_rules.py": "gpt_tf.text.make_spacy_rules"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``"grpcio==1.2"`` -> ``grpcio``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


def test_requirements_files_only_point_at_the_project_and_its_constraints():
    """Dependencies are declared once (pyproject.toml) and pinned once (constraints.txt): the requirements files
    install the project through them and list nothing of their own."""
    for name, target in (("requirements.txt", "-e .[serving]"), ("requirements-dev.txt", "-e .[dev]")):
        lines = [x.strip() for x in (ROOT / name).read_text().splitlines() if x.strip() and not x.startswith("#")]
        expected = ["-c constraints.txt", target]
        assert lines == expected, f"{name}: expected `-c constraints.txt`, `{target}`; got {lines}"


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
