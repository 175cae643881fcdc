"""The GPT-1 building blocks as Keras 3 layers (paper §3.1, §4.1; Radford et al. 2018), in ``keras.ops``.

Every layer mirrors a scope of the released TensorFlow code (openai/finetune-transformer-lm):
``c_attn`` (fused Q/K/V projection), ``c_proj``, ``c_fc``, ``ln_1``, ``ln_2``. Blocks are
post-LN: ``n = LN(x + attn(x)); h = LN(n + mlp(n))``. GELU is the tanh approximation the
release used. Weights are N(0, 0.02), biases 0, layer-norm gains 1.

The math is written once, in ``keras.ops``: it runs on JAX, TensorFlow and PyTorch. Where Keras runs on
TensorFlow, a few pieces run by TensorFlow code of the same arithmetic that is faster on a CPU
(``gpt_tf/nn/tf_pieces.py``, chosen at run time by ``gpt_tf.backend.tf_pieces()``): ``Conv1D``'s MatMul + BiasAdd
(which oneDNN fuses, with the GELU after it where no gradient needs the pre-activation) with, in training, the
padded weight gradient and the fused GELU kernel; layer norm with a written-out gradient or the fused kernels;
``Dropout16``'s mask from TF's Philox stream or the fused kernel; the attention's ``q·kᵀ`` and the gather of one
position per row. Q, K and V come out of one matmul and are split with one ``split`` (whose gradient is one
concat); the causal mask is an additive constant bias where the length is static; dropout masks come from 16
random bits per element (an exact rate under bfloat16 too); the attention softmax runs in float32 even under
``mixed_bfloat16`` so masked logits (-1e9) stay exact.

Generation's key/value cache: ``CausalSelfAttention`` and ``TransformerBlock`` take a ``cache`` and a
``cache_update_index`` and return the updated cache with their output (keras-hub's convention; the language
model's ``call_with_cache``: ``gpt_tf/gpt1/causal_lm.py``).
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from gpt_tf import backend

PACKAGE = "gpt_tf"


def gelu(x):
    """GELU, tanh approximation (as in the GPT-1 release and HF ``gelu_new``):
    ``0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))``."""
    pieces = backend.tf_pieces()
    return pieces.gelu(x) if pieces is not None else ops.gelu(x, approximate=True)


def layer_norm(x, gamma, beta, epsilon, training=False):
    """``(x - mean) / sqrt(var + epsilon) · gamma + beta`` over the last axis, computed in float32 (``gamma`` and
    ``beta`` read as float32) and returned in ``x``'s dtype: Keras's arithmetic (TensorFlow: with a written-out
    gradient, or the fused kernels in training)."""
    pieces = backend.tf_pieces()
    if pieces is not None:
        return pieces.layer_norm(x, gamma, beta, epsilon, training)
    xf = ops.cast(x, "float32")
    centred = xf - ops.mean(xf, axis=-1, keepdims=True)
    normed = centred * ops.rsqrt(ops.mean(ops.square(centred), axis=-1, keepdims=True) + epsilon)
    return ops.cast(normed * ops.cast(gamma, "float32") + ops.cast(beta, "float32"), x.dtype)


def take_at(x, index, axis: int):
    """``x`` at position ``index[b...]`` along ``axis``, that axis kept with length 1; ``index`` (int) has the shape of
    ``x``'s leading dimensions (some or all of those before ``axis``)."""
    pieces = backend.tf_pieces()
    if pieces is not None:
        return pieces.take_at(x, index, axis)
    index = ops.cast(index, "int32")
    index = ops.reshape(index, (*ops.shape(index), *[1] * (len(x.shape) - len(index.shape))))
    return ops.take_along_axis(x, index, axis=axis)


def attention_scores(q, k):
    """``q @ kᵀ`` over the last two axes."""
    pieces = backend.tf_pieces()
    return pieces.attention_scores(q, k) if pieces is not None else ops.matmul(q, ops.swapaxes(k, -1, -2))


def held_in(variable, dtype: str) -> bool:
    """Whether ``variable`` is stored in ``dtype`` (``"bfloat16"``: a ``dtype="bfloat16"`` model's weights, not a
    float32 weight read in bfloat16 under ``mixed_bfloat16``)."""
    return keras.backend.standardize_dtype(variable.dtype) == dtype


