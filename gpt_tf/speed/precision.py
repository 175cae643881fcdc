"""``--precision=auto``: float32 or mixed_bfloat16, whichever trains this model faster on this machine.

Whether bfloat16 pays depends on the CPU, not only on its flags: on an Intel Xeon with AVX512_BF16
(no AMX) ``mixed_bfloat16`` trains the ``tiny`` model slower than float32, on an AMD EPYC Zen 5 with
the same flag ~1.4x faster. So on a CPU ``auto`` measures: a few interleaved, timed training steps
(forward, loss, backward, AdamW) of the run's model shape in each precision, on random tokens, at
start-up. The result is cached per machine (the CPU model string and core count), TensorFlow
version and model shape in ``$XDG_CACHE_HOME/gpt_tf/precision.json`` (``~/.cache/gpt_tf``), so
only the first run of a shape on a machine pays the ~10-30 s. GPUs and TPUs get mixed_bfloat16 by
rule (their matrix units run bfloat16 at several times the float32 rate).

``resolve_precision`` returns the precision and one line saying what was picked and why.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time

from gpt_tf.speed import machine_cache
from gpt_tf.speed.machine_cache import read_cache, write_cache

PRECISIONS = ("float32", "mixed_bfloat16")
CACHE_FILE = "precision.json"
_STEPS, _WARMUP = 4, 2


def cache_path() -> str:
    return machine_cache.cache_path(CACHE_FILE)


def cpu_name() -> str:
    """The CPU model string (``/proc/cpuinfo``'s ``model name``; ``platform.processor()`` elsewhere)."""
    return machine_cache.cpu_info()["model"]


def cache_key(config, batch: int, seq: int) -> str:
    """Machine + TensorFlow version + model shape + timed batch + whether the fused kernels run: one cache entry."""
    import tensorflow as tf

    from gpt_tf.speed import kernels

    shape = f"{config.model_type} L{config.n_layer} d{config.n_embd} h{config.n_head} ff{config.d_ff} V{config.total_vocab}"
    fused = "fused kernels" if kernels.ops() is not None else "stock ops"
    return f"{cpu_name()} x{os.cpu_count()} | tf {tf.__version__} | {shape} | {batch}x{seq} | {fused}"


def _train_step(config, precision: str, batch: int, seq: int):
    """One compiled training step of a fresh ``config`` LM in ``precision`` on a fixed random batch."""
    import numpy as np
    import tensorflow as tf

    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.objectives import lm_loss
    from gpt_tf.nn.optim import make_optimizer

    model = causal_lm_for(config, dtype=precision)
    variables = model.trainable_variables
    optimizer = make_optimizer(1e-4, variables=variables)
    tokens = tf.constant(np.random.default_rng(0).integers(0, config.vocab_size, (batch, seq + 1)), tf.int32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            total, count = lm_loss(model(token_inputs(tokens[:, :-1]), training=True), tokens[:, 1:])
            loss = total / count
        optimizer.apply(tape.gradient(loss, variables), variables)  # as the training loop does
        return loss

    return lambda: float(step())


def measure(config, batch: int, seq: int) -> dict:
    """Median seconds per training step of each precision, steps interleaved (a load change hits both)."""
    steps = {p: _train_step(config, p, batch, seq) for p in PRECISIONS}
    times = {p: [] for p in PRECISIONS}
    for i in range(_WARMUP + _STEPS):
        for p in PRECISIONS:
            start = time.perf_counter()
            steps[p]()
            if i >= _WARMUP:
                times[p].append(time.perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def resolve_precision(requested: str, config, batch: int, seq: int, path: str | None = None) -> tuple[str, str]:
    """``(precision, reason)``: ``requested`` itself unless it is ``auto`` (see the module doc)."""
    if requested != "auto":
        return requested, f"precision {requested} (as requested)"
    import tensorflow as tf

    accelerators = tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("TPU")
    if accelerators:
        return "mixed_bfloat16", f"precision auto: mixed_bfloat16 (rule: {accelerators[0].device_type} present)"
    batch, seq = max(1, min(batch, 16)), max(8, min(seq, config.n_ctx, 128))  # a short, representative step
    path, key = path or cache_path(), cache_key(config, batch, seq)
    cache = read_cache(path)
    entry, how = cache.get(key), "cached"
    if entry is None:
        # The pick is derived from the figures the cache keeps (0.1 ms), so it can always be read off them
        # (times within 0.1 ms of each other are a tie, which float32, listed first, takes).
        seconds = {p: round(s, 4) for p, s in measure(config, batch, seq).items()}
        entry = {"pick": min(seconds, key=seconds.get), "s_per_step": seconds,
                 "measured": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        cache[key] = entry
        write_cache(path, cache)
        how = "measured now"
    timing = ", ".join(f"{p} {1e3 * s:.0f} ms" for p, s in entry["s_per_step"].items())
    return entry["pick"], (f"precision auto: {entry['pick']} ({how}, {entry['measured']}: {timing} per "
                           f"{batch}x{seq} training step; key {key!r} in {path})")


def step_seconds(config, precision: str, batch: int, seq: int) -> float:
    """Seconds per ``batch`` x ``seq`` training step of ``config`` in ``precision`` on this machine now: the
    median of 3 timed steps (after one) of at most 16 x 128, scaled by tokens (``--train_budget_minutes``).
    Timed afresh, not cached: what the run will meet is the machine's load now."""
    b, s = max(1, min(batch, 16)), max(8, min(seq, config.n_ctx, 128))
    step = _train_step(config, precision, b, s)
    step()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * (batch * seq) / (b * s)
