"""GPT-1's word split: spaCy's English tokenizer, reproduced from its rules without spaCy.

GPT-1 (openai/finetune-transformer-lm ``text_utils.py``) ran spaCy's English tokenizer on the text
after ``ftfy.fix_text`` and ``text_standardize``, lower-cased each token and applied BPE to it. This
module is that split, for the offline tokenizer; ``gpt_tf/text/tf_word_split.py`` is the same algorithm
in core TensorFlow ops. Both use the patterns and tables built here, from
``gpt_tf/text/spacy_en_rules.json`` (spaCy 3.8's English rules, written by ``gpt_tf/text/make_spacy_rules.py``).

The text is cut at spaces into chunks (after ``text_standardize`` a ``'\\n'`` chunk stands for every
line break). A chunk is split as spaCy's ``Tokenizer`` does (its ``_split_affixes`` and
``_attach_tokens``), case-sensitively (``Mr.`` is a word, ``mr.`` is ``mr .``; ``U.S.`` one word,
``u.s.`` is ``u.s .``):

1. a special case (``"can't" -> "ca n't"``, ``"Mr." -> "Mr."``, ``"gonna" -> "gon na"``) is
   looked up first; otherwise
2. a prefix (quotes, ``$``, ``...`` ...) and a suffix (quotes, ``'s``, ``.`` after a lower-case
   letter or digit or two capitals, ``...``, units after a digit ...) are cut off, in spaCy's loop:
   it stops where the remainder is a special case (then it is split as such) or nothing is cut;
3. what remains is one word if it is a URL or e-mail address, else it is cut at infixes
   (``...`` inside a word, ``.`` between a lower-case and a capital letter, ``:<>=`` between
   letters, ``^`` between digits, symbols).

Lookbehind and lookahead, which RE2 lacks, are matched as ordinary context inside capture groups
and written back by the rewrite (``(ctx)(infix)(ctx) -> '\\1 \\2 \\3'``, applied twice so that a
context character consumed by one match is seen by the next). The suffix is found with a lazy
``^.*?`` before the alternatives, which finds the leftmost suffix start as spaCy's ``re.search``
does; alternatives with a one-character context come after those without, two-character contexts
last, which keeps that order exact for spaCy's lists. Python ``re`` and RE2 agree on every pattern
here: explicit code points in classes, no back-references, leftmost-first alternation.

Words are lower-cased after the split, per word, as the release's ``token.text.lower()``. Known
differences from spaCy: its matcher that re-merges special cases across already split tokens
(``_apply_special_cases``) is not reproduced, and URL host labels and top-level domains have no
length limit (spaCy: 63); see ``gpt_tf/text/make_spacy_rules.py`` for the two lookarounds dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from pathlib import Path

from gpt_tf.text.text_clean import STANDARDIZE_RUN_CHARS, to_python_regex

END_OF_WORD = "</w>"  # the BPE marks the end of each word of this split with it (GPT-1: ``x</w>``)

RULES_FILE = Path(__file__).with_name("spacy_en_rules.json")
# Chunks no rule can split: letters only (ASCII), digits only, the line break.
SIMPLE_PATTERN = "[A-Za-z]+|[0-9]+|\n"
_CACHE_LIMIT = 1 << 20  # chunks memoised by the offline splitter before its cache is emptied


def fingerprint() -> str:
    """Names this split (rules file and algorithm), for the data builders' cache keys."""
    digest = hashlib.sha256(RULES_FILE.read_bytes()).hexdigest()[:16]
    return f"spacy_en/1:{digest}"


