"""Speed variants of our model for ``bench/train_throughput.py --variants=...`` (monkeypatches, bench only).

A variant is one or more option names joined by ``+`` (e.g. ``split_qkv+mask_bias``). Each option
patches ``gpt_tf`` classes in the (fresh) worker process before the model is built, so the
committed code runs as ``base`` and each alternative is measured against it in the same run.
The patched methods compute the same function as the committed ones (same parameters, same
dropout placement); only the op graph differs.
"""

from __future__ import annotations

import math

import numpy as np

OPTIONS = {
    "split_qkv": "tf.split the fused c_attn output into q, k, v (grad: one concat) instead of slicing a 5-D transpose",
    "mask_bias": "causal mask as an additive constant bias instead of ops.where (no SelectV2 forward and backward)",
    "softmax_bf16": "attention softmax in the compute dtype (no float32 round trip of the scores)",
    "scale_q": "scale q by 1/sqrt(d_head) before QK^T (a [B,T,d] multiply instead of [B,H,T,T])",
    "conv2d": "Conv1D as a 2-D MatMul + BiasAdd (oneDNN fuses them) instead of tensordot + AddV2",
    "gelu_cube": "GELU with x*x*x instead of ops.power(x, 3)",
    "gelu_tf": "GELU as tf.nn.gelu(approximate=True)",
    "head_f32": "LM head and its gradient in float32 (the tied table is float32 already) under mixed_bfloat16",
    "inter1": "tf.config.threading.set_inter_op_parallelism_threads(1)",
    "dropout16": "dropout masks from 16 random bits per element (half the Philox work of a float draw)",
    "fused_adam": "GPTAdamW update as one ResourceApplyAdam kernel per variable (+ one decay op) instead of ~12 ops",
}

# The combination measured fastest on the 2-core CPU (see the bench README / results), ready to port.
ALIASES = {"proposed": "split_qkv+mask_bias+conv2d+dropout16+fused_adam"}


def _attention_call(opts):
    """A ``CausalSelfAttention.call`` with the attention options in ``opts``."""
    import tensorflow as tf
    from keras import ops

    def call(self, x, training=False):
        batch, length, d = tf.shape(x)[0], tf.shape(x)[1], x.shape[-1]
        head = d // self.n_head
        scale = 1.0 / math.sqrt(head)
        qkv = self.c_attn(x)
        if "split_qkv" in opts:
            q, k, v = (
                tf.transpose(tf.reshape(t, (batch, length, self.n_head, head)), (0, 2, 1, 3))
                for t in tf.split(qkv, 3, axis=-1)
            )
        else:
            qkv = ops.transpose(ops.reshape(qkv, (batch, length, 3, self.n_head, head)), (2, 0, 3, 1, 4))
            q, k, v = qkv[0], qkv[1], qkv[2]
        if "scale_q" in opts:
            scores = tf.matmul(q * tf.cast(scale, q.dtype), k, transpose_b=True)
        else:
            scores = tf.matmul(q, k, transpose_b=True) * tf.cast(scale, q.dtype)
        if "softmax_bf16" not in opts:
            scores = tf.cast(scores, tf.float32)
        if "mask_bias" in opts:
            static = x.shape[1]
            if static is not None:
                bias = tf.constant(np.triu(np.full((static, static), -1e9, np.float32), 1), dtype=scores.dtype)
            else:
                bias = (1.0 - tf.linalg.band_part(tf.ones((length, length), scores.dtype), -1, 0)) * -1e9
            scores = scores + bias
        else:
            causal = tf.cast(tf.linalg.band_part(tf.ones((length, length)), -1, 0), tf.bool)
            scores = tf.where(causal, scores, tf.cast(-1e9, scores.dtype))
        weights = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
        weights = self.attn_dropout(weights, training=training)
        out = tf.reshape(tf.transpose(tf.matmul(weights, v), (0, 2, 1, 3)), (batch, length, d))
        return self.resid_dropout(self.c_proj(out), training=training)

    return call


