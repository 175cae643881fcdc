"""Length-bucketed batches of texts in memory (gpt_tf/gpt1/batching.py): ``bucketed`` gives ``fit`` the CLI's epoch
plan (batches of one bucket each, padded to it), ``sorted_batches`` runs ``evaluate`` / ``predict`` sorted by bucket,
and ``restore`` puts predictions back in the caller's order. keras-hub's own ``fit`` / ``predict`` on texts pad each
batch to ``sequence_length`` (keras-hub's one length; the task preprocessor's ``pad_to_bucket`` pads a batch of a
``tf.data`` pipeline to its bucket)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.small_runs import GPT1_TEXTS as TEXTS
from tests.small_runs import gpt1_classifier as _classifier
from tests.small_runs import gpt1_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return gpt1_tokenizer()


def _padded_tokens(lengths, order, batch_size, buckets):
    """Tokens a run of ``order`` in batches of ``batch_size`` costs, each batch padded to its longest's bucket."""
    rows = np.asarray(lengths)[np.asarray(order).reshape(-1, batch_size)]
    return int(sum(batch_size * buckets[np.searchsorted(buckets, row.max())] for row in rows))


def _view_lengths(preprocessor, x):
    """Each example's longest view as the preprocessor builds it (its extract token's position + 1)."""
    from gpt_tf.gpt1.preprocessor import pretokenize

    ids = pretokenize(x, preprocessor.tokenizer, preprocessor.input_type)
    return preprocessor.features(ids, padding="length")["extract_index"].numpy().max(axis=1) + 1


def test_bucketed_batches_are_the_clis_epoch_plan_and_pay_little_padding(tokenizer):
    import gpt_tf
    from gpt_tf.data.task_batches import bucket_lengths, epoch_plan
    from gpt_tf.gpt1 import batching

    rng = np.random.default_rng(0)
    words = np.minimum(rng.geometric(1 / 14, 400), 62)  # SST-2-like: many short, a few long
    texts = [" ".join(["word"] * int(n)) for n in words]
    pre = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=64)
    lengths = _view_lengths(pre, texts)
    batch, per_epoch = 16, 400 // 16
    dataset, steps = batching.bucketed(pre, texts, np.arange(400), batch_size=batch, seed=7)
    assert steps == per_epoch
    batches = list(dataset.take(2 * per_epoch + 3))
    order = np.concatenate([y.numpy() for _, y in batches])  # the labels are the examples' indices
    assert order.shape == ((2 * per_epoch + 3) * batch,)
    buckets = np.asarray(bucket_lengths(64))
    for x, y in batches:  # each batch padded to its longest view's bucket; its features the example's own
        width = int(buckets[np.searchsorted(buckets, lengths[y.numpy()].max())])
        assert x["input_ids"].shape == (batch, 1, width) and x["lm_weights"].shape == (batch, 1, width)
        np.testing.assert_array_equal(x["extract_index"].numpy()[:, 0], lengths[y.numpy()] - 1)
    for epoch in range(2):  # every epoch: N // B batches of distinct examples, in the CLI's plan (epoch_plan)
        seen = order[epoch * per_epoch * batch:(epoch + 1) * per_epoch * batch]
        assert len(set(seen.tolist())) == per_epoch * batch
        index, length = epoch_plan(lengths, tuple(buckets), batch, epoch, 7, training=True)
        np.testing.assert_array_equal(seen, index.numpy().reshape(-1))
        assert [b[0]["input_ids"].shape[2] for b in batches[epoch * per_epoch:(epoch + 1) * per_epoch]] == \
            length.numpy().tolist()
    assert not np.array_equal(order[:per_epoch * batch], order[per_epoch * batch:2 * per_epoch * batch])
    planned = _padded_tokens(lengths, order[:per_epoch * batch], batch, buckets)
    shuffled = _padded_tokens(lengths, rng.permutation(400)[:per_epoch * batch], batch, buckets)
    own_bucket = int(buckets[np.searchsorted(buckets, lengths[order[:per_epoch * batch]])].sum())
    assert planned <= 1.15 * own_bucket < shuffled / 1.5  # about each example's own bucket; far below random batches
    with pytest.raises(ValueError, match="5 examples make no batch of 16"):
        batching.bucketed(pre, texts[:5], np.arange(5), batch_size=batch)


