"""Log-probability of a continuation given a prefix under a language model, batched (the zero-shot primitive).

    scorer = LMScorer(lm, bos_id=separator_id)
    sums, counts = scorer.score([(prefix_ids, continuation_ids), ...])
    # sums[i] = Σ_t log p(continuation_t | bos, prefix, continuation_<t); counts[i] = tokens scored

Each request becomes one sequence ``[bos] + prefix + continuation``; the model reads all but its
last token and every continuation token is scored against the model's prediction at the position
before it. Sequences longer than the model's ``n_ctx + 1`` are cut from the LEFT (the start of the
prefix goes first, e.g. the start of a long RACE article), so the continuation keeps its context
nearest to it; a continuation longer than ``n_ctx + 1`` tokens keeps only its end scored.
``bos_id`` (e.g. the pre-training corpus's document separator) makes the first continuation token
scoreable when the prefix is empty; without it that token is context only and is not counted.

Requests are sorted by length and each batch is padded to a length bucket (the shortest of
``gpt_tf.data.task_batches.bucket_lengths(n_ctx)``, 8, 16, 24, 32, 48, ..., that holds its longest
sequence): batches hold sequences of similar length, and the few fixed shapes let XLA and TPUs
compile once per bucket. One ``tf.function`` with a ``[None, None]`` signature serves them all.
The LM head, the largest matmul (``n_embd × vocabulary``), runs only at the scored positions
(the continuation's tokens, a few of each sequence), not at every position. Log-probabilities are
computed in float32 (also under ``mixed_bfloat16``) with ``sparse_softmax_cross_entropy_with_logits``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from gpt_tf.backend import require_tensorflow
from gpt_tf.gpt1.backbone import token_inputs
from gpt_tf.data.task_batches import bucket_lengths


class LMScorer:
    """Sums of continuation-token log-probabilities under ``lm``.

    ``lm``: a ``GPT1CausalLM`` (its backbone's states, then the tied head at the scored positions
    only) or any callable from keras-hub's inputs ``{"token_ids", "padding_mask"}`` (``token_inputs``) to logits
    ``[B, T, V]`` with a ``config.n_ctx``.
    """

    def __init__(self, lm, bos_id: int | None = None, batch_size: int = 32):
        require_tensorflow("LMScorer (the zero-shot heuristics' scoring, tf.function'd)")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.lm, self.bos_id, self.batch_size = lm, bos_id, batch_size
        backbone = getattr(lm, "backbone", None)
        n_ctx = (backbone.config if backbone is not None else lm.config).n_ctx
        self.max_len = n_ctx + 1  # tokens per sequence: n_ctx inputs, each with its next token
        self.buckets = bucket_lengths(n_ctx)  # model input lengths a batch is padded to
        if backbone is not None and hasattr(backbone, "embed"):
            self._states, self._head = (lambda t: backbone(token_inputs(t), training=False)), backbone.embed.logits
        else:
            self._states, self._head = (lambda t: lm(token_inputs(t), training=False)), (lambda h: h)
        self._scores = tf.function(self._batch_scores, input_signature=[
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.float32)], reduce_retracing=True)

    def _batch_scores(self, tokens, mask):
        """``tokens`` [B, L] and ``mask`` [B, L] (1 on scored tokens) → Σ log p per row [B]."""
        states = self._states(tokens[:, :-1])
        scored = tf.where(mask[:, 1:] > 0)  # [n, 2]: (row, position) of each scored target
        logits = tf.cast(self._head(tf.gather_nd(states, scored)), tf.float32)
        logp = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.gather_nd(tokens[:, 1:], scored),
                                                               logits=logits)
        return tf.math.unsorted_segment_sum(logp, scored[:, 0], tf.shape(tokens)[0])

    def sequence(self, prefix: Sequence[int], continuation: Sequence[int]) -> tuple[list[int], int]:
        """The (left-truncated) token sequence of one request and how many of its tokens are scored."""
        head = ([] if self.bos_id is None else [self.bos_id]) + list(prefix)
        tokens = (head + list(continuation))[-self.max_len:]
        scored = min(len(continuation), len(tokens) - 1)  # the first token of the sequence has no context
        return tokens, scored

    def score(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> tuple[np.ndarray, np.ndarray]:
        """``(sums, counts)``: per request, the summed log-probability of its continuation tokens and their number."""
        sequences = [self.sequence(prefix, continuation) for prefix, continuation in requests]
        for i, (_, scored) in enumerate(sequences):
            if not scored:
                raise ValueError(f"request {i}: no continuation token to score (an empty continuation, or one "
                                 "token with neither a prefix nor a bos_id)")
        sums = np.zeros(len(sequences), np.float64)
        counts = np.array([scored for _, scored in sequences], np.int64)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            longest = max(len(sequences[i][0]) for i in rows) - 1  # model inputs: all tokens but the last
            length = 1 + next(b for b in self.buckets if b >= longest)
            tokens = np.zeros((len(rows), length), np.int32)
            mask = np.zeros((len(rows), length), np.float32)
            for r, i in enumerate(rows):
                seq, scored = sequences[i]
                tokens[r, :len(seq)] = seq
                mask[r, len(seq) - scored:len(seq)] = 1.0
            sums[rows] = self._scores(tf.constant(tokens), tf.constant(mask)).numpy()
        return sums, counts

    def mean_logprobs(self, requests) -> np.ndarray:
        """Average log-probability per continuation token of each request."""
        sums, counts = self.score(requests)
        return sums / np.maximum(counts, 1)
