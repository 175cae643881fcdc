"""Writes ``gpt_tf/text/spacy_en_rules.json``: spaCy's English tokenizer rules, in RE2-compatible form.

GPT-1 split words with spaCy's English tokenizer. The project reproduces that split in
``gpt_tf/text/word_split.py`` (offline) and ``gpt_tf/text/tf_tokenizer.py`` (core TensorFlow) without
depending on spaCy: this script copies spaCy's data once, from ``spacy.lang.en.English().tokenizer``
and the lists it was built from, into the JSON file:

* ``prefixes``: the prefix alternatives, in spaCy's order;
* ``suffixes``: ``[before, suffix]`` pairs, in spaCy's order: ``before`` is the lookbehind of the
  alternative (``''`` for none), which RE2 lacks; ``word_split`` matches it as ordinary context;
* ``infixes``: ``[before, infix, after]`` triples (lookbehind, infix, lookahead);
* ``url``: spaCy's ``URL_PATTERN`` as two patterns (IP address, host name), see :func:`url_patterns`;
* ``specials``: the tokenizer exceptions (``"can't" -> ["ca", "n't"]``), without those holding
  whitespace (the split runs on space-free chunks).

Patterns are rewritten for RE2 (TensorFlow) and, through ``text_clean.to_python_regex``, Python:
``\\uXXXX`` escapes become ``\\x{xxxx}``, and ``\\d``, ``\\w``, ``\\S`` become explicit classes
(Python's are Unicode-wide, RE2's ASCII). Two lookarounds are dropped, both unable to change a
result on text after ``text_standardize`` (which pads every run of ``+ - / ? ! , ; ( ) [ ] { } | \\
* ~ _ "`` with spaces, so such a run is a chunk of its own):

* the prefix ``\\+(?![0-9])`` becomes ``\\+``: a ``+`` never precedes a digit inside a chunk;
* the private-network exclusions ``(?!...)`` of ``URL_PATTERN``: they only decide whether an IP
  address is a URL, and no infix can split an IP address, so it is one token either way.

and one part of ``URL_PATTERN``, its scheme ``[\\w+-.]{2,}://``, which needs a ``/``.

    python -m gpt_tf.text.make_spacy_rules            # rewrites gpt_tf/text/spacy_en_rules.json (needs spaCy)
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

OUTPUT = Path(__file__).with_name("spacy_en_rules.json")


@functools.lru_cache(maxsize=None)
def _char_set(pattern: str) -> str:
    """Every code point that the one-character Python pattern matches."""
    compiled = re.compile(pattern)
    return "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and compiled.fullmatch(chr(c)))


def _class_body(chars: str) -> str:
    """``chars`` as the inside of a character class (``\\x{..}`` ranges)."""
    from gpt_tf.text.text_clean import regex_char_class  # pylint: disable=import-outside-toplevel
    return regex_char_class(chars)[1:-1]


def to_re2(pattern: str) -> str:
    """A Python ``re`` pattern of spaCy's, rewritten for RE2 (see the module docstring)."""
    shorthands = {"d": _char_set(r"\d"), "w": _char_set(r"\w")}
    out, i, in_class = [], 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            kind = pattern[i + 1]
            if kind in "uU":
                width = 4 if kind == "u" else 8
                out.append(f"\\x{{{int(pattern[i + 2: i + 2 + width], 16):x}}}")
                i += 2 + width
                continue
            if kind in shorthands:
                body = _class_body(shorthands[kind])
                out.append(body if in_class else f"[{body}]")
            elif kind == "S":
                assert not in_class, pattern
                out.append(f"[^{_class_body(_char_set(chr(92) + 's'))}]")
            else:
                out.append(pattern[i: i + 2])
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)


def _syntax(pattern: str):
    """``(index, char)`` of each character of ``pattern`` outside escapes and character classes."""
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        else:
            yield i, char
        i += 1


def _groups(pattern: str, nested: bool = False) -> list:
    """``(start, end)`` of the top-level (or all) parenthesised groups of ``pattern``, by end."""
    groups, stack = [], []
    for i, char in _syntax(pattern):
        if char == "(":
            stack.append(i)
        elif char == ")":
            start = stack.pop()
            if nested or not stack:
                groups.append((start, i))
    return groups


