"""The family's models with their weights held in fewer bytes, for inference on a CPU: ``with_weights``.

At one token per row (generation with the key/value cache) a step's time is the time to read the weights, so
fewer bytes per weight is what makes it faster (as llama.cpp's and PyTorch's CPU inference have it):

* ``"float32"``: the model as trained, 4 bytes per weight.
* ``"bfloat16"``: every weight held in bfloat16 (2 bytes; keras-hub's ``dtype="bfloat16"``, which
  ``from_preset(..., dtype="bfloat16")`` gives too), the products summed in float32 and the LM head's logits
  float32, so a greedy pick is the one float32's sums of the same weights make.
* ``"int8"``: Keras's ``quantize("int8")``: every projection and the token table (so the LM head) in int8 with a
  scale per output column (1 byte), each row of a product's inputs quantized to int8 by its absolute maximum.
* ``"int8_weight_only"``: the same int8 weights against float inputs (Keras's ``Int8QuantizationConfig`` with
  ``activation_quantizer=None``): one rounding fewer, a little slower on TensorFlow (float sums, not VNNI's).

On TensorFlow, products against such weights in inference are ``gpt_tf/nn/tf_weights.py``'s: a few rows read the
weights in their own bytes (a C++ kernel; AVX512-VNNI's integer sums for int8), many rows by oneDNN's int8
product or float32's MatMul; an export (``serving.export --weights``) holds core TensorFlow ops only. On JAX and
PyTorch Keras's own int8 and bfloat16 arithmetic run (see docs/benchmarks.md for where that is slower).
Layer norms, biases and the position table stay in the format too (bfloat16) or float32 (int8: Keras quantizes the
projections and the token table only).
"""

from __future__ import annotations

import warnings

import keras

WEIGHTS = ("float32", "bfloat16", "int8", "int8_weight_only")


def check_weights(weights: str) -> str:
    """``weights`` if it is one of ``WEIGHTS``, else ValueError naming them."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}; got {weights!r}")
    return weights


def quantization_config(weights: str):
    """The ``keras.quantizers.Int8QuantizationConfig`` of an int8 format (None: Keras's default, inputs quantized)."""
    if weights == "int8_weight_only":
        return keras.quantizers.Int8QuantizationConfig(activation_quantizer=None)
    return None


def weights_of(model) -> str:
    """The format ``model`` (a family model or backbone) holds its weights in: one of ``WEIGHTS``."""
    backbone = getattr(model, "backbone", model)
    table = backbone.token_embedding
    if table.quantization_mode == "int8":
        return "int8" if table.inputs_quantizer else "int8_weight_only"
    return keras.backend.standardize_dtype(table.embeddings.dtype) if table.quantization_mode is None else "other"


def with_weights(model, weights: str):
    """A copy of ``model`` (``GPT1CausalLM``, a task of ``gpt_tf/gpt1/text_classifier.py``, or a backbone) holding
    its weights in ``weights`` (``WEIGHTS``), for inference: the same layers and preprocessor, weights cast or
    quantized from ``model``'s (which is left as it is). ``"float32"`` of a float32 model: a plain copy.

    Example:

    ```python
    lm = gpt_tf.GPT1CausalLM.from_preset("gpt1_small_books_en")
    fast = gpt_tf.gpt1.weight_formats.with_weights(lm, "int8")    # ~4x fewer bytes per generated token
    fast.compile(sampler="greedy")
    fast.generate("the man walked into the room and", max_length=40)
    ```
    """
    check_weights(weights)
    if weights_of(model) not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"{type(model).__name__} already holds {weights_of(model)} weights: convert the float model")
    dtype = "bfloat16" if weights == "bfloat16" else "float32"
    copy = _rebuilt(model, dtype)
    copy.set_weights(model.get_weights())  # cast to the copy's variable dtype
    if weights.startswith("int8"):
        with warnings.catch_warnings():  # Keras names every layer without weights to quantize (layer norms, ...)
            warnings.filterwarnings("ignore", message=".*does not have a `quantize` method")
            copy.quantize("int8", config=quantization_config(weights))
    return copy


def _rebuilt(model, dtype: str):
    """``model``'s class built again from its config, the backbone's dtype policy ``dtype`` (its preprocessor the
    same object)."""
    backbone = getattr(model, "backbone", None)
    if backbone is None:  # a backbone
        return type(model).from_config({**model.get_config(), "dtype": dtype})
    config = model.get_config()
    config["backbone"] = _rebuilt(backbone, dtype)
    config["preprocessor"] = getattr(model, "preprocessor", None)
    return type(model).from_config(config)
