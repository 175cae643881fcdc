"""Speed variants of our model for ``bench/train_throughput.py --variants=...`` (monkeypatches, bench only).

A variant is one or more option names joined by ``+`` (e.g. ``scale_q+gelu_tf``). Each option
patches ``gpt_tf`` classes in the (fresh) worker process before the model is built, so the
committed code runs as ``base`` and each alternative is measured against it in the same run.
The patched methods compute the same function as the committed ones (same parameters, same
dropout placement); only the op graph differs.
"""

from __future__ import annotations

import math

OPTIONS = {
    "softmax_bf16": "attention softmax in the compute dtype (no float32 round trip of the scores)",
    "scale_q": "scale q by 1/sqrt(d_head) before QK^T (a [B,T,d] multiply instead of [B,H,T,T])",
    "gelu_cube": "GELU with x*x*x instead of ops.power(x, 3)",
    "gelu_tf": "GELU as tf.nn.gelu(approximate=True)",
    "head_f32": "LM head and its gradient in float32 (the tied table is float32 already) under mixed_bfloat16",
    "inter1": "tf.config.threading.set_inter_op_parallelism_threads(1)",
}
# The options measured fastest earlier (split_qkv, mask_bias, conv2d, dropout16, fused_adam) are now
# the committed code, i.e. ``base``; bench/results/train_throughput.md has their measurements.


def _attention_call(opts):
    """``CausalSelfAttention.call`` (gpt_tf/layers.py) with the attention options in ``opts``."""
    import tensorflow as tf
    from keras import ops

    from gpt_tf.layers import causal_bias

    def call(self, x, training=False, positions=None):
        if positions is not None:
            raise NotImplementedError("the attention variants are for language-model steps (no positions)")
        batch, length, d = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        head = d // self.n_head

        def split_heads(t):
            return ops.transpose(ops.reshape(t, (batch, length, self.n_head, head)), (0, 2, 1, 3))

        q, k, v = (split_heads(t) for t in ops.split(self.c_attn(x), 3, axis=-1))
        scale = ops.cast(1.0 / math.sqrt(head), q.dtype)
        scores = tf.matmul(q * scale, k, transpose_b=True) if "scale_q" in opts else tf.matmul(q, k, transpose_b=True) * scale
        if "softmax_bf16" in opts:
            scores = scores + ops.cast(causal_bias(length, x.shape[1]), scores.dtype)
        else:
            scores = ops.cast(scores, "float32") + causal_bias(length, x.shape[1])
        weights = self.attn_dropout(ops.cast(ops.softmax(scores, axis=-1), v.dtype), training=training)
        out = ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (batch, length, d))
        return self.resid_dropout(self.c_proj(out), training=training)

    return call


def _gelu_cube(x):
    from keras import ops

    return 0.5 * x * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def _gelu_tf(x):
    import tensorflow as tf

    return tf.nn.gelu(x, approximate=True)


def _logits_f32(self, h):
    """The tied LM head in float32 (the table is a float32 variable)."""
    import tensorflow as tf

    table = tf.convert_to_tensor(self.tokens_embed._value)  # the raw tf.Variable: no autocast to bfloat16
    h2 = tf.reshape(tf.cast(h, tf.float32), (-1, h.shape[-1]))
    logits = tf.matmul(h2, table, transpose_b=True)
    return tf.reshape(logits, tf.concat([tf.shape(h)[:-1], [self.total_vocab]], 0))


def parse(name):
    """The option names of variant ``name`` (``base`` → none); raises on an unknown option."""
    opts = set() if name in ("", "base") else set(name.split("+"))
    unknown = opts - set(OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown variant option(s) {sorted(unknown)}; choose from {sorted(OPTIONS)} joined by '+'"
        )
    return opts


def apply_variant(name):
    """Applies the monkeypatches of variant ``name`` (call before any TF op); returns the loss function."""
    import tensorflow as tf

    from gpt_tf import layers
    from gpt_tf.model import lm_loss

    opts = parse(name)
    if "inter1" in opts:
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if opts & {"softmax_bf16", "scale_q"}:
        layers.CausalSelfAttention.call = _attention_call(opts)
    if "gelu_cube" in opts:
        layers.gelu = _gelu_cube
    if "gelu_tf" in opts:
        layers.gelu = _gelu_tf
    if "head_f32" in opts:
        layers.GPTEmbedding.logits = _logits_f32
    return lm_loss
