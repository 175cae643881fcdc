"""Sampling text from a GPT language model.

The model sees at most ``n_ctx`` tokens (older ones slide out). Only BPE tokens are ever
sampled: the special tokens' logits are masked (and, unlike the release, whose single
embedding matrix also held the position rows, position embeddings live in their own table
and can never be emitted).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


class Sampler:
    """Autoregressive sampler with temperature and top-k; one traced function, fixed shapes."""

    def __init__(self, model, vocab_size: int, n_ctx: int):
        self.model, self.vocab_size, self.n_ctx = model, vocab_size, n_ctx
        self._next_logits = tf.function(self._next_logits_impl, reduce_retracing=True)

    def _next_logits_impl(self, window, position):
        logits = tf.cast(self.model(window, training=False), tf.float32)[0, position]
        return logits[: self.vocab_size]  # never a special token

    def sample(self, prompt_ids, length: int, temperature: float = 1.0, top_k: int = 40, seed: int = 0) -> list[int]:
        """Returns ``length`` new token ids continuing ``prompt_ids`` (which may be empty)."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        rng = np.random.default_rng(seed)
        ids = [int(i) for i in prompt_ids if 0 <= int(i) < self.vocab_size]
        if not ids:
            ids = [int(rng.integers(self.vocab_size))]  # start from a random token when no prompt
        out = []
        for _ in range(length):
            context = ids[-self.n_ctx :]
            window = np.zeros((1, self.n_ctx), np.int32)
            window[0, : len(context)] = context
            logits = self._next_logits(tf.constant(window), tf.constant(len(context) - 1)).numpy()
            out.append(self._choose(logits, temperature, top_k, rng))
            ids.append(out[-1])
        return out

    @staticmethod
    def _choose(logits, temperature, top_k, rng) -> int:
        if temperature == 0:
            return int(np.argmax(logits))
        logits = logits.astype(np.float64) / temperature
        if top_k and top_k < logits.size:
            cutoff = np.partition(logits, -top_k)[-top_k]
            logits = np.where(logits < cutoff, -np.inf, logits)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        return int(rng.choice(logits.size, p=probs))
