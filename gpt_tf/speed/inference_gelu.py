"""The tanh GELU of the project's own evaluation passes by the fused kernel, where that is measured faster.

With oneDNN's graph rewrites on, TensorFlow's remapper fuses a dense layer's ``MatMul + BiasAdd + GELU`` into one
oneDNN primitive. On an AVX2-only AMD EPYC Zen 3 that primitive's GELU is the slower way: a plain ``MatMul +
BiasAdd`` (still fused by oneDNN) followed by the project's GELU kernel (``gpt_tf/speed/kernels``, the one training uses)
ran a `tiny` backbone's forward pass 1.13-1.16x as fast (32 x 17 and 32 x 64 tokens, oneDNN on, float32,
2026-11-26). On the Zen 5 in bf16 the fused primitive won (``4d71791``). So it is measured, not assumed: the first
evaluation pass that meets a ``[nx, units]`` GELU layer times both ways on ``PROBE_TOKENS`` rows (~0.1 s) and keeps
the kernel only where it is at least 5% faster, cached per machine, shape, dtype and oneDNN setting in
``$XDG_CACHE_HOME/gpt_tf/inference_gelu.json``. ``GPT_TF_INFERENCE_GELU=1`` / ``0`` decides by hand;
``GPT_TF_AUTOTUNE=0`` (the test suite) leaves the stock ops.

Only inside ``passes()``: the CLI's fine-tuning evaluation and prediction pass and pre-training's held-out
evaluation. Everything else traced with ``training=False`` (exports, TF Serving, the Keras API's ``predict``)
keeps the stock ops: a SavedModel must hold core TensorFlow ops only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import tensorflow as tf

from gpt_tf.speed import kernels, machine_cache

ENV = "GPT_TF_INFERENCE_GELU"
CACHE_FILE = "inference_gelu.json"
PROBE_TOKENS, PROBE_REPS, MIN_GAIN = 512, 7, 1.05
_state = threading.local()
_decided: dict = {}
_machine = functools.cache(machine_cache.cache_key)


@contextlib.contextmanager
def passes():
    """Traces inside this block may run the GELU kernel in inference (where ``uses_kernel`` says so)."""
    before = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = before


def dense_gelu(x2, w, b, kernel: bool):
    """``gelu(x2 @ w + b)`` for 2-D ``x2``: stock ops (``layers.gelu``'s tanh GELU, which imports this module), or
    the MatMul + BiasAdd then the GELU kernel."""
    y = tf.nn.bias_add(tf.matmul(x2, w), b)
    return kernels.fused_gelu(y) if kernel else tf.nn.gelu(y, approximate=True)


def measure(nx: int, units: int, dtype) -> dict:
    """Median seconds of ``dense_gelu`` stock and with the kernel on ``PROBE_TOKENS`` rows, taking turns, in this
    process's thread pools (eagerly, also when called while a graph is traced)."""
    with tf.init_scope():
        x = tf.cast(tf.random.normal((PROBE_TOKENS, nx)), dtype)
        w = tf.cast(tf.random.normal((nx, units), stddev=0.02), dtype)
        b = tf.zeros((units,), dtype)
        runs = {name: tf.function(lambda a, kernel=kernel: dense_gelu(a, w, b, kernel)) for name, kernel in
                (("stock", False), ("kernel", True))}
        return machine_cache.median_seconds({name: lambda run=run: run(x).numpy() for name, run in runs.items()},
                                            PROBE_REPS)


def uses_kernel(y, nx: int, measure_fn=None) -> bool:
    """Whether the GELU of a dense layer's inference output ``y`` (``[rows, units]``, from ``nx`` inputs) runs the
    kernel: inside ``passes()`` only, where the kernels load, and as decided (see the module doc)."""
    if not getattr(_state, "on", False) or machine_cache.disabled() or not kernels.can_fuse(y):
        return False
    by_hand = os.environ.get(ENV, "").strip().lower()
    if by_hand:
        return by_hand not in ("0", "false", "off", "no")
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")
    key = f"{_machine()} | oneDNN {onednn} | {nx}x{y.shape[-1]} {y.dtype.name}"
    if key not in _decided:
        entry = machine_cache.measured_choice(CACHE_FILE, key, lambda: (measure_fn or measure)(nx, int(y.shape[-1]), y.dtype),
                                              lambda s: {"kernel": s["kernel"] * MIN_GAIN <= s["stock"]})
        _decided[key] = bool(entry["kernel"])
    return _decided[key]


def status(config, dtype="float32") -> str:
    """One line for the CLI: which GELU the evaluation passes run here, decided now (timed on a machine's first run
    of the shape, ~0.1 s, then cached)."""
    if machine_cache.disabled():
        return "GELU in evaluation: the stock ops (GPT_TF_AUTOTUNE=0)"
    if config.model_type == "lstm" or not kernels.can_fuse(tf.zeros((1, 1), dtype)):
        return "GELU in evaluation: the stock ops (" + ("no GELU layer)" if config.model_type == "lstm" else
                                                      "the fused kernels do not run here)")
    with passes():
        kernel = uses_kernel(tf.zeros((PROBE_TOKENS, config.d_ff), dtype), config.n_embd)
    how = (f"{ENV}={os.environ[ENV]}" if os.environ.get(ENV, "").strip()
           else f"timed per machine and shape, {machine_cache.cache_path(CACHE_FILE)}")
    which = "the fused GELU kernel after MatMul + BiasAdd" if kernel else "the stock ops (oneDNN fuses them where its rewrites are on)"
    return f"GELU in evaluation: {which} ({how}; exports keep the stock ops)"
