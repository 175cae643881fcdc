"""GPT-1 text cleanup, and the ONE definition of every rule the in-graph twin shares.

GPT-1's pipeline (openai/finetune-transformer-lm ``text_utils.py``) is
``ftfy.fix_text`` -> ``text_standardize`` -> word split -> lower-case -> BPE.
This module holds the text side of it:

* :func:`fix_text`: ``ftfy.fix_text`` with its default config: ftfy's own
  line-by-line loop, with a fast path for ASCII lines where ftfy provably only
  converts line breaks (no ``&`` that could start an HTML entity, none of
  ftfy's control characters, and ASCII is never mojibake), so results are
  identical and books clean 4-9x faster.
* :func:`text_standardize`: the reference function, written with explicit
  character classes (``\\s`` of Python ``re`` spelled out) so the very same
  pattern strings run in RE2 inside TensorFlow.
* :func:`clean_text` = ``text_standardize(fix_text(text))``: what the word
  splitter (``gpt_tf/text/word_split.py``) sees.
* :func:`graph_char_map`, :func:`nfc_pairs`, :func:`combining_classes`,
  :func:`canonical_decompositions`, :func:`full_nfc_pattern`, :func:`html_entities`,
  :func:`charref_specials`, :func:`ansi_escape_pattern`: ftfy's per-character
  fixes, NFC, HTML unescaping and terminal escapes as tables and patterns,
  derived from ftfy, ``unicodedata`` and ``html`` themselves, for
  ``gpt_tf/text/tf_text_clean.py``.

All patterns are written to mean the same in Python ``re``, RE2 (TensorFlow)
and Oniguruma (HF ``tokenizers``): only literal characters, ``\\x{...}``-style
code points inside classes (built by :func:`regex_char_class`), greedy
quantifiers and alternation (leftmost-first in all three engines).
"""

import functools
import html
import re
import unicodedata

import ftfy
from ftfy import chardata

# text_standardize's character replacements, in the reference's order.
STANDARDIZE_CHAR_MAP = {"\u2014": "-", "\u2013": "-", "\u2015": "-", "\u2026": "...", "\u00b4": "'"}
# The characters whose runs text_standardize pads with spaces, and its regex for it
# (verbatim; RE2-valid too; Python uses the equivalent, faster ``([chars])\1*``).
STANDARDIZE_RUN_CHARS = '-~!";?+,)(\\/*[]}{|_'
STANDARDIZE_PUNCT_RUNS = r'''(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)'''
# Every character Python's ``re`` matches with ``\s`` in a str pattern (== str.isspace()).
WHITESPACE_CHARS = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)
# ftfy's HTML entity pattern (ASCII only, so identical in RE2).
HTML_ENTITY_PATTERN = chardata.HTML_ENTITY_RE.pattern
# Highest code point scanned for Unicode properties (nothing relevant lies above).
_SCAN_LIMIT = 0x30000


def regex_char_class(chars):
    """A regex character class matching exactly ``chars``, as ``[\\x{..}-\\x{..}]``.

    The ``\\x{HHHH}`` syntax is read identically by RE2 and Oniguruma; use
    :func:`to_python_regex` to run the same pattern with Python ``re``.
    """
    codes = sorted({ord(c) for c in chars})
    parts, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        lo, hi = codes[i], codes[j]
        parts.append(f"\\x{{{lo:x}}}" if lo == hi else f"\\x{{{lo:x}}}-\\x{{{hi:x}}}")
        i = j + 1
    return "[" + "".join(parts) + "]"


def to_python_regex(pattern):
    """Rewrites the ``\\x{HHHH}`` escapes of a shared pattern into Python ``re`` syntax."""
    return re.sub(r"\\x\{([0-9a-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", pattern)


def standardize_patterns():
    """The regex steps of text_standardize as ``(pattern, replacement)`` pairs.

    Replacements use ``\\1`` (valid for both ``re.sub`` and RE2). The final
    ``strip()`` is the last pair. Character replacements come first, separately
    (:data:`STANDARDIZE_CHAR_MAP`).
    """
    ws = regex_char_class(WHITESPACE_CHARS)
    ws_not_newline = regex_char_class(WHITESPACE_CHARS.replace("\n", ""))
    return (
        (STANDARDIZE_PUNCT_RUNS, r" \1 "),
        (f"{ws}*\n{ws}*", " \n "),
        (f"{ws_not_newline}+", " "),
        (f"^{ws}+|{ws}+$", ""),
    )


