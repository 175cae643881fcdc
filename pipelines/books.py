"""Read a folder of books: BooksCorpus-style `.txt` files and raw Project Gutenberg files.

`iter_books(root)` walks `root` (nested folders allowed, hidden entries ignored) in a deterministic
order and yields, for every `*.txt` file, either a `Book` (decoded, cleaned text) or a `Skipped`
entry that says why the file was left out (empty, binary, unreadable, nothing left after cleaning).

Decoding (`decode_book`), decided per file and recorded in `Book.encoding` (and, when the file is
not clean, `Book.replaced_bytes` and `Book.encoding_note`, which the manifest keeps):
  * UTF-8 BOM -> 'utf-8-sig'; UTF-16 BOM -> 'utf-16'.
  * strict UTF-8 -> 'utf-8' (plain ASCII is reported as 'utf-8' too).
  * mostly UTF-8 -> 'utf-8' with each invalid byte sequence replaced by U+FFFD and the invalid bytes
    counted: a file whose valid multi-byte UTF-8 characters outnumber its invalid bytes is UTF-8 with
    a few stray bytes (one stray byte must not turn every real accented letter into mojibake).
  * otherwise (invalid bytes at least as many as valid multi-byte characters: a legacy file) a
    legacy 8-bit code page, with the counts that decided it in the note. Bytes 0x80-0x9F are C1 control characters in latin-1 but
    printable punctuation in cp1252 (0x93/0x94 curly quotes, 0x97 em dash, ...), which is what they
    mean in real-world text, so a file with such bytes is 'cp1252' -- unless it has one of the five
    bytes cp1252 leaves undefined (0x81 0x8D 0x8F 0x90 0x9D), then it cannot be cp1252 and is
    'latin-1'. Without any 0x80-0x9F byte both code pages agree, and the file is reported 'latin-1'.

Cleaning (`clean_text`): CRLF / CR line ends -> LF, the Project Gutenberg header and licence before
the text and the footer/licence after it are removed (`strip_gutenberg`), as are the World Library
copyright notices (`<<THIS ELECTRONIC VERSION ...>>`) repeated inside the old Shakespeare files.
"""

from __future__ import annotations

import codecs
import dataclasses
import os
import re
from pathlib import Path
from typing import Iterator, Optional, Union

# Raw bytes that never occur in text: everything below 0x20 except \t \n \v \f \r and ^Z (an old
# DOS end-of-file mark found at the end of some Gutenberg files), plus DEL.
_CONTROL_BYTES = bytes([b for b in range(0x20) if b not in (9, 10, 11, 12, 13, 26)] + [0x7F])
_BINARY_SAMPLE_BYTES = 1 << 16
_MAX_CONTROL_RATIO = 0.01
_C1_RANGE = re.compile(rb"[\x80-\x9f]")
_CP1252_UNDEFINED = re.compile(rb"[\x81\x8d\x8f\x90\x9d]")
_SURROGATES = re.compile("[\udc80-\udcff]")
_NON_ASCII = re.compile("[^\x00-\x7f]")

# Header ends: the header runs up to and including the first line matching the first marker kind
# (in this priority order) that occurs in the file. Each marker: (name, a lower-case keyword it
# contains -- found with str.find, much faster than a regex scan --, the line's regex).
_LINE = r"^[^\w\n]*"  # start of a line, then non-word characters
_HEADER_END_MARKERS = (
    # *** START OF THIS PROJECT GUTENBERG EBOOK X ***  /  ***START OF THE PROJECT GUTENBERG EBOOK X***
    ("start-of-project-gutenberg", "start of", _LINE + r"\*{3}[^\S\n]*START OF (THE|THIS) PROJECT GUTENBERG"),
    # *END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*  (and '*END THE SMALL PRINT!')
    ("end-the-small-print", "small print", _LINE + r"END[^\w\n]*THE SMALL PRINT"),
    # World Library Shakespeare (1990-93): ... '["Small Print" V.12.08.93]'
    ("small-print-version", "small print", _LINE + r'Small Print"? V\.'),
)
# Footer starts: the first line after the header matching any of these starts the footer.
_FOOTER_START_MARKERS = (
    ("end-of-project-gutenberg", "end of", _LINE + r"\*{3}[^\S\n]*END OF (THE|THIS) PROJECT GUTENBERG"),
    # End of the Project Gutenberg EBook of X / End of Project Gutenberg's X / End of this Project
    # Gutenberg Etext of X / The end of Project Gutenberg Etext of X
    ("end-of-the-ebook", "end of", _LINE + r"(The )?End of (the |this )?Project Gutenberg"),
    # World Library Shakespeare: 'End of this Etext of The Complete Works of William Shakespeare'
    ("end-of-this-etext", "end of", _LINE + r"End of (the |this )?E-?text of"),
    # a licence appended after the text without an END line
    ("start-the-small-print", "small print", _LINE + r"START[^\w\n]*THE SMALL PRINT"),
)
_HEADER_RES = tuple((name, kw, re.compile(rx, re.I | re.M)) for name, kw, rx in _HEADER_END_MARKERS)
_FOOTER_RES = tuple((name, kw, re.compile(rx, re.I | re.M)) for name, kw, rx in _FOOTER_START_MARKERS)
_LEGALESE_BLOCK = re.compile(r"<<THIS ELECTRONIC VERSION OF.{0,2000}?>>", re.S)
# Short paragraphs right after the header ('Produced by ...', 'Note: Project Gutenberg also has an
# HTML version ...') are Gutenberg's front matter, not part of the book.
_FRONT_MATTER = re.compile(
    r"^\s*(produced by|e-?text prepared by|this e-?(text|book) was (prepared|produced) by|"
    r"transcribed (from|by)|scanned by|note: project gutenberg also has|"
    r"(note: )?images of the original pages are available)", re.I)
