"""``GPT1CausalLM``: GPT-1's language model (backbone + tied LM head) as a keras-hub ``CausalLM``.

The project's one language model: what pre-training trains (``gpt_tf.training.lm_objective``, built by
``gpt_tf.gpt1.build.causal_lm_for`` with ``preprocessor=None``: the loop feeds token ids), what zero-shot scoring,
the LM export and the conversions read, and the one implementation of generation: ``generate()`` on strings, the
command line's ``--mode=generate`` and the training monitor's samples (``gpt_tf/gpt1/generate.py``) and the served
model's ``generate`` signature (``serving/lm_module.py``) all run ``generate_step``, on every Keras backend.

Generation follows keras-hub's convention: ``call_with_cache`` runs tokens through the blocks, each attention layer
taking and returning its key/value cache, ``_build_cache`` fills the cache from the prompt, and ``generate_step``
samples one token per step with the ``sampler`` given to ``compile`` (or ``use_sampler``), running only the new
token through the blocks. Its loop is written in core ops (a select, not XLA's dynamic update), so the exported
signature runs in stock TF Serving.
"""

from __future__ import annotations

import functools

import keras
import keras_hub
from keras import ops

from gpt_tf import backend
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.causal_lm_preprocessor import GPT1CausalLMPreprocessor
from gpt_tf.nn.layers import PACKAGE
from gpt_tf.nn.objectives import TokenCrossEntropy
from gpt_tf.convert.hf import FROM_PRESET


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1CausalLM(keras_hub.models.CausalLM):
    """GPT-1's language model (Eq. 1–2): ``{"token_ids", "padding_mask"}`` → next-token logits
    ``[B, T, vocabulary_size]``; ``generate()`` takes and returns strings. In training with the backbone's
    ``pad_vocabulary_to`` > 1 the logits are ``[B, T, padded]``, the columns past ``vocabulary_size`` -1e9
    (``GPTEmbedding.logits``; the loss reads them as it reads the real width); outside training, and so in
    generation, they are never padded.

    Generation samples with the ``sampler`` given to ``compile`` (keras-hub's, default top-k; one that picks one
    token per step: greedy, top-k, top-p, random) and never picks a special token (they are not text). A key/value
    cache holds every position's keys and values, so each new token runs through the blocks alone
    (``generate_step(use_cache=False)`` runs the sequence so far instead, the last block at the new position only:
    the same tokens under greedy sampling, slower). GPT-1 has no end token: generation runs to ``max_length``
    unless ``stop_token_ids`` are given. ``max_length`` is at most the model's context.

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
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, backbone, preprocessor=None, **kwargs):
        # === Layers ===
        if preprocessor is not None and preprocessor.sequence_length is None:
            preprocessor.sequence_length = backbone.max_sequence_length
        self.backbone = backbone
        self.preprocessor = preprocessor
        # === Functional model: the backbone, then the LM head tied to its token table ===
        inputs = backbone.input
        outputs = backbone.embed(backbone(inputs), reverse=True)
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", sampler="top_k", **kwargs):
        """keras-hub's ``CausalLM.compile``; ``loss="auto"`` is Eq. 1's ``TokenCrossEntropy`` (keras-hub's sparse
        cross-entropy's values, without a float32 log-softmax of every logit)."""
        if loss == "auto":
            loss = TokenCrossEntropy()
        if backend.on_tensorflow():  # no XLA on TensorFlow: the fused kernels and the exported graphs are plain ops
            kwargs.setdefault("jit_compile", False)
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, sampler=sampler, **kwargs)

    def use_sampler(self, sampler) -> None:
        """Generation's sampler (a name or a ``keras_hub.samplers.Sampler``), as ``compile(sampler=...)`` sets it,
        without compiling for training (the command line's and the training monitor's models; the export)."""
        self.sampler = keras_hub.samplers.get(sampler)
        self.generate_function = None
        if backend.on_tensorflow():
            self.jit_compile = False

    def generate(self, inputs, max_length=None, stop_token_ids=None, strip_prompt=False):
        """Continues each prompt to ``max_length`` tokens (default: the model's context); strings in, strings out."""
        n_ctx = self.backbone.max_sequence_length
        if max_length is not None and max_length > n_ctx:
            raise ValueError(f"max_length={max_length} is longer than the model's context ({n_ctx})")
        return super().generate(inputs, max_length=max_length, stop_token_ids=stop_token_ids, strip_prompt=strip_prompt)

    # ------------------------------------------------------------------ generation
    def call_with_cache(self, token_ids, cache, cache_update_index):
        """``(logits, hidden_states, cache)`` of ``token_ids`` at positions from ``cache_update_index`` on.

        ``cache``: each block's ``(keys, values)``, each ``[batch, num_heads, cache_length, head_dim]`` (keras-hub
        stacks them in one tensor; apart, a step copies the cache once instead of four times), or None with
        ``cache_update_index`` 0: a new cache of ``token_ids`` (``[batch, cache_length]``). With a cache,
        ``token_ids`` is one token per row, written at ``cache_update_index``."""
        backbone = self.backbone
        h = backbone.embed(token_ids, start_index=cache_update_index)
        caches = []
        for i, block in enumerate(backbone.blocks):
            h, block_cache = block(h, cache=None if cache is None else cache[i], cache_update_index=cache_update_index)
            caches.append(block_cache)
        return backbone.embed.logits(h), h, tuple(caches)

    def _build_cache(self, token_ids, padding_mask=None):
        """The prompt's ``(hidden_states, cache)``: every position of ``token_ids`` run once. With
        ``padding_mask`` (not on JAX, whose compiled loop takes static shapes only), only the positions up to the
        longest prompt: the cache past them is zeros, and generation writes each position before it is read (a
        prompt of 32 for 512 tokens runs 32 positions, not 512); ``hidden_states`` are then the prompt's only."""
        if padding_mask is None or keras.config.backend() == "jax":
            _, hidden_states, cache = self.call_with_cache(token_ids, None, 0)
            return hidden_states, cache
        batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        prompt = ops.maximum(ops.max(ops.sum(ops.cast(padding_mask, "int32"), axis=-1)), 1)
        _, hidden_states, cache = self.call_with_cache(ops.slice(token_ids, [0, 0], [batch, prompt]), None, 0)

        def padded(t):  # [batch, heads, prompt, head] -> [batch, heads, length, head]
            t = ops.pad(t, [[0, 0], [0, 0], [0, length - prompt], [0, 0]])
            return ops.reshape(t, (batch, t.shape[1], length, t.shape[3]))

        return hidden_states, tuple((padded(k), padded(v)) for k, v in cache)

    def generate_step(self, inputs, stop_token_ids=None, use_cache=True):
        """keras-hub's generation function for one batch ``{"token_ids", "padding_mask"}`` (prompts padded to the
        length to generate to); with ``use_cache=False`` each step runs the sequence so far (see the class doc)."""
        token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
        sampler = self.sampler
        if type(sampler).__call__ is not keras_hub.samplers.Sampler.__call__:
            raise ValueError(f"{type(sampler).__name__} is not supported: GPT1CausalLM samples one token per step "
                             "(greedy, top_k, top_p or random)")
        backbone = self.backbone
        n_special = backbone.num_special_tokens
        batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        never = ops.concatenate([ops.zeros([backbone.vocabulary_size - n_special]), ops.full([n_special], -1e9)])

        if use_cache and self.backbone.supports_cache:
            _, cache = self._build_cache(token_ids, padding_mask)

            def next_logits(prompt, cache, index):
                step = ops.slice(prompt, [0, index - 1], [batch, 1])
                logits, _, cache = self.call_with_cache(step, cache, index - 1)
                return logits[:, 0], cache
        else:
            cache = ()

            def next_logits(prompt, cache, index):
                state = self.backbone.states(prompt, positions=ops.full([batch], index - 1, "int32"))
                return self.backbone.embed.logits(state)[:, 0], cache

        mask = ops.cast(padding_mask, "bool")
        positions = ops.arange(length)

        def body(prompt, cache, index):
            logits, cache = next_logits(prompt, cache, index)
            token = sampler.get_next_token(sampler.compute_probabilities(ops.cast(logits, "float32") + never))
            at = positions == index
            prompted = ops.any(ops.logical_and(mask, at), axis=-1)  # the prompt goes on here: keep its token
            current = ops.sum(ops.where(at, prompt, 0), axis=-1)
            token = ops.where(prompted, current, ops.cast(token, prompt.dtype))
            return ops.where(at, token[:, None], prompt), cache, index + 1  # core ops: a select, not XLA's update

        def cond(prompt, cache, index):
            if stop_token_ids is None:
                return ops.convert_to_tensor(True, dtype="bool")
            stopped = ops.logical_and(_any_equal(prompt, stop_token_ids), ops.logical_not(mask))
            return ops.logical_not(ops.all(ops.any(stopped, axis=-1)))

        index = ops.cast(ops.min(ops.sum(ops.cast(mask, "int32"), axis=-1)), "int32")
        token_ids, _, _ = sampler.run_loop(cond, body, model=self, loop_vars=(token_ids, cache, index),
                                           maximum_iterations=length - index)
        if stop_token_ids is not None:  # generated positions holding a stop token
            ends = ops.cast(ops.logical_and(_any_equal(token_ids, stop_token_ids), ops.logical_not(mask)), "int32")
            padding_mask = ops.logical_not(ops.cast(ops.cumsum(ends, axis=-1) - ends, "bool"))
        else:
            padding_mask = ops.ones_like(token_ids, dtype="bool")
        return {"token_ids": token_ids, "padding_mask": padding_mask}



def _any_equal(token_ids, stop_token_ids):
    """Where ``token_ids`` holds one of ``stop_token_ids``."""
    return functools.reduce(ops.logical_or, [ops.equal(token_ids, stop) for stop in stop_token_ids])
