"""``GPT1CausalLM``: GPT-1's language model (backbone + tied LM head) as a keras-hub ``CausalLM``.

The project's one language model: what pre-training trains (``gpt_tf.training.lm_objective``, built by
``gpt_tf.gpt1.build.causal_lm_for`` with ``preprocessor=None``: the loop feeds token ids), what the monitor
samples from, what zero-shot scoring, the LM export and the conversions read, and the Python API's
``generate()`` on strings.
"""

from __future__ import annotations

import functools

import keras
import keras_hub
import tensorflow as tf
from keras import ops

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.causal_lm_preprocessor import GPT1CausalLMPreprocessor
from gpt_tf.layers import PACKAGE
from gpt_tf.preset_io import FindsPresets


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1CausalLM(FindsPresets, keras_hub.models.CausalLM):
    """GPT-1's language model (Eq. 1–2): ``{"token_ids", "padding_mask"}`` → next-token logits
    ``[B, T, vocabulary_size]``; ``generate()`` takes and returns strings.

    Generation samples with the ``sampler`` given to ``compile`` (keras-hub's, default top-k) and
    never picks a special token (they are not text). Each new token runs the backbone over the
    sequence so far, its last block at that position only (no key/value cache: GPT-1 models are
    small and their context short). GPT-1 has no end token: generation runs to ``max_length``
    unless ``stop_token_ids`` are given.

    Example:

    ```python
    import gpt_tf
    lm = gpt_tf.GPT1CausalLM.from_preset("gpt1_tiny_books_en")
    lm.generate("the man walked into the room and", max_length=24)
    lm.compile(sampler="greedy")
    lm.generate(["it was a dark night", "she said"], max_length=16)
    ```
    """

    backbone_cls = GPT1Backbone
    preprocessor_cls = GPT1CausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, compile=True, **kwargs):  # pylint: disable=redefined-builtin
        super().__init__(compile=False, **kwargs)
        if preprocessor is not None and preprocessor.sequence_length is None:
            preprocessor.sequence_length = backbone.config.n_ctx
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.dtype_policy = backbone.dtype_policy
        self.built = True
        if compile:
            self.compile()

    def call(self, inputs, training=False):
        token_ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        return self.backbone.embed.logits(self.backbone(token_ids, training=training))

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", sampler="top_k", **kwargs):
        kwargs.setdefault("jit_compile", False)
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, sampler=sampler, **kwargs)

    def generate(self, inputs, max_length=None, stop_token_ids=None, strip_prompt=False):
        """Continues each prompt to ``max_length`` tokens (default: the model's context); strings in, strings out."""
        n_ctx = self.backbone.config.n_ctx
        if max_length is not None and max_length > n_ctx:
            raise ValueError(f"max_length={max_length} is longer than the model's context ({n_ctx})")
        return super().generate(inputs, max_length=max_length, stop_token_ids=stop_token_ids, strip_prompt=strip_prompt)

    def generate_step(self, inputs, stop_token_ids=None):
        token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
        config = self.backbone.config
        batch = ops.shape(token_ids)[0]
        never = tf.concat([tf.zeros([config.vocab_size]), tf.fill([config.n_special], -1e9)], 0)  # no special token

        def next(prompt, cache, index):  # pylint: disable=redefined-builtin
            positions = tf.fill([batch], tf.cast(index - 1, tf.int32))
            state = self.backbone(prompt, positions=positions)[:, 0]
            logits = tf.cast(self.backbone.embed.logits(state), tf.float32) + never
            return logits, state, cache

        row_lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=-1)
        token_ids = self.sampler(next=next, prompt=token_ids, cache=None, index=ops.min(row_lengths),
                                 mask=padding_mask, stop_token_ids=stop_token_ids, hidden_states=None, model=self)
        if stop_token_ids is not None:  # generated positions holding a stop token
            stops = [ops.equal(token_ids, stop) for stop in stop_token_ids]
            ends = ops.cast(ops.logical_and(functools.reduce(ops.logical_or, stops), ops.logical_not(padding_mask)),
                            "int32")
            padding_mask = ops.logical_not(ops.cast(ops.cumsum(ends, axis=-1) - ends, "bool"))
        else:
            padding_mask = ops.ones_like(token_ids, dtype="bool")
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def get_config(self):
        return keras_hub.models.Task.get_config(self)
