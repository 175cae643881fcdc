"""The order in which ``fit`` / ``evaluate`` / ``predict`` feed in-memory examples: the CLI's length buckets.

The tasks' ``preprocess_samples`` has the preprocessor pad each batch keras-hub forms to the bucket of its
longest view (``pad_to_bucket=True``; called alone, it pads to ``sequence_length``). That alone saves little when a
batch is 32 examples drawn at random: its longest SST-2 phrase is ~3× the median. So, as the CLI's
input pipeline does (``gpt_tf.data.task_batches``), ``fit`` orders the examples by ``epoch_plan``: each
epoch a random permutation (its last N mod B examples sit the epoch out), stably sorted by bucket,
cut into batches of B, the batches in random order. Evaluation and prediction run the examples
sorted by bucket, and ``predict`` puts its outputs back in the caller's order.

Everything here works on the token ids ``pretokenize`` gives (``{field: ragged int32}``).
"""

from __future__ import annotations

import numpy as np
from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.gpt1.preprocessor import CHOICES
from gpt_tf.tasks import INPUT_FIELDS
from gpt_tf.data.task_batches import bucket_lengths, epoch_plan
from gpt_tf.data.transforms import view_lengths


def plannable(x) -> bool:
    """Texts as token ids in memory (what ``pretokenize`` returns), not features nor a dataset."""
    return (isinstance(x, dict) and "input_ids" not in x
            and all(isinstance(v, (tf.RaggedTensor, tf.Tensor)) for v in x.values()))


def lengths(x: dict, input_type: str, n_ctx: int) -> tf.Tensor:
    """Each example's longest view after truncation (``gpt_tf.data.transforms.view_lengths``): int32 [N]."""
    names = INPUT_FIELDS[input_type]

    def count(ids):
        ids = ids if isinstance(ids, tf.RaggedTensor) else tf.RaggedTensor.from_tensor(ids)
        return tf.cast(ids.row_lengths(axis=ids.ragged_rank), tf.int32)

    a = count(x[names[0]])
    b = count(x[names[1]]) if len(names) > 1 else tf.zeros_like(a)
    if input_type != "multiple_choice":
        return view_lengths(input_type, a, b, n_ctx)
    choices = count(x[CHOICES])
    return view_lengths(input_type, a, b, n_ctx, choices.to_tensor() if isinstance(choices, tf.RaggedTensor)
                        else choices)


def fit_order(lengths_: tf.Tensor, n_ctx: int, batch_size: int, batches: int, seed: int) -> np.ndarray:
    """Example indices for ``batches`` training batches of ``batch_size``, epoch after epoch of ``epoch_plan``
    (``[batches * batch_size]``); empty if there are fewer examples than one batch."""
    per_epoch = int(tf.size(lengths_)) // batch_size
    if per_epoch < 1:
        return np.zeros([0], np.int64)
    buckets = bucket_lengths(n_ctx)
    plans = [epoch_plan(lengths_, buckets, batch_size, epoch, seed, training=True)[0]
             for epoch in range(-(-batches // per_epoch))]
    return np.concatenate([p.numpy().reshape(-1) for p in plans])[: batches * batch_size]


def sorted_order(lengths_: tf.Tensor, n_ctx: int) -> np.ndarray:
    """The examples sorted by bucket (stable: the given order within a bucket), for evaluation and prediction."""
    bucket = tf.searchsorted(tf.constant(bucket_lengths(n_ctx), tf.int32), lengths_, side="left")
    return tf.argsort(bucket, stable=True).numpy()


def take(value, order: np.ndarray):
    """``value`` (a tensor, ragged tensor, array, dict of them or None) at the example indices ``order``."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {k: take(v, order) for k, v in value.items()}
    if isinstance(value, (tf.Tensor, tf.RaggedTensor)):
        return tf.gather(value, order)
    return np.asarray(value)[order]


def restore(outputs, order: np.ndarray):
    """``predict``'s outputs, computed in ``order``, back in the caller's order."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    if isinstance(outputs, dict):
        return {k: np.asarray(v)[inverse] for k, v in outputs.items()}
    return np.asarray(outputs)[inverse]
