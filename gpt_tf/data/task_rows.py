"""Row-level reading shared by the task readers (``gpt_tf.data.task_readers``, ``gpt_tf.data.winograd``).

`Example` is what every reader yields. `Rows` collects malformed rows (or raises on the first,
naming file:line); a row parser raises `BadRow` and its caller reports it. `read_table` reads a
delimited file (GLUE TSV, Story Cloze CSV, user CSV) row by row with those conventions; bytes that
are not UTF-8 are read with ``errors="surrogateescape"`` and reported by `bad_utf8`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Optional, Union

from gpt_tf.tasks import TaskSpec

_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # a byte that is not UTF-8, read with errors="surrogateescape"
_SURROGATE = re.compile("[\ud800-\udfff]")  # a lone surrogate, as a JSON "\\ud800" escape decodes


@dataclasses.dataclass(frozen=True)
class Example:
    """One labelled (or, for test files, unlabelled) example before tokenization."""

    guid: str
    text_a: str
    text_b: Optional[str]
    choices: Optional[tuple[str, ...]]
    label: Union[int, float, None]


class Rows:
    """Collects malformed-row skips, or raises on the first one."""

    def __init__(self, skip_malformed: bool):
        self.skip_malformed = skip_malformed
        self.skipped: list[dict] = []

    def bad(self, file, line: int, reason: str) -> None:
        """A malformed row: raise ValueError naming file and line, or count it."""
        if not self.skip_malformed:
            raise ValueError(f"{file}:{line}: {reason} (skip_malformed=True / --skip_malformed skips and "
                             "counts such rows)")
        self.skip(file, line, f"malformed: {reason}")

    def skip(self, file, line: int, reason: str) -> None:
        """A row skipped by the format's own convention (always counted)."""
        self.skipped.append({"file": str(file), "line": int(line), "reason": reason})


class BadRow(Exception):
    """Raised inside a row parser; turned into `Rows.bad` by the caller (at ``line`` when it knows it)."""

    def __init__(self, reason: str, line: int = 1):
        super().__init__(reason)
        self.line = line


def text_field(value: Optional[str], what: str) -> str:
    """A non-empty text field, or BadRow: empty, not a string (a JSON number, list, ...), or holding a lone
    surrogate (a JSON ``"\\ud800"``: not Unicode text, the tokenizer refuses it)."""
    if value is not None and not isinstance(value, str):
        raise BadRow(f"{what} is {_json_kind(value)}, not a string")
    if value is None or not value.strip():
        raise BadRow(f"empty {what}")
    surrogate = _SURROGATE.search(value)
    if surrogate:
        raise BadRow(f"{what} holds a lone surrogate U+{ord(surrogate.group()):04X} at character {surrogate.start()}: "
                     "not Unicode text")
    return value


def parse_json(text: str):
    """``json.loads(text)``, or BadRow (at the error's line) for text that is not JSON a row can hold: a syntax
    error, nesting deeper than the parser's recursion limit, an integer of more than 4300 digits."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRow(f"invalid JSON: {err.msg}", err.lineno) from None
    except (ValueError, RecursionError) as err:
        raise BadRow(f"invalid JSON: {str(err).split(';')[0][:200]}") from None


def label_index(raw: str, mapping: dict, what: str = "label") -> int:
    """Index of a raw label value, or BadRow listing the known values."""
    if not isinstance(raw, str) or raw not in mapping:
        shown = repr(raw) if isinstance(raw, str) else _json_kind(raw)
        raise BadRow(f"unknown {what} {shown[:100]}; expected one of {sorted(mapping)}")
    return mapping[raw]


def _json_kind(value) -> str:
    """What a JSON value is, for a message (``a number (3)``, ``a list``, ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({str(value)[:20]})"
    return {list: "a list", dict: "an object", str: "a string"}.get(type(value), type(value).__name__)


def parse_score(raw: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite float in [lo, hi], or BadRow."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise BadRow(f"score {raw!r} is not a number") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise BadRow(f"score {raw!r} is outside [{lo}, {hi}]")
    return value


def label_map(task: TaskSpec) -> dict:
    return {name: i for i, name in enumerate(task.label_names)}


def first_file(folder: Path, names: list[str], split: str) -> Path:
    """The first existing `folder/name`, or FileNotFoundError listing what was tried."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder}: no file for split {split!r}; looked for {', '.join(names)}")


def bad_utf8(fields) -> Optional[str]:
    """Why a row read with ``errors="surrogateescape"`` is not valid UTF-8 (None if it is)."""
    for k, field in enumerate(fields, start=1):
        match = _ESCAPED_BYTE.search(field) if field else None
        if match:
            return f"invalid UTF-8: byte 0x{ord(match.group()) - 0xDC00:02x} in field {k}"
    return None


def iter_table(path: Path, delimiter: str, quoting: int):
    """(line number, row) of a delimited file; line numbers count physical lines from 1. Bytes that
    are not UTF-8 come through as U+DC80..U+DCFF (``bad_utf8`` finds them)."""
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, quoting=quoting, strict=True)
        start = 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                raise ValueError(f"{path}:{start}: unreadable row: {err}") from err
            yield start, row
            start = reader.line_num + 1


def read_table(path: Path, rows: Rows, parse, header, delimiter="\t", quoting=csv.QUOTE_NONE):
    """Examples of a delimited file. `header`: tuple of column names when the file has none, or
    None to take them from the first line. `parse(record: dict, line)` -> Example, None (a counted
    convention skip) or raises BadRow."""
    out, columns = [], header
    for line, row in iter_table(path, delimiter, quoting):
        if columns is None:
            columns = _header_row(path, row)
            continue
        if not row:
            continue  # blank line (a trailing newline): not a row
        bad = bad_utf8(row)
        if bad:
            rows.bad(path, line, bad)
            continue
        if len(row) != len(columns):
            rows.bad(path, line, f"expected {len(columns)} columns {list(columns)}, found {len(row)}")
            continue
        try:
            example = parse(dict(zip(columns, row)), line)
        except BadRow as err:
            rows.bad(path, line, str(err))
            continue
        if example is not None:
            out.append(example)
    if columns is None:
        raise ValueError(f"{path}:1: empty file, no header")
    return out


def require_columns(path: Path, columns, needed) -> None:
    missing = [c for c in needed if c and c not in columns]
    if missing:
        raise ValueError(f"{path}:1: missing column(s) {missing}; the header has {list(columns)}")


def _header_row(path: Path, row) -> tuple:
    bad = bad_utf8(row)
    if bad:
        raise ValueError(f"{path}:1: header: {bad}")
    return tuple(row)


def peek_header(path: Path, delimiter: str, quoting: int) -> tuple:
    for _, row in iter_table(path, delimiter, quoting):
        return _header_row(path, row)
    raise ValueError(f"{path}:1: empty file, no header")