def keras_input_quantizer(quantizer):
    """An int8 layer's input quantizer as the faster product takes it: True for Keras's default (``AbsMaxQuantizer``
    over the last axis, values ±127), False for none (weight-only int8), None for any other (Keras's call runs)."""
    if not quantizer:
        return False
    default = isinstance(quantizer, keras.quantizers.AbsMaxQuantizer) and tuple(quantizer.value_range) == (-127, 127)
    # the fast product's epsilon is Keras's default, 1e-7 (tf_weights._KERAS_EPSILON, weight_matmul_blocks.h's
    # kEpsilon): a quantizer made under another keras.config.epsilon() runs Keras's own call
    return True if default and quantizer.axis in (None, (-1,)) and quantizer.epsilon == 1e-7 else None


def normal_init(std):
    return keras.initializers.RandomNormal(stddev=std)


@keras.saving.register_keras_serializable(package=PACKAGE)
def gelu_tanh(x):
    """``gelu`` as a Keras activation (``Conv1D``'s, for the code paths Keras runs itself: int8 and LoRA)."""
    return gelu(x)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Conv1D(keras.layers.Dense):
    """The release's ``conv1d`` with receptive field 1 as a Keras ``Dense``: ``activation(x @ kernel + bias)`` over
    the last axis, ``activation`` None or ``"gelu"``; ``w`` and ``b`` are the release's names of its kernel and bias.

    A ``Dense``, so Keras's features act on it: ``enable_lora`` (the kernel plus its low-rank update) and
    ``quantize("int8")`` (Keras's int8 kernel, scale and call; on TensorFlow in inference its product by
    ``tf_pieces.int8_matmul``). In float mode on TensorFlow it runs the same arithmetic through ``tf_pieces.dense``
    (a 2-D MatMul + BiasAdd that oneDNN fuses, in this layer's name scope, and in training the padded weight gradient
    and the fused GELU kernel), a kernel held in bfloat16 (``dtype="bfloat16"``) through ``tf_pieces.bf16_dense`` in
    inference; elsewhere ``Dense``'s own call.
    """

    ACTIVATIONS = (None, "gelu")
    FIXED = ("activation", "kernel_initializer", "use_bias", "bias_initializer")  # Dense's keys this layer sets itself

    def __init__(self, units, init_std=0.02, activation=None, **kwargs):
        if activation not in self.ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(self.ACTIVATIONS)}, got {activation!r}")
        for key in self.FIXED[1:]:  # in a Dense config; ``activation`` is this layer's own argument
            kwargs.pop(key, None)
        super().__init__(units, activation=gelu_tanh if activation else None,
                         kernel_initializer=normal_init(init_std), **kwargs)
        self.init_std = init_std
        self.activation_name = activation

    @property
    def w(self):
        """The kernel variable (``[in, units]``; the release's ``w``)."""
        return self._kernel

    @property
    def b(self):
        """The bias variable (the release's ``b``)."""
        return self.bias

    def call(self, inputs, training=False):
        pieces = backend.tf_pieces()
        if pieces is None:
            return super().call(inputs)
        if not training and held_in(self._kernel, "bfloat16") and not self.lora_enabled:
            x = ops.cast(inputs, self.compute_dtype)
            return pieces.bf16_dense(x, self._kernel, self.bias, self.activation_name)
        return pieces.dense(inputs, self.kernel, self.bias, self.activation_name, training)

    def quantize(self, mode=None, type_check=True, config=None):  # pylint: disable=unused-argument
        """``Dense.quantize`` (int8, int4, float8): this layer is a ``Dense`` with a faster float call."""
        super().quantize(mode, type_check=False, config=config)

    def _int8_call(self, inputs, training=None):
        """Keras's int8 call (the hook ``quantize("int8")`` runs): with Keras's input quantizer, the inputs quantized
        per row and the int8 product de-scaled; weight-only (``Int8QuantizationConfig(activation_quantizer=None)``),
        the float inputs against the int8 kernel, de-scaled; then bias, activation. In TensorFlow inference the
        product is ``tf_pieces.int8_matmul`` (``gpt_tf/nn/tf_weights.py``: the same arithmetic, reading 1 byte per
        weight); the rest is Keras's arithmetic."""
        pieces = backend.tf_pieces()
        quantizes = keras_input_quantizer(self.inputs_quantizer)
        if pieces is None or training or self.lora_enabled or quantizes is None:
            return super()._int8_call(inputs, training=training)
        x = ops.cast(pieces.int8_matmul(inputs, self._kernel, self.kernel_scale, quantizes), self.compute_dtype)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        return self.activation(x) if self.activation is not None else x

    def get_config(self):
        config = {key: value for key, value in super().get_config().items() if key not in self.FIXED}
        return {**config, "init_std": self.init_std, "activation": self.activation_name}


