"""TensorFlow's drop-in pieces of the model's math: the arithmetic of the ``keras.ops`` code they stand in for,
in TensorFlow code that runs faster on a CPU.

The model is written once, in ``keras.ops`` (``gpt_tf/nn/layers.py``, ``gpt_tf/nn/embedding.py``, ``gpt_tf/nn/task_head.py``,
``gpt_tf/nn/objectives.py``). Where Keras runs on TensorFlow (``gpt_tf.backend.tf_pieces()`` returns this module),
each piece below computes its part instead; on JAX and PyTorch Keras's ops do. Each says what it gains:

* ``dense``: ``Conv1D``'s ``x @ w + b`` as a 2-D MatMul + BiasAdd (which oneDNN fuses, with the GELU after it in
  inference graphs, when the three share a name scope); in training graphs the padded weight gradient for the
  shapes the speed choices pad (``gpt_tf.speed.aliased_grads``) and the GELU kernel with its gradient
  (``gpt_tf.speed.kernels``), else the GELU in float32 under ``mixed_bfloat16``; in the project's own evaluation
  passes the GELU kernel for the shapes the speed choices name (``gpt_tf.speed.inference_gelu``).
* ``layer_norm``: Keras's layer norm (float32 arithmetic) with a written-out gradient in half the graph ops; in
  training the fused kernels, one pass each way.
* ``dropout16``: ``layers.Dropout16``'s mask from 16 bits of TF's Philox stream per element; in training the
  fused kernel (the same mask, to the bit).
* ``attention_scores``: ``q·kᵀ`` as one batched matmul of the transposed operand.
* ``take_at``: one position per row by ``tf.gather`` with batch dimensions.
* ``real_targets``: the LM head's inputs at the real next tokens only (a shape known at run time only).
* ``token_cross_entropy``: the cross-entropy by oneDNN's softmax and a written-out gradient.
* ``int8_matmul``, ``bf16_matmul`` (``gpt_tf/nn/tf_weights.py``): the products against weights held in int8
  (Keras's ``quantize("int8")``) or bfloat16 (``dtype="bfloat16"``) in inference: a few rows read the weights in
  their own bytes (the weight kernel), many rows by oneDNN's int8 product or float32's MatMul; ``bf16_dense``:
  ``Conv1D`` with its kernel held in bfloat16.

Which of these run is the process's speed choices (``gpt_tf.speed.choices.current()``), read as a graph is traced,
never measured then. Exported SavedModels hold none of the custom ops: inference keeps the stock ops outside
``inference_gelu.passes()``.
"""

from __future__ import annotations

import tensorflow as tf

from gpt_tf.nn.tf_weights import bf16_matmul, int8_matmul  # noqa: F401  (pieces of this module's interface)
from gpt_tf.speed import aliased_grads, inference_gelu, kernels


def gelu(x):
    """GELU, tanh approximation (as in the GPT-1 release and HF ``gelu_new``), written as ``tf.nn.gelu`` writes it:
    the pattern TF's oneDNN remapper fuses with the MatMul + BiasAdd before it in inference graphs."""
    return tf.nn.gelu(x, approximate=True)


def dense(x, w, b, activation, training):
    """``Conv1D``: ``activation(x @ w + b)`` over the last axis of ``x``; ``activation`` None or ``"gelu"``.

    The GELU is applied in the caller's name scope (the layer's), because TF's oneDNN remapper fuses MatMul +
    BiasAdd + GELU into one kernel only when the three share a name scope (measured: with the GELU in another
    scope the graph keeps its 8 element-wise ops)."""
    x2 = tf.reshape(x, (-1, x.shape[-1]))  # as the release's conv1d: a 2-D MatMul + BiasAdd, not tensordot + add
    units = w.shape[-1]
    if training and aliased_grads.pads(x.shape[-1], units, x2.dtype):
        # Rows 4 KiB apart: the weight gradient on a padded copy, as the speed choices say (gpt_tf/speed/aliased_grads.py)
        w, b = (tf.convert_to_tensor(v, x2.dtype) for v in (w, b))
        y = aliased_grads.dense_padded_grad(x2, w, b)
    else:
        y = tf.nn.bias_add(tf.matmul(x2, w), b)
    if activation:
        if kernels.can_fuse(y) if training else inference_gelu.uses_kernel(y, x2.shape[-1]):
            # forward and gradient in one pass each (gpt_tf/speed/kernels); in the project's own evaluation passes,
            # where the speed choices take it over oneDNN's fused GELU (gpt_tf/speed/inference_gelu.py)
            y = kernels.fused_gelu(y)
        elif training and y.dtype != tf.float32:
            # Training keeps the pre-activation for the gradient, so nothing fuses the activation; run it (and its
            # gradient) in float32: CPU element-wise kernels take ~2x as long in bfloat16 as in float32, and float32
            # halves the rounding error of the 16-bit chain.
            y = tf.cast(gelu(tf.cast(y, tf.float32)), y.dtype)
        else:
            y = gelu(y)
    return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [units]], 0))