def test_sorted_batches_follow_the_longest_view_the_preprocessor_builds(tokenizer):
    import gpt_tf
    from gpt_tf.data.task_batches import bucket_lengths
    from gpt_tf.gpt1 import batching

    cases = [("single", TEXTS * 3, 64, 0), ("pair", (TEXTS * 3, TEXTS[::-1] * 3), 12, 0),  # 12: pairs truncated
             ("multiple_choice", (TEXTS[:2], [["yes .", "no no no no ."], ["maybe .", "never ."]]), 64, 2)]
    for input_type, x, n_ctx, k in cases:
        pre = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=n_ctx, input_type=input_type, num_choices=k)
        lengths = _view_lengths(pre, x)
        full = pre.features(_fields(pre, x), padding="length")
        buckets = np.asarray(bucket_lengths(n_ctx))
        dataset, order = batching.sorted_batches(pre, x, batch_size=2)
        by_bucket = np.searchsorted(buckets, lengths)
        np.testing.assert_array_equal(order, np.argsort(by_bucket, kind="stable"))  # stable: callers' order within
        done = 0
        for (features,) in dataset:
            rows = order[done:done + len(features["extract_index"])]
            width = int(buckets[by_bucket[rows].max()])
            assert features["input_ids"].shape[2] == width, input_type
            for key in ("input_ids", "lm_weights"):
                np.testing.assert_array_equal(features[key], full[key].numpy()[rows][:, :, :width])
            np.testing.assert_array_equal(features["extract_index"], full["extract_index"].numpy()[rows])
            done += len(rows)
        assert done == len(lengths), input_type
    assert max(_view_lengths(gpt_tf.GPT1TaskPreprocessor(tokenizer, 12, "pair"), cases[1][1])) == 12


def _fields(pre, x):
    from gpt_tf.gpt1.preprocessor import pretokenize

    return pretokenize(x, pre.tokenizer, pre.input_type)


def test_fit_on_bucketed_batches_and_predict_on_sorted_ones_keep_the_callers_order(tokenizer):
    from gpt_tf.gpt1 import batching

    texts = [" ".join(["word"] * n) + " ." for n in (1, 30, 3, 12, 2, 25, 5, 40, 1, 8)]
    labels = [n % 2 for n in range(10)]
    classifier = _classifier(tokenizer)
    pre = classifier.preprocessor
    train, steps = batching.bucketed(pre, texts, labels, batch_size=4, seed=0)
    assert steps == 10 // 4
    classifier.compile(train_steps=2 * steps)
    classifier.fit(train, steps_per_epoch=steps, epochs=2, verbose=0)
    assert int(classifier.optimizer.iterations.numpy()) == 2 * (10 // 4)  # N // B batches an epoch
    assert float(classifier.optimizer.learning_rate) == 0.0  # the schedule ran to its end with the updates
    dev, order = batching.sorted_batches(pre, texts, batch_size=4)
    together = batching.restore(classifier.predict(dev, verbose=0), order)
    alone = np.concatenate([classifier.predict([t], verbose=0) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    scored, _ = batching.sorted_batches(pre, texts, labels, batch_size=4)
    metrics = classifier.evaluate(scored, verbose=0, return_dict=True)
    assert metrics["accuracy"] == pytest.approx(np.mean(together.argmax(-1) == np.asarray(labels)))


def test_keras_hubs_own_fit_predict_and_evaluate_on_texts_and_a_bucketed_tf_data_pipeline(tokenizer):
    """Texts given to keras-hub's ``fit`` / ``predict`` / ``evaluate`` directly (Keras's batches, in the caller's
    order, each padded to ``sequence_length``: keras-hub's grain path fixes the batches' shape from the first ones),
    and the same texts through ``ds.batch(n).map(preprocessor)`` with ``pad_to_bucket=True``, whose batches' widths
    differ: the same predictions as each text alone."""
    import tensorflow as tf

    texts = [" ".join(["word"] * n) + " ." for n in (1, 30, 3, 12, 2, 25, 5, 40, 1, 8)]
    labels = [n % 2 for n in range(10)]
    classifier = _classifier(tokenizer)
    pre = classifier.preprocessor
    alone = np.concatenate([classifier.predict([t], verbose=0) for t in texts])
    np.testing.assert_allclose(classifier.predict(texts, batch_size=4, verbose=0), alone, atol=1e-5)
    metrics = classifier.evaluate(texts, labels, batch_size=4, verbose=0, return_dict=True)
    assert metrics["accuracy"] == pytest.approx(np.mean(alone.argmax(-1) == np.asarray(labels)))
    pre.pad_to_bucket = True
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(4).map(pre)
    widths = [int(x["input_ids"].shape[2]) for x in dataset]
    assert len(set(widths)) > 1 and min(widths) < pre.sequence_length  # each batch its own bucket
    classifier.preprocessor = None  # the features are made: predict takes them as they are
    np.testing.assert_allclose(classifier.predict(dataset, verbose=0), alone, atol=1e-5)
    classifier.preprocessor, pre.pad_to_bucket = pre, False
    classifier.fit(texts, labels, batch_size=4, epochs=1, verbose=0)
    assert int(classifier.optimizer.iterations.numpy()) == 3  # ceil(10 / 4): keras-hub's batches, the last short
