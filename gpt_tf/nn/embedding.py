"""The GPT-1 embedding as Keras 3 layers: the tied token table (a Keras ``ReversibleEmbedding``, whose transpose is
the LM head, Eq. 2) and the learned position table, summed with embedding dropout (``GPTEmbedding``).

In float mode the tables are read in their own dtype. ``quantize("int8")`` and ``enable_lora`` act on the token table
as on any ``ReversibleEmbedding``; on TensorFlow the int8 LM head's product in inference is ``tf_pieces.int8_matmul``
(1 byte per weight read; Keras's arithmetic). A table held in a 16-bit dtype (``dtype="bfloat16"``) gives float32
logits outside training: the products summed in float32 (on TensorFlow by ``tf_pieces.bf16_matmul``), not rounded
to 16 bits, so that a greedy pick is the one the float32 sums make.

With ``pad_vocab_to`` > 1 (``GPTConfig.pad_vocab_to``; off by default) the LM head pads the vocabulary in training
(``GPTEmbedding.logits``): the token table, zero-padded to ``padded_vocab`` rows in the forward pass only (the
variable keeps ``[total_vocab, n_embd]``), then the padded columns of the logits set to ``MASKED_LOGIT``.
"""

from __future__ import annotations

import keras
from keras import ops

from gpt_tf import backend
from gpt_tf.config import pad_vocab_problem, padded_width
from gpt_tf.nn.layers import PACKAGE, Dropout16, keras_input_quantizer, normal_init

# The padded columns' logit: no probability after a softmax, and representable in bfloat16 (float16's: -6e4).
MASKED_LOGIT = -1e9


