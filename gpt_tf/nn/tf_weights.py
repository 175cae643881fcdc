"""TensorFlow's products against weights held in fewer bytes: int8 (Keras's ``quantize("int8")``) and bfloat16
(``dtype="bfloat16"``), for ``Conv1D`` and the tied LM head in inference.

Which path runs is chosen while the graph is traced, by how many rows the product has and by where the graph will
run:

* **A few rows** (at most ``FEW_ROWS``: generation's one token per row, a prompt): the time is the time to read the
  weights, so the product reads them in their own bytes, 1 (int8) or 2 (bfloat16) per weight where float32 reads 4,
  decoded in registers (``gpt_tf.speed.kernels.weight_matmul``: with Keras's int8 input quantizer, its integer sums exactly,
  by AVX512-VNNI where the CPU has it; else float32 sums).
* **Many rows** (a batch of sentences, a prompt): the arithmetic decides. int8 with Keras's input quantizer:
  oneDNN's int8 matrix product (``QuantizedMatMulWithBias``, VNNI), the integers of Keras's product exactly, where
  TensorFlow runs oneDNN's rewrites; else the int8 operands as float32 in one float32 MatMul (the same integers while
  ``K`` ≤ 1040). Weight-only int8 and bfloat16: the weights cast to float32 and one float32 MatMul (bfloat16's own
  MatMul where the CPU has bfloat16 instructions: without them it is emulated, ~4x slower than float32).
* **Graphs for another process** (inside ``gpt_tf.speed.kernels.portable()``: the exports): core ops that compute
  the same on every TensorFlow build and setting, so neither the kernel nor oneDNN's int8 product (whose kernel
  exists only where oneDNN's rewrites run): a few rows of bfloat16 by bfloat16's MatMul (not for float32 out: the
  LM head's logits), the rest as above.

Where the row count is known only when the graph runs, both paths are traced under a ``tf.cond``.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from gpt_tf.speed import kernels

# The most rows the weight kernel takes: one thread of a 2-core Xeon (AVX-512 VNNI, no bf16), GPT-1's projections,
# 2026-11-29: the exact int8 kernel ahead of float32's MatMul to ~48 rows and of oneDNN's int8 product (which
# re-lays the weights out on every call) to ~64-128; the float32-sum kernel ahead of float32's MatMul to ~32;
# bfloat16's own MatMul (a portable graph's few rows) ahead of float32's at 1-2 rows only.
FEW_ROWS = {"int8": 64, "float": 32, "portable": 2}
_KERAS_EPSILON = 1e-7  # keras.config.epsilon(): abs_max_quantize's


@functools.lru_cache(maxsize=None)
def _onednn_runs() -> bool:
    """Whether this process's TensorFlow runs oneDNN's rewrites (which give ``QuantizedMatMulWithBias`` its kernel)."""
    from gpt_tf.speed.choices import onednn_in_effect  # pylint: disable=import-outside-toplevel

    return onednn_in_effect()


@functools.lru_cache(maxsize=None)
def _native_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 itself (AVX512_BF16 or AMX), so that TensorFlow's bfloat16 MatMul is fast."""
    from gpt_tf.speed.machine_cache import cpu_info  # pylint: disable=import-outside-toplevel

    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_info()["flags"]))


def int8_matmul(x, kernel, kernel_scale, quantize_inputs: bool, transpose: bool = False):
    """Keras's int8 product, de-scaled, float32 ``[..., N]`` (no bias): ``x`` ``[..., K]`` (float), ``kernel`` int8
    ``[K, N]`` (``[N, K]`` with ``transpose``: the token table as the LM head) with its per-column ``kernel_scale``
    ``[N]`` (Keras's: ``w ≈ kernel / kernel_scale``). ``quantize_inputs``: Keras's input quantizer (each row of ``x``
    quantized by its absolute maximum, ``y = Σ q·kernel / (kernel_scale · s)``); else weight-only
    (``y = Σ x·kernel / kernel_scale``)."""
    x2, restore = _rows(x)
    scale = tf.reshape(tf.cast(kernel_scale, tf.float32), [-1])

    def few(rows):
        return kernels.weight_matmul(rows, kernel, scale, transpose, quantize_inputs)

    def many(rows):
        rows = tf.cast(rows, tf.float32)
        if not quantize_inputs:
            return tf.matmul(rows, tf.cast(kernel, tf.float32), transpose_b=transpose) / scale
        q, row_scale = _quantize_rows(rows)
        if _onednn_runs() and not kernels.in_portable() and not transpose:  # oneDNN's product takes no transpose
            product = _onednn_int8_product(q, kernel)
        else:
            product = tf.matmul(q, tf.cast(kernel, tf.float32), transpose_b=transpose)
        return product / (scale * row_scale)

    return restore(_by_rows(x2, few, many, limit=FEW_ROWS["int8" if quantize_inputs else "float"]))


