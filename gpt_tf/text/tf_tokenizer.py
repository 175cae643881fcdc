"""In-graph GPT-1 tokenizer from core TensorFlow ops only (no TF Text, no py_function).

``TFGPTTokenizer(offline)(texts)`` maps ``tf.string [batch]``
to ``int32`` ragged ``[batch, None]`` ids equal to ``GPTTokenizer.encode``'s,
inside ``tf.function`` and in SavedModels served by stock TF Serving: the vocabulary and merges
of ``offline`` (a ``GPTTokenizer`` loaded from its two files; ``GPTTokenizer.tf_tokenizer()``
builds one) become ``StaticHashTable`` constants. This module does not import ``gpt_tf.text.tokenizer``.

Per batch of strings, mirroring the offline tokenizer step for step:

1. cleanup (``gpt_tf/text/tf_text_clean.py``): the ftfy subset and ``text_standardize``;
2. word split (``gpt_tf/text/tf_word_split.py``): spaCy's English rules, as GPT-1 used them, on the
   batch's unique space-free chunks;
3. lower-case each chunk's words (``tf.strings.lower``, ICU), the few characters ICU lower-cases
   unlike Python's ``str.lower`` (checked when the tokenizer is built) mapped first;
4. BPE per unique word of the batch: words that BPE keeps whole come from a
   word -> id table; the rest merge in a ``tf.while_loop``, every word at once,
   applying each word's lowest-rank pair at all its (leftmost,
   non-overlapping) places per step, as the reference ``bpe()`` does.
"""

import tensorflow as tf

from gpt_tf.text.tf_strings import StringMap, lookup_table, replace_where
from gpt_tf.text.tf_text_clean import TFTextCleaner
from gpt_tf.text.tf_word_split import TFWordSplit
from gpt_tf.text.text_clean import regex_char_class
from gpt_tf.text.word_split import END_OF_WORD

_NO_RANK = tf.int64.max


def _lowercase_fixups():
    """``{char: char.lower()}`` for the characters ICU lower-cases unlike Python's ``str.lower``."""
    chars = [chr(c) for c in range(0x30000) if not 0xD800 <= c <= 0xDFFF]
    icu = tf.strings.lower(tf.constant(chars), encoding="utf-8").numpy()
    return {c: c.lower() for c, lowered in zip(chars, icu) if lowered.decode("utf-8") != c.lower()}


def _whole_words(offline):
    """``{word: id}`` for vocabulary words whose BPE is that single token."""
    table = {}
    for token, index in offline.encoder.items():
        word = token[: -len(END_OF_WORD)]
        if token.endswith(END_OF_WORD) and word and offline.word_ids(word) == [index]:
            table[word] = index
    return table


