"""Fused CPU kernels for the training step, in C++ (``fused_ops.cc``), with TensorFlow's stock ops as the fallback.

TensorFlow runs an element-wise chain as one kernel per op, each a pass over memory; at the sizes this
project trains on a CPU those passes, not the matrix products, are what it can still save. The chains:

* **AdamW** (``fused_adamw``): the gradient clipping's multiplication, the decoupled decay and the Adam
  update in one pass over var, m, v and the gradient (read as bfloat16 or float32), where the stock path
  is a clipping product, a decay product, a subtraction and TF's ``ResourceApplyAdam`` (plus the
  gradient's cast under mixed_bfloat16). Same arithmetic as Keras AdamW (``GPTAdamW``'s docstring).
* **The tanh GELU in training** (``fused_gelu``): forward and gradient in one pass each, computed in float32
  from the bfloat16 or float32 pre-activation (the stock path: ~8 element-wise kernels forward, ~12
  backward, and four casts under mixed_bfloat16). Inference keeps ``tf.nn.gelu``, which oneDNN fuses
  into the matrix product, and exported SavedModels hold no custom op (stock TF Serving loads them); only
  the project's own evaluation passes run the kernel, where it is measured faster (``gpt_tf/speed/inference_gelu.py``).
* **Layer norm in training** (``fused_layer_norm``): forward and gradient in one pass over each row,
  vectorised across it (the graph's ``layers.layer_norm``: ~15 ops forward, ~30 backward); inference
  keeps the graph, for the same reason.
* **Products against int8 or bfloat16 weights in a few rows** (``weight_matmul``: generation, one token per row):
  the weights read in their own bytes and decoded in registers, where TensorFlow's MatMul reads float32
  (``gpt_tf/nn/tf_weights.py`` chooses it; Keras's int8 arithmetic to the bit, by AVX512-VNNI, with Keras's input
  quantizer).
* **Dropout** (``fused_dropout``): ``layers.Dropout16``'s mask, to the bit (TF's Philox4x32-10 stream for
  the same seed, its rounds run eight counters per vector), and the scaling in one pass; the gradient in one
  more (the graph: the random op, a bitcast, a slice, a compare, a product, a select, and two more ops
  backward).

All are exact to float32 rounding against the stock ops (``tests/test_kernels.py``). The library is
built on first use with the machine's C++ compiler (``build.py``, ~10 s, cached per machine;
``python -m gpt_tf.speed.kernels`` builds it ahead, as ``scripts/setup.sh`` does). The stock ops run instead,
with the reason in ``status()``, where it cannot be built or loaded, when a GPU or TPU is visible (the
kernels are CPU-only), inside XLA-compiled functions (``--jit_compile``), in graphs traced inside ``portable()``
(the exports: another process runs them), and where the run's speed choices turn them off
(``SpeedChoices.fused_kernels``, ``gpt_tf/speed/choices.py``; ``GPT_TF_FUSED_KERNELS=0`` by hand, for A/B runs).
"""

from __future__ import annotations

import functools

from gpt_tf.speed import choices

_portable = choices.TracingFlag()


@functools.lru_cache(maxsize=None)
def _load():
    """``(ops module or None, one line saying what runs and why)``: the library built and loaded, once per process."""
    import tensorflow as tf

    accelerators = [d.device_type for d in tf.config.list_logical_devices() if d.device_type in ("GPU", "TPU")]
    if accelerators:
        return None, f"fused CPU kernels: off ({accelerators[0]} visible; they are CPU-only)"
    from gpt_tf.speed.kernels.build import KernelBuildError, library_path

    try:
        path = library_path()
        return tf.load_op_library(str(path)), f"fused CPU kernels: on ({path})"
    except (KernelBuildError, tf.errors.OpError, OSError) as e:
        return None, f"fused CPU kernels: off, TensorFlow's stock ops run (same results, slower): {e}"


def ops():
    """The loaded kernel library, or None where the stock ops run: the speed choices turn the kernels off, or they
    do not load here (see ``status()``)."""
    return _load()[0] if choices.current().fused_kernels else None


def graph_ops():
    """``ops()`` for the function being traced: None inside an XLA-compiled one and inside ``portable()``."""
    return None if in_xla() or in_portable() else ops()


