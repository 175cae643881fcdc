"""keras-hub's preset layout as the core reads it, without importing keras-hub.

A preset folder (``GPT1Backbone.save_to_preset``, ``python -m gpt_tf.gpt1.convert``) holds
``config.json`` (the backbone's Keras config: keras-hub's field names), ``model.weights.h5`` (the
backbone's weights), ``tokenizer.json`` + ``assets/tokenizer/`` (GPT-1's two BPE files) and
``metadata.json``; a task adds ``task.json`` / ``task.weights.h5``. The backbone's variables are
``GPTBackbone``'s, so the core restores a preset into any GPT model (``--init_checkpoint=<preset>``)
with no keras-hub in the process. ``backbone_kwargs`` / ``config_from_kwargs`` are the one mapping
between ``GPTConfig``'s fields and keras-hub's.
"""

from __future__ import annotations

import json
import os

from gpt_tf.config import GPTConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")

# GPTConfig field -> keras-hub argument (vocab_size is derived: keras-hub counts the special rows).
_NAMES = {"n_special": "num_special_tokens", "n_ctx": "max_sequence_length", "n_embd": "hidden_dim",
          "n_layer": "num_layers", "n_head": "num_heads", "d_ff": "intermediate_dim",
          "embd_pdrop": "embedding_dropout", "attn_pdrop": "attention_dropout", "resid_pdrop": "dropout",
          "layer_norm_epsilon": "layer_norm_epsilon", "init_std": "init_std"}


def backbone_kwargs(config: GPTConfig) -> dict:
    """``GPT1Backbone``'s arguments for ``config``: ``vocabulary_size`` counts the special-token rows."""
    if config.model_type != "gpt":
        raise ValueError(f"a GPT-1 preset holds a transformer, not model_type={config.model_type!r}")
    return {"vocabulary_size": config.total_vocab, **{new: getattr(config, old) for old, new in _NAMES.items()}}


def config_from_kwargs(kwargs: dict) -> GPTConfig:
    """The ``GPTConfig`` of ``GPT1Backbone`` arguments (``backbone_kwargs``'s inverse)."""
    fields = {old: kwargs[new] for old, new in _NAMES.items() if new in kwargs}
    n_special = fields.get("n_special", GPTConfig.n_special)
    return GPTConfig(vocab_size=int(kwargs["vocabulary_size"]) - n_special, **fields)


def is_preset(path: str) -> bool:
    """Whether ``path`` is a folder holding a preset's ``config.json`` and ``model.weights.h5``."""
    return os.path.isfile(os.path.join(path, CONFIG_FILE)) and os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def preset_config(path: str) -> GPTConfig:
    """The ``GPTConfig`` of the preset folder ``path`` (its ``config.json``)."""
    config_path = os.path.join(path, CONFIG_FILE)
    with open(config_path) as f:
        saved = json.load(f)
    name = saved.get("registered_name", "")
    if not name.endswith("GPT1Backbone"):
        raise ValueError(f"{config_path}: a {name or 'non-Keras'} config, not a GPT1Backbone preset")
    return config_from_kwargs(saved["config"])


def load_preset_weights(backbone, path: str) -> str:
    """The preset's backbone weights into ``backbone`` (a ``GPTBackbone`` of the same shape); returns the file."""
    weights = os.path.join(path, WEIGHTS_FILE)
    backbone.load_weights(weights)
    return weights