class TFGPTTokenizer(tf.Module):
    """GPT-1 BPE tokenizer as a tf.Module: ``tf.string [batch] -> int32 ragged [batch, None]``."""

    def __init__(self, offline, name=None):
        """Builds the lookup tables from ``offline``, a ``GPTTokenizer`` loaded from its files."""
        super().__init__(name=name)
        self.encoder_path, self.merges_path = str(offline.encoder_path), str(offline.merges_path)
        self.vocab_size = offline.vocab_size
        self._encoder = lookup_table(list(offline.encoder), list(offline.encoder.values()),
                                     tf.string, offline.unk_id)
        self._ranks = lookup_table([f"{a} {b}" for a, b in offline.merges],
                                   list(range(len(offline.merges))), tf.string, _NO_RANK)
        whole = _whole_words(offline)
        self._whole = lookup_table(list(whole), list(whole.values()), tf.string, -1)
        self._clean = TFTextCleaner()
        self._split = TFWordSplit()
        fixups = _lowercase_fixups()
        self._lower_fixups = StringMap(fixups)
        self._lower_pattern = "(?s).*" + regex_char_class(fixups) + ".*"

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def __call__(self, texts):
        """Token ids of each text: ``int32`` ragged ``[batch, None]``."""
        words = self.words(texts)
        unique, index = tf.unique(words.flat_values)
        per_word = tf.gather(self._bpe(unique), index)
        return tf.RaggedTensor.from_row_splits(per_word, words.row_splits).merge_dims(1, 2)

    def clean(self, texts):
        """ftfy subset + text_standardize (cased): ``tf.string [batch]``."""
        return self._clean(texts)

    def words(self, texts):
        """The words BPE runs on (split, lower-cased): ``tf.string`` ragged ``[batch, None]``."""
        chunks = tf.strings.split(self.clean(texts), sep=" ")
        unique, index = tf.unique(chunks.flat_values)
        split = self.lower(self._split(unique))
        per_chunk = tf.gather(tf.strings.split(split, sep=" "), index)
        words = chunks.with_flat_values(per_chunk).merge_dims(1, 2)
        return tf.ragged.boolean_mask(words, tf.strings.length(words) > 0)

    def lower(self, texts):
        """Python's ``str.lower`` of each string."""
        texts = replace_where(texts, tf.strings.regex_full_match(texts, self._lower_pattern),
                              self._lower_fixups.map_chars)
        return tf.strings.lower(texts, encoding="utf-8")

    def _bpe(self, words):
        """Token ids of unique non-empty words: ``int32`` ragged ``[words, None]``."""
        whole = self._whole.lookup(words)
        is_whole = whole >= 0
        merged = self._merge(tf.boolean_mask(words, ~is_whole))
        single = tf.RaggedTensor.from_tensor(tf.cast(tf.boolean_mask(whole, is_whole), tf.int32)[:, None])
        order = tf.concat([tf.where(is_whole)[:, 0], tf.where(~is_whole)[:, 0]], axis=0)
        return tf.gather(tf.concat([single, merged], axis=0), tf.math.invert_permutation(order))

    def _merge(self, words):
        """Reference BPE on every word at once, in a while loop until no pair merges."""
        chars = tf.strings.unicode_split(words, "UTF-8")
        rows = chars.value_rowids()
        is_last = tf.range(tf.size(rows, tf.int64)) == tf.gather(chars.row_splits[1:] - 1, rows)
        symbols = tf.where(is_last, chars.flat_values + END_OF_WORD, chars.flat_values)
        start = (symbols, chars.row_splits, tf.size(symbols) > 0)
        symbols, splits, _ = tf.while_loop(
            lambda s, r, go: go, self._merge_step, start,
            shape_invariants=(tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([])))
        ids = tf.cast(self._encoder.lookup(symbols), tf.int32)
        return tf.RaggedTensor.from_row_splits(ids, splits, validate=False)

    def _merge_step(self, symbols, splits, _):
        """Merges each word's lowest-rank pair at its leftmost non-overlapping places."""
        size = tf.size(symbols, tf.int64)
        position = tf.range(size)
        rows = tf.ragged.row_splits_to_segment_ids(splits)
        following = tf.concat([symbols[1:], [""]], axis=0)[:size]
        has_next = position + 1 < tf.gather(splits[1:], rows)
        rank = tf.where(has_next, self._ranks.lookup(symbols + " " + following), _NO_RANK)
        best = tf.gather(tf.math.segment_min(rank, rows), rows)
        match = (rank == best) & (rank < _NO_RANK)
        # Runs of matches (only for pairs like 'a a'): take the 1st, 3rd, ... of each run.
        group_start = ~match | tf.equal(position, tf.gather(splits[:-1], rows))
        group = tf.cumsum(tf.cast(group_start, tf.int64)) - 1
        first = tf.gather(tf.math.segment_min(position, group), group)
        k = position - first - 1 + tf.cast(tf.gather(match, first), tf.int64)
        take = match & tf.equal(k % 2, 0)
        drop = tf.concat([[False], take[:-1]], axis=0)[:size]
        keep = ~drop
        symbols = tf.boolean_mask(tf.where(take, symbols + following, symbols), keep)
        lengths = tf.math.unsorted_segment_sum(
            tf.cast(keep, tf.int64), rows, tf.size(splits, tf.int64) - 1)
        splits = tf.concat([[0], tf.cumsum(lengths)], axis=0)
        return symbols, splits, tf.reduce_any(take)
