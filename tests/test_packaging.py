"""gpt-tf installs as a package (pyproject.toml) and runs from any folder.

The wheel is built from a copy of the packaged sources (nothing is written into the checkout) without build
isolation or downloads, unpacked into a temporary folder, and run from another temporary folder with only that
folder on PYTHONPATH: the checkout is nowhere on sys.path, so a file the package needs but does not ship, or a
path resolved from the current folder, fails here. The sdist carries what pyproject.toml says; NOTICE names files
that exist. (The dependencies' declarations, pins and setup.sh: tests/test_dependencies.py.)
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gpt_tf", "pipelines", "serving")
# Examples for commands run from a checkout (paths relative to it), read only when a flag names them.
NOT_SHIPPED = {"serving/models.config", "serving/models.docker.config", "serving/batching_parameters.txt"}
PROBE = "gpt_tf/presets/zz_packaging_probe/assets/tokenizer/probe.txt"  # a preset-like file, nested
LICENSE_FILES = ("LICENSE", "NOTICE")


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
    for data in ("gpt_tf/text/spacy_en_rules.json", "gpt_tf/speed/kernels/fused_ops.cc",
                 "gpt_tf/speed/kernels/common.h", PROBE,
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
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence


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
    missing = sorted(h for h in local if not (kernels / h).is_file())
    assert local and not missing, missing
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
        return [n for n in names
                if n in skip.get(Path(folder), ()) or n == "__pycache__" or n.endswith((".pyc", ".egg-info"))]

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