def bf16_matmul(x, kernel, out_dtype, transpose: bool = False):
    """``x @ kernel`` (``kernel`` bfloat16 ``[K, N]``, or ``[N, K]`` with ``transpose``) in ``out_dtype``, float32
    sums (the few-row kernel, float32's MatMul) or bfloat16's MatMul (where the CPU has bfloat16 instructions; a few
    rows in a portable graph)."""
    x2, restore = _rows(x)

    def few(rows):
        return kernels.weight_matmul(rows, kernel, tf.zeros([0]), transpose, out_dtype=out_dtype)

    def many(rows):
        if _native_bf16():
            return tf.cast(tf.matmul(tf.cast(rows, tf.bfloat16), kernel, transpose_b=transpose), out_dtype)
        return tf.cast(tf.matmul(tf.cast(rows, tf.float32), tf.cast(kernel, tf.float32), transpose_b=transpose),
                       out_dtype)

    def few_portable(rows):
        return tf.cast(tf.matmul(tf.cast(rows, tf.bfloat16), kernel, transpose_b=transpose), out_dtype)

    exact = tf.as_dtype(out_dtype) == tf.float32  # the LM head's float32 logits: never bfloat16's rounded sums
    return restore(_by_rows(x2, few, many, None if exact else few_portable, limit=FEW_ROWS["float"]))


def _rows(x):
    """``x`` as a matrix ``[rows, K]``, and the function that gives a ``[rows, N]`` result ``x``'s leading shape."""
    x2 = tf.reshape(x, (-1, x.shape[-1]))
    if x.shape.rank == 2:
        return x2, lambda y: y
    lead = tf.shape(x)[:-1]
    return x2, lambda y: tf.reshape(y, tf.concat([lead, tf.shape(y)[-1:]], 0))


def _by_rows(x2, few, many, few_portable=None, limit=8):
    """``few(x2)`` for at most ``limit`` rows where the kernel runs (``few_portable`` for at most
    ``FEW_ROWS["portable"]`` in a portable graph, where given), else ``many(x2)``; a ``tf.cond`` where the row count
    is not static."""
    small = few if kernels.graph_ops() is not None else few_portable
    if small is None:
        return many(x2)
    if small is few_portable:
        limit = FEW_ROWS["portable"]
    rows = x2.shape[0]
    if rows is not None:
        return small(x2) if rows <= limit else many(x2)
    return tf.cond(tf.shape(x2)[0] <= limit, lambda: small(x2), lambda: many(x2))


def _quantize_rows(x):
    """Keras's ``abs_max_quantize(x, axis=-1)`` (value range ±127): ``(q as float32, s)``, ``q = clip(round(x s))``,
    ``s = 127 / (max|x| + ε)`` per row."""
    s = 127.0 / (tf.reduce_max(tf.abs(x), axis=-1, keepdims=True) + _KERAS_EPSILON)
    return tf.clip_by_value(tf.round(x * s), -127.0, 127.0), s


def _onednn_int8_product(q, kernel):
    """``q @ kernel`` of whole numbers (``q`` float32 in [-127, 127], ``kernel`` int8 ``[K, N]``), exactly, by oneDNN's
    u8 x s8 product (VNNI): ``(q + 128) @ kernel - 128 Σ_k kernel``, the column sums ``Σ_k kernel`` from a row of ones
    appended to ``q + 128`` (one more row of the same product, where a reduction over the int8 kernel would cast all
    of it to int32 first); the int32 sums as float32."""
    ones = tf.fill([1, tf.shape(q)[1]], -127.0)  # 1 once shifted
    a = tf.bitcast(tf.cast(tf.concat([q, ones], 0) + 128.0, tf.uint8), tf.quint8)
    b = tf.bitcast(kernel, tf.qint8)
    zero = tf.constant(0.0)
    product, _, _ = tf.raw_ops.QuantizedMatMulWithBias(
        a=a, b=b, bias=tf.zeros([kernel.shape[1]]), min_a=zero, max_a=255.0, min_b=-127.0, max_b=127.0,
        Toutput=tf.qint32, input_quant_mode="MIN_FIRST")
    product = tf.bitcast(product, tf.int32)
    return tf.cast(product[:-1] - 128 * product[-1:], tf.float32)
