"""The books a build reads: one folder or several, scanned once, then read again one book at a time.

A split's folders are read in the order given, each in ``pipelines.books.find_book_files``'s order. ``scan`` reads
every file once to learn which books are usable (and why the others are skipped), keeping only where each book is;
``stream`` and ``texts`` read the usable books again, one at a time, whenever the build needs their text (to train
the BPE, to tokenize them). Memory holds one book, never the corpus: reading and cleaning a book is a small share of
tokenizing it. A book's id is its path relative to its folder (``pipelines.books.book_id_for``); with several folders
the manifest also names each book's folder, by its index among them.

Folders must not overlap: the same folder twice, or one inside another, would read its books twice (or put held-out
books in training).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator, Sequence

from gpt_tf.console import progress
from gpt_tf.data.records import sha256_file
from pipelines.book_stream import PretrainDataError
from pipelines.books import Book, Skipped, find_book_files, load_book


@dataclasses.dataclass(frozen=True)
class BookRef:
    """A usable book found by ``scan``: where to read it again."""

    path: str
    root: str  # its folder, as given
    book_id: str  # relative path under ``root`` without '.txt'
    folder: int  # index of ``root`` among the split's folders


def require_folders(folders: Sequence[str], flag: str) -> None:
    """Each folder exists and holds a .txt file; PretrainDataError naming the flag and the folder otherwise."""
    if not folders:
        raise PretrainDataError(f"{flag}: no folder given")
    for folder in folders:
        if not folder or not Path(folder).is_dir():
            raise PretrainDataError(f"{flag}: folder {folder!r} does not exist")
        if not find_book_files(folder):
            raise PretrainDataError(f"{flag}: folder {folder!r} holds no .txt files")


def require_apart(named: Sequence[tuple[str, str]]) -> None:
    """No two of the ``(flag, folder)`` pairs are the same folder or one inside the other."""
    resolved = [(flag, folder, Path(folder).resolve()) for flag, folder in named]
    for i, (flag_a, a, path_a) in enumerate(resolved):
        for flag_b, b, path_b in resolved[i + 1:]:
            if path_a == path_b:
                raise PretrainDataError(f"{flag_b}: folder {b!r} is also given to {flag_a}: its books would be "
                                        "read twice")
            if path_a in path_b.parents or path_b in path_a.parents:
                raise PretrainDataError(f"{flag_a} {a!r} and {flag_b} {b!r}: one folder is inside the other, so its "
                                        "books would be read twice; give folders that do not overlap")


def fingerprint(root: str) -> list:
    """[relative path, size, sha256] of each book file of one folder (unreadable files: the error)."""
    rows = []
    for path in find_book_files(root):
        try:
            rows.append([path.relative_to(root).as_posix(), path.stat().st_size, sha256_file(path)])
        except OSError as err:
            rows.append([path.relative_to(root).as_posix(), -1, f"unreadable: {err.strerror}"])
    return rows


def scan(folders: Sequence[str], flag: str, show_progress: bool) -> tuple[list[BookRef], list[tuple[int, Skipped]]]:
    """The usable books of ``folders`` (none kept in memory) and the skipped files with their folder's index;
    PretrainDataError if no file is usable."""
    files = [(k, folder, path) for k, folder in enumerate(folders) for path in find_book_files(folder)]
    books, skipped = [], []
    for k, folder, path in progress(files, desc=f"read {', '.join(Path(f).name for f in folders)}", unit="file",
                                    disable=not show_progress):
        item = load_book(path, folder)
        if isinstance(item, Book):
            books.append(BookRef(str(path), folder, item.book_id, k))
        else:
            skipped.append((k, item))
    if not books:
        reasons = "; ".join(f"{s.book_id}: {s.reason}" for _, s in skipped[:3])
        raise PretrainDataError(f"{flag}: no usable book in {', '.join(map(repr, folders))}: all {len(skipped)} .txt "
                          f"files were skipped ({reasons})")
    return books, skipped


def stream(refs: Sequence[BookRef]) -> Iterator[tuple[BookRef, Book]]:
    """Each book of ``refs`` read again, in order, one at a time."""
    for ref in refs:
        book = load_book(ref.path, ref.root)
        if not isinstance(book, Book):  # the file changed since the scan
            raise PretrainDataError(f"{ref.path}: usable when the build started, now skipped: {book.reason}")
        yield ref, book


def texts(refs: Sequence[BookRef]) -> Iterator[str]:
    """The cleaned text of each book of ``refs``, one at a time."""
    return (book.text for _, book in stream(refs))

