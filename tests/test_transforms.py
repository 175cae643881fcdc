"""Fine-tuning data, (1): the input transformations of §3.3 on hand-made records (gpt_tf/data/transforms.py)."""

import random

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.tasks import TaskSpec, get_task
from pipelines import finetune_data as fd
from gpt_tf.data import transforms

SPECIAL = {"start": 100, "delimiter": 101, "extract": 102, "pad": 103}
S, D, E, P = 100, 101, 102, 103
MC3 = TaskSpec("mc3", "multiple_choice", "choice", ("1", "2", "3"), ("accuracy",), num_choices=3)


def transform(task, a, b=(), choices=(), label=1.0, n_ctx=12):
    """Hand-made tokens -> record -> numpy (input_ids, extract_index, lm_weights, label)."""
    rec = {"guid": "g", "tokens_a": list(a), "tokens_b": list(b), "label": label,
           "choice_tokens": [t for c in choices for t in c], "choice_lengths": [len(c) for c in choices]}
    feats, lab = transforms.transform_record(task, transforms.parse_record(fd.serialize(rec)), n_ctx, SPECIAL)
    return feats["input_ids"].numpy(), feats["extract_index"].numpy(), feats["lm_weights"].numpy(), lab.numpy()


def padded(tokens, n_ctx=12):
    return list(tokens) + [P] * (n_ctx - len(tokens))


def test_single_layout_extract_and_lm_weights():
    ids, ext, w, label = transform(get_task("sst2"), [1, 2, 3], label=1.0)
    assert ids.tolist() == [padded([S, 1, 2, 3, E])]
    assert ext.tolist() == [4] and label == 1 and label.dtype == np.int32
    # weight t = 1 iff input_ids[t + 1] is a real token: targets 1, 2, 3, <e>; never padding.
    assert w.tolist() == [[1, 1, 1, 1] + [0] * 8]


def test_pair_layout():
    ids, ext, w, _ = transform(get_task("rte"), [1, 2], [3, 4, 5], label=0.0)
    assert ids.tolist() == [padded([S, 1, 2, D, 3, 4, 5, E])]
    assert ext.tolist() == [7] and w[0].tolist() == [1] * 7 + [0] * 5


@pytest.mark.parametrize("a,b", [([1, 2], [3, 4, 5]), ([7, 8, 9], [6])])
def test_pair_symmetric_has_both_orders(a, b):
    ids, ext, w, _ = transform(get_task("mrpc"), a, b)
    assert ids.tolist() == [padded([S, *a, D, *b, E]), padded([S, *b, D, *a, E])]
    n = len(a) + len(b) + 2
    assert ext.tolist() == [n, n] and w.sum(axis=1).tolist() == [n, n]


def test_multiple_choice_three_candidates():
    ids, ext, w, label = transform(MC3, [1, 2], [3], [[10], [11, 12], [13, 14, 15]], label=2.0, n_ctx=10)
    assert ids.tolist() == [padded([S, 1, 2, 3, D, 10, E], 10), padded([S, 1, 2, 3, D, 11, 12, E], 10),
                            padded([S, 1, 2, 3, D, 13, 14, 15, E], 10)]
    assert ext.tolist() == [6, 7, 8] and label == 2
    assert w.tolist() == [[1.0] * k + [0.0] * (10 - k) for k in (6, 7, 8)]


def test_full_length_view_has_zero_weight_at_last_position_and_no_padding():
    ids, ext, w, _ = transform(get_task("sst2"), list(range(1, 11)), n_ctx=12)
    assert ids[0].tolist() == [S, *range(1, 11), E] and ext[0] == 11
    assert w[0, -1] == 0 and w[0].sum() == 11


def test_regression_label_is_float_and_unlabelled_is_minus_one():
    *_, label = transform(get_task("stsb"), [1], [2], label=3.25)
    assert label.dtype == np.float32 and label == pytest.approx(3.25)
    *_, label = transform(get_task("rte"), [1], [2], label=None)
    assert label == -1


def test_truncation_never_cuts_the_hypothesis():
    premise, hyp = list(range(1, 41)), [50, 51, 52]
    ids, ext, w, _ = transform(get_task("rte"), premise, hyp, n_ctx=10)
    assert ids[0].tolist() == [S, 1, 2, 3, 4, D, 50, 51, 52, E]  # premise cut from the right
    assert ext[0] == 9 and w[0, -1] == 0 and w[0].sum() == 9


def test_single_keeps_the_beginning():
    ids, *_ = transform(get_task("cola"), list(range(1, 30)), n_ctx=8)
    assert ids[0].tolist() == [S, 1, 2, 3, 4, 5, 6, E]


def test_second_part_cut_only_as_a_last_resort():
    ids, *_ = transform(get_task("rte"), [1, 2, 3], list(range(50, 70)), n_ctx=10)
    assert ids[0].tolist() == [S, D, 50, 51, 52, 53, 54, 55, 56, E]


def test_symmetric_views_are_built_from_one_truncation():
    ids, *_ = transform(get_task("qqp"), list(range(1, 30)), [50, 51], n_ctx=10)
    assert ids.tolist() == [[S, 1, 2, 3, 4, 5, D, 50, 51, E], [S, 50, 51, D, 1, 2, 3, 4, 5, E]]


def test_multiple_choice_cuts_the_context_from_the_left_and_keeps_the_answer():
    context, question = list(range(1, 41)), [60, 61]
    ids, ext, _, _ = transform(MC3, context, question, [[70, 71], [72], [73, 74, 75]], n_ctx=10)
    assert ids.tolist() == [[S, 38, 39, 40, 60, 61, D, 70, 71, E], [S, 37, 38, 39, 40, 60, 61, D, 72, E],
                            [S, 39, 40, 60, 61, D, 73, 74, 75, E]]
    assert ext.tolist() == [9, 9, 9]


def test_random_lengths_keep_the_invariants():
    rng = random.Random(0)
    pair, mc = get_task("rte"), MC3
    for _ in range(40):
        n_ctx = rng.randint(4, 24)
        a = [rng.randint(0, 99) for _ in range(rng.randint(1, 30))]
        b = [rng.randint(0, 99) for _ in range(rng.randint(1, 30))]
        ids, ext, w, _ = transform(pair, a, b, n_ctx=n_ctx)
        row, n = ids[0].tolist(), int(ext[0]) + 1
        assert row[0] == S and row[n - 1] == E and row[n:] == [P] * (n_ctx - n) and row.count(D) == 1
        got_a, got_b = row[1:row.index(D)], row[row.index(D) + 1:n - 1]
        assert got_a == a[:len(got_a)]  # a prefix of the premise
        assert got_b == (b if len(b) <= n_ctx - 3 else b[:n_ctx - 3])  # hypothesis whole if it fits
        assert n == min(len(a) + len(b) + 3, n_ctx) and w[0].sum() == n - 1
        choices = [[rng.randint(0, 99) for _ in range(rng.randint(1, 8))] for _ in range(3)]
        ids, ext, _, _ = transform(mc, a, b, choices, label=0.0, n_ctx=n_ctx)
        for row, e, c in zip(ids.tolist(), ext.tolist(), choices):
            ctx, got_c = row[1:row.index(D)], row[row.index(D) + 1:e]
            assert ctx == (a + b)[len(a + b) - len(ctx):]  # a suffix of the context
            assert got_c == c[: n_ctx - 3] and e + 1 == min(len(a + b) + len(c) + 3, n_ctx)


def test_wrong_number_of_choices_fails():
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_choices=3"):
        transform(MC3, [1], [], [[2], [3]], label=0.0)
