"""The GPT-1 building blocks as Keras 3 layers (paper §3.1, §4.1; Radford et al. 2018).

Every layer mirrors a scope of the released TensorFlow code (openai/finetune-transformer-lm):
``c_attn`` (fused Q/K/V projection), ``c_proj``, ``c_fc``, ``ln_1``, ``ln_2``. Blocks are
post-LN: ``n = LN(x + attn(x)); h = LN(n + mlp(n))``. GELU is the tanh approximation the
release used. Weights are N(0, 0.02), biases 0, layer-norm gains 1.

Speed notes (measured in ``bench/train_throughput.py``, ``bench/finetune_speed.py``): Q, K and V
come out of one matmul and are split with one ``split`` (whose gradient is one concat, not three
full-size slice gradients); the causal mask is an additive constant bias; ``Conv1D`` is a 2-D
MatMul + BiasAdd, which oneDNN fuses (with the GELU after it too, where no gradient needs the
pre-activation: evaluation, serving), and in training its weight gradient runs on a padded copy of
an operand whose rows are a multiple of 4 KiB apart where that is measured faster
(``gpt_tf.aliased_grads``); dropout masks come from 16 random bits per element, for static and
dynamic (length-bucketed) shapes alike; the attention softmax runs in float32 even under
``mixed_bfloat16`` so masked logits (-1e9) stay exact; layer norm has a hand-written gradient
(``LayerNorm``: Keras's arithmetic in half the graph ops). In training, the GELU, the layer norm and
the dropout run as fused C++ kernels where they can (``gpt_tf.kernels``: the same values, one pass
each way), else the graph (the GELU then in float32 under ``mixed_bfloat16``, where CPU element-wise
kernels are twice as fast).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from gpt_tf import aliased_grads, inference_gelu, kernels

PACKAGE = "gpt_tf"


def gelu(x):
    """GELU, tanh approximation (as in the GPT-1 release and HF ``gelu_new``):
    ``0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))``, written as ``tf.nn.gelu`` writes it, the
    pattern TF's oneDNN remapper fuses with the MatMul + BiasAdd before it in inference graphs."""
    return tf.nn.gelu(x, approximate=True)


def _normal(std):
    return keras.initializers.RandomNormal(stddev=std)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Conv1D(keras.layers.Layer):
    """The release's ``conv1d`` with receptive field 1: ``x @ w + b`` over the last axis, then
    ``activation`` (None or ``"gelu"``).

    The GELU is applied here, in the layer's own name scope, because TF's oneDNN remapper fuses
    MatMul + BiasAdd + GELU into one kernel only when the three share a name scope (measured: with
    the GELU in the caller's scope the graph keeps its 8 element-wise ops)."""

    ACTIVATIONS = {None: None, "gelu": gelu}

    def __init__(self, units, init_std=0.02, activation=None, **kwargs):
        super().__init__(**kwargs)
        if activation not in self.ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(self.ACTIVATIONS)}, got {activation!r}")
        self.units = units
        self.init_std = init_std
        self.activation = activation

    def build(self, input_shape):
        self.w = self.add_weight(name="w", shape=(input_shape[-1], self.units), initializer=_normal(self.init_std))
        self.b = self.add_weight(name="b", shape=(self.units,), initializer="zeros")

    def call(self, x, training=False):
        # As the release's conv1d: a 2-D MatMul + BiasAdd (fused by oneDNN), not tensordot + add.
        x2 = tf.reshape(x, (-1, x.shape[-1]))
        if training and aliased_grads.pads(x.shape[-1], self.units, x2.dtype):
            # Rows 4 KiB apart: the weight gradient on a padded copy, where measured faster (gpt_tf/aliased_grads.py)
            w, b = (tf.convert_to_tensor(v, x2.dtype) for v in (self.w, self.b))
            y = aliased_grads.dense_padded_grad(x2, w, b)
        else:
            y = tf.nn.bias_add(tf.matmul(x2, self.w), self.b)
        if self.activation:
            activation = self.ACTIVATIONS[self.activation]
            if self.activation == "gelu" and (kernels.can_fuse(y) if training else inference_gelu.uses_kernel(y, x2.shape[-1])):
                # forward and gradient in one pass each (gpt_tf/kernels); in the project's own evaluation passes,
                # where measured faster than oneDNN's fused GELU (gpt_tf/inference_gelu.py)
                y = kernels.fused_gelu(y)
            elif training and y.dtype != tf.float32:
                # Training keeps the pre-activation for the gradient, so nothing fuses the activation;
                # run it (and its gradient) in float32: CPU element-wise kernels take ~2x as long in
                # bfloat16 as in float32, and float32 halves the rounding error of the 16-bit chain.
                y = tf.cast(activation(tf.cast(y, tf.float32)), y.dtype)
            else:
                y = activation(y)
        return tf.reshape(y, tf.concat([tf.shape(x)[:-1], [self.units]], 0))

    def get_config(self):
        return {**super().get_config(), "units": self.units, "init_std": self.init_std, "activation": self.activation}


