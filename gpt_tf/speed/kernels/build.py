"""Compiles ``fused_ops.cc`` against the installed TensorFlow, once per machine, into a cache folder.

The library lands in ``$GPT_TF_KERNEL_DIR`` (default ``$XDG_CACHE_HOME/gpt_tf/kernels``, i.e.
``~/.cache/gpt_tf/kernels``) under a name that hashes everything the binary depends on: the source,
the TensorFlow version and its compile flags, the compiler and the CPU's model and flags (it is
built with ``-march=native``, so a copy taken to another CPU is never loaded). Paths count as the files
they resolve to: the source's text is hashed, not its folder, and TensorFlow's include and library folders
by their real path, so a checkout reached through another path (a git worktree or a folder whose ``.venv``
is a link to the same environment, as tests/test_walkthrough.py lays one out) uses the same build. A build takes ~10 s; it is written
to a temporary file and renamed into place, so processes that build at the same time do not clash.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fused_ops.cc")  # includes a header per kernel (the *.h beside it)
HEADERS = tuple(sorted(SOURCE.parent.glob("*.h")))
# -fno-math-errno lets the compiler vectorise sqrt (without it the AdamW loop ran 15x slower);
# -march=native: the machine's vector width (the cache key holds the CPU model).
CXXFLAGS = ("-shared", "-fPIC", "-O3", "-march=native", "-fno-math-errno", "-Wno-deprecated-declarations")


class KernelBuildError(RuntimeError):
    """The kernels cannot be built here (no compiler, no TensorFlow headers, a compile error)."""


def kernel_dir() -> Path:
    if os.environ.get("GPT_TF_KERNEL_DIR"):
        return Path(os.environ["GPT_TF_KERNEL_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpt_tf" / "kernels"


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise KernelBuildError("no C++ compiler found (install g++, or set CXX)")
    return cxx


def _command(cxx: str, out: Path) -> list[str]:
    import tensorflow as tf

    return [cxx, *CXXFLAGS, *_cpu_exceptions(), str(SOURCE), "-o", str(out), *tf.sysconfig.get_compile_flags(),
            *tf.sysconfig.get_link_flags()]


def _cpu_exceptions() -> tuple[str, ...]:
    """``-march=native``'s instruction sets the TensorFlow headers cannot be compiled with: on a CPU with AVX512-FP16
    (Intel Sapphire Rapids and later), Eigen's half-precision packet code in TensorFlow 2.21's headers fails to
    compile under g++ 12 ("expected initializer before '<' token", ``PacketMathFP16.h``), so it is turned off (the
    kernels use no float16; a compiler that enables AVX512-FP16 with ``-march=native`` knows its ``-mno-`` flag)."""
    return ("-mno-avx512fp16",) if "avx512_fp16" in _cpu_signature().split() else ()


def _cpu_signature() -> str:
    """What ``-march=native`` compiles for: the CPU's model and feature flags (``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(lines[:2])
    except OSError:
        return platform.processor() or platform.machine()


def _key_word(word: str) -> str:
    """A compile-command word as the cache key holds it: the source by name (its text is hashed), an
    include or library folder (``-I``/``-L``) by its real path."""
    if word == str(SOURCE):
        return SOURCE.name
    if word.startswith(("-I", "-L")) and len(word) > 2:
        return word[:2] + os.path.realpath(word[2:])
    return word


def cache_key(cxx: str, version: str) -> str:
    """What names the build: the sources' text, the compile command (paths as ``_key_word`` holds them),
    the compiler's version line and the CPU."""
    sources = [p.read_text() for p in (SOURCE, *HEADERS)]
    command = " ".join(_key_word(w) for w in _command(cxx, Path("x")))
    return hashlib.sha256("\n".join([*sources, command, version, _cpu_signature()]).encode()).hexdigest()[:16]


def library_path() -> Path:
    """The built library (built now if this machine has none for this source and TensorFlow)."""
    cxx = _compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as e:
        raise KernelBuildError(f"{cxx} --version failed: {e}") from e
    path = kernel_dir() / f"fused_ops-{cache_key(cxx, version)}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fused_ops-", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        done = subprocess.run(_command(cxx, Path(tmp)), capture_output=True, text=True)
        if done.returncode:
            raise KernelBuildError(f"{cxx} failed on {SOURCE.name} (exit {done.returncode}):\n{done.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