_MAX_FRONT_MATTER_LINES = 8


@dataclasses.dataclass(frozen=True)
class Book:
    """A readable book: cleaned text plus where it came from and how it was decoded."""

    path: str  # the file's path as found under the root
    book_id: str  # relative path from the root, POSIX separators, without the '.txt' suffix
    text: str  # cleaned text, LF line ends, no Gutenberg header/footer
    encoding: str  # 'utf-8', 'utf-8-sig', 'utf-16', 'cp1252' or 'latin-1'
    header: Optional[str] = None  # name of the Gutenberg header marker found, None if none
    footer: Optional[str] = None  # name of the Gutenberg footer marker found, None if none
    replaced_bytes: int = 0  # invalid UTF-8 bytes replaced by U+FFFD (a mostly-UTF-8 file)
    encoding_note: Optional[str] = None  # how the encoding was decided, when the file was not clean UTF-8


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A file that was not used, and why."""

    path: str
    book_id: str
    reason: str


def book_id_for(path: Path, root: Path) -> str:
    """Relative POSIX path of `path` under `root`, without its extension."""
    rel = path.relative_to(root).as_posix()
    return rel[: -len(path.suffix)] if path.suffix else rel


def find_book_files(root: Union[str, Path]) -> list[Path]:
    """All `*.txt` files under `root` (any depth, case-insensitive suffix, hidden entries ignored),
    sorted by relative POSIX path so the order is the same on every machine."""
    root = Path(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if not name.startswith(".") and name.lower().endswith(".txt"):
                found.append(Path(dirpath) / name)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def binary_reason(data: bytes) -> Optional[str]:
    """Why `data` looks like a binary file rather than text, or None if it looks like text."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None  # UTF-16 text legitimately has NUL bytes
    nul = data.find(b"\x00")
    if nul >= 0:
        return f"binary file (NUL byte at offset {nul})"
    sample = data[:_BINARY_SAMPLE_BYTES]
    n_control = len(sample) - len(sample.translate(None, _CONTROL_BYTES))
    if sample and n_control / len(sample) > _MAX_CONTROL_RATIO:
        return (f"binary file ({n_control} control bytes in the first {len(sample)} bytes, "
                f"more than {_MAX_CONTROL_RATIO:.0%})")
    return None


def _decode_legacy(data: bytes) -> tuple[str, str]:
    """Decode non-UTF-8 bytes as cp1252 or latin-1 (see the module docstring for the rule)."""
    if _C1_RANGE.search(data) and not _CP1252_UNDEFINED.search(data):
        return data.decode("cp1252"), "cp1252"
    return data.decode("latin-1"), "latin-1"


@dataclasses.dataclass(frozen=True)
class Decoded:
    """A file's text and how it was read."""

    text: str
    encoding: str
    replaced_bytes: int = 0  # invalid UTF-8 bytes replaced by U+FFFD
    note: Optional[str] = None  # why, when the file was not clean UTF-8


def _utf8_or_legacy(body: bytes, name: str) -> Decoded:
    """Bytes that are not strict UTF-8: mostly UTF-8 (bad bytes replaced) or a legacy code page."""
    escaped = body.decode("utf-8", errors="surrogateescape")  # each invalid byte -> one U+DC80..U+DCFF
    invalid = len(_SURROGATES.findall(escaped))
    valid = len(_NON_ASCII.findall(escaped)) - invalid  # valid multi-byte characters
    if valid > invalid:
        note = (f"not strict UTF-8: {invalid} invalid byte(s) replaced by U+FFFD ({valid} valid multi-byte "
                "characters outnumber them)")
        return Decoded(body.decode("utf-8", errors="replace"), name, invalid, note)
    text, legacy = _decode_legacy(body)
    return Decoded(text, legacy, 0, f"not UTF-8: {invalid} invalid byte(s), {valid} valid multi-byte "
                                    f"character(s); read as {legacy}")


