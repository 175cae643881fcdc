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
    # a word of 7 to 40 hex digits with a letter among them, anywhere but after "sha256" ("at 1a2b3c4",
    # "--baseline_ref=1a2b3c4", "git show 1a2b3c4:path"); one of digits only where a commit would be named
    "a commit hash": re.compile(
        r"(?<!sha256 )(?<![\w.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])"
        r"|(?:`|\b(?:at|of|commit|revision|since|ref|base)[\s=]+`?)\d{7,40}(?![\w-])"),
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
    hashes = ("python -m bench.tokenizer --baseline_ref=ef438ba", "`git show ec0684d:bench/results/w.npz`",
              "the fix (`1e2411d`)", "at `7129582`, before it", "--base=3f2a1b9c0d4e5f60718293a4b5c6d7e8f9a0b1c2")
    assert [text for text in hashes if not RULES["a commit hash"].search(text)] == []
    clean = ("Section [results](#results-at-a-glance), `~/.cache/gpt_tf`, /models in the container, 4.5e-06, "
             "sha256 f393d09d, 2,566,421 tokens, a 64-digit digest " + "a1" * 32 + ", `--base=REV`, 1234567 bytes")
    assert not any(rule.search(clean) for rule in RULES.values())


FENCED = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a markdown file's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated one numbered."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCED.sub("", path.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        number, unique = 0, slug
        while unique in found:
            number += 1
            unique = f"{slug}-{number}"
        found.add(unique)
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_between_the_docs_resolve(path):
    dead = []
    text = re.sub(r"`[^`\n]*`", "", FENCED.sub("", path.read_text(encoding="utf-8")))
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            dead.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            dead.append(f"{target}: no such heading")
    assert not dead, f"{path.relative_to(ROOT)}: " + "; ".join(dead)


def test_the_docs_site_builds_with_no_warning(tmp_path):
    """``mkdocs build --strict`` (mkdocs.yml: docs/ as a site, the API reference from the family's docstrings): a
    dead link, a missing anchor, a page outside the navigation or a docstring mkdocstrings cannot read fails."""
    import os
    import subprocess
    import sys

    try:
        import mkdocs  # noqa: F401  (the docs extra)
        import mkdocstrings  # noqa: F401
    except ImportError as err:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"the docs extra is not installed ({err}): pip install '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("GPT1Backbone", "GPT1TextClassifier", "GPT1MultipleChoice", "vocabulary_size", "num_classes"):
        assert name in api, f"the API reference lost {name}"