@keras.saving.register_keras_serializable(package=PACKAGE)
class TokenEmbedding(keras.layers.ReversibleEmbedding):
    """Keras's ``ReversibleEmbedding`` (tied: the LM head is its transpose) whose table is read in its own dtype:
    ``GPTEmbedding`` gathers float32 rows and casts them, where Keras's autocast would cast the whole table to the
    compute dtype on every call under mixed precision. ``quantize`` is ``ReversibleEmbedding``'s."""

    def add_weight(self, *args, **kwargs):
        if kwargs.get("name") == "embeddings":
            kwargs["autocast"] = False
        return super().add_weight(*args, **kwargs)

    def quantize(self, mode=None, type_check=True, config=None):  # pylint: disable=unused-argument
        super().quantize(mode, type_check=False, config=config)

    def _int8_call(self, inputs, reverse=False):
        """Keras's int8 call; the LM head's (``reverse``) product on TensorFlow by ``tf_pieces.int8_matmul`` (as
        ``Conv1D``'s: Keras's input quantizer or weight-only), the rest Keras's arithmetic."""
        pieces = backend.tf_pieces()
        quantizes = keras_input_quantizer(self.inputs_quantizer)
        if (not reverse or pieces is None or not self.tie_weights or self.lora_enabled or quantizes is None
                or self.logit_soft_cap is not None):
            return super()._int8_call(inputs, reverse=reverse)
        logits = pieces.int8_matmul(inputs, self._embeddings, self.embeddings_scale, quantizes, transpose=True)
        return ops.cast(logits, self.compute_dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PositionTable(keras.layers.Layer):
    """The learned position table ``positions_embed`` ``[n_ctx, n_embd]``, N(0, init_std), read in its own dtype
    (``GPTEmbedding`` adds it to the gathered token rows; a layer of its own so that the token table comes first
    among the embedding's weights, as in the release)."""

    def __init__(self, n_ctx, n_embd, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        self.n_ctx, self.n_embd, self.init_std = n_ctx, n_embd, init_std

    def build(self, input_shape=None):
        self.positions_embed = self.add_weight(name="positions_embed", shape=(self.n_ctx, self.n_embd),
                                               initializer=normal_init(self.init_std), autocast=False)

    def get_config(self):
        return {**super().get_config(), "n_ctx": self.n_ctx, "n_embd": self.n_embd, "init_std": self.init_std}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPTEmbedding(keras.layers.Layer):
    """Token + learned position embedding with embedding dropout; with ``reverse=True`` the tied LM head (Eq. 2).

    The token table is a Keras ``ReversibleEmbedding`` (``token_embedding``, a ``TokenEmbedding``; tied: the LM head
    is its transpose),
    so ``quantize("int8")`` and ``enable_lora`` act on it; the position table is a ``PositionTable``. In float
    mode the tables are read in their own (float32) dtype: the rows are gathered and added, then cast to the
    compute dtype (Keras's autocast would cast the whole token table to bfloat16 on every call first, and the sum
    would round twice under ``mixed_bfloat16``); the head casts the table to the states' dtype."""

    def __init__(self, total_vocab, n_ctx, n_embd, embd_pdrop=0.1, init_std=0.02, pad_vocab_to=1, **kwargs):
        super().__init__(**kwargs)
        if pad_vocab_problem(pad_vocab_to):
            raise ValueError(pad_vocab_problem(pad_vocab_to))
        self.total_vocab = total_vocab
        self.pad_vocab_to = pad_vocab_to
        self.n_ctx = n_ctx
        self.n_embd = n_embd
        self.embd_pdrop = embd_pdrop
        self.init_std = init_std
        self.dropout = Dropout16(embd_pdrop, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        # Made here, not in __init__: its initializer takes its seed when it is made, and made at build (as both
        # tables' were before the token table became a Keras layer), the same seed draws the same weights.
        self.token_embedding = TokenEmbedding(
            self.total_vocab, self.n_embd, tie_weights=True, embeddings_initializer=normal_init(self.init_std),
            name="tokens_embed", dtype=self.dtype_policy)
        self.token_embedding.build()
        self.position_table = PositionTable(self.n_ctx, self.n_embd, self.init_std, name="positions_embed",
                                            dtype=self.dtype_policy)
        self.position_table.build()

    @property
    def positions_embed(self):
        """The position table variable (``[n_ctx, n_embd]``)."""
        return self.position_table.positions_embed

    @property
    def tokens_embed(self):
        """The token table (``[total_vocab, n_embd]``; the release's ``we`` rows before the positions)."""
        return self.token_embedding.embeddings

    @property
    def padded_vocab(self) -> int:
        """The LM head's width in training: ``total_vocab`` rounded up to a multiple of ``pad_vocab_to``."""
        return padded_width(self.total_vocab, self.pad_vocab_to)

    def pads(self, training) -> bool:
        """Whether the LM head gives ``padded_vocab`` columns (``logits``): in training, with the float tables, when
        ``padded_vocab`` > ``total_vocab``."""
        return bool(training) and self.padded_vocab > self.total_vocab and self._float_tables()

    def _float_tables(self) -> bool:
        return self.token_embedding.quantization_mode is None and not self.token_embedding.lora_enabled

    def call(self, inputs, training=False, start_index=0, reverse=False):
        """Token + position embeddings of ``inputs`` (token ids ``[batch, length]``) at positions ``start_index`` on;
        with ``reverse=True``, the LM head's logits of ``inputs`` (states ``[..., n_embd]``; ``logits``)."""
        if reverse:
            return self.logits(inputs, training=training)
        length = ops.shape(inputs)[-1]
        if isinstance(start_index, int) and start_index == 0:
            positions = self.positions_embed[:length]
        else:  # a generation step: the position of its token
            table = ops.convert_to_tensor(self.positions_embed)
            positions = ops.slice(table, [start_index, 0], [length, self.n_embd])
        if self._float_tables():
            h = ops.cast(ops.take(self.tokens_embed, inputs, axis=0) + positions, self.compute_dtype)
        else:  # int8 / LoRA: Keras's embedding call
            h = self.token_embedding(inputs) + ops.cast(positions, self.compute_dtype)
        return self.dropout(h, training=training)

    def logits(self, h, training=False):
        """The LM head tied to the token embedding: ``h @ W_eᵀ``, ``[..., total_vocab]``.

        In training with ``pad_vocab_to`` > 1 (``pads``), ``[..., padded_vocab]``: ``W_e`` zero-padded to
        ``padded_vocab`` rows (a GPU matmul's width a multiple of 128, say), the columns from ``total_vocab`` on then
        ``MASKED_LOGIT``, so a softmax, the cross-entropy (``objectives.lm_loss``) and an argmax never pick them;
        the real columns are the unpadded head's. Every caller in training takes it so, the loss alone reading its
        output: the language model's graph (``call(reverse=True)``), the tasks' LM logits at every position or at
        the real next tokens only (TensorFlow's ``tf_pieces.real_targets``: the same head on fewer rows, where
        padding is as correct and, on a GPU, as useful). Outside training the head is unpadded, so generation,
        scoring and the export see ``total_vocab`` columns. The int8 and LoRA tables (``token_embedding``'s
        ``reverse`` call, Keras's or ``tf_pieces.int8_matmul``) are never padded: the setting is for float
        training. A table held in a 16-bit dtype gives float32 logits outside training (``float32_logits``)."""
        if self._float_tables():
            if self.float32_logits(training):  # a 16-bit table: float32 sums, float32 logits
                pieces = backend.tf_pieces()
                if pieces is not None:
                    return pieces.bf16_matmul(h, self.tokens_embed, "float32", transpose=True)
                table = ops.cast(self.tokens_embed, "float32")
                return ops.matmul(ops.cast(h, "float32"), ops.transpose(table))
            table = ops.cast(self.tokens_embed, h.dtype)
            if not self.pads(training):
                return ops.matmul(h, ops.transpose(table))
            extra = self.padded_vocab - self.total_vocab
            logits = ops.matmul(h, ops.transpose(ops.pad(table, [[0, extra], [0, 0]])))
            masked = -6e4 if keras.backend.standardize_dtype(h.dtype) == "float16" else MASKED_LOGIT
            return ops.add(logits, ops.concatenate([ops.zeros([self.total_vocab], h.dtype),
                                                    ops.full([extra], masked, h.dtype)]))
        return ops.cast(self.token_embedding(h, reverse=True), h.dtype)

    def float32_logits(self, training=False) -> bool:
        """Whether the LM head gives float32 logits where the compute dtype is 16-bit: outside training, from a float
        token table held in a 16-bit dtype (``dtype="bfloat16"``)."""
        table = keras.backend.standardize_dtype(self.tokens_embed.dtype) if self._float_tables() else "int8"
        return not training and table in ("bfloat16", "float16")

    def compute_output_spec(self, inputs, training=False, start_index=0, reverse=False):
        if reverse:
            width = self.padded_vocab if self.pads(training) else self.total_vocab
            dtype = "float32" if self.float32_logits(training) else self.compute_dtype
            return keras.KerasTensor((*inputs.shape[:-1], width), dtype=dtype)
        return keras.KerasTensor((*inputs.shape, self.n_embd), dtype=self.compute_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "total_vocab": self.total_vocab,
            "n_ctx": self.n_ctx,
            "n_embd": self.n_embd,
            "embd_pdrop": self.embd_pdrop,
            "init_std": self.init_std,
            "pad_vocab_to": self.pad_vocab_to,
        }
