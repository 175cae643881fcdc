"""``fit`` / ``evaluate`` / ``predict`` on texts in memory feed the CLI's length buckets (gpt_tf/gpt1/batching.py):
planned training batches of one bucket each, evaluation sorted by bucket, predictions back in the caller's order."""

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


def test_fit_order_is_the_clis_epoch_plan_and_pays_little_padding():
    from gpt_tf.gpt1 import batching
    from gpt_tf.data.task_batches import bucket_lengths

    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(1 / 14, 400) + 2, 64).astype(np.int32)  # SST-2-like: many short, a few long
    batch, per_epoch = 16, 400 // 16
    order = batching.fit_order(lengths, 64, batch, 2 * per_epoch + 3, seed=7)
    assert order.shape == ((2 * per_epoch + 3) * batch,)
    for epoch in range(2):  # every epoch: N // B batches of distinct examples
        seen = order[epoch * per_epoch * batch:(epoch + 1) * per_epoch * batch]
        assert len(set(seen.tolist())) == per_epoch * batch
    assert not np.array_equal(order[:per_epoch * batch], order[per_epoch * batch:2 * per_epoch * batch])
    buckets = np.asarray(bucket_lengths(64))
    planned = _padded_tokens(lengths, order[:per_epoch * batch], batch, buckets)
    shuffled = _padded_tokens(lengths, rng.permutation(400)[:per_epoch * batch], batch, buckets)
    own_bucket = int(buckets[np.searchsorted(buckets, lengths[order[:per_epoch * batch]])].sum())
    assert planned <= 1.15 * own_bucket < shuffled / 1.5  # about each example's own bucket; far below random batches
    assert batching.fit_order(lengths[:5], 64, batch, 3, seed=0).size == 0  # no full batch: nothing planned


def test_lengths_are_the_longest_view_the_preprocessor_builds(tokenizer):
    import gpt_tf
    from gpt_tf.gpt1 import batching
    from gpt_tf.gpt1.preprocessor import pretokenize

    cases = [("single", TEXTS, 64, 0), ("pair", (TEXTS, TEXTS[::-1]), 12, 0),  # 12: the pairs are truncated
             ("multiple_choice", (TEXTS[:2], [["yes .", "no no no no ."], ["maybe .", "never ."]]), 64, 2)]
    for input_type, x, n_ctx, k in cases:
        preprocessor = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=n_ctx, input_type=input_type,
                                                   num_choices=k)
        ids = pretokenize(x, tokenizer, input_type)
        built = preprocessor.features(ids)["extract_index"].numpy().max(axis=1) + 1
        assert batching.lengths(ids, input_type, n_ctx).numpy().tolist() == built.tolist(), input_type
    assert max(batching.lengths(pretokenize(cases[1][1], tokenizer, "pair"), "pair", 12).numpy()) == 12


def test_fit_runs_the_planned_batches_and_predict_keeps_the_callers_order(tokenizer, monkeypatch):
    texts = [" ".join(["word"] * n) + " ." for n in (1, 30, 3, 12, 2, 25, 5, 40, 1, 8)]
    labels = [n % 2 for n in range(10)]
    classifier = _classifier(tokenizer)
    features, padding = classifier.preprocessor.features, []

    def recorded(fields, **kwargs):  # how fit / predict / evaluate have their batches padded
        padding.append(kwargs.get("pad_to_bucket"))
        return features(fields, **kwargs)

    monkeypatch.setattr(classifier.preprocessor, "features", recorded)
    classifier.fit(texts, labels, batch_size=4, epochs=2, verbose=0)
    assert int(classifier.optimizer.iterations.numpy()) == 2 * (10 // 4)  # planned: N // B batches an epoch
    together = classifier.predict(texts, batch_size=4, verbose=0)
    alone = np.concatenate([classifier.predict([t], verbose=0) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    metrics = classifier.evaluate(texts, labels, batch_size=4, verbose=0, return_dict=True)
    assert metrics["accuracy"] == pytest.approx(np.mean(together.argmax(-1) == np.asarray(labels)))
    assert padding and set(padding) == {True}  # each batch to its bucket: the explicit choice of the task's path
