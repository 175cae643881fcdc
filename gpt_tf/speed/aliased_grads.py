"""Weight gradients whose operand rows alias in the L1 cache, padded where that is measured faster.

A dense layer's weight gradient is ``xᵀ·dy`` over the batch's tokens. When the rows of ``x`` (``n_embd``
wide) or of ``dy`` (``units`` wide) are a whole number of 4 KiB apart, every row maps to the same L1 cache
sets (their period on x86), and oneDNN's CPU sgemm can slow to about half speed. Measured on an AVX2-only
AMD EPYC Zen 3, one thread, 1,024 tokens (``bench.train_throughput --mode=profile`` found it):

| weight (n_embd × units) | plain | one operand zero-padded by 64 bytes |
|---|---:|---:|
| 256 × 1024 (`tiny`'s c_fc) | 38 GFLOP/s | 65 GFLOP/s |
| 1024 × 256 (`tiny`'s c_proj) | 36 | 65 |
| 768 × 3072 (GPT-1's c_fc) | 80 | 78 |
| 512 × 2048 | 80 | 75 |

So it depends on the shape and on the CPU, and is measured, not assumed: ``decide`` times both ways (a few dozen
milliseconds) and keeps the padded one only where it is at least 5% faster; the answer is cached per machine
(``machine_cache.cache_key``) and shape in ``$XDG_CACHE_HOME/gpt_tf/weight_grads.json``. ``gpt_tf/speed/resolve.py``
asks it for a run's shapes before the model is built and writes the answer into the run's speed choices
(``SpeedChoices.padded_grads``), which ``pads`` reads while a training graph is traced. Training graphs only:
evaluation, serving and exports run the plain ``MatMul + BiasAdd``. The padding adds zero rows or columns to the
product, sliced off: each weight's gradient sums the same products over the same tokens.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from gpt_tf.speed import choices, machine_cache

CACHE_FILE = "weight_grads.json"
PERIOD = 4096  # bytes: the L1 data cache's set period (line size × sets) on current x86 cores
PAD = 64  # bytes of zero columns: one cache line
PROBE_TOKENS, PROBE_REPS, MIN_GAIN = 1024, 5, 1.05
_machine = functools.cache(machine_cache.cache_key)  # reads /proc/cpuinfo: once per process


def aliased(n: int, dtype) -> bool:
    """Whether rows of ``n`` elements of ``dtype`` are a whole number of ``PERIOD`` bytes long."""
    return n * tf.as_dtype(dtype).size % PERIOD == 0


def aliased_shape(nx: int, units: int, dtype) -> bool:
    """Whether either operand of a ``[nx, units]`` weight's gradient has rows a whole number of ``PERIOD`` apart."""
    return aliased(nx, dtype) or aliased(units, dtype)


def _pad_columns(t):
    return tf.pad(t, [[0, 0], [0, PAD // t.dtype.size]])


def weight_grad(x, dy, pad: bool):
    """``xᵀ·dy`` ([n_embd, units]); with ``pad``, the aliased operand zero-padded and the result sliced."""
    nx, units = x.shape[-1], dy.shape[-1]
    if pad and aliased(nx, x.dtype):
        return tf.matmul(_pad_columns(x), dy, transpose_a=True)[:nx]
    if pad and aliased(units, dy.dtype):
        return tf.matmul(x, _pad_columns(dy), transpose_a=True)[:, :units]
    return tf.matmul(x, dy, transpose_a=True)


@tf.custom_gradient
def dense_padded_grad(x, w, b):
    """``x @ w + b`` (2-D; the MatMul + BiasAdd oneDNN fuses) whose weight gradient is ``weight_grad(pad=True)``."""
    y = tf.nn.bias_add(tf.matmul(x, w), b)

    def grad(dy):
        return tf.matmul(dy, w, transpose_b=True), weight_grad(x, dy, pad=True), tf.raw_ops.BiasAddGrad(out_backprop=dy)

    return y, grad


def cache_path() -> str:
    return machine_cache.cache_path(CACHE_FILE)


def measure(nx: int, units: int, dtype) -> dict:
    """Median seconds of ``weight_grad`` plain and padded on ``PROBE_TOKENS`` tokens, taking turns, in this
    process's thread pools."""
    x = tf.cast(tf.random.normal((PROBE_TOKENS, nx), dtype=tf.float32), dtype)
    dy = tf.cast(tf.random.normal((PROBE_TOKENS, units), dtype=tf.float32), dtype)
    runs = {name: tf.function(lambda a, b, pad=pad: weight_grad(a, b, pad)) for name, pad in
            (("plain", False), ("padded", True))}
    return machine_cache.median_seconds({name: lambda run=run: run(x, dy).numpy() for name, run in runs.items()},
                                        PROBE_REPS)


def pads(nx: int, units: int, dtype) -> bool:
    """Whether a training graph's dense layer ``[nx, units]`` in ``dtype`` takes the padded weight gradient: an
    aliased shape the speed choices pad (``SpeedChoices.padded_grads``)."""
    dtype = tf.as_dtype(dtype)
    return aliased_shape(nx, units, dtype) and choices.current().pads(nx, units, dtype.name)


def decide(nx: int, units: int, dtype, measure_fn=None) -> bool:
    """Whether the padded weight gradient is at least 5% faster for ``[nx, units]`` in ``dtype`` on this machine:
    read from the cache, or timed now and cached (never on a GPU or TPU, where the cache effect does not apply)."""
    dtype = tf.as_dtype(dtype)
    if not aliased_shape(nx, units, dtype) or tf.config.list_logical_devices("GPU") or \
            tf.config.list_logical_devices("TPU"):
        return False
    key = f"{_machine()} | {nx}x{units} {dtype.name}"
    entry = machine_cache.measured_choice(CACHE_FILE, key, lambda: (measure_fn or measure)(nx, units, dtype),
                                          lambda s: {"pad": s["padded"] * MIN_GAIN <= s["plain"]})
    return bool(entry["pad"])


def dense_shapes(config) -> list:
    """The ``(n_embd, units)`` of the model's ``Conv1D`` weights: a block's c_attn, attention c_proj, c_fc and
    MLP c_proj; the LSTM's projection back to ``n_embd`` (``gpt_tf/gpt1/lstm.py``)."""
    d, f = config.n_embd, config.d_ff
    if config.model_type == "lstm":
        return [(f, d)] if f != d else []
    return list(dict.fromkeys([(d, 3 * d), (d, d), (d, f), (f, d)]))

