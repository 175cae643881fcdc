"""The family's models for a ``GPTConfig`` (a model size of ``gpt_tf/config.py``, a run's ``model_config.json``):
freshly initialised, for the command lines' loops and the readers of their runs.

``backbone_for`` builds ``GPT1Backbone``, or for ``model_type="lstm"`` the LSTM baseline of Table 5
(``LSTMBackbone``); ``causal_lm_for`` puts ``GPT1CausalLM`` on it with ``preprocessor=None`` (the loops feed
token ids) and uncompiled (they bring their own optimizer).
"""

from __future__ import annotations

from gpt_tf.config import GPTConfig
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.causal_lm import GPT1CausalLM
from gpt_tf.gpt1.lstm import LSTMBackbone


def backbone_for(config: GPTConfig, dtype=None, name: str = "backbone") -> GPT1Backbone:
    """The backbone ``config`` describes (``dtype`` e.g. ``"mixed_bfloat16"``; None: the global policy)."""
    cls = LSTMBackbone if config.model_type == "lstm" else GPT1Backbone
    return cls.from_gpt_config(config, dtype=dtype, name=name)


def causal_lm_for(config: GPTConfig, dtype=None) -> GPT1CausalLM:
    """``GPT1CausalLM`` on ``backbone_for(config)``: the language model pre-training trains."""
    return GPT1CausalLM(backbone_for(config, dtype=dtype), preprocessor=None, compile=False)
