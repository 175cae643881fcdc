"""The offline tokenizer (``gpt_tf/text/tokenizer.py``) and its in-graph twin (``gpt_tf/text/tf_tokenizer.py``,
what every export carries) give the same ids on generated text: any Unicode, control characters, combining
marks in any order, Hangul jamo, emoji sequences, HTML entities, long runs; the graph on raw bytes equals the
offline tokenizer on those bytes decoded with U+FFFD for what is not UTF-8; a lone surrogate is refused by both
(it has no UTF-8 form: TensorFlow cannot make a string tensor of it, the offline tokenizer raises the same way).

GPT-1's released BPE (40,478 tokens), in batches of 16 texts: the graph's per-call cost is what the time goes on.
``GPT_TF_FUZZ_EXAMPLES=N`` runs N batches per test.
"""

from __future__ import annotations

import re

import pytest
import tensorflow as tf
from hypothesis import example, given
from hypothesis import strategies as st

from gpt_tf.text import text_clean
from gpt_tf.text.tokenizer import GPTTokenizer
from tests.small_runs import fuzz_settings


@pytest.fixture(scope="module")
def tokenizers(shared_data):
    offline = GPTTokenizer.from_dir(shared_data / "gpt1_bpe")
    return offline, offline.tf_tokenizer()


MARKS = sorted(text_clean.combining_classes())
ANY = st.characters(codec="utf-8", exclude_categories=["Cs"])
CLUSTER = st.tuples(st.sampled_from(list("aeiouAEIOUnNcCsSzZàéÅ") + ["\u1ea1", "\u01d6", "\u0958", "\u212b"]),
                    st.lists(st.one_of(st.sampled_from(MARKS), st.sampled_from(["\u0301", "\u0323", "\u0302", "\u0308",
                                                                                 "\u031b", "\u0345", "\u0344"])),
                             max_size=4)).map(lambda p: p[0] + "".join(p[1]))
JAMO = st.lists(st.sampled_from([chr(c) for c in [*range(0x1100, 0x1113), *range(0x1161, 0x1176),
                                                  *range(0x11A8, 0x11C3), 0xAC00, 0xD7A3, 0xB098]]),
                max_size=4).map("".join)
EMOJI = st.sampled_from(["\U0001F600", "\U0001F469\u200d\U0001F4BB", "\u2764\ufe0f", "\U0001F1EB\U0001F1F7",
                         "\U0001F44D\U0001F3FD", "\U0001F3F3\ufe0f\u200d\U0001F308", "#\ufe0f\u20e3"])
CONTROL = st.characters(categories=["Cc", "Cf", "Zs", "Zl", "Zp", "Co", "Cn"])
RUNS = st.tuples(st.sampled_from(["x", "-", "!", " ", ".", "ab", "\u00e9", "\u0301", "\n", "&amp;", "\U0001F600"]),
                 st.integers(1, 300)).map(lambda p: p[0] * p[1])
PIECE = st.one_of(st.text(ANY, max_size=6), CLUSTER, JAMO, EMOJI, CONTROL, RUNS,
                  st.sampled_from(["&amp;", "&#x301;", "&#769;", "&eacute;", "&#128;", "&#0;", "<b>", "\r\n", "\x1b[31m"]))
TEXTS = st.lists(st.lists(PIECE, max_size=8).map("".join), min_size=1, max_size=16)


def graph_ids(graph, texts) -> list:
    return graph(tf.constant(texts)).to_list()


@fuzz_settings(60)
@given(texts=TEXTS)
@example(texts=["N\u0328\u030c\u0328", "\u00e0\u0323", "O\u0327\u0301\u0302\u0302", "c\u0323\u0303\u0316\u0302"])
@example(texts=["\u00ce\x8c\x00\U0001F1F7", "\x00\u00e7\x9e\u00ab\U0001F4BB"])
def test_offline_and_in_graph_ids_agree_on_generated_text(tokenizers, texts):
    """The first example held marks NFC reorders or blocks (the graph composed neighbours only: 119 texts in
    1,086 differed); the second, mojibake on a line with a NUL (the graph left it unrepaired)."""
    offline, graph = tokenizers
    assert graph_ids(graph, texts) == offline.encode_batch(texts)


@fuzz_settings(40)
@given(blobs=st.lists(st.one_of(st.binary(max_size=24), st.text(ANY, max_size=8).map(str.encode)), min_size=1,
                      max_size=16))
@example(blobs=[b"\xed\xa0\x80", b"a\xffb", b"\xc3", b"\xf0\x9f\x98", b"\xe2\x82\x28", b"\x80\x80"])
def test_the_graph_on_bytes_equals_the_offline_tokenizer_on_them_decoded_with_replacement(tokenizers, blobs):
    """What a served model is sent is bytes: where they are not UTF-8 each bad sequence is one U+FFFD, as
    Python's ``bytes.decode(errors="replace")`` makes it."""
    offline, graph = tokenizers
    assert graph_ids(graph, blobs) == offline.encode_batch([b.decode("utf-8", errors="replace") for b in blobs])


@fuzz_settings(60)
@given(before=st.text(ANY, max_size=5), surrogate=st.integers(0xD800, 0xDFFF), after=st.text(ANY, max_size=5))
def test_a_lone_surrogate_is_refused_by_both(tokenizers, before, surrogate, after):
    offline, _ = tokenizers
    text = before + chr(surrogate) + after
    message = re.escape(f"the text holds a lone surrogate U+{surrogate:04X} at character {len(before)}: it is not "
                        "Unicode text")
    with pytest.raises(ValueError, match=message):
        offline.encode(text)
    with pytest.raises(ValueError, match=message):
        offline.encode_batch(["fine", text])
    with pytest.raises((ValueError, TypeError), match="Error converting unicode string"):
        tf.constant([text])  # the graph's input: TensorFlow has no UTF-8 for it either


def test_the_python_apis_eager_path_takes_bytes_as_the_graph_does():
    """``GPT1Tokenizer.tokenize`` runs the offline tokenizer eagerly and the graph in ``tf.function``; bytes that
    are not UTF-8 were a UnicodeDecodeError on the eager path (the graph makes them U+FFFD)."""
    from tests.small_runs import gpt1_tokenizer

    tokenizer = gpt1_tokenizer()
    blobs = tf.constant([b"a\xffb", b"\xed\xa0\x80 x", b"caf\xc3\xa9 \xc3", b"plain"])
    eager = tokenizer.tokenize(blobs)  # (a list: keras-hub's preprocessing layers answer eager calls in Python)
    assert eager == tf.function(tokenizer.tokenize)(blobs).to_list()
