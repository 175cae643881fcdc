r"""Figures in the docs pages taken from the files the benchmarks write (``bench/results/*.md``), at build time.

A page names what it shows by a comment the site replaces (``mkdocs.yml``'s ``hooks``):

    <!-- include: bench/results/held_out_bits.md -->                      the whole file
    <!-- include: bench/results/speed_table_amd_epyc_avx2.md "Measured" -->   the block that starts with that text

A block is the paragraph that starts with the text and, where a table follows it, the table; found by its words,
not by line numbers, so a rewritten results file still gives the right block, and one that no longer holds it
fails the build (and ``tests/test_flag_reference.py``). The figure, its command, CPU and date live in one file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r'^<!-- include: (\S+?)(?: "([^"]+)")? -->$', re.M)


def block(path: str, start: str | None) -> str:
    """The file's text, or its block that begins with ``start``."""
    text = (ROOT / path).read_text(encoding="utf-8").strip("\n")
    if start is None:
        return text
    paragraphs = re.split(r"\n\s*\n", text)
    for index, paragraph in enumerate(paragraphs):
        if paragraph.lstrip().startswith(start):
            found = [paragraph]
            if index + 1 < len(paragraphs) and paragraphs[index + 1].lstrip().startswith("|") \
                    and not paragraph.lstrip().startswith("|"):
                found.append(paragraphs[index + 1])
            return "\n\n".join(found)
    raise ValueError(f"{path} has no block starting {start!r}")


def expand(markdown: str) -> str:
    return DIRECTIVE.sub(lambda m: block(m.group(1), m.group(2)), markdown)


def includes(markdown: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in DIRECTIVE.finditer(markdown)]


def on_page_markdown(markdown: str, **_) -> str:
    """mkdocs hook."""
    return expand(markdown)
