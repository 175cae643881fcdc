"""Reference points for held-out perplexity: the unigram model of the training tokens.

A language model that has learnt anything about context must beat the perplexity of the
add-one-smoothed unigram distribution estimated on the training split; the demo and the
README report both, measured on the same held-out tokens.
"""

from __future__ import annotations

import math

import numpy as np

from gpt_tf.data.reader import pretraining_dataset


def _token_counts(data_dir: str, split: str, n_ctx: int, vocab_size: int, batch_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, np.int64)
    dataset = pretraining_dataset(data_dir, split, batch_size=batch_size, n_ctx=n_ctx, shuffle=False, repeat=False)
    for _, targets in dataset.as_numpy_iterator():
        counts += np.bincount(targets.ravel(), minlength=vocab_size)[:vocab_size]
    return counts


def unigram_perplexity(data_dir: str, n_ctx: int, vocab_size: int) -> dict:
    """Perplexity on the held-out targets of the add-one unigram model fitted to the train targets.

    Scores every held-out sequence (``Pretrainer.evaluate`` drops the last partial batch, so its
    token count can be slightly smaller; both counts are reported).
    """
    train = _token_counts(data_dir, "train", n_ctx, vocab_size, batch_size=256)
    valid = _token_counts(data_dir, "valid", n_ctx, vocab_size, batch_size=1)
    log_p = np.log((train + 1) / (train.sum() + vocab_size))
    tokens = int(valid.sum())
    if not tokens:
        raise ValueError(f"no held-out tokens in {data_dir}")
    return {"unigram_perplexity": math.exp(-float((valid * log_p).sum()) / tokens), "unigram_tokens": tokens}
