"""In-graph GPT-1 tokenizer from core TensorFlow ops only (no TF Text, no py_function).

``TFGPTTokenizer(encoder_json, merges_bpe)(texts)`` maps ``tf.string [batch]``
to ``int32`` ragged ``[batch, None]`` ids equal to ``GPTTokenizer.encode``'s,
inside ``tf.function`` and in SavedModels served by stock TF Serving: the files
are read in Python at construction and become ``StaticHashTable`` constants.

Per string, mirroring ``gpt_tf/text_clean.py`` (same tables and patterns):

1. invalid UTF-8 -> U+FFFD;
2. ftfy ``unescape_html``: named entities (ftfy's table) and numeric
   references (``html.unescape`` rules), repeated until stable, on the lines
   before the first line holding ``<`` (ftfy's ``"auto"`` rule);
3. ftfy ``remove_terminal_escapes``;
4. one per-character table: ftfy's ``fix_c1_controls``, ``fix_latin_ligatures``,
   ``fix_character_width``, ``uncurl_quotes``, ``fix_line_breaks``,
   ``remove_control_chars``, NFC of single characters, and text_standardize's
   ``— – ― … ´`` (only strings holding such a character pay for it);
   then NFC's pairwise compositions (``e`` + U+0301 -> ``é``, Hangul jamo),
   leftmost first, until none applies;
5. text_standardize's regexes (RE2), then ``tf.strings.lower`` (ICU), with the
   few characters ICU lower-cases differently from Python pre-lowered in step 4;
6. word split (module docstring of ``gpt_tf/tokenizer.py``): punctuation
   isolated, split on spaces;
7. BPE per unique word of the batch: words that BPE keeps whole come from a
   word -> id table; the rest merge in a ``tf.while_loop``, every word at once,
   applying each word's lowest-rank pair at all its (leftmost,
   non-overlapping) places per step, as the reference ``bpe()`` does.

What ftfy does that the graph does not (text differs only where these apply):
mojibake repair (``fix_encoding``: ``cafÃ©`` -> ``café``, and its
``restore_byte_a0`` / ``replace_lossy_sequences`` / ``decode_inconsistent_utf8``
helpers, e.g. ``Kerry‚Äôs`` or ``Iraqâ\\x80\\x99s`` stay as they are); the
parts of NFC beyond pairwise composition (reordering combining marks given
out of canonical order, composing past a blocking mark); lone surrogates
(cannot occur in UTF-8 input); and the interplay of steps inside ftfy's
repeat-until-stable loop (e.g. a full-width ``＆amp;`` that ftfy turns into
``&amp;`` and then ``&``). Lower-casing uses TensorFlow's ICU, whose Unicode
version may be older than Python's: the characters it lower-cases differently
(checked when the tokenizer is built) are pre-lowered in step 4.
"""

import tensorflow as tf

from gpt_tf import text_clean
from gpt_tf.tokenizer import END_OF_WORD, GPTTokenizer

_NO_RANK = tf.int64.max
_HEAD_PATTERN = "(?s)^((?:[^<\n]*\n)*)[^\n]*<.*$"  # lines before the first line with '<'
_MARK = "\x00"  # entity delimiter; NUL is a control character ftfy deletes anyway


def _table(keys, values, key_dtype, default):
    """A StaticHashTable ``key -> int64`` built from Python lists (exported as constants)."""
    init = tf.lookup.KeyValueTensorInitializer(
        tf.constant(keys, key_dtype), tf.constant(values, tf.int64))
    return tf.lookup.StaticHashTable(init, default_value=tf.constant(default, tf.int64))


def _replace_where(texts, mask, function):
    """Applies ``function`` to the strings selected by ``mask`` only; returns all strings."""
    chosen = tf.cast(tf.where(mask)[:, 0], tf.int32)
    others = tf.cast(tf.where(~mask)[:, 0], tf.int32)
    return tf.dynamic_stitch(
        [others, chosen], [tf.gather(texts, others), function(tf.gather(texts, chosen))])


