"""gpt_tf: GPT-1 (Radford et al. 2018) in TensorFlow / Keras 3.

``import gpt_tf.gpt1`` registers the keras-hub model family (``gpt_tf/gpt1/``) and the shipped presets with
keras-hub, as importing any keras-hub model family from outside keras-hub does; then
``keras_hub.models.TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)`` resolves. ``import gpt_tf``
alone imports neither TensorFlow nor keras-hub, so the command lines (``python -m gpt_tf.train``) start fast and
check their flags first; the names below load ``gpt_tf.gpt1`` (and register it) on first use:

    import gpt_tf
    classifier = gpt_tf.GPT1TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)
"""

from __future__ import annotations

import importlib

# The package's version: pyproject.toml reads it from here (setuptools finds the literal without importing).
__version__ = "0.1.0"

_FAMILY = ("GPT1Backbone", "GPT1Tokenizer", "GPT1TaskPreprocessor", "GPT1CausalLMPreprocessor", "GPT1CausalLM",
           "GPT1TextClassifier", "GPT1TextRegressor", "GPT1MultipleChoice")
__all__ = list(_FAMILY)


def __getattr__(name):
    if name in _FAMILY:
        return getattr(importlib.import_module("gpt_tf.gpt1"), name)
    raise AttributeError(f"module 'gpt_tf' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_FAMILY))