@dataclasses.dataclass(frozen=True)
class SplitPatterns:
    """The word split as RE2 patterns with ``\\1``-style rewrites, and the special cases."""

    prefix: str  # '^(prefix)?.*$' -> '\\1': the prefix of a chunk ('' for none)
    suffix: str  # '^.*?(?:(suffix)|ctx(suffix)|...)$|^.*$' -> suffix_rewrite: its suffix
    suffix_rewrite: str
    infix: str  # infixes without context -> ' \\1 '
    context_infixes: tuple  # ('(before)(infix)(after)', ...) -> '\\1 \\2 \\3', each applied twice
    urls: tuple  # a chunk full-matching one of these is one word
    specials: dict  # {chunk: 'its words joined by spaces'}
    merge: str  # '(^| )(words|...)( |$)' on words joined by two spaces: special cases split apart
    merges: dict  # {'words  joined  by  two  spaces': 'the special case's words joined by spaces'}
    infix_probe: str  # full-matches every string that an infix pattern can change (graph shortcut)
    merge_probe: str  # full-matches every string of words (any spacing) that ``merge`` can change


def _alternation(patterns) -> str:
    return "|".join(patterns)


def _suffix_pattern(suffixes) -> tuple:
    """The suffix search and its rewrite; alternatives grouped by context, shortest context first."""
    groups = {}
    for before, suffix in suffixes:
        groups.setdefault(before, []).append(suffix)
    width = {before: len(re.findall(r"\[(?:\\.|[^\]])*\]|\\.|.", before)) for before in groups}
    order = sorted(groups, key=lambda before: width[before])  # stable: spaCy's order within a width
    if len(order) > 9:
        raise ValueError("more than 9 suffix contexts: RE2 rewrites stop at \\9")
    body = _alternation(f"{before}({_alternation(groups[before])})" for before in order)
    rewrite = "".join(f"\\{i}" for i in range(1, len(order) + 1))
    return f"^(?s:.*?)(?:{body})$|^(?s:.*)$", rewrite


