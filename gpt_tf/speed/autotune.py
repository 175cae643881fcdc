"""The fastest CPU settings for this machine, found once and applied before TensorFlow is imported.

What is fastest depends on the CPU, not only on its flags: TensorFlow 2.21 leaves oneDNN's graph
rewrites (``TF_ENABLE_ONEDNN_OPTS``) off on CPUs without AVX-512, where turning them on made a
training step 30-52% faster on an AMD EPYC Zen 3. So at a command's first start on a
machine, ``apply()`` times a short training step of a 1-layer ``tiny`` model (batch 4 x 64, forward, LM
loss, backward, AdamW) in a few worker processes, one per candidate that needs its own process --
oneDNN rewrites off / on, TensorFlow's default thread pools / one inter-op thread -- each timing the
step with the fused kernels (``gpt_tf/speed/kernels``) on and off; the workers take turns step by step (a
load change hits all alike). The fastest combination is cached per machine (CPU model, CPU flags,
usable cores, TensorFlow version) in ``$XDG_CACHE_HOME/gpt_tf/settings.json`` (``~/.cache/gpt_tf``),
once per machine (it took 4-6 min on the issue's 2-core Zen 3 at a load of 10-16, shared with four
other sessions; not yet timed on a quiet machine); later starts read it (delete the entry to re-measure). The chosen values are set as environment variables before
``import tensorflow`` (``TF_ENABLE_ONEDNN_OPTS``, ``GPT_TF_FUSED_KERNELS``, ``TF_NUM_INTRAOP_THREADS``,
``TF_NUM_INTEROP_THREADS``), and ``apply()`` returns one line saying what runs and why.

* A variable set by hand wins over the pick (it is kept, and the line says so).
* ``GPT_TF_AUTOTUNE=0`` leaves everything at TensorFlow's defaults, measures nothing and prints no
  line (the test suite sets it, so that it stays deterministic and fast).
* The precision is picked per model shape by ``--precision=auto`` (``gpt_tf/speed/precision.py``), in the
  process, under these settings.
* Exported SavedModels are unaffected: the rewrites act when a graph runs, never on what is saved,
  and the fused kernels are for training only (inference and exports use stock ops).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from gpt_tf.speed import machine_cache
from gpt_tf.speed.machine_cache import ENV, cache_key, cpu_info, disabled, read_cache, write_cache

ONEDNN, FUSED = "TF_ENABLE_ONEDNN_OPTS", "GPT_TF_FUSED_KERNELS"
INTRA, INTER = "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"
SETTINGS = (ONEDNN, FUSED, INTRA, INTER)
CACHE_FILE = "settings.json"
PROBE = {"size": "tiny", "n_layer": 1, "batch": 4, "seq": 64, "warmup": 1, "steps": 3}
TAG = "@@autotune "
# A candidate's process-wide settings (0 threads: TensorFlow's default, one per core for each pool).
BASE = {ONEDNN: "0", FUSED: "1", INTRA: "0", INTER: "0"}  # the project's settings before (on an AVX2-only CPU)
PROCESS_CANDIDATES = ({ONEDNN: "0", INTRA: "0", INTER: "0"}, {ONEDNN: "1", INTRA: "0", INTER: "0"},
                      {ONEDNN: "1", INTRA: str(os.cpu_count() or 1), INTER: "1"})


def cache_path(environ=os.environ) -> str:
    return machine_cache.cache_path(CACHE_FILE, environ)


def candidate_name(settings: dict) -> str:
    """``oneDNN on, fused kernels on, threads 0/1`` (0: TensorFlow's default pool size)."""
    return (f"oneDNN {'on' if settings[ONEDNN] == '1' else 'off'}, "
            f"fused kernels {'on' if settings[FUSED] == '1' else 'off'}, "
            f"threads intra {settings[INTRA]}/inter {settings[INTER]}")


def pick(seconds: dict) -> str:
    """The fastest candidate name; within 5% of the fastest, the first listed: ``measure`` lists ``BASE`` first,
    then each process's fused-kernels step before its stock one, so a difference within the noise of a shared
    machine keeps the settings that ran before (three probes on a busy Zen 3 swung ~5%)."""
    best = min(seconds.values())
    return next(name for name, s in seconds.items() if s <= 1.05 * best)


# ----------------------------------------------------------------------------- measuring


def worker_main(settings: dict) -> None:
    """In a worker process (its settings already in the environment): builds the probe step with the
    fused kernels on and off, says READY, then runs one step per ``step fused|stock`` line on stdin."""
    import numpy as np
    import tensorflow as tf

    from gpt_tf.speed import kernels
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.objectives import lm_loss
    from gpt_tf.nn.optim import make_optimizer

    apply_threads(tf)
    config = get_size(PROBE["size"], n_layer=PROBE["n_layer"])
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (PROBE["batch"], PROBE["seq"] + 1))
    tokens = tf.constant(ids, tf.int32)

    def build():
        model = causal_lm_for(config)
        variables = model.trainable_variables
        optimizer = make_optimizer(1e-4, variables=variables)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                total, count = lm_loss(model(token_inputs(tokens[:, :-1]), training=True), tokens[:, 1:])
                loss = total / count
            optimizer.apply(tape.gradient(loss, variables), variables)
            return loss

        step()  # traced here, with the kernels that run now
        return lambda: float(step())

    kernels.ops()  # builds the library on a machine's first run; the other workers start after this line
    print(f"{TAG}LOADED", flush=True)
    steps = {}
    for fused in ("1", "0"):
        os.environ[FUSED] = fused
        kernels._load.cache_clear()  # re-reads the variable
        if fused == "0" or kernels.ops() is not None:
            steps[fused] = build()
    print(f"{TAG}READY {json.dumps(list(steps))}", flush=True)  # fused first: see pick()
    for line in sys.stdin:
        fused = line.split()[-1]
        start = time.perf_counter()
        steps[fused]()
        print(f"{TAG}STEP {time.perf_counter() - start:.6f}", flush=True)


