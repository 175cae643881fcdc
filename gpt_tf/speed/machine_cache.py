"""This machine's identity and the per-machine cache files of ``~/.cache/gpt_tf`` (no TensorFlow, no gpt_tf).

What the measured choices share (``autotune.py``: the CPU settings; ``precision.py``: the precision per model;
``aliased_grads.py``: the padded weight gradients per shape; ``inference_gelu.py``: the GELU of evaluation passes): the machine's key (CPU model, a hash of its
flags, usable cores, TensorFlow's version), where their JSON files live (``$XDG_CACHE_HOME/gpt_tf``), how
they are read and replaced, and whether TensorFlow turns oneDNN's rewrites on by itself on this CPU.
"""

from __future__ import annotations

import hashlib
import json
import os

# The CPU features on which TensorFlow 2.21 turns oneDNN's graph rewrites on by itself (``TF_ENABLE_ONEDNN_OPTS``
# unset): the neural-network instructions of AVX-512 and AMX; off elsewhere (AVX2-only CPUs such as a Zen 3).
ONEDNN_BY_DEFAULT = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cache_path(name: str, environ=os.environ) -> str:
    """``$XDG_CACHE_HOME/gpt_tf/<name>`` (``~/.cache`` without it)."""
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpt_tf", name)


def read_cache(path: str) -> dict:
    """A JSON cache file of ~/.cache/gpt_tf ({} when absent or unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_cache(path: str, cache: dict) -> None:
    """Atomic replace, so concurrent runs never read a half-written file (the last writer wins)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def cpu_info() -> dict:
    """``{"model": ..., "flags": [...]}`` from ``/proc/cpuinfo`` (the platform's names elsewhere)."""
    import platform

    model, cpu_flags = "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not cpu_flags:
                    cpu_flags = value.split()
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(), "flags": sorted(cpu_flags)}


def median_seconds(runs: dict, reps: int) -> dict:
    """``{name: median seconds}`` of the callables ``runs``, called in turns ``reps`` times after one untimed turn
    (the first call traces); a call must return once its work is done (``.numpy()``)."""
    import statistics
    import time

    times = {name: [] for name in runs}
    for i in range(reps + 1):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if i:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measured_choice(name: str, key: str, measure, choose) -> dict:
    """The entry ``key`` of the cache file ``name``; absent, it is made now: ``measure()`` gives seconds per way,
    ``choose(seconds)`` the decision's fields, stored with the seconds and the time of measuring."""
    import datetime

    path = cache_path(name)
    cache = read_cache(path)
    if key not in cache:
        seconds = measure()
        cache[key] = {**choose(seconds), "s": {k: round(v, 6) for k, v in seconds.items()},
                      "measured": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        write_cache(path, {**read_cache(path), key: cache[key]})  # another run may have written meanwhile
    return cache[key]


def onednn_default(info: dict | None = None) -> bool:
    """Whether TensorFlow runs oneDNN's rewrites on this CPU (``cpu_info()``'s flags) when nobody says otherwise."""
    return any(flag in (info or cpu_info())["flags"] for flag in ONEDNN_BY_DEFAULT)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def tf_version() -> str:
    """TensorFlow's version without importing it (the CPU settings are decided before the import)."""
    from importlib import metadata

    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-intel"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def cache_key(info: dict | None = None, cores: int | None = None, version: str | None = None) -> str:
    """The machine (CPU model, a hash of all its flags, usable cores) and TensorFlow's version."""
    info = info or cpu_info()
    flags_hash = hashlib.sha1(" ".join(info["flags"]).encode()).hexdigest()[:10]
    notable = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in info["flags"]]
    return (f"{info['model']} x{cores or usable_cores()} | {'+'.join(notable) or 'no avx2'} flags#{flags_hash} "
            f"| tf {version or tf_version()}")