def causal_bias(length, static_length=None):
    """Additive causal mask ``[length, length]``: 0 on and below the diagonal, -1e9 above (float32).

    A constant when the length is static, so the graph adds it instead of selecting with a mask.
    """
    if static_length is not None:
        return tf.constant(np.triu(np.full((static_length, static_length), -1e9, np.float32), 1))
    return (1.0 - tf.linalg.band_part(tf.ones((length, length)), -1, 0)) * -1e9


@keras.saving.register_keras_serializable(package=PACKAGE)
class Dropout16(keras.layers.Dropout):
    """Dropout whose mask comes from 16 random bits per element (half the Philox work of a float draw).

    Keeps an element iff its 16-bit draw is ≥ rate·2^16, so the drop rate is exact to 2^-16 (Keras
    draws a uniform in the input dtype, which under bfloat16 drops ~10.2% for rate 0.1). Where the fused
    kernels run, one kernel makes the same mask and output (``gpt_tf.kernels.fused_dropout``).
    """

    def call(self, inputs, training=False):
        if not training or self.rate <= 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        seed = self.seed_generator.next()
        threshold, scale = round(self.rate * 65536) - 32768, 1.0 / (1.0 - self.rate)  # keep iff draw >= threshold
        if kernels.can_fuse(inputs):  # the same mask and values in one pass each way (gpt_tf/kernels)
            return kernels.fused_dropout(inputs, seed, threshold, scale)
        n = tf.size(inputs)  # static or not: length-bucketed batches have a dynamic length
        bits = tf.random.stateless_uniform([(n + 1) // 2], seed, minval=None, maxval=None,
                                           dtype=tf.uint32)
        draws = tf.reshape(tf.reshape(tf.bitcast(bits, tf.int16), [-1])[:n], tf.shape(inputs))  # over [-2^15, 2^15)
        keep = draws >= tf.constant(threshold, tf.int16)
        return tf.where(keep, inputs * tf.cast(scale, inputs.dtype), tf.zeros_like(inputs))


@keras.saving.register_keras_serializable(package=PACKAGE)
class CausalSelfAttention(keras.layers.Layer):
    """Masked multi-head self-attention (Vaswani et al., as used in GPT-1), scaled by 1/sqrt(d_head)."""

    def __init__(self, n_head, attn_pdrop=0.1, resid_pdrop=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.n_head = n_head
        self.attn_pdrop = attn_pdrop
        self.resid_pdrop = resid_pdrop
        self.init_std = init_std
        self.attn_dropout = Dropout16(attn_pdrop, dtype=self.dtype_policy)
        self.resid_dropout = Dropout16(resid_pdrop, dtype=self.dtype_policy)

    def build(self, input_shape):
        d = input_shape[-1]
        if d % self.n_head:
            raise ValueError(f"width {d} is not divisible by n_head={self.n_head}")
        self.c_attn = Conv1D(3 * d, self.init_std, name="c_attn", dtype=self.dtype_policy)
        self.c_attn.build(input_shape)
        self.c_proj = Conv1D(d, self.init_std, name="c_proj", dtype=self.dtype_policy)
        self.c_proj.build(input_shape)

    def call(self, x, training=False, positions=None):
        """``x`` [batch, length, d] -> [batch, length, d]; with ``positions`` [batch] (int32), only the
        output at that position of each row, [batch, 1, d] (its query against all keys up to it)."""
        batch, length, d = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        head = d // self.n_head

        def split_heads(t):  # [batch, length, d] -> [batch, heads, length, head]
            return ops.transpose(ops.reshape(t, (batch, length, self.n_head, head)), (0, 2, 1, 3))

        q, k, v = (split_heads(t) for t in ops.split(self.c_attn(x), 3, axis=-1))
        if positions is None:
            bias, rows = causal_bias(length, x.shape[1]), length
        else:  # one query per row; it sees keys 0..position
            q = tf.gather(q, positions[:, None], axis=2, batch_dims=1)  # [batch, heads, 1, head]
            visible = tf.range(length)[None, :] <= positions[:, None]
            bias, rows = tf.where(visible, 0.0, -1e9)[:, None, None, :], 1
        scores = tf.matmul(q, k, transpose_b=True) * ops.cast(1.0 / math.sqrt(head), q.dtype)
        weights = ops.cast(ops.softmax(ops.cast(scores, "float32") + bias, axis=-1), v.dtype)
        weights = self.attn_dropout(weights, training=training)
        out = ops.matmul(weights, v)  # [batch, heads, rows, head]
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (batch, rows, d))
        return self.resid_dropout(self.c_proj(out), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "n_head": self.n_head,
            "attn_pdrop": self.attn_pdrop,
            "resid_pdrop": self.resid_pdrop,
            "init_std": self.init_std,
        }


@keras.saving.register_keras_serializable(package=PACKAGE)
class MLP(keras.layers.Layer):
    """Position-wise feed-forward: ``c_proj(gelu(c_fc(x)))`` with residual dropout."""

    def __init__(self, d_ff, resid_pdrop=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.resid_pdrop = resid_pdrop
        self.init_std = init_std
        self.dropout = Dropout16(resid_pdrop, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.c_fc = Conv1D(self.d_ff, self.init_std, activation="gelu", name="c_fc", dtype=self.dtype_policy)
        self.c_fc.build(input_shape)
        self.c_proj = Conv1D(input_shape[-1], self.init_std, name="c_proj", dtype=self.dtype_policy)
        self.c_proj.build((*input_shape[:-1], self.d_ff))

    def call(self, x, training=False):
        return self.dropout(self.c_proj(self.c_fc(x, training=training)), training=training)  # c_fc applies the GELU

    def get_config(self):
        return {**super().get_config(), "d_ff": self.d_ff, "resid_pdrop": self.resid_pdrop, "init_std": self.init_std}


def layer_norm(x, gamma, beta, epsilon):
    """``(x - mean) / sqrt(var + epsilon) · gamma + beta`` over the last axis, computed in float32 and
    returned in ``x``'s dtype, with a hand-written gradient.

    Autodiff through Keras's layer norm took ~80 graph ops per forward + backward; this gradient
    (``dx = rstd·(g - mean(g) - x̂·mean(g·x̂))`` with ``g = dy·gamma``) takes ~45, which ran the pair in
    0.43 ms instead of 0.75 on a bf16 [32, 18, 256] input."""

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


@keras.saving.register_keras_serializable(package=PACKAGE)
class LayerNorm(keras.layers.LayerNormalization):
    """Keras's ``LayerNormalization`` over the last axis (same weights, config and float32 arithmetic)
    computed by ``layer_norm``: the same values, a gradient in about half the ops; in training, by the
    fused kernels where they run (``gpt_tf.kernels.fused_layer_norm``: one pass forward, one backward)."""

    def build(self, input_shape):
        axes = tuple(self.axis) if isinstance(self.axis, (list, tuple)) else (self.axis,)
        if axes not in ((-1,), (len(input_shape) - 1,)) or not (self.center and self.scale) or self.rms_scaling:
            raise ValueError("LayerNorm normalises the last axis with a gain and a bias; got "
                             f"axis={self.axis}, center={self.center}, scale={self.scale}, rms_scaling={self.rms_scaling}")
        super().build(input_shape)

    def call(self, inputs, training=False):
        x = ops.cast(inputs, self.compute_dtype)
        # In training, one pass forward and one backward where the fused kernels run (gpt_tf/kernels).
        norm = kernels.fused_layer_norm if training and kernels.can_fuse(x) else layer_norm
        return norm(x, self.gamma, self.beta, self.epsilon)


@keras.saving.register_keras_serializable(package=PACKAGE)
class TransformerBlock(keras.layers.Layer):
    """One post-LN decoder block: ``n = ln_1(x + attn(x)); h = ln_2(n + mlp(n))``."""

    def __init__(self, n_head, d_ff, attn_pdrop=0.1, resid_pdrop=0.1, layer_norm_epsilon=1e-5, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.n_head = n_head
        self.d_ff = d_ff
        self.attn_pdrop = attn_pdrop
        self.resid_pdrop = resid_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.init_std = init_std
        policy = self.dtype_policy
        self.attn = CausalSelfAttention(n_head, attn_pdrop, resid_pdrop, init_std, name="attn", dtype=policy)
        self.ln_1 = LayerNorm(epsilon=layer_norm_epsilon, name="ln_1", dtype=policy)
        self.mlp = MLP(d_ff, resid_pdrop, init_std, name="mlp", dtype=policy)
        self.ln_2 = LayerNorm(epsilon=layer_norm_epsilon, name="ln_2", dtype=policy)

    def build(self, input_shape):
        for layer in (self.attn, self.ln_1, self.mlp, self.ln_2):
            layer.build(input_shape)

    def call(self, x, training=False, positions=None):
        """``[batch, length, d]`` -> the same; with ``positions`` [batch], only the state at that
        position of each row, ``[batch, 1, d]`` (what a task head reads from the last block)."""
        residual = x if positions is None else tf.gather(x, positions[:, None], axis=1, batch_dims=1)
        n = self.ln_1(residual + self.attn(x, training=training, positions=positions), training=training)
        return self.ln_2(n + self.mlp(n, training=training), training=training)

    def get_config(self):
        return {
            **super().get_config(),
            "n_head": self.n_head,
            "d_ff": self.d_ff,
            "attn_pdrop": self.attn_pdrop,
            "resid_pdrop": self.resid_pdrop,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "init_std": self.init_std,
        }


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPTEmbedding(keras.layers.Layer):
    """Token + learned position embedding with embedding dropout; also the tied LM head (Eq. 2).

    The tables are read in their own (float32) dtype: the rows are gathered, then cast to the compute
    dtype. Keras's autocast would cast the whole token table to bfloat16 on every call first (40k
    rows for a few hundred gathered under ``mixed_bfloat16``)."""

    def __init__(self, total_vocab, n_ctx, n_embd, embd_pdrop=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.total_vocab = total_vocab
        self.n_ctx = n_ctx
        self.n_embd = n_embd
        self.embd_pdrop = embd_pdrop
        self.init_std = init_std
        self.dropout = Dropout16(embd_pdrop, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.tokens_embed = self.add_weight(
            name="tokens_embed", shape=(self.total_vocab, self.n_embd), initializer=_normal(self.init_std),
            autocast=False,  # see the class doc; ``logits`` casts the table itself
        )
        self.positions_embed = self.add_weight(
            name="positions_embed", shape=(self.n_ctx, self.n_embd), initializer=_normal(self.init_std),
            autocast=False,
        )

    def call(self, token_ids, training=False):
        length = ops.shape(token_ids)[-1]
        h = ops.take(self.tokens_embed, token_ids, axis=0) + self.positions_embed[:length]
        return self.dropout(ops.cast(h, self.compute_dtype), training=training)

    def logits(self, h):
        """The LM head tied to the token embedding: ``h @ W_e^T``."""
        return ops.matmul(h, ops.transpose(ops.cast(self.tokens_embed, h.dtype)))

    def get_config(self):
        return {
            **super().get_config(),
            "total_vocab": self.total_vocab,
            "n_ctx": self.n_ctx,
            "n_embd": self.n_embd,
            "embd_pdrop": self.embd_pdrop,
            "init_std": self.init_std,
        }