def lookarounds(pattern: str) -> tuple:
    """``(before, body, after)``: a leading lookbehind and a trailing lookahead split off."""
    before = after = ""
    groups = _groups(pattern)
    if groups and groups[0][0] == 0 and pattern.startswith("(?<="):
        before, pattern = pattern[4: groups[0][1]], pattern[groups[0][1] + 1:]
        groups = _groups(pattern)
    if groups and groups[-1][1] == len(pattern) - 1 and pattern[groups[-1][0]:].startswith(("(?=", "(?!")):
        start = groups[-1][0]
        if pattern[start + 2] == "!":
            if pattern != r"\+(?![0-9])":
                raise ValueError(f"unexpected negative lookahead in {pattern!r}")
        else:
            after = pattern[start + 3: -1]
        pattern = pattern[:start]
    if "(?<" in pattern or "(?=" in pattern or "(?!" in pattern:
        raise ValueError(f"lookaround left in {pattern!r}")
    return before, pattern, after


def _top_level_alternatives(body: str) -> list:
    """``body`` split at its top-level ``|``."""
    parts, depth, start = [], 0, 0
    for i, char in _syntax(body):
        if char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    return parts + [body[start:]]


def url_patterns(pattern: str) -> list:
    """spaCy's URL_PATTERN as two RE2 patterns (IP address, host name) to full-match, either.

    Dropped: the negative lookaheads (private IP ranges) and the scheme ``[\\w+-.]{2,}://``
    (``/`` is padded by text_standardize, so it cannot match a chunk); the length limits of host
    labels (63) and of the top-level domain (2-63) become ``*`` and ``{2,}``, and the pattern is
    split in two, so that each RE2 program fits RE2's default DFA memory (TensorFlow logs an
    error and falls back to a slow matcher otherwise).
    """
    for start, end in sorted(_groups(pattern, nested=True), reverse=True):
        if pattern.startswith("(?!", start):
            pattern = pattern[:start] + pattern[end + 1:]
    scheme = r"(?:(?:[\w\+\-\.]{2,})://)?"
    assert "(?!" not in pattern and pattern.count(scheme) == 1
    pattern = pattern.replace("(?u)", "").replace(scheme, "")
    assert pattern.count("{0,62}") == 1 and pattern.count("{2,63}") == 1
    pattern = pattern.replace("{0,62}", "*").replace("{2,63}", "{2,}")
    groups = _groups(pattern)
    host_group = max(groups, key=lambda g: g[1] - g[0])  # (?:IP|HOST): the longest top-level group
    ip, host = _top_level_alternatives(pattern[host_group[0] + 3: host_group[1]])
    head, tail = pattern[: host_group[0]], pattern[host_group[1] + 1:]
    return [to_re2(f"{head}(?:{ip}){tail}"), to_re2(f"{head}(?:{host}){tail}")]


def export() -> dict:
    """The rules as a JSON-ready dict."""
    import spacy  # pylint: disable=import-outside-toplevel
    from spacy.lang import punctuation, tokenizer_exceptions  # pylint: disable=import-outside-toplevel
    from spacy.lang.en import English  # pylint: disable=import-outside-toplevel
    from spacy.lang.en.punctuation import TOKENIZER_INFIXES  # pylint: disable=import-outside-toplevel
    from spacy.symbols import ORTH  # pylint: disable=import-outside-toplevel
    tokenizer = English().tokenizer
    assert tokenizer.token_match is None and tokenizer.url_match == tokenizer_exceptions.URL_MATCH
    prefix_list, suffix_list, infix_list = ([p for p in entries if p.strip()] for entries in (
        punctuation.TOKENIZER_PREFIXES, punctuation.TOKENIZER_SUFFIXES, TOKENIZER_INFIXES))  # as spacy.util
    assert tokenizer.prefix_search.__self__.pattern == "|".join("^" + p for p in prefix_list)
    assert tokenizer.suffix_search.__self__.pattern == "|".join(p + "$" for p in suffix_list)
    assert tokenizer.infix_finditer.__self__.pattern == "|".join(infix_list)
    prefixes = []
    for pattern in prefix_list:
        before, body, after = lookarounds(pattern)
        assert not before and not after, pattern
        prefixes.append(to_re2(body))
    suffixes = []
    for pattern in suffix_list:
        before, body, after = lookarounds(pattern)
        assert not after, pattern
        suffixes.append([to_re2(before), to_re2(body)])
    infixes = [[to_re2(part) for part in lookarounds(p)] for p in infix_list]
    specials = {chunk: [piece[ORTH] for piece in pieces]
                for chunk, pieces in sorted(tokenizer.rules.items()) if not any(c.isspace() for c in chunk)}
    return {"source": f"spaCy {spacy.__version__}, spacy.lang.en.English().tokenizer; see gpt_tf/text/make_spacy_rules.py",
            "prefixes": prefixes, "suffixes": suffixes, "infixes": infixes,
            "url": url_patterns(tokenizer_exceptions.URL_PATTERN), "specials": specials}


def main():
    OUTPUT.write_text(json.dumps(export(), ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
