"""ftfy's mojibake repair (``fix_encoding``) in core TensorFlow ops: ``Iraqâ\\x80\\x99s`` -> ``Iraq’s``.

``TFFixEncoding().fix(lines)`` applies ftfy's ``fix_encoding`` to each line (ftfy's ``fix_text``
works line by line; ``gpt_tf/text/tf_text_clean.py`` cuts the texts that :meth:`candidates` picks), from
the patterns and tables of ``gpt_tf/text/fix_encoding_rules.py``: until a line stops changing, one step
of ftfy's ``_fix_encoding_one_step_and_explain``:

1. ASCII lines and lines that ftfy's ``is_bad`` heuristic accepts are left alone;
2. for each single-byte encoding of ftfy's list (Latin-1, Windows-1252, ..., cp437) that can
   represent the whole line: ``restore_byte_a0`` and ``replace_lossy_sequences`` as regexes over
   the line, a character -> byte table, and the bytes are the repaired line if they are UTF-8;
3. otherwise, pieces that look like UTF-8 read as one of those encodings
   (``decode_inconsistent_utf8``) are repaired alone, with steps 2 and 4;
4. otherwise C1 controls become Windows-1252 characters.

Only texts holding a non-ASCII character that the heuristic calls bad pay for it. Not
reproduced (such a line is left as it is): ftfy's ``utf-8-variants`` decoding (CESU-8
surrogate pairs, ``C0 80``). Lines are cut into pieces at a byte no UTF-8 text holds (``\xff``),
so a NUL in a line changes nothing.
"""

import tensorflow as tf

from gpt_tf.text import fix_encoding_rules as rules
from gpt_tf.text.tf_strings import StringMap, odd_positions, replace_where

_MARK = b"\xff"  # cuts lines into pieces: a byte no UTF-8 text holds (the cleaner made every text UTF-8 first)
_ASCII = "(?s)[\\x{0}-\\x{7f}]*"
_C1 = "(?s).*[\\x{80}-\\x{9f}].*"


class _Encoding(tf.Module):
    """One of ftfy's single-byte encodings: can it hold a line, and what bytes does it give."""

    def __init__(self, spec, name=None):
        super().__init__(name=name)
        self.possible, self.restore_a0, self.lossy = spec["possible"], spec["restore_a0"], spec["lossy"]
        self.replacement, self.variants = spec["replacement"], spec["variants"]
        self.a_grave, self.byte_a0 = spec["a_grave"], spec["byte_a0"]
        self._bytes = StringMap({char: byte for char, byte in spec["bytes"].items()})

    def decode(self, lines):
        """``(repaired, ok, stop)``: the re-decoded lines, whether that worked, whether ftfy stops here."""
        possible = tf.strings.regex_full_match(lines, self.possible)
        text = lines
        if self.restore_a0:
            text = self._restore_byte_a0(text)
        if self.lossy:
            text = tf.strings.regex_replace(text, self.lossy, self.replacement)
        variants = tf.strings.regex_full_match(text, self.variants)
        encoded = self._bytes.map_chars(text)
        valid = tf.equal(tf.strings.unicode_transcode(encoded, "UTF-8", "UTF-8", errors="replace"), encoded)
        return encoded, possible & valid & ~variants, possible & variants


    def _restore_byte_a0(self, text):
        """ftfy's ``restore_byte_a0`` over text: byte 20 back to A0."""
        a_grave, exceptions = self.a_grave
        text = tf.strings.regex_replace(text, f"({a_grave}) ({exceptions})", b"\\1" + _MARK + b"\\2")  # hide them
        text = tf.strings.regex_replace(text, f"({a_grave}) ", rf"\1{self.byte_a0} ")
        # The marks back to spaces: the one byte of the text that is not UTF-8, replaced by U+0020.
        text = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0x20)
        return _replace_in_matches(text, self.restore_a0, " ", self.byte_a0)


def _replace_in_matches(texts, pattern, old, new):
    """Replaces ``old`` by ``new`` inside every match of ``pattern``."""
    parts = tf.strings.split(tf.strings.regex_replace(texts, pattern, _MARK + b"\\0" + _MARK), _MARK)
    flat = parts.flat_values
    flat = tf.where(odd_positions(parts), tf.strings.regex_replace(flat, old, new), flat)
    return tf.strings.reduce_join(parts.with_flat_values(flat), axis=1)


class TFFixEncoding(tf.Module):
    """ftfy's ``fix_encoding``, line by line: ``tf.string [batch] -> tf.string [batch]``."""

    def __init__(self, name=None):
        super().__init__(name=name)
        self._bad = rules.badness_pattern()
        self._detector = rules.utf8_detector_pattern()
        self._encodings = [_Encoding(spec) for spec in rules.encodings()]
        self._c1 = StringMap(rules.c1_to_windows_1252())

    def candidates(self, texts):
        """Texts that may hold a line to repair: a superset (``(?m)``: ``^`` also at line starts)."""
        return ~tf.strings.regex_full_match(texts, _ASCII) & tf.strings.regex_full_match(texts, "(?m)" + self._bad)

    def fix(self, lines, inconsistent=True):
        """``fix_encoding`` of each line (ftfy's segment): steps until nothing changes."""
        def body(lines, _):
            new = self._step(lines, inconsistent)
            return new, tf.reduce_any(tf.not_equal(new, lines))

        lines, _ = tf.while_loop(lambda _, changed: changed, body, (lines, tf.constant(True)))
        return lines

    def _step(self, lines, inconsistent):
        """One ``_fix_encoding_one_step_and_explain`` on every line."""
        active = ~tf.strings.regex_full_match(lines, _ASCII) & tf.strings.regex_full_match(lines, self._bad)
        result, done = lines, ~active
        for encoding in self._encodings:
            decoded, ok, stop = encoding.decode(lines)
            result = tf.where(~done & ok, decoded, result)
            done |= ok | stop
        if inconsistent:
            pieces = replace_where(lines, ~done, self._decode_inconsistent)
            changed = tf.not_equal(pieces, lines)
            result = tf.where(~done & changed, pieces, result)
            done |= changed
        has_c1 = tf.strings.regex_full_match(lines, _C1)
        return tf.where(~done & has_c1, self._c1.map_chars(lines), result)

    def _decode_inconsistent(self, lines):
        """ftfy's ``decode_inconsistent_utf8``: repairs the bad, shorter UTF-8-looking pieces alone."""
        marked = tf.strings.regex_replace(lines, self._detector, b"\\1" + _MARK + b"\\2" + _MARK)
        parts = tf.strings.split(marked, _MARK)
        flat = parts.flat_values
        line_length = tf.gather(tf.strings.length(lines, unit="UTF8_CHAR"), parts.value_rowids())
        candidate = (odd_positions(parts) & (tf.strings.length(flat, unit="UTF8_CHAR") < line_length)
                     & tf.strings.regex_full_match(flat, self._bad))
        flat = replace_where(flat, candidate, lambda pieces: self.fix(pieces, inconsistent=False))
        return tf.strings.reduce_join(parts.with_flat_values(flat), axis=1)
