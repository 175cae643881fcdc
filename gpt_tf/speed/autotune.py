"""The fastest process-wide CPU settings for this machine: oneDNN's rewrites, the fused kernels, the thread pools.

What is fastest depends on the CPU, not only on its flags: TensorFlow 2.21 leaves oneDNN's graph
rewrites (``TF_ENABLE_ONEDNN_OPTS``) off on CPUs without AVX-512, where turning them on made a
training step 30-52% faster on an AMD EPYC Zen 3. So the first time a run asks on a machine (``--speed=auto``,
``gpt_tf/speed/resolve.py``), ``decide`` times a short training step of a 1-layer ``tiny`` model (batch 4 x 64,
forward, LM loss, backward, AdamW) in a few worker processes, one per candidate that needs its own process --
oneDNN rewrites off / on, TensorFlow's default thread pools / one inter-op thread -- each timing the
step with the fused kernels (``gpt_tf/speed/kernels``) on and off; the workers take turns step by step (a
load change hits all alike). The fastest combination is cached per machine (CPU model, CPU flags,
usable cores, TensorFlow version) in ``$XDG_CACHE_HOME/gpt_tf/settings.json`` (``~/.cache/gpt_tf``),
once per machine (it took 4-6 min on a 2-core Zen 3 shared with other work); later runs read it (delete the entry
to re-measure). ``process_choices`` gives the pick as ``SpeedChoices`` fields and one phrase saying why; a command
line starts TensorFlow under them (``gpt_tf/console.py``).

Serving takes a fixed default per CPU instead (``serving_default``): nothing timed, the same on every start.
Exported SavedModels are unaffected: the rewrites act when a graph runs, never on what is saved, and the fused
kernels are for training only.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from gpt_tf.speed import choices, machine_cache
from gpt_tf.speed.choices import SpeedChoices
from gpt_tf.speed.machine_cache import cache_key, cpu_info, read_cache, write_cache

# The settings as the cache file names them (environment variables, "0" / "1"; threads: 0 is TensorFlow's default).
ONEDNN, FUSED, INTRA, INTER = choices.ONEDNN, choices.FUSED_KERNELS, choices.INTRA_THREADS, choices.INTER_THREADS
SETTINGS = (ONEDNN, FUSED, INTRA, INTER)
CACHE_FILE = "settings.json"
PROBE = {"size": "tiny", "n_layer": 1, "batch": 4, "seq": 64, "warmup": 1, "steps": 3}
TAG = "@@autotune "
# A candidate's process-wide settings (0 threads: TensorFlow's default, one per core for each pool).
BASE = {ONEDNN: "0", FUSED: "1", INTRA: "0", INTER: "0"}  # the project's settings before (on an AVX2-only CPU)
PROCESS_CANDIDATES = ({ONEDNN: "0", INTRA: "0", INTER: "0"}, {ONEDNN: "1", INTRA: "0", INTER: "0"},
                      {ONEDNN: "1", INTRA: str(os.cpu_count() or 1), INTER: "1"})


def cache_path() -> str:
    return machine_cache.cache_path(CACHE_FILE)


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
    """In a worker process (its oneDNN setting already in the environment, as TensorFlow reads it): builds the probe
    step with the fused kernels on and off, says READY, then runs one step per ``step fused|stock`` line on stdin."""
    import numpy as np
    import tensorflow as tf

    from gpt_tf.speed import kernels
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.objectives import lm_loss
    from gpt_tf.nn.optim import make_optimizer

    choices.apply_threads(tf, settings_choices({**settings, FUSED: "1"}))
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
        with choices.using(SpeedChoices(fused_kernels=fused == "1")):  # the step is traced under these choices
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
        env = {k: v for k, v in os.environ.items() if k not in (choices.HANDED_OVER, FUSED)}  # a copy for the child
        env.update({**settings, choices.AUTOTUNE: "0", "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3",
                    "PYTHONUNBUFFERED": "1"})
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


# ----------------------------------------------------------------------------- the decision


def settings_of(name: str) -> dict:
    """The environment settings of a candidate name (``candidate_name``'s inverse)."""
    for process in PROCESS_CANDIDATES:
        for fused in ("1", "0"):
            settings = {**process, FUSED: fused}
            if candidate_name(settings) == name:
                return settings
    raise ValueError(f"unknown settings {name!r}")


def settings_choices(settings: dict) -> SpeedChoices:
    """The ``SpeedChoices`` fields of cached settings (``{TF_ENABLE_ONEDNN_OPTS: "1", ...}``)."""
    return SpeedChoices(fused_kernels=settings[FUSED] == "1", onednn=settings[ONEDNN] == "1",
                        intra_op_threads=int(settings[INTRA]), inter_op_threads=int(settings[INTER]))


def decide(path: str | None = None, measure_fn=measure) -> tuple[dict, str]:
    """``(entry, how)``: this machine's cached entry (``pick``, ``settings``, ``s_per_step``, ``measured``),
    measured now with ``measure_fn`` and cached where absent."""
    import fcntl

    path = path or cache_path()
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


def process_choices(path: str | None = None, measure_fn=measure) -> tuple[SpeedChoices, str]:
    """This machine's picked settings as ``SpeedChoices`` (the per-shape fields empty) and a phrase saying why;
    where the probe fails, the defaults and the reason (the command goes on)."""
    path = path or cache_path()
    try:
        entry, how = decide(path, measure_fn)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:  # never stops the command
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return SpeedChoices(), f"the CPU settings probe failed ({reason}): TensorFlow's defaults, nothing cached"
    seconds = entry["s_per_step"]
    before = seconds.get(candidate_name(BASE))
    gain = f", {before / seconds[entry['pick']]:.2f}x the speed with oneDNN off" if before else ""
    probe = f"{PROBE['n_layer']}-layer {PROBE['size']} {PROBE['batch']}x{PROBE['seq']}"
    return settings_choices(entry["settings"]), (f"CPU settings {how}: {1e3 * seconds[entry['pick']]:.0f} ms per "
                                                  f"{probe} training step{gain}, {path}")


# Serving (``serving.server``, ``serving.export``): a fixed default per CPU, no probe (a server must start fast
# and behave alike on every start): the oneDNN rewrites where TensorFlow turns them on by itself (CPUs with these
# neural-network instructions; nothing changes there), off elsewhere. On the AVX2-only Zen 3, with the rewrites
# off, the gRPC p50 was lower in 3 of the 4 served configurations and the p99 in all 4, both values interleaved
# in one quiet run (``bench.serving_latency --onednn=ab``, docs/benchmarks.md), unlike the training step.


def serving_default(info: dict | None = None) -> dict:
    """``{TF_ENABLE_ONEDNN_OPTS: "1" or "0"}`` for serving on this CPU (``cpu_info()``'s flags)."""
    return {ONEDNN: "1" if machine_cache.onednn_default(info or cpu_info()) else "0"}


def serving_choices(info: dict | None = None) -> SpeedChoices:
    """Serving's choices (the server, the export): ``serving_default``'s oneDNN setting and TensorFlow's stock ops
    only (no fused kernel: what they trace holds core ops only, as stock TF Serving loads them)."""
    return SpeedChoices(fused_kernels=False, onednn=serving_default(info)[ONEDNN] == "1")


if __name__ == "__main__":  # a probe worker (``measure`` starts it)
    worker_main(json.loads(sys.argv[1]))
