"""The GPT-1 backbone: token ids -> the final decoder block's states (keras-hub's backbone).

``GPTEmbedding`` (token + learned position tables, the tied LM head) then ``n_layer``
``TransformerBlock``s; on request every block's states (layer-transfer studies). Its own module
so that the LSTM baseline (``gpt_tf/lstm.py``) can subclass it and ``gpt_tf/model.py`` can pick
either without an import circle.
"""

from __future__ import annotations

import keras

from gpt_tf.config import GPTConfig
from gpt_tf.layers import PACKAGE, GPTEmbedding, TransformerBlock


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPTBackbone(keras.Model):
    """Token ids ``[batch, length]`` (length ≤ n_ctx) → hidden states ``[batch, length, n_embd]``."""

    def __init__(self, config: GPTConfig | dict, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, GPTConfig) else GPTConfig(**config)
        c, policy = self.config, self.dtype_policy
        self.embed = GPTEmbedding(c.total_vocab, c.n_ctx, c.n_embd, c.embd_pdrop, c.init_std, name="embed", dtype=policy)
        self.blocks = [self.make_block(i) for i in range(c.n_layer)]
        self.embed.build()
        for block in self.blocks:
            block.build((None, None, c.n_embd))
        self.built = True

    def make_block(self, i):
        """Block ``i``: a post-LN transformer block (the LSTM baseline overrides this)."""
        c = self.config
        return TransformerBlock(c.n_head, c.d_ff, c.attn_pdrop, c.resid_pdrop, c.layer_norm_epsilon, c.init_std,
                                name=f"h{i}", dtype=self.dtype_policy)

    def call(self, token_ids, training=False, return_all_states=False, positions=None):
        """States ``[batch, length, n_embd]`` (or every block's, a list); with ``positions`` [batch],
        only the final state at that position of each row, ``[batch, 1, n_embd]``: the last block
        then runs its query, projection and MLP for that position alone (a task head's input)."""
        if positions is not None and return_all_states:
            raise ValueError("positions and return_all_states do not go together")
        h = self.embed(token_ids, training=training)
        states = []
        for i, block in enumerate(self.blocks):
            last = i == len(self.blocks) - 1
            h = block(h, training=training, positions=positions) if last and positions is not None else \
                block(h, training=training)
            states.append(h)
        return states if return_all_states else h

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
