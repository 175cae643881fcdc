"""The docs speak to users: no issue numbers, no commit hashes in prose, no paths of one machine, no words about
how the project is developed, and no placeholders of another tool's output. History belongs to git.

The docs are README.md, WORKSPACE.md, docs/*.md, bench/README.md, tools/*/README.md and the shipped presets' model
cards; fenced code blocks are read too (a command with a machine's path would not run elsewhere).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted({ROOT / "README.md", ROOT / "WORKSPACE.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md",
               *(ROOT / "tools").glob("*/README.md"), *(ROOT / "gpt_tf").rglob("presets/*/README.md")})
RULES = {
    "an issue number": re.compile(r"(?<![\w/&])#\d+\b|\b[Ii]ssues? #?\d+\b"),
    "a path of one machine": re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home|Users|opt|mnt|srv)/[\w.-]"),
    "a placeholder of another tool": re.compile(r"\$OUT\b|<files_at>|\bfiles_at\b"),
    "words about how the project is developed": re.compile(
        r"\b(?:lent|device call|development machine|this session|earlier session|a session)\b", re.I),
    # a short hex word with letters and digits, where a commit would be named ("at 1a2b3c4", "clone of `1a2b3c4`")
    "a commit hash": re.compile(r"\b(?:at|of|commit|revision|since)\s+`?(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b"),
}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_carry_no_history_or_machine_detail(path):
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for what, rule in RULES.items():
            for match in rule.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {match.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_rules_catch_what_they_name():
    caught = {what: bool(rule.search(text)) for (what, rule), text in zip(RULES.items(), (
        "as asked in issue #31", "see /work/main/runs/x", "copy it to $OUT", "on a lent GPU", "a fresh clone of 054d592"))}
    assert all(caught.values()), caught
    clean = "Section [results](#results-at-a-glance), `~/.cache/gpt_tf`, /models in the container, 4.5e-06, sha256 f393d09d"
    assert not any(rule.search(clean) for rule in RULES.values())
