"""``GPT1Backbone``: GPT-1's decoder as a ``keras_hub.models.Backbone``.

It *is* the project's ``GPTBackbone`` (``gpt_tf/backbone.py``: the same layers, variables and
numerics; the task model ``GPTTaskModel``, layer transfer and the weight converters take it as
they are) with keras-hub's constructor arguments, ``get_config``, ``from_preset`` and
``save_to_preset``.
"""

from __future__ import annotations

import keras
import keras_hub

from gpt_tf.backbone import GPTBackbone
from gpt_tf.layers import PACKAGE
from gpt_tf.preset_io import FindsPresets, backbone_kwargs, config_from_kwargs


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1Backbone(FindsPresets, keras_hub.models.Backbone, GPTBackbone):
    """GPT-1 (Radford et al. 2018): token ids ``[batch, length]`` → final states ``[batch, length, hidden_dim]``.

    Post-LN decoder blocks with learned positions and a token embedding tied to the LM head
    (``backbone.embed.logits(states)``). Right padding needs no mask: attention is causal.

    Args:
        vocabulary_size: rows of the token embedding: the BPE tokens, then ``num_special_tokens``
            rows (start, delimiter, extract, pad; paper §3.3). GPT-1: 40478 + 4.
        num_layers, num_heads, hidden_dim, intermediate_dim: 12, 12, 768, 3072 for GPT-1.
        max_sequence_length: ``n_ctx``, 512 for GPT-1.
        dropout: residual dropout; ``attention_dropout`` and ``embedding_dropout`` likewise (0.1).
        layer_norm_epsilon, init_std: 1e-5 and N(0, 0.02).
        dtype: e.g. ``"float32"`` or ``"mixed_bfloat16"``.

    Example:

    ```python
    import gpt_tf, keras_hub, numpy as np
    backbone = keras_hub.models.Backbone.from_preset("books_tiny")    # a GPT1Backbone
    states = backbone(np.array([[1, 2, 3]]))                          # [1, 3, 256]
    small = gpt_tf.GPT1Backbone(vocabulary_size=1004, num_layers=2, num_heads=4, hidden_dim=32,
                                intermediate_dim=128, max_sequence_length=32)
    small.summary()
    ```
    """

    def __init__(self, vocabulary_size=40482, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072,
                 max_sequence_length=512, dropout=0.1, attention_dropout=0.1, embedding_dropout=0.1,
                 num_special_tokens=4, layer_norm_epsilon=1e-5, init_std=0.02, dtype=None, **kwargs):
        config = config_from_kwargs(dict(
            vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim, max_sequence_length=max_sequence_length, dropout=dropout,
            attention_dropout=attention_dropout, embedding_dropout=embedding_dropout,
            num_special_tokens=num_special_tokens, layer_norm_epsilon=layer_norm_epsilon, init_std=init_std))
        if isinstance(dtype, dict):
            dtype = keras.dtype_policies.deserialize(dtype)
        # GPTBackbone builds its layers in the model's dtype policy, so it must have it before it starts:
        # its __init__ runs with `dtype` (keras-hub's Backbone.__init__ would set the policy only afterwards),
        # then this sets what Backbone.__init__ sets.
        GPTBackbone.__init__(self, config, dtype=dtype, **kwargs)
        self._functional_layer_ids = set()
        self._initialized = True

    @classmethod
    def from_gpt_config(cls, config, **kwargs) -> "GPT1Backbone":
        """A backbone for a ``GPTConfig`` (e.g. ``gpt_tf.config.get_size("tiny")``)."""
        return cls(**backbone_kwargs(config), **kwargs)

    @property
    def token_embedding(self):
        return self.embed

    def call(self, inputs, training=False, return_all_states=False, positions=None):
        """``inputs``: token ids, or keras-hub's ``{"token_ids", "padding_mask"}`` (the mask is not needed:
        attention is causal and padding comes last)."""
        token_ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        return GPTBackbone.call(self, token_ids, training=training, return_all_states=return_all_states,
                                positions=positions)

    def get_config(self):
        base = keras_hub.models.Backbone.get_config(self)
        return {**base, **backbone_kwargs(self.config)}

    @classmethod
    def from_config(cls, config):
        return keras_hub.models.Backbone.from_config.__func__(cls, config)
