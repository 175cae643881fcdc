"""GPT-1's text cleanup (ftfy subset + ``text_standardize``) in core TensorFlow ops.

``TFTextCleaner()(texts)`` maps ``tf.string [batch]`` to ``text_clean.clean_text`` of each text
(cased), from the tables and patterns of ``gpt_tf/text/text_clean.py``. Per string:

1. invalid UTF-8 -> U+FFFD;
2. ftfy ``unescape_html``: named entities (ftfy's table) and numeric
   references (``html.unescape`` rules), repeated until stable, on the lines
   before the first line holding ``<`` (ftfy's ``"auto"`` rule);
3. ftfy ``fix_encoding``, the mojibake repair (``gpt_tf/text/tf_fix_encoding.py``);
4. ftfy ``remove_terminal_escapes``;
5. one per-character table: ftfy's ``fix_c1_controls``, ``fix_latin_ligatures``,
   ``fix_character_width``, ``uncurl_quotes``, ``fix_line_breaks``,
   ``remove_control_chars``, NFC of single characters, and text_standardize's
   ``— – ― … ´`` (only strings holding such a character pay for it);
   then NFC, all of it, on the strings holding a character that may compose
   with the one before it or marks NFC may reorder: canonical decomposition,
   marks in canonical order, composition with blocking (``e`` + U+0301 -> ``é``,
   ``à`` + U+0323 -> ``ạ`` + U+0300, Hangul jamo);
6. text_standardize's regexes (RE2).

What ftfy does that the graph does not (text differs only where these apply):
the mojibake cases listed in ``gpt_tf/text/tf_fix_encoding.py``; a UTF-8-looking
piece of a line that ftfy repairs with a repair of its own pieces (mojibake of
mojibake beside text no encoding holds, ``Ã…Â‹Â™›``: the graph repairs one level);
lone surrogates (cannot occur in UTF-8 input; the offline tokenizer refuses them);
and the interplay of steps inside ftfy's repeat-until-stable loop (e.g. a full-width
``＆amp;`` that ftfy turns into ``&amp;`` and then ``&``).
"""

import tensorflow as tf

from gpt_tf.text import text_clean
from gpt_tf.text.tf_fix_encoding import TFFixEncoding
from gpt_tf.text.tf_strings import StringMap, apart, lookup_table, replace_where

_HEAD_PATTERN = "(?s)^((?:[^<\n]*\n)*)[^\n]*<.*$"  # lines before the first line with '<'
_MARK = "\x00"  # entity delimiter; NUL is a control character ftfy deletes anyway


