"""The training objectives' arithmetic, written once: what pre-training and fine-tuning minimise.

* Eq. 1, the language model's loss: ``lm_loss`` (sums over tokens, for exact averaging across replicas and
  micro-batches) on ``token_cross_entropy`` (on TensorFlow, its cross-entropy rewritten for speed and memory).
* Eq. 5, fine-tuning's L3 = L2 + λ·L1 on one batch: ``task_loss`` (L2 the task's cross-entropy or squared
  error, L1 the auxiliary LM loss at the real next tokens only).
* Fine-tuning's update: ``global_counts`` (the global batch's examples and LM tokens, all-reduced once per
  replica) and ``finetune_update_loss`` (Eq. 5 normalised by them, so the replicas' and micro-batches'
  gradients sum to the global batch's). The CLI's loop (``gpt_tf.training.task_objective.Finetuner``) and the
  keras-hub tasks' ``fit`` (``GPT1TaskMixin.train_step``) both call these two, so they make the same update;
  ``finetune_loss`` is the value both report and the tasks' ``compute_loss``.

In ``keras.ops``, for every backend, but ``global_counts`` (``tf.distribute``'s all-reduce: TensorFlow's loop and
``fit``); the other backends' ``fit`` takes Keras's own train step, each batch normalised by its own counts.
"""

from __future__ import annotations

import keras
from keras import ops

from gpt_tf import backend
from gpt_tf.tasks import as_task_spec


# ---------------------------------------------------------------------- Eq. 1: the language model
def lm_loss(logits, targets, weights=None):
    """Mean token cross-entropy (Eq. 1), computed in float32; ``weights`` masks tokens (e.g. padding).

    Returns ``(sum_of_losses, sum_of_weights)`` so callers can average across replicas and
    micro-batches exactly.
    """
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


# ---------------------------------------------------------------------- Eq. 5: fine-tuning
def task_loss(task, outputs, features, label, lm_coef) -> dict:
    """Eq. 5, L3 = L2 + λ·L1, in float32, for one (per-replica) batch.

    ``outputs``: a keras-hub task's ``task_outputs`` (``gpt_tf/gpt1/task.py``). Returns ``total``, ``task`` (L2: mean
    cross-entropy for classification/choice, mean squared error for regression) and ``lm`` (L1:
    ``sum(CE·lm_weights) / sum(lm_weights)`` with targets ``input_ids[..., t+1]``; padding never counts).
    For exact averaging across replicas and micro-batches it also returns the sums behind the means:
    ``task_sum`` and ``examples`` (so ``task = task_sum / examples``) and ``lm_sum`` and ``lm_tokens``
    (``lm = lm_sum / lm_tokens``, 0 when there are no tokens); ``finetune_loss`` divides them by the
    global batch's counts instead. With ``lm_coef == 0`` the LM term is skipped and ``outputs`` need not
    hold ``"lm"``; outputs of ``with_lm="targets"`` give the same L1 from the real targets alone.
    """
    task_sum, examples = _task_loss_sum(as_task_spec(task).head, outputs["task"], label)
    if lm_coef:
        if "lm" not in outputs:
            raise ValueError("lm_coef is non-zero but outputs lack 'lm' (run task_outputs with with_lm=True)")
        if "lm_targets" in outputs:
            lm_sum, lm_tokens = lm_loss(outputs["lm"], outputs["lm_targets"], outputs["lm_target_weights"])
        else:
            input_ids = ops.convert_to_tensor(features["input_ids"], "int32")
            weights = ops.cast(features["lm_weights"], "float32")[..., :-1]
            lm_sum, lm_tokens = lm_loss(outputs["lm"][..., :-1, :], input_ids[..., 1:], weights)
    else:
        lm_sum, lm_tokens = ops.zeros((), "float32"), ops.zeros((), "float32")
    task_mean = task_sum / examples
    lm_mean = lm_sum / ops.maximum(lm_tokens, 1e-9)
    return {
        "total": task_mean + float(lm_coef) * lm_mean,
        "task": task_mean,
        "lm": lm_mean,
        "task_sum": task_sum,
        "examples": examples,
        "lm_sum": lm_sum,
        "lm_tokens": lm_tokens,
    }


def _task_loss_sum(head: str, task_out, label):
    """Sum over the batch of the per-example L2 terms, and the number of examples (float32)."""
    task_out = ops.cast(task_out, "float32")
    if head == "regression":
        losses = ops.square(task_out - ops.cast(label, "float32"))
    else:  # classification over classes, choice over the K candidates
        losses = keras.losses.sparse_categorical_crossentropy(ops.cast(label, "int32"), task_out, from_logits=True)
    return ops.sum(losses), ops.cast(ops.shape(losses)[0], "float32")


def global_counts(features, label, lm_coef) -> dict:
    """In a replica: the global batch's ``examples`` and LM target ``lm_tokens`` (at least 1), each summed over
    the replicas by one all-reduce. They carry no gradient; taken from the features before any micro-batch
    runs, they make every replica's and micro-batch's loss a share of the global batch's (``finetune_loss``).
    TensorFlow's (``tf.distribute``): the CLI's loop and the tasks' ``fit`` on TensorFlow."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ctx = tf.distribute.get_replica_context()
    lm = tf.reduce_sum(tf.cast(features["lm_weights"], tf.float32)) if lm_coef else tf.constant(0.0)
    return {"examples": ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.shape(label)[0], tf.float32)),
            "lm_tokens": tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, lm), 1.0)}


def finetune_loss(task, outputs, features, label, lm_coef, counts=None):
    """``(loss, parts)``: Eq. 5 (``task_loss``'s ``parts``) as a loss. With ``counts`` (``global_counts``) it is
    ``task_sum / examples + λ·lm_sum / lm_tokens`` over the GLOBAL batch, what an update minimises on each
    replica (the replicas' gradients then sum to the global batch's); without, this batch's ``total``."""
    parts = task_loss(task, outputs, features, label, lm_coef)
    if counts is None:
        return parts["total"], parts
    return parts["task_sum"] / counts["examples"] + lm_coef * (parts["lm_sum"] / counts["lm_tokens"]), parts


def finetune_update_loss(task_model, task, features, label, counts, lm_coef):
    """``(loss, parts, outputs)`` of one training pass of ``task_model`` (a keras-hub task of the family: its
    ``task_outputs``) over a (micro-)batch:
    the LM head only at the real next tokens (``with_lm="targets"``) and only when λ > 0, then
    ``finetune_loss`` with the global batch's ``counts``. Call it under the gradient tape."""
    outputs = task_model.task_outputs(features, training=True, with_lm="targets" if lm_coef else False)
    loss, parts = finetune_loss(task, outputs, features, label, lm_coef, counts)
    return loss, parts, outputs