def layer_norm(x, gamma, beta, epsilon, training):
    """``(x - mean) / sqrt(var + epsilon) · gamma + beta`` over the last axis, in float32, ``x``'s dtype out.

    In training where the fused kernels run, by them (one pass forward, one backward); else with a written-out
    gradient: autodiff through Keras's layer norm took ~80 graph ops per forward + backward, this one
    (``dx = rstd·(g - mean(g) - x̂·mean(g·x̂))`` with ``g = dy·gamma``) ~45, which ran the pair in 0.43 ms instead
    of 0.75 on a bf16 [32, 18, 256] input."""
    if training and kernels.can_fuse(x):
        return kernels.fused_layer_norm(x, gamma, beta, epsilon)

    @tf.custom_gradient
    def norm(x, gamma, beta):
        xf = tf.cast(x, tf.float32)
        centred = xf - tf.reduce_mean(xf, -1, keepdims=True)
        rstd = tf.math.rsqrt(tf.reduce_mean(tf.square(centred), -1, keepdims=True) + epsilon)
        normed = centred * rstd

        def grad(dy):
            dy = tf.cast(dy, tf.float32)
            rows = list(range(len(dy.shape) - 1))  # every axis but the normalised one
            g = dy * gamma
            dx = rstd * (g - tf.reduce_mean(g, -1, keepdims=True)
                         - normed * tf.reduce_mean(g * normed, -1, keepdims=True))
            return tf.cast(dx, x.dtype), tf.reduce_sum(dy * normed, rows), tf.reduce_sum(dy, rows)

        return tf.cast(normed * gamma + beta, x.dtype), grad

    return norm(x, tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32))


def dropout16(x, seed, threshold: int, scale: float):
    """``Dropout16`` in training: an element kept iff its 16-bit draw (TF's Philox stream for ``seed``, read as
    int16) is ``>= threshold``, then times ``scale``; by the fused kernel where it runs (the same mask)."""
    if kernels.can_fuse(x):  # the same mask and values in one pass each way (gpt_tf/speed/kernels)
        return kernels.fused_dropout(x, seed, threshold, scale)
    n = tf.size(x)  # static or not: length-bucketed batches have a dynamic length
    bits = tf.random.stateless_uniform([(n + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32)
    draws = tf.reshape(tf.reshape(tf.bitcast(bits, tf.int16), [-1])[:n], tf.shape(x))  # over [-2^15, 2^15)
    keep = draws >= tf.constant(threshold, tf.int16)
    return tf.where(keep, x * tf.cast(scale, x.dtype), tf.zeros_like(x))


def attention_scores(q, k):
    """``q @ kᵀ`` over the last two axes, one batched matmul of the transposed operand."""
    return tf.matmul(q, k, transpose_b=True)


def take_at(x, index, axis: int):
    """``x`` at ``index[b...]`` along ``axis`` (``index``: ``x``'s leading dimensions before ``axis``, or some of
    them), that axis kept with length 1."""
    return tf.gather(x, index[..., None], axis=axis, batch_dims=len(index.shape))


def real_targets(states, token_ids, lm_weights):
    """``(states at the positions t whose next token is real [N, d], those next tokens [N], their weights [N])``:
    where ``lm_weights > 0`` (``[..., T]``, as ``token_ids``; ``states`` ``[..., T, d]``), so padding and the last
    token cost the LM head no work."""
    where = tf.where(lm_weights > 0)  # [N, rank]: the positions t whose target t + 1 is real
    next_token = tf.one_hot(tf.rank(lm_weights) - 1, tf.rank(lm_weights), dtype=tf.int64)  # +1 on the last axis
    return (tf.gather_nd(states, where), tf.gather_nd(token_ids, where + next_token),
            tf.gather_nd(lm_weights, where))


def token_cross_entropy(logits, targets):
    """``-log softmax(logits)[target]`` per position: float32 ``logits`` [..., V], int ``targets`` [...].

    The values and gradient (``softmax - one_hot(target)``) of ``tf.nn.sparse_softmax_cross_entropy_with_logits``,
    about 3x faster on CPU: that fused kernel spends ~3.6 ns per logit on one core (Eigen; at λ = 0.5 it was a
    tenth of a fine-tuning step), while ``tf.nn.softmax`` runs oneDNN's kernel. The log-normaliser comes from the
    softmax itself: ``p_max = exp(max - lse)``, so ``lse = max - log(p_max)``, and ``p_max >= 1/V`` never
    underflows (``log p[target]`` could).
    """
    logits = tf.convert_to_tensor(logits, tf.float32)
    targets = tf.cast(targets, tf.int32)
    vocab = tf.shape(logits)[-1]
    flat, flat_targets = tf.reshape(logits, [-1, vocab]), tf.reshape(targets, [-1])

    @tf.custom_gradient
    def xent(flat):
        probs = tf.nn.softmax(flat)
        lse = tf.reduce_max(flat, -1) - tf.math.log(tf.reduce_max(probs, -1))
        loss = lse - tf.gather(flat, flat_targets, batch_dims=1)

        def grad(upstream):
            where = tf.stack([tf.range(tf.shape(flat_targets)[0]), flat_targets], 1)
            return tf.tensor_scatter_nd_sub(probs, where, tf.ones_like(lse)) * upstream[:, None]

        return loss, grad

    return tf.reshape(xent(flat), tf.shape(targets))


def bf16_dense(x, w, b, activation):
    """``Conv1D`` in inference with its kernel held in bfloat16 (``dtype="bfloat16"``): ``activation(x @ w + b)`` in
    ``x``'s dtype, the product by ``tf_weights.bf16_matmul`` (float32 sums)."""
    y = tf.nn.bias_add(bf16_matmul(x, w, x.dtype), tf.cast(b, x.dtype))
    return gelu(y) if activation else y