def causal_bias(length, static_length=None):
    """Additive causal mask ``[length, length]``: 0 on and below the diagonal, -1e9 above (float32).

    A constant when the length is static, so the graph adds it instead of selecting with a mask.
    """
    if static_length is not None:
        return ops.convert_to_tensor(np.triu(np.full((static_length, static_length), -1e9, np.float32), 1))
    rows = ops.arange(length)
    return ops.where(rows[None, :] <= rows[:, None], 0.0, -1e9)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Dropout16(keras.layers.Dropout):
    """Dropout whose mask comes from 16 random bits per element (half the Philox work of a float draw).

    Keeps an element iff its 16-bit draw is ≥ rate·2^16, so the drop rate is exact to 2^-16 (Keras
    draws a uniform in the input dtype, which under bfloat16 drops ~10.2% for rate 0.1). On TensorFlow the bits
    are TF's Philox stream, the same as the fused kernel's where it runs (``tf_pieces.dropout16``); on the other
    backends, ``backend.draws16``'s (on JAX 16 random bits, where ``keras.random.randint`` would draw 64).
    """

    def call(self, inputs, training=False):
        if not training or self.rate <= 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        threshold, scale = round(self.rate * 65536) - 32768, 1.0 / (1.0 - self.rate)  # keep iff draw >= threshold
        pieces = backend.tf_pieces()
        if pieces is not None:  # TF's Philox stream, or the fused kernel (gpt_tf/nn/tf_pieces.py)
            return pieces.dropout16(inputs, self.seed_generator.next(), threshold, scale)
        draws = backend.draws16(ops.shape(inputs), self.seed_generator)
        return ops.where(draws >= threshold, inputs * ops.cast(scale, inputs.dtype), ops.zeros_like(inputs))