def _escape(text: str) -> str:
    """``text`` as a literal in RE2 and Python ``re``."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


def _merge_table(specials: dict, splitter: "WordSplitter") -> dict:
    """``{affix split of a special case, words joined by two spaces: its own words}``.

    spaCy's ``_apply_special_cases`` re-merges the tokens that its affix rules cut a special
    case into (``Mrs.L.`` -> ``Mrs . L.`` -> ``Mrs. L.``, ``''Tis`` -> ``' ' Tis`` -> ``'' Tis``).
    Cases holding a character that ``text_standardize`` pads with spaces next to another one can
    never occur inside a chunk and are left out.
    """
    table = {}
    for chunk, words in specials.items():
        pieces = splitter.split_chunk(chunk).split(" ")
        padded = any(c in STANDARDIZE_RUN_CHARS for c in chunk) and len(set(chunk)) > 1
        if len(pieces) > 1 and not padded:
            table["  ".join(pieces)] = words
    return table


@functools.lru_cache(maxsize=None)
def split_patterns(path: str = str(RULES_FILE)) -> SplitPatterns:
    """The patterns of :class:`SplitPatterns`, from the rules file."""
    rules = json.loads(Path(path).read_text(encoding="utf-8"))
    suffix, suffix_rewrite = _suffix_pattern(rules["suffixes"])
    plain = [infix for before, infix, after in rules["infixes"] if not before and not after]
    context = tuple(f"({before})({infix})({after})" for before, infix, after in rules["infixes"] if before or after)
    specials = {chunk: " ".join(words) for chunk, words in rules["specials"].items()}
    patterns = SplitPatterns(
        prefix=f"^({_alternation(rules['prefixes'])})?(?s:.*)$", suffix=suffix, suffix_rewrite=suffix_rewrite,
        infix=f"({_alternation(plain)})", context_infixes=context, urls=tuple(rules["url"]),
        specials={}, merge="", merges={}, infix_probe="", merge_probe="")
    merges = _merge_table(specials, WordSplitter(patterns))  # spaCy's _tokenize_affixes(chunk, False)
    longest_first = sorted(merges, key=lambda key: (-key.count("  "), -len(key), key))
    merge = f"(^| )({_alternation(_escape(key) for key in longest_first)})( |$)"
    any_spacing = _alternation(_escape(key).replace("  ", " +") for key in longest_first)
    return dataclasses.replace(
        patterns, specials=specials, merge=merge, merges=merges,
        infix_probe=f"(?s).*(?:{_alternation([patterns.infix, *patterns.context_infixes])}).*",
        merge_probe=f"(?s)(?:.* )?(?:{any_spacing})(?: .*)?")


class WordSplitter:
    """The split of :func:`split_patterns` in Python ``re``, memoised per chunk."""

    def __init__(self, patterns: SplitPatterns | None = None):
        patterns = patterns or split_patterns()
        def compiled(pattern):
            return re.compile(to_python_regex(pattern))
        self._simple = compiled(SIMPLE_PATTERN)
        self._prefix = compiled(patterns.prefix)
        self._suffix = compiled(patterns.suffix)
        self._suffix_rewrite = patterns.suffix_rewrite
        self._infix = compiled(patterns.infix)
        self._context_infixes = [compiled(p) for p in patterns.context_infixes]
        self._urls = [compiled(p) for p in patterns.urls]
        self._specials = patterns.specials
        self._merge = compiled(patterns.merge) if patterns.merge else None
        self._merges = patterns.merges
        self._cache = {}

    def __call__(self, text: str) -> str:
        """The lower-cased words of a cleaned text (after ``text_standardize``), joined by spaces."""
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        return " ".join([cache[c] if c in cache else self._remember(c) for c in text.split(" ")])

    def _remember(self, chunk: str) -> str:
        words = self.split_chunk(chunk).lower()
        self._cache[chunk] = words
        return words

    def split_chunk(self, chunk: str) -> str:
        """The words of one space-free chunk, cased, joined by spaces."""
        special = self._specials.get(chunk)
        if special is not None:
            return special
        if self._simple.fullmatch(chunk):
            return chunk
        prefixes, suffixes, rest = self._split_affixes(chunk)
        middle = self._specials.get(rest)
        if middle is None:
            middle = self._split_infixes(rest)
            if middle != rest and any(url.fullmatch(rest) for url in self._urls):
                middle = rest
        words = "  ".join(w for w in (*prefixes, *middle.split(" "), *reversed(suffixes)) if w)
        if self._merge is not None and self._merge.search(words):
            words = self._merge.sub(lambda m: m[1] + self._merges[m[2]] + m[3], words)
        return " ".join(w for w in words.split(" ") if w)

    def _split_infixes(self, rest: str) -> str:
        """Spaces around the infixes of ``rest`` (each ``sub`` only where its pattern occurs)."""
        if self._infix.search(rest):
            rest = self._infix.sub(r" \1 ", rest)
        for pattern in self._context_infixes:
            if pattern.search(rest):
                rest = pattern.sub(r"\1 \2 \3", pattern.sub(r"\1 \2 \3", rest))
        return rest

    def _split_affixes(self, rest: str) -> tuple:
        """spaCy's ``_split_affixes``: prefixes, suffixes (innermost last) and what remains."""
        prefixes, suffixes, specials = [], [], self._specials
        while rest and rest not in specials:
            prefix = self._prefix.match(rest).group(1) or ""  # == sub(pattern, r"\1")
            minus_pre = rest[len(prefix):]
            if prefix and minus_pre in specials:
                prefixes.append(prefix)
                return prefixes, suffixes, minus_pre
            suffix = "".join(filter(None, self._suffix.match(minus_pre).groups()))  # == sub(..., rewrite)
            minus_suf = rest[: len(rest) - len(suffix)]
            if suffix and minus_suf in specials:
                suffixes.append(suffix)
                return prefixes, suffixes, minus_suf
            if prefix and suffix and len(prefix) + len(suffix) <= len(rest):
                prefixes.append(prefix)
                suffixes.append(suffix)
                rest = rest[len(prefix): len(rest) - len(suffix)]
            elif prefix or suffix:
                (prefixes if prefix else suffixes).append(prefix or suffix)
                rest = minus_pre if prefix else minus_suf
            else:
                break
        return prefixes, suffixes, rest
