"""Sampling text from token ids: the command line's ``--mode=generate`` and the training monitor's samples.

A thin caller of the one implementation of generation, ``GPT1CausalLM.generate_step`` (the key/value cache;
``gpt_tf/gpt1/causal_lm.py``), with keras-hub's samplers: greedy at temperature 0, else top-k (``top_k`` 0: the
whole vocabulary) at the given temperature. Only BPE tokens are ever sampled (the special tokens' logits are
masked; unlike the release, whose single embedding matrix also held the position rows, position embeddings live
in their own table and can never be emitted). The model sees at most ``n_ctx`` tokens: a sample longer than the
context continues from the last half-context of what came before (the cache starts again there).
"""

from __future__ import annotations

import keras_hub
import numpy as np


def sampler_for(temperature: float, top_k: int, seed: int):
    """keras-hub's sampler for the command line's flags: greedy at temperature 0, else top-k (0: all tokens)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return keras_hub.samplers.GreedySampler()
    if top_k:
        return keras_hub.samplers.TopKSampler(k=top_k, temperature=temperature, seed=seed)
    return keras_hub.samplers.RandomSampler(temperature=temperature, seed=seed)


class Sampler:
    """``lm`` (a ``GPT1CausalLM``, e.g. pre-training's) sampled from token ids."""

    def __init__(self, lm):
        config = lm.backbone.config
        self.lm, self.vocab_size, self.n_ctx = lm, config.vocab_size, config.n_ctx

    def sample(self, prompt_ids, length: int, temperature: float = 1.0, top_k: int = 40, seed: int = 0) -> list[int]:
        """``length`` new token ids continuing ``prompt_ids`` (which may be empty: then a random first token)."""
        self.lm.use_sampler(sampler_for(temperature, top_k, seed))
        rng = np.random.default_rng(seed)
        ids = [int(i) for i in prompt_ids if 0 <= int(i) < self.vocab_size]
        if not ids:
            ids = [int(rng.integers(self.vocab_size))]  # start from a random token when no prompt
        out = []
        while len(out) < length:
            left = length - len(out)
            context = ids[-max(self.n_ctx // 2, self.n_ctx - left):]
            total = min(len(context) + left, self.n_ctx)
            token_ids = np.zeros((1, total), np.int32)  # past the prompt: written before it is read
            token_ids[0, : len(context)] = context
            mask = np.arange(total)[None, :] < len(context)
            done = self.lm.generate({"token_ids": token_ids, "padding_mask": mask}, stop_token_ids=None)
            new = [int(i) for i in np.asarray(done["token_ids"])[0, len(context):]]
            out += new
            ids += new
        return out
