"""Bits per character and per byte (gpt_tf/text/text_units.py) and their counting in the evaluations
(gpt_tf/training/text_counts.py): the token table against decoded text, the arithmetic against a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpt_tf.text.text_units import bits_per_text, count_text, token_text_lengths
from gpt_tf.text.tokenizer import GPTTokenizer

# a BPE of its own: "ab" + "é" as words, the newline token, <unk> for the rest
ENCODER = {"<unk>": 0, "a": 1, "b": 2, "é": 3, "\n": 4, "a</w>": 5, "b</w>": 6, "é</w>": 7, "\n</w>": 8, "ab</w>": 9}
MERGES = [("a", "b</w>")]


@pytest.fixture(scope="module")
def tiny():
    return GPTTokenizer(ENCODER, MERGES)


def test_each_tokens_characters_and_bytes_are_its_decoded_text(tiny):
    lengths = token_text_lengths(tiny)
    assert lengths.shape == (10, 2)
    assert lengths[ENCODER["ab</w>"]].tolist() == [3, 3]  # "ab" and the space after the word
    assert lengths[ENCODER["é</w>"]].tolist() == [2, 3]  # é is two bytes in UTF-8
    assert lengths[ENCODER["a"]].tolist() == [1, 1]  # inside a word: no space
    assert lengths[ENCODER["\n</w>"]].tolist() == [2, 2]
    assert lengths[0].tolist() == [1, 1]  # <unk>: the one character it stands for
    ids = tiny.encode("ab é\nb ab ab é")
    assert 0 not in ids
    decoded = tiny.decode(ids) + " "  # decode drops the last word's space
    assert count_text(lengths, ids) == (len(decoded), len(decoded.encode("utf-8")))
    assert count_text(lengths, np.asarray(ids * 2).reshape(2, -1)) == (2 * len(decoded), 2 * len(decoded.encode()))


def test_bits_per_character_of_a_hand_computed_loss():
    """A model that gives each of 8 tokens probability 1/2 spends 8 bits; the 8 tokens encode 16 characters
    (20 bytes): 0.5 bits per character, 0.4 per byte."""
    result = bits_per_text(8 * math.log(2), 16, 20)
    assert result == pytest.approx({"bits_per_char": 0.5, "bits_per_byte": 0.4, "chars": 16, "bytes": 20})
    with pytest.raises(ValueError, match="0 characters"):
        bits_per_text(1.0, 0, 0)


def test_the_counter_sums_a_distributed_batch_as_the_arrays(tiny):
    import tensorflow as tf

    from gpt_tf.training.text_counts import TextCounter

    targets = np.random.default_rng(0).integers(0, len(ENCODER), size=(4, 6)).astype(np.int32)
    expected = count_text(token_text_lengths(tiny), targets)
    for strategy in (tf.distribute.get_strategy(), tf.distribute.MirroredStrategy(["/cpu:0"])):
        counter = TextCounter(tiny, strategy)
        for batch in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(targets).batch(2)):
            counter.add_replicas(batch)
        assert (counter.chars, counter.bytes) == expected
    plain = TextCounter(tiny)
    plain.add(targets)
    assert plain.bits(8 * math.log(2)) == bits_per_text(8 * math.log(2), *expected)