def _conv1d_call(self, x):
    """``x @ w + b`` as a 2-D MatMul + BiasAdd (the release's conv1d reshape)."""
    import tensorflow as tf

    shape = tf.shape(x)
    y = tf.nn.bias_add(tf.matmul(tf.reshape(x, (-1, x.shape[-1])), self.w), self.b)
    return tf.reshape(y, tf.concat([shape[:-1], [self.units]], 0))


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


def _fused_update_step(self, gradient, variable, learning_rate):
    """Decoupled weight decay, then the Adam update in TF's fused ``ResourceApplyAdam`` kernel.

    Same arithmetic as Keras ``AdamW``: ``var -= lr·wd·var``; ``m += (g - m)(1 - β1)``;
    ``v += (g² - v)(1 - β2)``; ``var -= lr·sqrt(1 - β2^t)/(1 - β1^t) · m / (sqrt(v) + ε)``.
    """
    import tensorflow as tf

    dtype = variable.dtype
    lr = tf.cast(learning_rate, dtype)
    if self.weight_decay is not None and self._use_weight_decay(variable):
        variable.assign_sub(variable * (lr * tf.cast(self.weight_decay, dtype)))
    index = self._get_variable_index(variable)
    m, v = self._momentums[index].value, self._velocities[index].value
    step = tf.cast(self.iterations + 1, dtype)
    beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
    tf.raw_ops.ResourceApplyAdam(
        var=variable.handle,
        m=m.handle,
        v=v.handle,
        beta1_power=tf.pow(beta_1, step),
        beta2_power=tf.pow(beta_2, step),
        lr=lr,
        beta1=beta_1,
        beta2=beta_2,
        epsilon=tf.cast(self.epsilon, dtype),
        grad=tf.cast(gradient, dtype),
        use_locking=False,
    )


def _dropout16(original_call):
    """A ``keras.layers.Dropout.call`` drawing one 16-bit integer per element: keep iff it is ≥ rate·2^16.

    The keep probability is exact to 2^-16 (Keras draws a uniform in the input dtype, which under
    bfloat16 has 8 bits, so it actually drops ~10.2% for rate 0.1).
    """
    import tensorflow as tf
    from keras.src.backend.tensorflow.random import _cast_seed
    from keras.src.random.seed_generator import draw_seed

    def call(self, inputs, training=False):
        n = inputs.shape.num_elements()
        if not training or self.rate <= 0 or self.noise_shape is not None or n is None or n % 2:
            return original_call(self, inputs, training=training)
        seed = _cast_seed(draw_seed(self.seed_generator))
        bits = tf.random.stateless_uniform([n // 2], seed, minval=None, maxval=None, dtype=tf.uint32)
        draws = tf.reshape(tf.bitcast(bits, tf.int16), tf.shape(inputs))  # uniform over [-2^15, 2^15)
        keep = draws >= tf.constant(round(self.rate * 65536) - 32768, tf.int16)
        return tf.where(keep, inputs * tf.cast(1.0 / (1.0 - self.rate), inputs.dtype), tf.zeros_like(inputs))

    return call


def parse(name):
    """The option names of variant ``name`` (``base`` → none); raises on an unknown option."""
    name = ALIASES.get(name, name)
    opts = set() if name in ("", "base") else set(name.split("+"))
    unknown = opts - set(OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown variant option(s) {sorted(unknown)}; choose from {sorted(OPTIONS)} joined by '+', "
            f"or an alias in {sorted(ALIASES)}"
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
    if opts & {"split_qkv", "mask_bias", "softmax_bf16", "scale_q"}:
        layers.CausalSelfAttention.call = _attention_call(opts)
    if "conv2d" in opts:
        layers.Conv1D.call = _conv1d_call
    if "gelu_cube" in opts:
        layers.gelu = _gelu_cube
    if "gelu_tf" in opts:
        layers.gelu = _gelu_tf
    if "head_f32" in opts:
        layers.GPTEmbedding.logits = _logits_f32
    if "dropout16" in opts:
        import keras

        keras.layers.Dropout.call = _dropout16(keras.layers.Dropout.call)
    if "fused_adam" in opts:
        from gpt_tf import optim

        optim.GPTAdamW.update_step = _fused_update_step
        optim.GPTAdamW._apply_weight_decay = lambda self, variables: None  # folded into update_step
    return lm_loss
