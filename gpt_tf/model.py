"""GPT-1 models: the backbone (embeddings + decoder blocks) and the language model on top.

Follows keras-hub's split: ``GPTBackbone`` (``gpt_tf/backbone.py``) maps token ids to the final
block's states (and, on request, every block's states for layer-transfer studies);
``GPTLanguageModel`` adds the LM head tied to the token embedding (Eq. 2) and is what
pre-training optimises (Eq. 1).
Fine-tuning tasks reuse the backbone. ``make_backbone`` picks the transformer or the LSTM
baseline (``gpt_tf/lstm.py``) from ``config.model_type``.
"""

from __future__ import annotations

import keras

from gpt_tf.backbone import GPTBackbone
from gpt_tf.config import GPTConfig
from gpt_tf.layers import PACKAGE
from gpt_tf.lstm import LSTMBackbone


def make_backbone(config: GPTConfig, dtype=None, name="backbone"):
    """The backbone ``config.model_type`` names: ``GPTBackbone`` ("gpt") or ``LSTMBackbone`` ("lstm")."""
    cls = LSTMBackbone if config.model_type == "lstm" else GPTBackbone
    return cls(config, dtype=dtype, name=name)


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPTLanguageModel(keras.Model):
    """The backbone with the tied LM head: token ids → next-token logits ``[batch, length, total_vocab]``."""

    def __init__(self, backbone: GPTBackbone | dict, **kwargs):
        super().__init__(**kwargs)
        if isinstance(backbone, dict):
            backbone = keras.saving.deserialize_keras_object(backbone)
        self.backbone = backbone
        self.built = True

    @classmethod
    def from_config_preset(cls, config: GPTConfig, dtype=None, name="gpt_lm"):
        """Builds a freshly initialised model for ``config`` (dtype e.g. ``"mixed_bfloat16"``)."""
        return cls(make_backbone(config, dtype=dtype), dtype=dtype, name=name)

    @property
    def config(self) -> GPTConfig:
        return self.backbone.config

    def call(self, token_ids, training=False):
        h = self.backbone(token_ids, training=training)
        return self.backbone.embed.logits(h)

    def get_config(self):
        return {**super().get_config(), "backbone": keras.saving.serialize_keras_object(self.backbone)}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