class _Worker:
    def __init__(self, settings: dict):
        env = {**os.environ, **settings, ENV: "0", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds gpt_tf/
        env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen([sys.executable, "-m", "gpt_tf.speed.autotune", json.dumps(settings)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read(self, kind: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(TAG + kind):
                return line[len(TAG + kind):].strip()
        raise RuntimeError(f"settings probe worker failed: {self.proc.stderr.read()[-2000:]}")

    def step(self, fused: str) -> float:
        self.proc.stdin.write(f"step {fused}\n")
        self.proc.stdin.flush()
        return float(self.read("STEP"))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def measure() -> dict:
    """Median seconds per probe step of every candidate (name → seconds), the workers taking turns."""
    workers = [_Worker(PROCESS_CANDIDATES[0])]
    try:
        workers[0].read("LOADED")  # the fused kernels are built (once per machine) by one worker only
        workers += [_Worker(s) for s in PROCESS_CANDIDATES[1:]]  # the rest start together: only steps are timed
        runs = []
        for settings, worker in zip(PROCESS_CANDIDATES, workers, strict=True):
            for fused in json.loads(worker.read("READY")):
                runs.append((candidate_name({**settings, FUSED: fused}), worker, fused))
        runs.sort(key=lambda r: r[0] != candidate_name(BASE))  # first: what ran before this module, see pick()
        times = {name: [] for name, _, _ in runs}
        for i in range(PROBE["warmup"] + PROBE["steps"]):
            for name, worker, fused in runs:
                seconds = worker.step(fused)
                if i >= PROBE["warmup"]:
                    times[name].append(seconds)
    finally:
        for worker in workers:
            worker.close()
    return {name: round(statistics.median(t), 4) for name, t in times.items()}


def apply_threads(tf) -> None:
    """Sizes TensorFlow's thread pools from ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` (0 or
    unset: its default); call right after the import, before any op runs."""
    for name, setter in ((INTRA, tf.config.threading.set_intra_op_parallelism_threads),
                         (INTER, tf.config.threading.set_inter_op_parallelism_threads)):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            try:
                setter(int(value))
            except RuntimeError:  # the runtime started already: its pools stay as they are
                pass


# ----------------------------------------------------------------------------- the decision


def settings_of(name: str) -> dict:
    """The environment settings of a candidate name (``candidate_name``'s inverse)."""
    for process in PROCESS_CANDIDATES:
        for fused in ("1", "0"):
            settings = {**process, FUSED: fused}
            if candidate_name(settings) == name:
                return settings
    raise ValueError(f"unknown settings {name!r}")


def decide(path: str | None = None, measure_fn=measure, environ=os.environ) -> tuple[dict, str]:
    """``(entry, how)``: this machine's cached entry (``pick``, ``settings``, ``s_per_step``, ``measured``),
    measured now with ``measure_fn`` and cached where absent."""
    import fcntl

    path = path or cache_path(environ)
    key = cache_key()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # One probe per machine at a time: commands started together wait for the first one's pick (two probes
    # at once would slow each other and disagree).
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = read_cache(path)
        entry = cache.get(key)
        if entry is not None and set(entry.get("settings", {})) == set(SETTINGS):
            return entry, f"cached {entry['measured']}"
        seconds = measure_fn()
        name = pick(seconds)
        entry = {"pick": name, "settings": settings_of(name), "s_per_step": seconds,
                 "measured": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        cache[key] = entry
        write_cache(path, cache)
    return entry, "measured now"


def apply(environ=os.environ, path: str | None = None, measure_fn=measure) -> str | None:
    """Sets this machine's fastest settings in ``environ`` (call before TensorFlow is imported) where not
    set by hand; returns the one line saying what runs and why (None with ``GPT_TF_AUTOTUNE=0``)."""
    if disabled(environ):
        return None
    if "tensorflow" in sys.modules:
        return "settings auto: not applied (TensorFlow was imported before them); TensorFlow's defaults run"
    path = path or cache_path(environ)
    try:
        entry, how = decide(path, measure_fn, environ)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:  # never stops the command
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return f"settings auto: the probe failed ({reason}); TensorFlow's defaults run, nothing cached"
    by_hand = [name for name in SETTINGS if environ.get(name, "").strip()]
    for name, value in entry["settings"].items():
        if name not in by_hand:
            environ[name] = value
    effective = {name: environ[name].strip() for name in SETTINGS}
    for name in (ONEDNN, FUSED):  # the spellings TensorFlow and gpt_tf.speed.kernels take for off
        effective[name] = "0" if effective[name].lower() in ("0", "false", "off", "no") else "1"
    seconds = entry["s_per_step"]
    before = seconds.get(candidate_name(BASE))
    gain = f", {before / seconds[entry['pick']]:.2f}x the speed with oneDNN off" if before else ""
    hand = f"; set by hand: {', '.join(f'{n}={environ[n]}' for n in by_hand)}" if by_hand else ""
    probe = f"{PROBE['n_layer']}-layer {PROBE['size']} {PROBE['batch']}x{PROBE['seq']}"
    return (f"settings auto: {candidate_name(effective)}{hand} (pick {how}: {1e3 * seconds[entry['pick']]:.0f} ms "
            f"per {probe} training step{gain}; precision: --precision=auto per model; {path})")


# Serving (``serving.server``, ``serving.export``): a fixed default per CPU, no probe (a server must start fast
# and behave alike on every start): the oneDNN rewrites where TensorFlow turns them on by itself (CPUs with these
# neural-network instructions; nothing changes there), off elsewhere. On the AVX2-only Zen 3, with the rewrites
# off, the gRPC p50 was lower in 3 of the 4 served configurations and the p99 in all 4, both values interleaved
# in one quiet run (``bench.serving_latency --onednn=ab``, docs/benchmarks.md), unlike the training step.
SERVING_ONEDNN_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def serving_default(info: dict | None = None) -> dict:
    """``{TF_ENABLE_ONEDNN_OPTS: "1" or "0"}`` for serving on this CPU (``cpu_info()``'s flags)."""
    flags_ = (info or cpu_info())["flags"]
    return {ONEDNN: "1" if any(f in flags_ for f in SERVING_ONEDNN_FLAGS) else "0"}


def apply_serving(environ=os.environ, info: dict | None = None) -> str | None:
    """Sets the serving default (``serving_default``) where not set by hand; the one line (None when disabled)."""
    if disabled(environ) or "tensorflow" in sys.modules:
        return None
    default = serving_default(info)
    hand = [name for name in default if environ.get(name, "").strip()]
    for name, value in default.items():
        if name not in hand:
            environ[name] = value
    on = environ[ONEDNN].strip().lower() not in ("0", "false", "off", "no")
    how = f"set by hand: {ONEDNN}={environ[ONEDNN]}" if hand else "the serving default, gpt_tf/speed/autotune.py"
    return f"settings auto: oneDNN {'on' if on else 'off'} ({how})"


if __name__ == "__main__":  # a probe worker (``measure`` starts it)
    worker_main(json.loads(sys.argv[1]))