def portable():
    """Graphs traced inside (``with portable():``) are for another process (a SavedModel): they hold core ops that
    compute the same on every TensorFlow build and setting (no kernel of this library; ``gpt_tf/nn/tf_weights.py``:
    no oneDNN-only op)."""
    return _portable.on()


def in_portable() -> bool:
    """Whether the graph being traced is inside ``portable()``."""
    return bool(_portable)


def status() -> str:
    """One line: whether the fused kernels run, and why not where they do not."""
    if not choices.current().fused_kernels:
        return "fused CPU kernels: off (the speed choices); TensorFlow's stock ops run"
    return _load()[1]


def in_xla() -> bool:
    """Whether the function being traced is XLA-compiled (XLA cannot compile a custom op)."""
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))


def can_fuse(x) -> bool:
    """Whether ``fused_gelu`` / ``fused_layer_norm`` / ``fused_dropout`` run the kernels on ``x`` (else the
    caller runs the stock ops)."""
    import tensorflow as tf

    return x.dtype in (tf.float32, tf.bfloat16) and graph_ops() is not None


def fused_gelu(x):
    """The tanh GELU of ``layers.gelu`` (the release's), by the fused kernel, with its fused gradient;
    computed in float32, returned in ``x``'s dtype. Call where ``can_fuse(x)``."""
    import tensorflow as tf

    lib = ops()

    @tf.custom_gradient
    def gelu(x):
        return lib.gpt_gelu(x), lambda dy: lib.gpt_gelu_grad(dy, x)

    return gelu(x)


def fused_layer_norm(x, gamma, beta, epsilon):
    """``layers.layer_norm`` (over the last axis, float32 arithmetic with ``gamma`` and ``beta`` read as
    float32, ``x``'s dtype out) by the fused kernels, forward and gradient one pass over each row; the
    same arguments. Call where ``can_fuse(x)``."""
    import tensorflow as tf

    lib = ops()

    @tf.custom_gradient
    def norm(x, gamma, beta):
        y, mean, rstd = lib.gpt_layer_norm(x, gamma, beta, epsilon=epsilon)
        return y, lambda dy: lib.gpt_layer_norm_grad(dy, x, gamma, mean, rstd)

    return norm(x, tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))


def fused_dropout(x, seed, threshold: int, scale: float):
    """``layers.Dropout16``'s dropout of ``x`` with ``seed`` (its mask to the bit: TF's Philox stream for
    the seed, 16 bits per element, an element kept iff its int16 draw is ``>= threshold``, then times
    ``scale``) by the fused kernels, one pass forward and one backward; the kept mask is saved for the
    gradient (1 byte per element). Call where ``can_fuse(x)``."""
    import tensorflow as tf

    lib = ops()
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)

    @tf.custom_gradient
    def drop(x):
        y, keep = lib.gpt_dropout(x, key, counter, threshold=threshold, scale=scale)
        return y, lambda dy: lib.gpt_dropout_grad(dy, keep, scale=scale)

    return drop(x)


def weight_matmul(x, w, scale, transpose_w=False, quantize_inputs=False, out_dtype=None):
    """``x @ w`` (``x`` ``[M, K]`` float32 or bfloat16; ``w`` int8 or bfloat16 ``[K, N]``, ``[N, K]`` with
    ``transpose_w``) by the few-row kernel; int8 ``w`` de-scaled by ``scale`` ``[N]`` (Keras's ``kernel_scale``), with
    Keras's input quantizer where ``quantize_inputs``; ``scale`` empty for bfloat16. Call where ``graph_ops()`` is not
    None."""
    import tensorflow as tf

    return ops().gpt_weight_matmul(x, w, scale, transpose_w=transpose_w, quantize_inputs=quantize_inputs,
                                   Tout=out_dtype or tf.float32)


def fused_adamw(var, m, v, grad, scalars):
    """One AdamW update of the float32 resource variables ``var``, ``m``, ``v`` by ``grad`` (float32 or
    bfloat16) times a factor, by the fused kernel; ``scalars`` = [alpha, decay, beta1, beta2, epsilon, factor]
    (``GPTAdamW._update_scalars``). Call where ``graph_ops()`` is not None."""
    return ops().gpt_fused_adam_w(var=var.handle, m=m.handle, v=v.handle, grad=grad, scalars=scalars)
