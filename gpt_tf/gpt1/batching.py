"""Length-bucketed batches of texts in memory for ``fit``, ``evaluate`` and ``predict``: the command line's order.

Given texts, keras-hub's ``fit`` batches them in Keras's order and the task's preprocessor pads each batch to its
``sequence_length`` (keras-hub's one length). Even padded to the length bucket of its longest view, 32 random SST-2
phrases are mostly padding: the longest is ~3× the median. ``bucketed`` orders the examples as the command
line's input pipeline does (``gpt_tf.data.task_batches.epoch_plan``): every epoch a random permutation (its last N mod
B examples sit the epoch out), stably sorted by bucket, cut into batches of B, the batches in random order, each
padded to its bucket. ``sorted_batches`` runs evaluation and prediction sorted by bucket, and ``restore`` puts
``predict``'s outputs back in the caller's order. Both tokenize the texts once, by the offline tokenizer.

    train, steps = bucketed(classifier.preprocessor, train_x, train_y, batch_size=32, seed=0)
    classifier.compile(train_steps=3 * steps)          # the paper's schedule over the updates fit will run
    classifier.fit(train, steps_per_epoch=steps, epochs=3)
    dev, order = sorted_batches(classifier.preprocessor, dev_x, batch_size=64)
    logits = restore(classifier.predict(dev), order)
"""

from __future__ import annotations

import numpy as np
from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.data.task_batches import bucket_lengths, epoch_plan
from gpt_tf.gpt1.preprocessor import pretokenize

_EPOCHS = 2**62  # training repeats "forever": fit's steps_per_epoch and epochs decide when to stop


def _features(preprocessor, x):
    """Every example's features padded to ``sequence_length`` (numpy), and its longest view's length."""
    ids = pretokenize(x, preprocessor.tokenizer, preprocessor.input_type)
    # In a graph: the per-example map is a loop there, where eagerly it runs example by example in Python.
    features = tf.function(lambda ids: preprocessor.features(ids, padding="length"))(ids)
    features = {k: v.numpy() for k, v in features.items()}
    return features, features["extract_index"].max(axis=1) + 1


def _batch(features, y, sample_weight, index, length):
    """The examples ``index`` of ``features`` (and ``y``, ``sample_weight``), their views cut to ``length``."""
    x = {k: tf.gather(v, index) for k, v in features.items()}
    x["input_ids"], x["lm_weights"] = x["input_ids"][:, :, :length], x["lm_weights"][:, :, :length]
    return tuple(t for t in (x, None if y is None else tf.gather(y, index),
                             None if sample_weight is None else tf.gather(sample_weight, index)) if t is not None)


def bucketed(preprocessor, x, y=None, batch_size: int = 32, seed: int = 0, sample_weight=None):
    """``(dataset, steps_per_epoch)``: training batches of ``x`` (texts as the task's preprocessor takes them), ``y``
    and ``sample_weight`` in the command line's bucketed order, epoch after epoch without end (pass
    ``steps_per_epoch`` to ``fit``); each epoch a fresh plan from ``seed`` and the epoch number."""
    features, lengths = _features(preprocessor, x)
    steps = len(lengths) // batch_size
    if steps < 1:
        raise ValueError(f"{len(lengths)} examples make no batch of {batch_size}")
    buckets = bucket_lengths(preprocessor.sequence_length)
    y = None if y is None else tf.constant(np.asarray(y))
    sample_weight = None if sample_weight is None else tf.constant(np.asarray(sample_weight))

    def epoch(e):
        index, length = epoch_plan(lengths, buckets, batch_size, e, seed, training=True)
        return tf.data.Dataset.from_tensor_slices((index, length))

    dataset = tf.data.Dataset.range(_EPOCHS).flat_map(epoch)
    return dataset.map(lambda i, n: _batch(features, y, sample_weight, i, n)).prefetch(2), steps


def sorted_batches(preprocessor, x, y=None, batch_size: int = 32):
    """``(dataset, order)``: ``x`` (and ``y``) in batches of examples sorted by length bucket (stable: the given order
    within a bucket), each padded to its bucket; ``order`` the example indices in dataset order (``restore``)."""
    features, lengths = _features(preprocessor, x)
    buckets = np.asarray(bucket_lengths(preprocessor.sequence_length))
    order = np.argsort(np.searchsorted(buckets, lengths), kind="stable")
    y = None if y is None else tf.constant(np.asarray(y)[order])
    features = {k: v[order] for k, v in features.items()}
    starts = np.arange(0, len(order), batch_size)
    ends = np.minimum(starts + batch_size, len(order))
    length = [int(buckets[np.searchsorted(buckets, lengths[order][s:e].max())]) for s, e in zip(starts, ends)]
    dataset = tf.data.Dataset.from_tensor_slices((starts, ends, np.asarray(length, np.int32)))
    dataset = dataset.map(lambda s, e, n: (tf.range(s, e), n))
    return dataset.map(lambda i, n: _batch(features, y, None, i, n)), order


def restore(outputs, order: np.ndarray):
    """``predict``'s outputs, computed in ``order`` (``sorted_batches``), back in the caller's order."""
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    if isinstance(outputs, dict):
        return {k: np.asarray(v)[inverse] for k, v in outputs.items()}
    return np.asarray(outputs)[inverse]
