"""``GPT1CausalLMPreprocessor``: texts → the language model's token ids, for ``fit`` and ``generate``.

GPT-1 pre-trained on a plain token stream (no start or end token), so none is added; padding uses the pad
id and comes last. As keras-hub's preprocessors, it takes one string or a batch, eagerly or in ``tf.data`` (mapped
before or after ``batch``): one string gives outputs of one rank less. ``from_preset`` of a preset without
``preprocessor.json`` (the shipped ones) takes the backbone's ``max_sequence_length`` unless one is given
(``preset_length``, as the tasks' ``GPT1TaskPreprocessor`` does too).
"""

from __future__ import annotations

import keras
import keras_hub
from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.keras_hub_adapter import preprocessing_function, preset_sequence_length
from gpt_tf.gpt1.tokenizer import GPT1Tokenizer
from gpt_tf.nn.layers import PACKAGE
from gpt_tf.convert.hf import FROM_PRESET


def preset_length(loader, kwargs) -> dict:
    """keras-hub's ``_add_missing_kwargs`` of the family's preprocessors, after the base class's: the backbone's
    ``max_sequence_length`` in the preset's config where no ``sequence_length`` is given (``keras_hub_adapter``)."""
    if kwargs.get("sequence_length") is None:
        kwargs["sequence_length"] = preset_sequence_length(loader)
    return kwargs


def sequence_length_of(preprocessor, sequence_length=None) -> int:
    """``sequence_length`` (a call's override) or the preprocessor's; a ValueError where neither is set."""
    length = sequence_length or preprocessor.sequence_length
    if length is None:
        raise ValueError(f"{type(preprocessor).__name__}: sequence_length is not set: pass sequence_length, load it "
                         "with from_preset or attach it to a task")
    return int(length)


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1CausalLMPreprocessor(keras_hub.models.CausalLMPreprocessor):
    """Texts → ``({"token_ids", "padding_mask"}, next ids, mask)`` for the LM, and ``generate``'s prompts.

    GPT-1 pre-trained on a plain token stream (no start or end token), so none is added; padding
    uses the pad id and comes last, every output ``sequence_length`` long.

    Args:
        tokenizer: a ``GPT1Tokenizer``.
        sequence_length: the packed length (``from_preset``: the backbone's ``max_sequence_length`` unless given;
            ``GPT1CausalLM`` sets it to its context where it is None). ``call`` and ``generate_preprocess`` take a
            ``sequence_length`` that overrides it.

    Inputs: one string (outputs ``[T]``) or a batch ``[B]`` (outputs ``[B, T]``), eagerly or in ``tf.data``:
    ``ds.map(preprocessor)`` before ``batch`` (then batched) or after it.

    Example:

    ```python
    import gpt_tf, tensorflow as tf
    pre = gpt_tf.GPT1CausalLMPreprocessor.from_preset("gpt1_tiny_books_en", sequence_length=16)
    x, y, sample_weight = pre(["the man walked into the room ."])   # y: x["token_ids"] shifted by one
    x, y, sample_weight = pre("the man walked")                     # one string: x["token_ids"] is [16]
    ds = tf.data.Dataset.from_tensor_slices(["she said", "it was a dark night"]).map(pre).batch(32)
    gpt_tf.GPT1CausalLMPreprocessor.from_preset("gpt1_tiny_books_en").sequence_length   # 128: the backbone's
    ```
    """

    backbone_cls = GPT1Backbone
    tokenizer_cls = GPT1Tokenizer
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, tokenizer, sequence_length=None, **kwargs):
        keras_hub.models.Preprocessor.__init__(self, **kwargs)
        self.packer = None
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length
        self.add_start_token = self.add_end_token = False

    @classmethod
    def _add_missing_kwargs(cls, loader, kwargs):
        return preset_length(loader, super()._add_missing_kwargs(loader, kwargs))

    def build(self, input_shape=None):
        self.built = True  # no packer: `_pack` pads

    def _pack(self, x, length):
        """Strings ``[]`` or ``[B]`` → ``(token_ids, padding_mask)``, ``[length]`` or ``[B, length]``: the ids
        truncated to ``length``, then padded. One string is tokenized as a batch of one (the tokenizer gives a lone
        string's ids dense, a batch's ragged), its outputs taken back out of it."""
        x = tf.convert_to_tensor(x, tf.string)
        if x.shape.rank not in (0, 1):
            raise ValueError(f"{type(self).__name__} takes one string or a batch of them, got shape {x.shape}")
        scalar = x.shape.rank == 0
        ids = self.tokenizer.tokenize(x[tf.newaxis] if scalar else x)[:, :length]
        token_ids = ids.to_tensor(default_value=self.tokenizer.pad_token_id, shape=[None, length])
        mask = tf.sequence_mask(ids.row_lengths(), length)
        return (token_ids[0], mask[0]) if scalar else (token_ids, mask)

    @preprocessing_function
    def call(self, x, y=None, sample_weight=None, sequence_length=None):
        """``(x, y, sample_weight)``: ``x["token_ids"]`` and its mask, the next ids and their mask (``y`` and
        ``sample_weight`` given are replaced, as keras-hub's do)."""
        token_ids, mask = self._pack(x, sequence_length_of(self, sequence_length) + 1)
        x = {"token_ids": token_ids[..., :-1], "padding_mask": mask[..., :-1]}
        return keras.utils.pack_x_y_sample_weight(x, token_ids[..., 1:], mask[..., 1:])

    @preprocessing_function
    def generate_preprocess(self, x, sequence_length=None):
        """Prompts → ``{"token_ids", "padding_mask"}``, padded to ``sequence_length`` (generation's length)."""
        token_ids, mask = self._pack(x, sequence_length_of(self, sequence_length))
        return {"token_ids": token_ids, "padding_mask": mask}

    @preprocessing_function
    def generate_postprocess(self, x):
        ids = tf.ragged.boolean_mask(x["token_ids"], tf.cast(x["padding_mask"], tf.bool))
        return self.tokenizer.detokenize(ids)

    def get_config(self):
        config = keras_hub.models.Preprocessor.get_config(self)
        config.update(sequence_length=self.sequence_length)
        return config