def decode_book(data: bytes) -> Decoded:
    """Decode a text file's bytes (see the module doc). Raises UnicodeDecodeError only for a UTF-16
    BOM followed by invalid UTF-16."""
    if data.startswith(codecs.BOM_UTF8):
        body = data[len(codecs.BOM_UTF8):]
        try:
            return Decoded(body.decode("utf-8"), "utf-8-sig")
        except UnicodeDecodeError:
            return _utf8_or_legacy(body, "utf-8-sig")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return Decoded(data.decode("utf-16"), "utf-16")
    try:
        return Decoded(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError:
        return _utf8_or_legacy(data, "utf-8")


def decode_bytes(data: bytes) -> tuple[str, str]:
    """(text, encoding name) of ``decode_book``."""
    decoded = decode_book(data)
    return decoded.text, decoded.encoding


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR -> LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _line_end(text: str, pos: int) -> int:
    """Index just past the newline ending the line that contains `pos` (len(text) if none)."""
    end = text.find("\n", pos)
    return len(text) if end < 0 else end + 1


def _first_line(text: str, lowered: Optional[str], start: int, keyword: str, pattern) -> Optional[int]:
    """Offset of the first line at or after `start` that matches `pattern`, or None. Candidate
    lines are those holding `keyword` in `lowered` (text.lower(); None: scan with the regex)."""
    if lowered is None:
        match = pattern.search(text, start)
        return match.start() if match else None
    pos = lowered.find(keyword, start)
    while pos >= 0:
        line = text.rfind("\n", 0, pos) + 1
        if line >= start and pattern.match(text, line):
            return line
        pos = lowered.find(keyword, _line_end(text, pos))
    return None


def _header_end(text: str, lowered: Optional[str]) -> tuple[int, Optional[str]]:
    """Offset of the first body character and the header marker's name (0, None if no header)."""
    for name, keyword, pattern in _HEADER_RES:
        line = _first_line(text, lowered, 0, keyword, pattern)
        if line is not None:
            end = _line_end(text, line)
            # a long START line may wrap: '*** START OF THIS ... EBOOK THE\nLONG TITLE ***'
            if name == "start-of-project-gutenberg" and not text[line:end].rstrip().endswith("***"):
                following = _line_end(text, end)
                if text[end:following].rstrip().endswith("***"):
                    end = following
            return end, name
    return 0, None


def _footer_start(text: str, lowered: Optional[str], start: int) -> tuple[int, Optional[str]]:
    """Offset where the footer begins (len(text) if none) and the footer marker's name."""
    found = [(line, name) for name, keyword, pattern in _FOOTER_RES
             if (line := _first_line(text, lowered, start, keyword, pattern)) is not None]
    return min(found) if found else (len(text), None)


def _drop_front_matter(lines: list[str]) -> list[str]:
    """Remove the short Gutenberg front-matter paragraphs ('Produced by ...') opening the body."""
    while True:
        first = next((i for i, line in enumerate(lines) if line.strip()), None)
        if first is None or not _FRONT_MATTER.match(lines[first]):
            return lines
        end = first
        while end < len(lines) and lines[end].strip():
            end += 1
        if end - first > _MAX_FRONT_MATTER_LINES:
            return lines
        lines = lines[end:]


def strip_gutenberg(text: str) -> tuple[str, Optional[str], Optional[str]]:
    """Remove the Project Gutenberg header/licence and footer/licence from LF-normalized `text`.

    Returns (body, header marker name or None, footer marker name or None). Text without any
    marker (e.g. a BooksCorpus file) comes back unchanged apart from surrounding blank lines.
    """
    text = _LEGALESE_BLOCK.sub("", text)
    lowered = text.lower()
    lowered = lowered if len(lowered) == len(text) else None  # offsets must agree
    start, header = _header_end(text, lowered)
    end, footer = _footer_start(text, lowered, start)
    body = text[start:end].split("\n")
    if header is not None:
        body = _drop_front_matter(body)
    return "\n".join(body).strip("\n"), header, footer


def clean_text(text: str) -> tuple[str, Optional[str], Optional[str]]:
    """Normalize line ends, strip Gutenberg boilerplate and trailing spaces of every line."""
    body, header, footer = strip_gutenberg(normalize_newlines(text))
    body = "\n".join(line.rstrip() for line in body.split("\n")).strip()
    return body, header, footer


def load_book(path: Union[str, Path], root: Union[str, Path]) -> Union[Book, Skipped]:
    """Read, decode and clean one file; a `Skipped` with the reason if it cannot be used."""
    path, root = Path(path), Path(root)
    book_id = book_id_for(path, root)
    try:
        data = path.read_bytes()
    except OSError as err:
        return Skipped(str(path), book_id, f"unreadable: {err.strerror or err}")
    if not data.strip():
        return Skipped(str(path), book_id, "empty file" if not data else "empty file (whitespace only)")
    reason = binary_reason(data)
    if reason:
        return Skipped(str(path), book_id, reason)
    try:
        decoded = decode_book(data)
    except UnicodeDecodeError as err:
        return Skipped(str(path), book_id, f"undecodable: {err}")
    body, header, footer = clean_text(decoded.text)
    if not body:
        return Skipped(str(path), book_id, "no text left after removing the Project Gutenberg header/licence")
    return Book(str(path), book_id, body, decoded.encoding, header, footer, decoded.replaced_bytes, decoded.note)


def iter_books(root: Union[str, Path]) -> Iterator[Union[Book, Skipped]]:
    """Yield a `Book` or a `Skipped` for every `*.txt` file under `root`, in `find_book_files` order."""
    root = Path(root)
    for path in find_book_files(root):
        yield load_book(path, root)
