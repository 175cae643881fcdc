"""gpt_tf: GPT-1 (Radford et al. 2018) in TensorFlow / Keras 3.

The keras-hub model family (``gpt_tf/gpt1/``) is exported here lazily: ``import gpt_tf`` imports
neither TensorFlow nor keras-hub (the command lines start fast and check their flags first). The
names below load ``gpt_tf.gpt1`` on first use, and so does importing keras-hub: a hook registers
the GPT-1 classes and presets as soon as ``keras_hub`` is imported (before or after ``gpt_tf``), so
``keras_hub.models.Backbone.from_preset(dir)`` and ``keras_hub.models.TextClassifier.from_preset(dir,
num_classes=2)`` resolve GPT-1 presets.

    import gpt_tf
    classifier = gpt_tf.GPT1TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

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


class _RegisterAfterKerasHub(importlib.abc.MetaPathFinder):
    """Imports ``gpt_tf.gpt1`` (which registers the family) right after ``keras_hub`` finishes importing."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras_hub":
            return None
        sys.meta_path.remove(self)  # once; the other finders find keras_hub itself
        spec = importlib.util.find_spec("keras_hub")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            importlib.import_module("gpt_tf.gpt1")

        loader.exec_module = exec_then_register
        return spec


if "keras_hub" in sys.modules:
    importlib.import_module("gpt_tf.gpt1")
elif not any(isinstance(f, _RegisterAfterKerasHub) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterKerasHub())