class TFTextCleaner(tf.Module):
    """``text_clean.clean_text`` as a tf.Module: ``tf.string [batch] -> tf.string [batch]``."""

    def __init__(self, name=None):
        super().__init__(name=name)
        char_map = text_clean.graph_char_map()
        self._chars = StringMap(char_map)
        self._char_pattern = "(?s).*" + text_clean.regex_char_class(char_map) + ".*"
        ftfy_map = text_clean.graph_char_map(standardize=False)
        self._ftfy_chars = StringMap(ftfy_map)
        self._ftfy_char_pattern = "(?s).*" + text_clean.regex_char_class(ftfy_map) + ".*"
        self._entities = StringMap(text_clean.html_entities())
        self._charrefs = StringMap(text_clean.charref_specials(), key_dtype=tf.int64)
        pairs = text_clean.nfc_pairs()
        self._pairs = StringMap(pairs)
        self._pair_pattern = "(?s).*" + text_clean.regex_char_class({k[1] for k in pairs}) + ".*"
        classes = text_clean.combining_classes()
        self._classes = lookup_table(list(classes), list(classes.values()), tf.string, 0)
        self._decompose = StringMap(text_clean.canonical_decompositions())
        self._seconds = StringMap({k[1]: "" for k in pairs if k[1] not in classes})  # starters that compose backwards
        self._full_nfc_pattern = text_clean.full_nfc_pattern()
        self._ansi = text_clean.ansi_escape_pattern()
        self._fix_encoding = TFFixEncoding()
        # The branches few texts take, each a function of its own (tf_strings.apart): iterators start seconds sooner.
        self._unescape_html, self._fix_segments, self._nfc = (
            apart(f) for f in (self._unescape_html, self._fix_segments, self._nfc))

    def __call__(self, texts):
        """ftfy subset + text_standardize of each text (cased)."""
        texts = tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace")
        has_entity = tf.strings.regex_full_match(texts, f"(?s).*{text_clean.HTML_ENTITY_PATTERN}.*")
        texts = replace_where(texts, has_entity, self._unescape_html)
        non_ascii = ~tf.strings.regex_full_match(texts, "(?s)[\\x{0}-\\x{7f}]*")  # ASCII is never mojibake
        texts = replace_where(texts, non_ascii, self._fix_mojibake)
        texts = self._fix_chars(texts)
        for pattern, rewrite in text_clean.standardize_patterns():
            texts = tf.strings.regex_replace(texts, pattern, rewrite)
        return texts

    def _fix_chars(self, texts, ftfy_only=False):
        """ftfy's fixers after ``fix_encoding``: terminal escapes, the per-character table, NFC;
        text_standardize's character replacements too unless ``ftfy_only``."""
        chars, pattern = (self._ftfy_chars, self._ftfy_char_pattern) if ftfy_only else (
            self._chars, self._char_pattern)
        texts = tf.strings.regex_replace(texts, self._ansi, "")
        texts = replace_where(texts, tf.strings.regex_full_match(texts, pattern), chars.map_chars)
        composes = (tf.strings.regex_full_match(texts, self._pair_pattern)
                    | tf.strings.regex_full_match(texts, self._full_nfc_pattern))
        return replace_where(texts, composes, self._nfc)

    def _fix_mojibake(self, texts):
        """ftfy's mojibake repair on the texts its heuristic flags, now or after one round of fixes."""
        mojibake = self._fix_encoding.candidates(texts) | self._fix_encoding.candidates(
            self._fix_chars(texts, ftfy_only=True))  # also what ftfy's loop sees after one round
        return replace_where(texts, mojibake, self._fix_segments)

    def _fix_segments(self, texts):
        """Texts with mojibake: ftfy's per-line loop, ``fix_encoding`` then the fixers after it,
        until the line (which a fixed line break may have cut in two) stops changing."""
        segments = tf.strings.split(texts, "\n")

        def body(lines, _):
            new = self._fix_chars(self._fix_encoding.fix(lines), ftfy_only=True)
            return new, tf.reduce_any(tf.not_equal(new, lines))

        lines, _ = tf.while_loop(lambda _, changed: changed, body, (segments.flat_values, tf.constant(True)))
        return tf.strings.reduce_join(segments.with_flat_values(lines), axis=1, separator="\n")

    def _nfc(self, texts):
        """Unicode NFC (of the texts holding a character that may compose with the one before it, or marks
        that NFC may reorder: ``text_clean.full_nfc_pattern``): canonical decomposition, marks in canonical
        order (stably, by combining class), then canonical composition left to right, each mark composing with
        the last starter unless a mark of the same or a higher class stands between.

        Composition runs over *pieces*: a piece starts at the text's start and at each starter that composes
        with nothing before it, so no composition crosses one; every piece advances one character a step (as
        many steps as the longest piece), all pieces at once.
        """
        chars = tf.strings.unicode_split(self._decompose.map_chars(texts), "UTF-8")
        flat, rows, n = chars.flat_values, chars.value_rowids(), tf.size(chars.flat_values, tf.int64)
        position = tf.range(n)
        row_start = tf.equal(position, tf.gather(chars.row_splits[:-1], rows))
        classes = self._classes.lookup(flat)
        # Canonical order: within each run of non-starters (a run ends at a starter or a text's start), by class.
        runs = tf.cumsum(tf.cast((classes == 0) | row_start, tf.int64))
        order = tf.argsort(runs * 256 + classes, stable=True)
        flat, classes = tf.gather(flat, order), tf.gather(classes, order)
        starts = row_start | ((classes == 0) & ~self._seconds.contains(flat))
        piece = tf.cumsum(tf.cast(starts, tf.int64)) - 1
        n_pieces = tf.reduce_sum(tf.cast(starts, tf.int64))
        step = position - tf.gather(tf.where(starts)[:, 0], piece)  # the character's place in its piece
        by_step = tf.cast(tf.argsort(step, stable=True), tf.int64)  # step 0 of every piece, then step 1, ...
        counts = tf.math.bincount(step, dtype=tf.int64, minlength=1)
        offsets = tf.concat([[0], tf.cumsum(counts)], axis=0)

        def body(k, starter_at, starter, last, out, keep):
            at = by_step[offsets[k]:offsets[k + 1]]  # the characters at step k, one per piece long enough
            p = tf.gather(piece, at)[:, None]
            char, cls = tf.gather(flat, at), tf.gather(classes, at)
            s_at, s, s_last = tf.gather(starter_at, p[:, 0]), tf.gather(starter, p[:, 0]), tf.gather(last, p[:, 0])
            composed = self._pairs.get(s + char, "")
            join = (s_at >= 0) & ((s_last < 0) | (s_last < cls)) & tf.not_equal(composed, "")
            new = ~join & (cls == 0)  # a starter that composes with nothing before it
            starter = tf.tensor_scatter_nd_update(starter, p, tf.where(join, composed, tf.where(new, char, s)))
            starter_at = tf.tensor_scatter_nd_update(starter_at, p, tf.where(new, at, s_at))
            last = tf.tensor_scatter_nd_update(last, p, tf.where(join, s_last, tf.where(new, tf.constant(-1, tf.int64), cls)))
            out = tf.tensor_scatter_nd_update(out, tf.where(join, s_at, at)[:, None], tf.where(join, composed, char))
            keep = tf.tensor_scatter_nd_update(keep, at[:, None], ~join)
            return k + 1, starter_at, starter, last, out, keep

        state = (tf.constant(0, tf.int64), tf.fill([n_pieces], tf.constant(-1, tf.int64)), tf.fill([n_pieces], ""),
                 tf.fill([n_pieces], tf.constant(-1, tf.int64)), flat, tf.ones([n], tf.bool))
        _, _, _, _, out, keep = tf.while_loop(lambda k, *_: k < tf.size(counts, tf.int64), body, state)
        nfc = tf.RaggedTensor.from_value_rowids(tf.boolean_mask(out, keep), tf.boolean_mask(rows, keep),
                                                nrows=tf.size(texts, tf.int64))
        return tf.strings.reduce_join(nfc, axis=1)

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
        value = self._entities.get(flat, self._charref(flat))  # every piece: the text may hold NULs
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
        char = tf.strings.unicode_encode(
            tf.cast(tf.minimum(number, 0x110000), tf.int32)[:, None], "UTF-8", errors="replace")
        value = self._charrefs.get(number, char)
        return tf.where((is_dec | is_hex) & tf.not_equal(value, ";"), value, pieces)