@functools.lru_cache(maxsize=None)
def _python_standardize_patterns():
    """Compiled Python versions of :func:`standardize_patterns`.

    The punctuation-run alternation ``(-+|~+|...)`` becomes ``([-~...])\\1*``:
    at each position both match the maximal run of the character found there
    when it is one of :data:`STANDARDIZE_RUN_CHARS`, and nothing otherwise;
    the back-reference form is 6x faster in ``re`` (RE2 has no back-references).
    """
    runs = re.compile("([" + re.escape(STANDARDIZE_RUN_CHARS) + r"])\1*")
    rest = [(re.compile(to_python_regex(p)), r) for p, r in standardize_patterns()[1:]]
    return ((runs, r" \g<0> "), *rest)


def text_standardize(text):
    """GPT-1's ``text_standardize``: dashes/ellipsis/acute, punctuation runs, whitespace."""
    for old, new in STANDARDIZE_CHAR_MAP.items():
        text = text.replace(old, new)
    for pattern, replacement in _python_standardize_patterns():
        text = pattern.sub(replacement, text)
    return text


@functools.lru_cache(maxsize=None)
def _ftfy_ascii_hazards():
    """ASCII characters that make ftfy do more than fix line breaks on ASCII text."""
    controls = "".join(chr(c) for c in chardata.CONTROL_CHARS if c < 0x80)
    return re.compile("[" + re.escape(controls + "&") + "]")


def fix_text(text):
    """``ftfy.fix_text(text)`` (default config), skipping ftfy where provably a no-op.

    This is ftfy's own segment loop (one segment per line, ``unescape_html``
    switched off from the first segment holding ``<`` on) with a fast path:
    on an ASCII segment ftfy's ``fix_encoding`` and all non-ASCII fixers do
    nothing, ``unescape_html`` needs ``&``, ``remove_terminal_escapes`` /
    ``remove_control_chars`` need a control character and NFC is the identity,
    so what remains is ``fix_line_breaks`` (``\\r\\n`` and ``\\r`` -> ``\\n``).
    """
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    config = ftfy.TextFixerConfig(explain=False)
    hazards = _ftfy_ascii_hazards()
    out, pos = [], 0
    while pos < len(text):
        end = text.find("\n", pos) + 1 or len(text)
        end = min(end, pos + config.max_decode_length)
        segment = text[pos:end]
        if config.unescape_html == "auto" and "<" in segment:
            config = config._replace(unescape_html=False)
        if segment.isascii() and not hazards.search(segment):
            out.append(segment.replace("\r\n", "\n").replace("\r", "\n"))
        else:
            out.append(ftfy.fix_and_explain(segment, config).text)
        pos = end
    return "".join(out)


def clean_text(text):
    """GPT-1's cleanup: ``text_standardize(ftfy.fix_text(text))``."""
    return text_standardize(fix_text(text))


_SURROGATE = re.compile("[\ud800-\udfff]")


def refuse_surrogates(text):
    """``text``, or ValueError when it holds a lone surrogate: such a ``str`` is not Unicode text and has no
    UTF-8 form, so the in-graph tokenizer can never be given it (TensorFlow refuses to make a string tensor of
    it) and the offline one refuses it the same way instead of guessing (ftfy would make it U+FFFD)."""
    match = _SURROGATE.search(text)
    if match:
        raise ValueError(f"the text holds a lone surrogate U+{ord(match.group()):04X} at character {match.start()}: "
                         "it is not Unicode text (decode its bytes with errors='replace', or drop it)")
    return text


def _canonical_pair(code):
    """The two characters a precomposed character decomposes into, canonically, or None."""
    if 0xAC00 <= code <= 0xD7A3:  # Hangul syllables: algorithmic (L V) or (LV T)
        trailing = (code - 0xAC00) % 28
        if trailing:
            return chr(code - trailing), chr(0x11A7 + trailing)
        return tuple(unicodedata.normalize("NFD", chr(code)))
    parts = unicodedata.decomposition(chr(code)).split()
    if len(parts) != 2 or parts[0].startswith("<"):
        return None
    return chr(int(parts[0], 16)), chr(int(parts[1], 16))


@functools.lru_cache(maxsize=None)
def _unicode_scan():
    """One pass over the code points: decimal digits, NFC singletons, NFC pairs."""
    digits, nfc, pairs = [], [], {}
    for code in range(_SCAN_LIMIT):
        char = chr(code)
        if unicodedata.category(char) == "Nd":
            digits.append(char)
        decomposition = unicodedata.decomposition(char)
        if decomposition and decomposition[0] != "<" and not unicodedata.is_normalized("NFC", char):
            nfc.append(char)
        pair = _canonical_pair(code) if decomposition or 0xAC00 <= code <= 0xD7A3 else None
        if pair and unicodedata.normalize("NFC", pair[0] + pair[1]) == char:
            pairs[pair[0] + pair[1]] = char
    return "".join(digits), "".join(nfc), pairs