@keras.saving.register_keras_serializable(package=PACKAGE)
def write_at(cache, t, index):
    """``cache`` [batch, heads, length, head] with ``t`` [batch, heads, 1, head] written at position ``index``: a
    scatter of the batch x heads rows (a core op, not XLA's slice update; it copies the cache once, ~2.5x faster than
    a select over all of it)."""
    batch, heads = ops.shape(t)[0], ops.shape(t)[1]
    rows = ops.arange(batch * heads, dtype="int32")
    at = ops.full_like(rows, ops.cast(index, "int32"))
    indices = ops.stack([rows // heads, rows % heads, at], axis=1)
    return ops.scatter_update(cache, indices, ops.reshape(t, (batch * heads, ops.shape(t)[3])))


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

    def fused(self, training) -> bool:
        """Whether the whole-sequence attention runs as ``keras.ops.dot_product_attention`` (causal; the backend's
        flash kernel where it has one for the device and dtype, cuDNN's on a GPU under JAX, else its exact XLA
        or SDPA arithmetic): on JAX and PyTorch, where no attention dropout is drawn (inference, or
        ``attn_pdrop`` 0). The paper's attention dropout needs the probabilities, so it takes the written-out
        path; so does TensorFlow, whose ``dot_product_attention`` is the same einsums without its faster pieces."""
        return backend.tf_pieces() is None and (not training or self.attn_pdrop == 0)

    def call(self, x, training=False, positions=None, cache=None, cache_update_index=None):
        """``x`` [batch, length, d] -> [batch, length, d]; with ``positions`` [batch] (int32), only the
        output at that position of each row, [batch, 1, d] (its query against all keys up to it).

        Generation (``cache_update_index`` given) returns ``(output, cache)``, the cache ``(keys, values)``, each
        ``[batch, heads, cache_length, head]``. ``cache`` None: ``x`` is the tokens from position 0 on (``length`` =
        the cache's length) and the cache holds their keys and values; else ``x`` is one token at position
        ``cache_update_index``, whose key and value are written there, its query attending to positions up to it.
        (Keys and values apart, not stacked: each step then reads and writes the cache once, which at GPT-1's size
        is a tenth of a step's memory traffic.)
        """
        batch, length, d = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        head = d // self.n_head

        def split_heads(t):  # [batch, length, d] -> [batch, heads, length, head]
            return ops.transpose(ops.reshape(t, (batch, length, self.n_head, head)), (0, 2, 1, 3))

        if cache_update_index is None and positions is None and self.fused(training):
            q, k, v = (ops.reshape(t, (batch, length, self.n_head, head)) for t in ops.split(self.c_attn(x), 3, axis=-1))
            out = ops.dot_product_attention(q, k, v, scale=1.0 / math.sqrt(head), is_causal=True)
            return self.resid_dropout(self.c_proj(ops.reshape(out, (batch, length, d))), training=training)
        q, k, v = (split_heads(t) for t in ops.split(self.c_attn(x), 3, axis=-1))
        if cache_update_index is not None and cache is not None:  # one new token; the keys up to it are visible
            if x.shape[1] not in (1, None):
                raise ValueError(f"a cached step takes one token per row, got {x.shape[1]}")
            keys = ops.arange(ops.shape(cache[0])[2])
            k, v = (write_at(c, t, cache_update_index) for c, t in zip(cache, (k, v)))
            bias, rows = ops.where(keys <= cache_update_index, 0.0, -1e9), length
        elif positions is None:
            bias, rows = causal_bias(length, x.shape[1]), length
        else:  # one query per row; it sees keys 0..position
            q = take_at(q, positions, axis=2)  # [batch, heads, 1, head]
            visible = ops.arange(length)[None, :] <= positions[:, None]
            bias, rows = ops.where(visible, 0.0, -1e9)[:, None, None, :], 1
        scores = attention_scores(q, k) * ops.cast(1.0 / math.sqrt(head), q.dtype)
        weights = ops.cast(ops.softmax(ops.cast(scores, "float32") + bias, axis=-1), v.dtype)
        weights = self.attn_dropout(weights, training=training)
        out = ops.matmul(weights, v)  # [batch, heads, rows, head]
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (batch, rows, d))
        out = self.resid_dropout(self.c_proj(out), training=training)
        return out if cache_update_index is None else (out, (k, v))

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


@keras.saving.register_keras_serializable(package=PACKAGE)
class LayerNorm(keras.layers.LayerNormalization):
    """Keras's ``LayerNormalization`` over the last axis (same weights, config and float32 arithmetic)
    computed by ``layer_norm``: on TensorFlow with a gradient in about half the ops, and in training by the
    fused kernels where they run (``gpt_tf.speed.kernels.fused_layer_norm``: one pass forward, one backward)."""

    def build(self, input_shape):
        axes = tuple(self.axis) if isinstance(self.axis, (list, tuple)) else (self.axis,)
        if axes not in ((-1,), (len(input_shape) - 1,)) or not (self.center and self.scale) or self.rms_scaling:
            raise ValueError("LayerNorm normalises the last axis with a gain and a bias; got "
                             f"axis={self.axis}, center={self.center}, scale={self.scale}, rms_scaling={self.rms_scaling}")
        super().build(input_shape)

    def call(self, inputs, training=False):
        return layer_norm(ops.cast(inputs, self.compute_dtype), self.gamma, self.beta, self.epsilon, training)


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

    def compute_output_spec(self, x, training=False, positions=None, cache=None, cache_update_index=None):
        """The functional graph's shape: ``x``'s (the graph runs every position, no cache)."""
        if positions is not None or cache_update_index is not None:
            return super().compute_output_spec(x, training=training, positions=positions, cache=cache,
                                               cache_update_index=cache_update_index)
        return keras.KerasTensor(x.shape, dtype=self.compute_dtype)

    def call(self, x, training=False, positions=None, cache=None, cache_update_index=None):
        """``[batch, length, d]`` -> the same; with ``positions`` [batch], only the state at that
        position of each row, ``[batch, 1, d]`` (what a task head reads from the last block). With
        ``cache_update_index``, ``(states, cache)``: the attention's key/value cache (``CausalSelfAttention``)."""
        if cache_update_index is not None:
            attended, cache = self.attn(x, training=training, cache=cache, cache_update_index=cache_update_index)
            n = self.ln_1(x + attended, training=training)
            return self.ln_2(n + self.mlp(n, training=training), training=training), cache
        residual = x if positions is None else take_at(x, positions, axis=1)
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
