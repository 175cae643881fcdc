"""GPT-1's word split (spaCy's English rules) in core TensorFlow ops: the twin of ``gpt_tf/text/word_split.py``.

``TFWordSplit()(chunks)`` maps space-free chunks of cleaned text (``tf.string [n]``) to their words,
cased and joined by spaces, equal to ``WordSplitter().split_chunk``: the same patterns (RE2 here,
Python ``re`` there) and tables, the same algorithm step for step, on all chunks at once:

* special cases and chunks no rule can split are looked up / kept;
* the others go through spaCy's affix loop in a ``tf.while_loop``: each step finds every chunk's
  prefix and suffix with one ``regex_replace`` each, checks the remainders against the special
  cases (a hash table) and cuts, until no chunk changes;
* the remainder is a special case, a URL, or cut at its infixes; then the special-case re-merge.

Strings are cut by byte offsets (``tf.strings.substr``): prefixes and suffixes are extracted as
strings, so their byte lengths are exact.
"""

import tensorflow as tf

from gpt_tf.text.tf_strings import StringMap, odd_positions, replace_where
from gpt_tf.text.word_split import SIMPLE_PATTERN, split_patterns

_MARK = "\x00"  # delimits re-merged spans; NUL never survives the cleanup


class TFWordSplit(tf.Module):
    """The word split of :func:`gpt_tf.text.word_split.split_patterns` as a tf.Module."""

    def __init__(self, name=None):
        super().__init__(name=name)
        self._patterns = split_patterns()
        self._specials = StringMap(self._patterns.specials)
        self._merges = StringMap(self._patterns.merges)

    def __call__(self, chunks):
        """Words of each chunk (``tf.string [n]``), cased, separated by spaces."""
        words = self._specials.get(chunks, chunks)
        hard = ~self._specials.contains(chunks) & ~tf.strings.regex_full_match(chunks, SIMPLE_PATTERN)
        return replace_where(words, hard, self._split)

    def _split(self, chunks):
        """``split_chunk`` for chunks that are neither special cases nor simple."""
        prefixes, rest, suffixes = self._split_affixes(chunks)
        has_infix = tf.strings.regex_full_match(rest, self._patterns.infix_probe)
        middle = self._specials.get(rest, replace_where(rest, has_infix, self._split_infixes))
        words = prefixes + middle + suffixes
        return replace_where(words, tf.strings.regex_full_match(words, self._patterns.merge_probe), self._merge)

    def _split_infixes(self, rest):
        """Spaces around infixes, unless the string is a URL: ``WordSplitter``'s ``split_chunk``."""
        middle = tf.strings.regex_replace(rest, self._patterns.infix, r" \1 ")
        for pattern in self._patterns.context_infixes:
            for _ in range(2):
                middle = tf.strings.regex_replace(middle, pattern, r"\1 \2 \3")
        is_url = tf.zeros_like(middle, tf.bool)
        for url in self._patterns.urls:
            is_url |= tf.strings.regex_full_match(rest, url)
        return tf.where(tf.not_equal(middle, rest) & is_url, rest, middle)

    def _merge(self, words):
        """spaCy's re-merge of special cases its affix rules cut apart (``WordSplitter``'s ``merge``)."""
        pieces = tf.strings.split(words, " ")
        pieces = tf.ragged.boolean_mask(pieces, tf.strings.length(pieces) > 0)
        joined = tf.strings.reduce_join(pieces, axis=1, separator="  ")
        marked = tf.strings.regex_replace(joined, self._patterns.merge, rf"\1{_MARK}\2{_MARK}\3")
        parts = tf.strings.split(marked, _MARK)
        flat = parts.flat_values
        merged = tf.where(odd_positions(parts), self._merges.get(flat, flat), flat)
        return tf.strings.reduce_join(parts.with_flat_values(merged), axis=1)

    def _split_affixes(self, chunks):
        """spaCy's prefix/suffix loop on every chunk at once: ``(prefixes, rest, suffixes)``.

        ``prefixes`` ends with a space after each prefix, ``suffixes`` starts with one before each.
        """
        empty = tf.fill(tf.shape(chunks), "")
        start = (chunks, empty, empty, tf.ones(tf.shape(chunks), tf.bool))
        rest, prefixes, suffixes, _ = tf.while_loop(
            lambda rest, pre, suf, active: tf.reduce_any(active), self._affix_step, start)
        return prefixes, rest, suffixes

    def _affix_step(self, rest, prefixes, suffixes, active):
        """One turn of ``WordSplitter._split_affixes``'s loop, on every chunk still active."""
        active &= (tf.strings.length(rest) > 0) & ~self._specials.contains(rest)
        size = tf.strings.length(rest)
        prefix = tf.strings.regex_replace(rest, self._patterns.prefix, r"\1")
        pre = tf.strings.length(prefix)
        minus_pre = tf.strings.substr(rest, pre, size - pre)
        suffix = tf.strings.regex_replace(minus_pre, self._patterns.suffix, self._patterns.suffix_rewrite)
        suf = tf.strings.length(suffix)
        minus_suf = tf.strings.substr(rest, tf.zeros_like(size), size - suf)
        only_pre = (pre > 0) & self._specials.contains(minus_pre)  # then stop
        only_suf = ~only_pre & (suf > 0) & self._specials.contains(minus_suf)  # then stop
        both = ~only_pre & ~only_suf & (pre > 0) & (suf > 0) & (pre + suf <= size)
        take_pre = active & (only_pre | (~only_suf & (pre > 0)))
        take_suf = active & (only_suf | both | (~only_pre & ~only_suf & (pre == 0) & (suf > 0)))
        cut_pre = tf.where(take_pre, pre, 0)
        cut_suf = tf.where(take_suf, suf, 0)
        rest = tf.strings.substr(rest, cut_pre, size - cut_pre - cut_suf)
        prefixes += tf.where(take_pre, prefix + " ", "")
        suffixes = tf.where(take_suf, " " + suffix, "") + suffixes
        return rest, prefixes, suffixes, active & (take_pre | take_suf) & ~only_pre & ~only_suf
