"""The tanh GELU of the project's own evaluation passes by the fused kernel, where that is measured faster.

With oneDNN's graph rewrites on, TensorFlow's remapper fuses a dense layer's ``MatMul + BiasAdd + GELU`` into one
oneDNN primitive. On an AVX2-only AMD EPYC Zen 3 that primitive's GELU is the slower way: a plain ``MatMul +
BiasAdd`` (still fused by oneDNN) followed by the project's GELU kernel (``gpt_tf/speed/kernels``, the one training uses)
ran a `tiny` backbone's forward pass 1.13-1.16x as fast (32 x 17 and 32 x 64 tokens, oneDNN on, float32,
2026-11-26). On the Zen 5 in bf16 the fused primitive won. So it is measured, not assumed: ``decide`` times both
ways on ``PROBE_TOKENS`` rows (~0.1 s) and keeps the kernel only where it is at least 5% faster, cached per machine,
shape, dtype and oneDNN setting in ``$XDG_CACHE_HOME/gpt_tf/inference_gelu.json``. ``gpt_tf/speed/resolve.py`` asks
it for a run's GELU layer before the model is built and writes the answer into the run's speed choices
(``SpeedChoices.inference_gelu``), which ``uses_kernel`` reads while a graph is traced.

Only inside ``passes()``: the CLI's fine-tuning evaluation and prediction pass and pre-training's held-out
evaluation. Everything else traced with ``training=False`` (exports, TF Serving, the Keras API's ``predict``)
keeps the stock ops: a SavedModel must hold core TensorFlow ops only.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from gpt_tf.speed import choices, kernels, machine_cache

CACHE_FILE = "inference_gelu.json"
PROBE_TOKENS, PROBE_REPS, MIN_GAIN = 512, 7, 1.05
_passes = choices.TracingFlag()
_machine = functools.cache(machine_cache.cache_key)


def passes():
    """Traces inside this block (``with passes():``) may run the GELU kernel in inference (where the speed choices
    say so)."""
    return _passes.on()


def dense_gelu(x2, w, b, kernel: bool):
    """``gelu(x2 @ w + b)`` for 2-D ``x2``: stock ops (``layers.gelu``'s tanh GELU, which imports this module), or
    the MatMul + BiasAdd then the GELU kernel."""
    y = tf.nn.bias_add(tf.matmul(x2, w), b)
    return kernels.fused_gelu(y) if kernel else tf.nn.gelu(y, approximate=True)


def measure(nx: int, units: int, dtype) -> dict:
    """Median seconds of ``dense_gelu`` stock and with the kernel on ``PROBE_TOKENS`` rows, taking turns, in this
    process's thread pools (call where the kernels load: ``kernels.ops()``)."""
    x = tf.cast(tf.random.normal((PROBE_TOKENS, nx)), dtype)
    w = tf.cast(tf.random.normal((nx, units), stddev=0.02), dtype)
    b = tf.zeros((units,), dtype)
    runs = {name: tf.function(lambda a, kernel=kernel: dense_gelu(a, w, b, kernel)) for name, kernel in
            (("stock", False), ("kernel", True))}
    return machine_cache.median_seconds({name: lambda run=run: run(x).numpy() for name, run in runs.items()},
                                        PROBE_REPS)


def uses_kernel(y, nx: int) -> bool:
    """Whether the GELU of a dense layer's inference output ``y`` (``[rows, units]``, from ``nx`` inputs) runs the
    kernel: inside ``passes()`` only, where the speed choices say so (``SpeedChoices.inference_gelu``) and the
    kernels run."""
    return (bool(_passes) and choices.current().gelu_kernel(nx, int(y.shape[-1]), y.dtype.name)
            and kernels.can_fuse(y))


def decide(nx: int, units: int, dtype, onednn: bool, measure_fn=None) -> bool:
    """Whether the kernel is at least 5% faster for a ``[nx, units]`` GELU layer in ``dtype`` on this machine with
    oneDNN's rewrites ``onednn`` (those this process runs with): read from the cache, or timed now and cached. False
    where the kernels do not run (``kernels.ops()``)."""
    dtype = tf.as_dtype(dtype)
    if kernels.ops() is None or dtype not in (tf.float32, tf.bfloat16):
        return False
    key = f"{_machine()} | oneDNN {'on' if onednn else 'off'} | {nx}x{units} {dtype.name}"
    entry = machine_cache.measured_choice(CACHE_FILE, key, lambda: (measure_fn or measure)(nx, units, dtype),
                                          lambda s: {"kernel": s["kernel"] * MIN_GAIN <= s["stock"]})
    return bool(entry["kernel"])


def gelu_shapes(config) -> list:
    """The ``(n_embd, d_ff)`` of the model's GELU layer (a block's c_fc); none for the LSTM."""
    return [] if config.model_type == "lstm" else [(config.n_embd, config.d_ff)]


def cache_path() -> str:
    return machine_cache.cache_path(CACHE_FILE)
