"""The GPT-1 presets shipped in ``gpt_tf/presets/``, registered by name with keras-hub.

Their conversions (a run folder, GPT-1's release shards or a ``transformers`` state dict into a preset) are
``gpt_tf/convert/presets.py``, with their command line ``python -m gpt_tf.convert``.
"""

from __future__ import annotations

import json
import os

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.keras_hub_adapter import register_presets
from gpt_tf.convert.preset_io import PRESET_ALIASES, shipped_presets

# keras-hub's preset names: family, size, data, language. Each folder's README.md is its model card; these are the
# one-line descriptions keras-hub lists (`keras_hub.models.Backbone.presets[name]["metadata"]["description"]`).
DESCRIPTIONS = {
    "gpt1_tiny_books_en": "The `tiny` GPT-1 (4 layers, 256 dims, 128 context, 8k BPE) pre-trained on 409 Gutenberg "
                          "books (tools/torch_pretrain/train.py, 7,158 updates, held-out perplexity 55.1): the model "
                          "the README's fine-tuning tables start from.",
    "gpt1_small_books_en": "The `small` GPT-1 (6 layers, 384 dims, 256 context, 16k BPE) pre-trained on the same 409 "
                           "Gutenberg books by the family's own fit on JAX (tools/jax_pretrain.py, 6,839 updates, "
                           "held-out perplexity 55.1 per 16k-BPE token).",
}


def register_shipped_presets() -> None:
    """Registers each shipped preset with keras-hub (``keras_hub_adapter.register_presets``), so
    ``from_preset("gpt1_tiny_books_en")`` finds its folder (no network: keras-hub reads a local folder as the
    preset's handle) and ``keras_hub.models.Backbone.presets`` lists it with its description. An earlier name
    (``PRESET_ALIASES``: ``"books_tiny"``) loads its preset too but is not listed."""
    presets = {}
    for name, folder in shipped_presets().items():
        if name in PRESET_ALIASES:
            continue
        with open(os.path.join(folder, "metadata.json")) as f:
            params = json.load(f).get("parameter_count")
        presets[name] = {"metadata": {"description": DESCRIPTIONS.get(name, name), "params": params, "path": "gpt1"},
                         "kaggle_handle": folder}
    aliases = {alias: name for alias, name in PRESET_ALIASES.items() if name in presets}
    register_presets(presets, GPT1Backbone, aliases)
