"""ftfy's ``fix_encoding`` (mojibake repair) as RE2 patterns and tables, for ``gpt_tf/text/tf_fix_encoding.py``.

ftfy decides that a line is mojibake with its ``BADNESS_RE`` heuristic, then tries, in order, each
single-byte encoding of ``CHARMAP_ENCODINGS`` that can represent the whole line: encode the line
in it (after ``restore_byte_a0`` and, for ``sloppy-*`` encodings, ``replace_lossy_sequences``) and
decode the bytes as UTF-8. Failing that, it repairs embedded pieces (``decode_inconsistent_utf8``,
found by ``UTF8_DETECTOR_RE``), else maps C1 controls to Windows-1252. Everything here is derived
from ftfy's own regexes and codecs:

* :func:`to_re2` rewrites a Python pattern (parsed by ``re``'s own parser) for RE2, spelling
  ``\\s``/``\\w`` and every class out as explicit code points; byte patterns can be rewritten
  over the characters that their bytes decode to in one encoding, so the byte-level steps run
  on text (a character of a line that the encoding can represent is exactly one byte);
* :func:`encodings` gives, per encoding: the character -> byte table, ftfy's "possible"
  pattern, its ``restore_byte_a0`` (``A_GRAVE_WORD_RE``, whose lookahead becomes a list of
  exceptions, then ``ALTERED_UTF8_RE``) and ``replace_lossy_sequences`` patterns over text, and
  the byte sequences that make ftfy decode with ``utf-8-variants`` (CESU-8, ``C0 80``).
"""

import functools
import re
import re._constants as sre  # pylint: disable=protected-access
import re._parser as sre_parse  # pylint: disable=protected-access

import ftfy.bad_codecs  # noqa: F401  (registers the sloppy-* codecs)  pylint: disable=unused-import
from ftfy import badness, chardata, fixes

from gpt_tf.text.text_clean import regex_char_class

# restore_byte_a0 starts with A_GRAVE_WORD_RE.sub(b"\xc3\xa0 "): 'Ã ' read as the word 'à', unless
# one of these follows (its negative lookahead).
_A_GRAVE = b"\xc3 (?! |quele|quela|quilo|s )"
_A_GRAVE_EXCEPTIONS = "(?: |quele|quela|quilo|s )"
# Byte sequences that make ftfy decode with its "utf-8-variants" codec (CESU-8 pairs, Java's C0 80).
_VARIANTS = rb"\xed[\xa0-\xaf][\x80-\xbf]\xed[\xb0-\xbf][\x80-\xbf]|\xc0\x80"


@functools.lru_cache(maxsize=None)
def _category(name) -> str:
    """The characters of a ``re`` category (``\\s``, ``\\w``, ``\\d``) in a str pattern."""
    shorthand = {sre.CATEGORY_SPACE: r"\s", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_DIGIT: r"\d"}[name]
    compiled = re.compile(shorthand)
    return "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and compiled.match(chr(c)))


def _class(items, char) -> str:
    """An RE2 class for the items of a parsed ``[...]`` (``char`` maps a literal to its character)."""
    negate, members = False, set()
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            members.add(char(av))
        elif op is sre.RANGE:
            members.update(char(c) for c in range(av[0], av[1] + 1))
        elif op is sre.CATEGORY:
            members.update(_category(av))
        else:
            raise ValueError(f"unsupported class item {op}")
    body = regex_char_class(members)
    return "[^" + body[1:] if negate else body


def _emit(tree, char) -> str:
    """RE2 syntax for a parsed pattern."""
    out = []
    for op, av in tree:
        if op is sre.LITERAL:
            out.append(_class([(op, av)], char))
        elif op is sre.IN:
            out.append(_class(av, char))
        elif op is sre.ANY:
            out.append(".")
        elif op is sre.CATEGORY:
            out.append(_class([(op, av)], char))
        elif op is sre.AT and av in (sre.AT_BEGINNING, sre.AT_END):
            out.append("^" if av is sre.AT_BEGINNING else "$")
        elif op is sre.BRANCH:
            out.append("(?:" + "|".join(_emit(branch, char) for branch in av[1]) + ")")
        elif op is sre.SUBPATTERN:
            out.append(("(" if av[0] else "(?:") + _emit(av[3], char) + ")")
        elif op is sre.MAX_REPEAT:
            low, high, sub = av
            high = "" if high is sre.MAXREPEAT else high
            out.append(f"(?:{_emit(sub, char)}){{{low},{high}}}")
        else:
            raise ValueError(f"unsupported regex construct {op}")
    return "".join(out)


def to_re2(pattern, flags=0, char=chr) -> str:
    """``pattern`` (Python ``re``, str or bytes) rewritten for RE2; ``char`` maps literals."""
    return _emit(sre_parse.parse(pattern, flags), char)


def badness_pattern() -> str:
    """``(?s).*(?:BADNESS_RE).*``: full-matches the lines ftfy calls mojibake (``is_bad``)."""
    return "(?s).*(?:" + to_re2(badness.BADNESS_RE.pattern, badness.BADNESS_RE.flags) + ").*"


def utf8_detector_pattern() -> str:
    """``UTF8_DETECTOR_RE`` as ``(^|[^continuation])(sequence)``: its lookbehind becomes a group."""
    tree = sre_parse.parse(chardata.UTF8_DETECTOR_RE.pattern, chardata.UTF8_DETECTOR_RE.flags)
    (look_op, look), sequences = list(tree)
    assert look_op is sre.ASSERT_NOT and look[0] == -1 and sequences[0] is sre.MAX_REPEAT
    (class_op, items), = list(look[1])
    assert class_op is sre.IN
    not_after = _class([(sre.NEGATE, None)] + list(items), chr)
    return f"(^|{not_after})({_emit([sequences], chr)})"


def c1_to_windows_1252() -> dict:
    """ftfy's ``fix_c1_controls``: ``{C1 control: its Windows-1252 character}``."""
    return {chr(c): bytes([c]).decode("sloppy-windows-1252") for c in range(0x80, 0xA0)}


@functools.lru_cache(maxsize=None)
def encodings() -> tuple:
    """Per CHARMAP encoding, in ftfy's order: name and RE2 patterns over text, byte table."""
    assert fixes.A_GRAVE_WORD_RE.pattern == _A_GRAVE
    out = []
    for name in chardata.CHARMAP_ENCODINGS:
        decoded = {b: bytes([b]).decode(name) for b in range(256)}
        char = decoded.__getitem__
        possible = chardata.ENCODING_REGEXES[name]
        out.append({
            "name": name,
            "possible": "(?s)" + to_re2(possible.pattern, possible.flags),
            "bytes": {decoded[b]: bytes([b]) for b in range(256)},
            "restore_a0": None if name == "macroman" else to_re2(
                chardata.ALTERED_UTF8_RE.pattern, chardata.ALTERED_UTF8_RE.flags, char),
            "lossy": to_re2(chardata.LOSSY_UTF8_RE.pattern, chardata.LOSSY_UTF8_RE.flags, char)
            if name.startswith("sloppy") else None,
            "replacement": "\ufffd".encode("utf-8").decode(name),
            "a_grave": (regex_char_class(decoded[0xC3]), _A_GRAVE_EXCEPTIONS),
            "byte_a0": decoded[0xA0],
            "variants": "(?s).*(?:" + to_re2(_VARIANTS, 0, char) + ").*",
        })
    return tuple(out)
