"""The LSTM baseline of the paper's ablations (§5, Table 5) in the same framework as the transformer.

``LSTMBackbone`` is a ``GPT1Backbone`` whose blocks are LSTM layers: ``call(ids)`` → states ``[batch, length,
n_embd]``, ``.embed`` (the same ``GPTEmbedding``: token + position tables, dropout, and the tied LM
head ``.embed.logits``), ``model_type = "lstm"`` and ``.blocks`` (one ``LSTMBlock`` per layer, for
layer transfer) — so ``GPT1CausalLM``, ``Pretrainer``, the tasks and ``Finetuner`` train it
unchanged (``--model=lstm_tiny``; ``gpt_tf.gpt1.build.backbone_for`` picks it for an LSTM
config). The learned position table is kept so that checkpoints, layer
transfer and ``n_ctx`` work as for the transformer; the recurrence does not need it.

A block is ``dropout(proj(LSTM(x)))``: a left-to-right LSTM of ``config.d_ff`` units (Keras's
LSTM with its standard initialisation: Glorot kernels, orthogonal recurrent kernels, forget-gate
bias 1) and, when ``d_ff != n_embd``, a linear projection back to ``n_embd`` (N(0, init_std)) so
the tied LM head and the task head see ``n_embd``-wide states. It is causal by construction.
"""

from __future__ import annotations

import keras

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.nn.layers import PACKAGE, Conv1D, Dropout16, take_at


@keras.saving.register_keras_serializable(package=PACKAGE)
class LSTMBlock(keras.layers.Layer):
    """``dropout(proj(LSTM(x)))``, ``[batch, length, n_embd]`` → the same shape."""

    def __init__(self, units, n_embd, resid_pdrop=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.units, self.n_embd, self.resid_pdrop, self.init_std = units, n_embd, resid_pdrop, init_std
        policy = self.dtype_policy
        self.lstm = keras.layers.LSTM(units, return_sequences=True, name="lstm", dtype=policy)
        self.proj = Conv1D(n_embd, init_std, name="c_proj", dtype=policy) if units != n_embd else None
        self.dropout = Dropout16(resid_pdrop, dtype=policy)

    def build(self, input_shape):
        self.lstm.build(input_shape)
        if self.proj is not None:
            self.proj.build((*input_shape[:-1], self.units))

    def compute_output_spec(self, x, training=False, positions=None):
        if positions is not None:
            return super().compute_output_spec(x, training=training, positions=positions)
        return keras.KerasTensor((*x.shape[:-1], self.n_embd), dtype=self.compute_dtype)

    def call(self, x, training=False, positions=None):
        """With ``positions`` [batch]: only the output at that position of each row, [batch, 1, n_embd]."""
        h = self.lstm(x, training=training)  # the recurrence needs every step anyway
        if positions is not None:
            h = take_at(h, positions, axis=1)
        if self.proj is not None:
            h = self.proj(h)
        return self.dropout(h, training=training)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "n_embd": self.n_embd,
                "resid_pdrop": self.resid_pdrop, "init_std": self.init_std}


@keras.saving.register_keras_serializable(package=PACKAGE)
class LSTMBackbone(GPT1Backbone):
    """Token ids ``[batch, length]`` (length ≤ n_ctx) → states ``[batch, length, n_embd]`` through LSTM layers.

    ``GPT1Backbone``'s arguments; ``intermediate_dim`` is the LSTM's units, ``num_heads`` is unused (1).

    Example:

    ```python
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.lstm import LSTMBackbone
    lstm = LSTMBackbone.from_gpt_config(get_size("lstm_test"))    # no from_preset: no LSTM preset is shipped
    ```
    """

    model_type = "lstm"
    supports_cache = False  # generation runs the recurrence over the whole sequence at each step

    def make_block(self, i, num_heads, intermediate_dim, attention_dropout, dropout, layer_norm_epsilon, init_std,
                   dtype):
        del num_heads, attention_dropout, layer_norm_epsilon  # a recurrence has no heads, attention or layer norm
        return LSTMBlock(intermediate_dim, self.embed.n_embd, dropout, init_std, name=f"h{i}", dtype=dtype)