def _lowercase_fixups(char_map):
    """Adds pre-lowered entries for characters ICU lower-cases unlike Python's ``str.lower``."""
    candidates = {chr(c) for c in range(0x30000) if chr(c).lower() != chr(c)} | set(char_map)
    candidates = sorted(candidates)
    values = [char_map.get(c, c) for c in candidates]
    icu = tf.strings.lower(tf.constant(values), encoding="utf-8").numpy()
    for char, value, lowered in zip(candidates, values, icu):
        if lowered.decode("utf-8") != value.lower():
            char_map[char] = value.lower()
    return char_map


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

    def __init__(self, encoder_json, merges_bpe, name=None):
        """Reads the two files (in Python) and builds the lookup tables."""
        super().__init__(name=name)
        offline = GPTTokenizer.from_files(encoder_json, merges_bpe)
        self.encoder_path, self.merges_path = str(encoder_json), str(merges_bpe)
        self.vocab_size = offline.vocab_size
        self._encoder = _table(list(offline.encoder), list(offline.encoder.values()),
                               tf.string, offline.unk_id)
        self._ranks = _table([f"{a} {b}" for a, b in offline.merges],
                             list(range(len(offline.merges))), tf.string, _NO_RANK)
        whole = _whole_words(offline)
        self._whole = _table(list(whole), list(whole.values()), tf.string, -1)
        char_map = _lowercase_fixups(dict(text_clean.graph_char_map()))
        self._chars = _table(list(char_map), list(range(len(char_map))), tf.string, -1)
        self._char_values = tf.constant(list(char_map.values()))
        self._char_pattern = "(?s).*" + text_clean.regex_char_class(char_map) + ".*"
        entities = text_clean.html_entities()
        self._entities = _table(list(entities), list(range(len(entities))), tf.string, -1)
        self._entity_values = tf.constant(list(entities.values()))
        specials = text_clean.charref_specials()
        self._charrefs = _table(list(specials), list(range(len(specials))), tf.int64, -1)
        self._charref_values = tf.constant(list(specials.values()))
        pairs = text_clean.nfc_pairs()
        self._pairs = _table(list(pairs), list(range(len(pairs))), tf.string, -1)
        self._pair_values = tf.constant(list(pairs.values()))
        self._pair_pattern = "(?s).*" + text_clean.regex_char_class({k[1] for k in pairs}) + ".*"
        self._punctuation = text_clean.punctuation_class()
        self._ansi = text_clean.ansi_escape_pattern()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def __call__(self, texts):
        """Token ids of each text: ``int32`` ragged ``[batch, None]``."""
        words = self.words(texts)
        unique, index = tf.unique(words.flat_values)
        per_word = tf.gather(self._bpe(unique), index)
        return tf.RaggedTensor.from_row_splits(per_word, words.row_splits).merge_dims(1, 2)

    def prepare(self, texts):
        """ftfy subset + text_standardize + lower-case: ``tf.string [batch]``."""
        texts = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace")
        has_entity = tf.strings.regex_full_match(texts, f"(?s).*{text_clean.HTML_ENTITY_PATTERN}.*")
        texts = _replace_where(texts, has_entity, self._unescape_html)
        texts = tf.strings.regex_replace(texts, self._ansi, "")
        texts = _replace_where(texts, tf.strings.regex_full_match(texts, self._char_pattern),
                               self._map_chars)
        texts = _replace_where(texts, tf.strings.regex_full_match(texts, self._pair_pattern),
                               self._compose)
        for pattern, rewrite in text_clean.standardize_patterns():
            texts = tf.strings.regex_replace(texts, pattern, rewrite)
        return tf.strings.lower(texts, encoding="utf-8")

    def words(self, texts):
        """Prepared texts split into words: ``tf.string`` ragged ``[batch, None]``."""
        spaced = tf.strings.regex_replace(self.prepare(texts), self._punctuation, r" \0 ")
        pieces = tf.strings.split(spaced, sep=" ")
        return tf.ragged.boolean_mask(pieces, tf.strings.length(pieces) > 0)

    def _map_chars(self, texts):
        """Replaces every character found in the per-character table."""
        chars = tf.strings.unicode_split(texts, "UTF-8")
        slot = self._chars.lookup(chars.flat_values)
        mapped = tf.where(slot >= 0, tf.gather(self._char_values, tf.maximum(slot, 0)),
                          chars.flat_values)
        return tf.strings.reduce_join(chars.with_flat_values(mapped), axis=1)

    def _compose(self, texts):
        """NFC composition: joins composable pairs, leftmost first, until none is left."""
        chars = tf.strings.unicode_split(texts, "UTF-8")

        def step(symbols, splits, _):
            size = tf.size(symbols, tf.int64)
            rows = tf.ragged.row_splits_to_segment_ids(splits)
            following = tf.concat([symbols[1:], [""]], axis=0)[:size]
            has_next = tf.range(size) + 1 < tf.gather(splits[1:], rows)
            slot = tf.where(has_next, self._pairs.lookup(symbols + following), -1)
            match = slot >= 0
            take = match & ~tf.concat([[False], match[:-1]], axis=0)[:size]
            keep = ~tf.concat([[False], take[:-1]], axis=0)[:size]
            composed = tf.gather(self._pair_values, tf.maximum(slot, 0))
            symbols = tf.boolean_mask(tf.where(take, composed, symbols), keep)
            lengths = tf.math.unsorted_segment_sum(
                tf.cast(keep, tf.int64), rows, tf.size(splits, tf.int64) - 1)
            return symbols, tf.concat([[0], tf.cumsum(lengths)], axis=0), tf.reduce_any(take)

        symbols, splits, _ = tf.while_loop(
            lambda s, r, go: go, step, (chars.flat_values, chars.row_splits, tf.constant(True)),
            shape_invariants=(tf.TensorShape([None]), tf.TensorShape([None]), tf.TensorShape([])))
        return tf.strings.reduce_join(tf.RaggedTensor.from_row_splits(symbols, splits), axis=1)

    def _unescape_html(self, texts):
        """ftfy's unescape_html, repeated until stable, before the first line with '<'."""
        head = tf.strings.regex_replace(texts, _HEAD_PATTERN, r"\1")
        start = tf.strings.length(head)
        tail = tf.strings.substr(texts, start, tf.strings.length(texts) - start)

        def body(text, _):
            new = self._unescape_once(text)
            return new, tf.reduce_any(tf.not_equal(new, text))

        head, _ = tf.while_loop(lambda _, changed: changed, body, (head, tf.constant(True)))
        return head + tail

    def _unescape_once(self, texts):
        """One ``HTML_ENTITY_RE.sub`` pass: entities become their characters."""
        marked = tf.strings.regex_replace(
            texts, text_clean.HTML_ENTITY_PATTERN, _MARK + r"\0" + _MARK)
        pieces = tf.strings.split(marked, sep=_MARK)
        flat = pieces.flat_values
        slot = self._entities.lookup(flat)
        named = tf.gather(self._entity_values, tf.maximum(slot, 0))
        value = tf.where(slot >= 0, named, self._charref(flat))
        return tf.strings.reduce_join(pieces.with_flat_values(value), axis=1)

    def _charref(self, pieces):
        """``&#65;`` / ``&#x41;`` -> ``'A'`` as ftfy (via ``html.unescape``); others unchanged."""
        is_dec = tf.strings.regex_full_match(pieces, "&#[0-9]+;")
        is_hex = tf.strings.regex_full_match(pieces, "&#[xX][0-9a-fA-F]+;")
        digits = tf.strings.regex_replace(pieces, "^&#[xX]?0*([0-9a-fA-F]*);$", r"\1")
        digits = tf.where((is_dec | is_hex) & (tf.strings.length(digits) > 0), digits, "0")
        size = tf.strings.length(digits)
        too_big = tf.where(is_hex, size > 6, size > 7)
        digits = tf.where(too_big, "0", digits)
        decimal = tf.strings.to_number(tf.where(is_dec, digits, "0"), tf.int64)
        hex_digits = tf.where(is_hex, digits, "0")
        offset = tf.strings.length(hex_digits)
        padded = tf.strings.substr("000000" + hex_digits, offset, tf.fill(tf.shape(offset), 6))
        codes = tf.cast(tf.strings.unicode_decode(padded, "UTF-8").to_tensor(shape=[None, 6]), tf.int64)
        nibbles = tf.where(codes >= 97, codes - 87, tf.where(codes >= 65, codes - 55, codes - 48))
        hexadecimal = tf.reduce_sum(nibbles * (16 ** tf.range(5, -1, -1, dtype=tf.int64)), axis=1)
        number = tf.where(too_big, tf.constant(0x110000, tf.int64), tf.where(is_hex, hexadecimal, decimal))
        slot = self._charrefs.lookup(number)
        char = tf.strings.unicode_encode(
            tf.cast(tf.minimum(number, 0x110000), tf.int32)[:, None], "UTF-8", errors="replace")
        value = tf.where(slot >= 0, tf.gather(self._charref_values, tf.maximum(slot, 0)), char)
        return tf.where((is_dec | is_hex) & tf.not_equal(value, ";"), value, pieces)

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
