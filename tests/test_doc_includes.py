"""The figures the docs pages take from bench/results/*.md (``<!-- include: FILE "start" -->``, expanded by the
docs build's hook ``tools/doc_includes.py``) are still in those files: a rewritten results file that lost a
block fails here, not on the site."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import doc_includes

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_include_finds_its_block(page):
    for path, start in doc_includes.includes(page.read_text(encoding="utf-8")):
        assert path.startswith("bench/results/"), f"{page.name}: {path}: figures come from bench/results/"
        text = doc_includes.block(path, start)
        assert text.strip(), f"{page.name}: {path} {start!r} is empty"
        if start and start.startswith("|"):
            assert text.lstrip().startswith("|"), f"{page.name}: {path} {start!r} is not a table"


def test_a_block_is_its_paragraph_and_the_table_after_it(tmp_path, monkeypatch):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.md").write_text(
        "Measured on a CPU.\n\nSpeed (tokens/s):\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nAfter.\n", encoding="utf-8")
    monkeypatch.setattr(doc_includes, "ROOT", tmp_path)
    page = 'Before.\n\n<!-- include: bench/results/x.md "Speed" -->\n\nEnd.\n'
    assert doc_includes.expand(page) == "Before.\n\nSpeed (tokens/s):\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nEnd.\n"
    with pytest.raises(ValueError):
        doc_includes.block("bench/results/x.md", "Latency")