def nfc_pairs():
    """``{first + second: composed}``: NFC's primary compositions (``'e\\u0301' -> 'é'``).

    Applied pairwise, left to right, until none applies, they reproduce NFC on
    marks in canonical order; not on unordered marks or blocked compositions.
    """
    return dict(_unicode_scan()[2])


@functools.lru_cache(maxsize=None)
def combining_classes():
    """``{char: canonical combining class}`` of every non-starter (class > 0): what NFC reorders and blocks on."""
    return {chr(c): unicodedata.combining(chr(c)) for c in range(0x110000)
            if not 0xD800 <= c <= 0xDFFF and unicodedata.combining(chr(c))}


@functools.lru_cache(maxsize=None)
def canonical_decompositions():
    """``{char: NFD(char)}`` for every character NFD changes (precomposed letters, Hangul syllables, singletons)."""
    out = {}
    for code in range(_SCAN_LIMIT):
        char = chr(code)
        if not 0xD800 <= code <= 0xDFFF and (unicodedata.decomposition(char) or 0xAC00 <= code <= 0xD7A3):
            nfd = unicodedata.normalize("NFD", char)
            if nfd != char:
                out[char] = nfd
    return out


def full_nfc_pattern():
    """A pattern matching texts whose NFC needs more than composing neighbours pairwise (``nfc_pairs``): a
    non-starter right after another, or after a character whose decomposition ends with one (``à`` + U+0323).
    There marks are reordered by combining class and a composition may be blocked or reach past a mark."""
    marks = combining_classes()
    tails = [c for c, d in canonical_decompositions().items() if d[-1] in marks]
    return "(?s).*" + regex_char_class([*marks, *tails]) + regex_char_class(marks) + ".*"


def ansi_escape_pattern():
    """ftfy's ``ANSI_RE`` with Python's Unicode ``\\d`` spelled out (RE2's is ASCII)."""
    digits = regex_char_class(_unicode_scan()[0])
    return f"\x1b\\[(?:{digits}|;)*[a-zA-Z]"


def _ftfy_char_candidates():
    """Characters that one of ftfy's context-free fixers changes, or text_standardize maps."""
    chars = {chr(c) for c in chardata.CONTROL_CHARS} | {chr(c) for c in chardata.LIGATURES}
    chars |= {chr(c) for c in chardata.WIDTH_MAP} | {chr(c) for c in range(0x80, 0xA0)}
    chars |= set("\r\u2028\u2029\x85") | set(STANDARDIZE_CHAR_MAP) | set(_unicode_scan()[1])
    chars |= {chr(c) for c in range(0x10000) if chardata.SINGLE_QUOTE_RE.match(chr(c))}
    chars |= {chr(c) for c in range(0x10000) if chardata.DOUBLE_QUOTE_RE.match(chr(c))}
    return chars


@functools.lru_cache(maxsize=None)
def graph_char_map(standardize=True):
    """``{char: replacement}`` for every character ftfy + text_standardize map on its own.

    Each value is computed by ftfy itself (``fix_text`` on the lone character,
    minus the context-dependent ``fix_encoding`` / ``unescape_html``), followed
    by text_standardize's character replacements: C1 controls as Windows-1252,
    Latin ligatures, full/half-width forms, curly quotes, line breaks, control
    characters, NFC of single characters, dashes, ``…`` and ``´``. (The graph
    removes whole terminal escapes before it applies the map, which drops ESC.)
    ``standardize=False``: ftfy's replacements only.
    """
    table = {}
    for char in sorted(_ftfy_char_candidates()):
        value = ftfy.fix_text(char, fix_encoding=False, unescape_html=False)
        for old, new in STANDARDIZE_CHAR_MAP.items() if standardize else ():
            value = value.replace(old, new)
        if value != char:
            table[char] = value
    return table


def html_entities():
    """ftfy's named HTML entities (``'&amp;' -> '&'``, ``'&EACUTE;' -> 'É'``, ...)."""
    return dict(chardata.HTML_ENTITIES)


@functools.lru_cache(maxsize=None)
def charref_specials():
    """Numeric character references that ``html.unescape`` does not map to ``chr(n)``.

    ``{n: replacement}``: Windows-1252 for 0x80-0x9F, U+FFFD for 0, ``''`` for
    non-characters and most controls. Values come from ``html.unescape``.
    """
    candidates = set(html._invalid_charrefs) | set(html._invalid_codepoints)  # pylint: disable=protected-access
    return {n: html.unescape(f"&#{n};") for n in sorted(candidates)}
