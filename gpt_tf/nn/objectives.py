"""The training objectives' arithmetic, written once: what pre-training and fine-tuning minimise.

* Eq. 1, the language model's loss: ``token_cross_entropy`` per position, ``TokenCrossEntropy`` as the Keras loss
  (``GPT1CausalLM.compile``'s default), ``lm_loss`` as sums (the held-out evaluation and the scorers add them up).
* Eq. 5's auxiliary term L1 on a fine-tuning batch: ``auxiliary_lm_loss``, the loss ``ExtractStates`` adds in
  training (``gpt_tf/nn/task_head.py``); L2 is the task head's Keras loss (``compile()``'s), L3 = L2 + λ·L1 Keras's
  sum of the two.

Every value is a mean over examples (L1: over views, each view's own mean over its tokens, as the original release
normalises it), so the replicas' losses and accumulated micro-batches' combine as Keras combines any loss: their mean
is the whole batch's. In ``keras.ops``, for every backend; on TensorFlow the cross-entropy runs by
``tf_pieces.token_cross_entropy`` and the LM head only at the real next tokens (``tf_pieces.real_targets``).
"""

from __future__ import annotations

import keras
from keras import ops

from gpt_tf import backend


# ---------------------------------------------------------------------- Eq. 1: the language model
def lm_loss(logits, targets, weights=None):
    """Token cross-entropy (Eq. 1) in float32 as ``(sum_of_losses, sum_of_weights)``: their ratio is the mean over the
    tokens ``weights`` marks (all without it), exact however the tokens are split between calls."""
    losses = token_cross_entropy(logits, targets)
    if weights is None:
        weights = ops.ones_like(losses)
    weights = ops.cast(weights, "float32")
    return ops.sum(losses * weights), ops.sum(weights)


def token_cross_entropy(logits, targets):
    """``-log softmax(logits)[target]`` per position, in float32: ``logits`` [..., V] (any float dtype), int
    ``targets`` [...].

    ``logsumexp(logits) - logits[target]``, the float32 cast inside the reduction: under XLA (JAX) no float32 copy
    of the logits is made, forward or backward, where Keras's sparse cross-entropy writes a float32 log-softmax of
    them all. On TensorFlow the same values and gradient (``softmax - one_hot(target)``) by oneDNN's softmax and a
    written-out gradient, ~3x faster on a CPU and never a log of an underflowed probability
    (``tf_pieces.token_cross_entropy``).
    """
    pieces = backend.tf_pieces()
    if pieces is not None:
        return pieces.token_cross_entropy(ops.cast(logits, "float32"), targets)
    picked = ops.take_along_axis(logits, ops.expand_dims(ops.cast(targets, "int32"), -1), axis=-1)[..., 0]
    return ops.logsumexp(ops.cast(logits, "float32"), axis=-1) - ops.cast(picked, "float32")


@keras.saving.register_keras_serializable(package="gpt_tf")
class TokenCrossEntropy(keras.losses.Loss):
    """Eq. 1's per-token loss (``token_cross_entropy``) as a Keras loss: the language model's ``compile()`` default,
    in place of keras-hub's ``SparseCategoricalCrossentropy(from_logits=True)`` (the same values; the reduction,
    padding weights included, is Keras's)."""

    def __init__(self, name="token_cross_entropy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        return token_cross_entropy(y_pred, y_true)


@keras.saving.register_keras_serializable(package="gpt_tf")
class SquaredError(keras.losses.Loss):
    """The regression head's L2: ``(score - label)²`` per example, then Keras's reduction (the mean over the batch,
    shared out over ``tf.distribute`` replicas). Keras's ``MeanSquaredError`` averages over the last axis, which for
    scores ``[B]`` is the batch itself: a scalar that Keras neither weights per example nor shares out over
    replicas."""

    def __init__(self, name="squared_error", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        return ops.square(ops.cast(y_pred, self.dtype) - ops.cast(y_true, self.dtype))


# ---------------------------------------------------------------------- Eq. 5: fine-tuning's auxiliary LM loss
def auxiliary_lm_loss(embedding, states, token_ids, lm_weights):
    """L1 of Eq. 5 on a batch of rows (views), in float32: each row's mean cross-entropy of its real next tokens,
    averaged over the rows (the release's ``sum(lm_losses·M) / sum(M)`` per sequence, then the batch mean).

    ``states`` ``[R, T, d]``: the final block at every position; ``embedding`` the backbone's ``GPTEmbedding`` (the
    tied LM head, padded in training with ``pad_vocab_to``); ``token_ids`` ``[R, T]``; ``lm_weights`` ``[R, T]``, > 0
    at t where ``token_ids[t + 1]`` is a real token (padding and the last token never count). On TensorFlow the
    head runs at those positions only (``tf_pieces.real_targets``: padding costs no LM-head work); elsewhere at every
    position, the padded ones weighted 0 (static shapes for XLA).
    """
    weights = ops.cast(lm_weights, "float32")
    rows = ops.cast(ops.shape(weights)[0], "float32")
    # each row's tokens weigh 1 / (its real targets · the rows): the sum below is the mean of the rows' means
    scaled = weights / (ops.maximum(ops.sum(weights, axis=-1, keepdims=True), 1.0) * rows)
    pieces = backend.tf_pieces()
    if pieces is not None:  # a shape known at run time: TensorFlow's graphs only
        at_targets, targets, scale = pieces.real_targets(states, token_ids, scaled)
        return ops.sum(token_cross_entropy(embedding.logits(at_targets, training=True), targets) * scale)
    logits = embedding.logits(states[:, :-1], training=True)
    return ops.sum(token_cross_entropy(logits, token_ids[:, 1:]) * scaled[:, :-1])
