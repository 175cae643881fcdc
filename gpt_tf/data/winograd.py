"""Reader of the Definite Pronoun Resolution Dataset (DPRD; Rahman & Ng, EMNLP 2012), the paper's Winograd set.

Official layout (http://www.hlt.utdallas.edu/~vince/data/emnlp12/): a folder with ``train.c.txt``
and ``test.c.txt`` (or one such file). Each example spans four lines, and examples are separated
by a blank line::

    The bee landed on the flower because it had pollen.      <- sentence
    it                                                       <- target pronoun
    bee,flower                                               <- the two candidate antecedents
    flower                                                   <- the correct antecedent

As the dataset's description says, "if the target pronoun appears more than once in the sentence,
its first occurrence is the one to be resolved": the first whole-word, case-insensitive match.

Each example becomes a ``gpt_tf.data.task_rows.Example`` ready for the substitution heuristic
(§5): ``text_a`` = the sentence before the pronoun, ``text_b`` = the rest after it, ``choices`` =
the two candidates, ``label`` = the index of the correct one. Malformed examples (not four lines,
not two candidates, an answer that is neither candidate, a pronoun not in the sentence or nothing
after it) raise ``ValueError("{file}:{line}: ...")``, or with ``skip_malformed=True`` are skipped
and counted, as in ``task_readers``.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpt_tf.data.task_rows import Example, Rows

SPLITS = ("train", "test")


def dpr_file(path_or_dir, split: str) -> Path:
    """``{split}.c.txt`` in the folder (a file path is used as is, for any split)."""
    path = Path(path_or_dir)
    if path.is_file():
        return path
    if split not in SPLITS:
        raise ValueError(f"DPRD split {split!r} is not one of {SPLITS}")
    found = path / f"{split}.c.txt"
    if not found.is_file():
        raise FileNotFoundError(f"{path}: no {found.name} (the DPRD layout: train.c.txt, test.c.txt)")
    return found


def _records(path: Path):
    """(first line number, [lines]) of each blank-line-separated record."""
    record, start = [], 0
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if line:
                if not record:
                    start = number
                record.append(line)
            elif record:
                yield start, record
                record = []
    if record:
        yield start, record


def _example(lines: list[str], guid: str) -> Example:
    if len(lines) != 4:
        raise ValueError(f"expected 4 lines (sentence, pronoun, 'cand1,cand2', answer), found {len(lines)}")
    sentence, pronoun, candidates, answer = lines
    choices = tuple(c.strip() for c in candidates.split(","))
    if len(choices) != 2 or not all(choices):
        raise ValueError(f"expected two comma-separated candidates, found {candidates!r}")
    matches = [i for i, c in enumerate(choices) if c.lower() == answer.lower()]
    if len(matches) != 1:
        raise ValueError(f"answer {answer!r} is not exactly one of the candidates {list(choices)}")
    found = re.search(rf"(?<!\w){re.escape(pronoun)}(?!\w)", sentence, flags=re.IGNORECASE)
    if found is None:
        raise ValueError(f"pronoun {pronoun!r} does not occur as a word in {sentence!r}")
    before, after = sentence[:found.start()].strip(), sentence[found.end():].strip()
    if not after:
        raise ValueError(f"nothing follows the pronoun {pronoun!r} in {sentence!r} (no text to score)")
    return Example(guid, before, after, choices, matches[0])


def read_dpr(path_or_dir, split: str, skip_malformed: bool = False) -> tuple[list[Example], list[dict]]:
    """Examples of one DPRD split and the skipped rows ``[{"file", "line", "reason"}]`` (see module doc)."""
    path, rows, out = dpr_file(path_or_dir, split), Rows(skip_malformed), []
    for line, lines in _records(path):
        try:
            out.append(_example(lines, f"{split}-{line}"))
        except ValueError as err:
            rows.bad(path, line, str(err))
    if not out and not rows.skipped:
        raise ValueError(f"{path}: no examples")
    return out, rows.skipped
