"""GPT-1 as a keras-hub model family: backbone, tokenizer, preprocessors, language model, tasks, presets.

The project's model lives here: ``GPT1Backbone`` (its one backbone; ``LSTMBackbone``, Table 5's LSTM baseline,
a subclass) and ``GPT1CausalLM`` (its one language model), which the command lines train too
(``build.py``). Importing this package registers the classes with Keras (so
``keras_hub.models.Backbone.from_preset`` and ``keras_hub.models.TextClassifier.from_preset`` resolve GPT-1
presets to them) and the presets shipped inside ``gpt_tf`` (``gpt1_tiny_books_en``, ``gpt1_small_books_en``; the
earlier name ``books_tiny`` loads the tiny one without being listed).
``import gpt_tf.gpt1`` is how a user registers them; ``gpt_tf``'s ``GPT1*`` names import it on first use.
"""

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.causal_lm import GPT1CausalLM
from gpt_tf.gpt1.causal_lm_preprocessor import GPT1CausalLMPreprocessor
from gpt_tf.gpt1.lstm import LSTMBackbone
from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor
from gpt_tf.gpt1.presets import register_shipped_presets
from gpt_tf.gpt1.text_classifier import GPT1MultipleChoice, GPT1TextClassifier, GPT1TextRegressor
from gpt_tf.gpt1.tokenizer import GPT1Tokenizer

register_shipped_presets()

__all__ = ["GPT1Backbone", "GPT1Tokenizer", "GPT1TaskPreprocessor", "GPT1CausalLMPreprocessor", "GPT1CausalLM",
           "GPT1TextClassifier", "GPT1TextRegressor", "GPT1MultipleChoice", "LSTMBackbone"]
