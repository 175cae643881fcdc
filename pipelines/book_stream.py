"""The pre-training token stream and its windows: books -> one token stream -> GZIP TFRecord shards.

Token stream. The books of a split (sorted by relative path) are tokenized and concatenated, with
ONE separator token between consecutive books: the tokenizer's newline token '\\n</w>'
(`SEPARATOR_TOKEN`, id 40477 in GPT-1's vocabulary). GPT-1's vocabulary has no end-of-text token,
and the newline token is what a book's own paragraph breaks already look like, so a book boundary
is shown to the model as a paragraph break. The separator must exist in the vocabulary.

Windows. With the stream t[0..T-1], record i holds t[i*n_ctx : i*n_ctx + n_ctx + 1]: n_ctx inputs
plus one more token so that targets are the inputs shifted by one. The stride is n_ctx, so two
consecutive windows share their boundary token (the last target of one is the first input of
the next) and every token but the first is predicted exactly once. There are
floor((T - 1) / n_ctx) records; the remaining (T - 1) % n_ctx tokens of the tail are dropped.
Record format and file names: `gpt_tf.data.records`.

Bounded memory. The windows are written as the stream is made (`WindowWriter`): each book is read, tokenized and
its windows written before the next one is read, so memory holds one book and its tokens whatever the corpus.
Shards fill in order under temporary names and take their `{split}-{k}-of-{n}` names once n is known: the same
files, byte for byte, as a stream written whole.

Targets' text. With a table of each token's characters and bytes (`gpt_tf.text.text_units`), the writer also counts
the text that the windows' targets encode: every token of the stream but its first, up to the last window's end.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from gpt_tf.console import import_tensorflow, progress
from gpt_tf.write_errors import writing
from pipelines.books import Book
from gpt_tf.data.common import encode_pieces
from gpt_tf.data.records import COMPRESSION, PRETRAIN_FEATURE, sha256_file, shard_file

SEPARATOR_TOKEN = "\n</w>"
_BLOCK_CHARS = 8192  # books are cut at newlines into blocks of about this size for encode_batch


class PretrainDataError(ValueError):
    """Bad input or configuration, detected before any output is written."""


def text_blocks(text: str, max_chars: int = _BLOCK_CHARS) -> list[str]:
    """Cut `text` at newline runs into blocks of whole lines of about `max_chars` characters.

    The tokenizer turns every newline run into one '\\n</w>' token, so encoding the blocks and
    joining them with that token gives the tokens of the whole text."""
    blocks, current, size = [], [], 0
    for line in re.split(r"\s*\n\s*", text):
        if line:
            current.append(line)
            size += len(line) + 1
        if size >= max_chars:
            blocks.append("\n".join(current))
            current, size = [], 0
    if current:
        blocks.append("\n".join(current))
    return blocks


def encode_book(tokenizer, text: str, newline_id: int) -> np.ndarray:
    """Tokens of one book (int32): its blocks joined by the newline token, in bounded memory
    (``gpt_tf.data.common.encode_pieces``: a line longer than a block is tokenized in pieces)."""
    parts, last = [], -1
    for block, ids in encode_pieces(tokenizer, text_blocks(text)):
        if ids:
            if parts and block != last:
                parts.append(np.asarray([newline_id], np.int32))
            parts.append(np.asarray(ids, np.int32))
            last = block
    return np.concatenate(parts) if parts else np.zeros([0], np.int32)


def separator_id(tokenizer) -> int:
    """Id of SEPARATOR_TOKEN in the tokenizer's vocabulary; checks newlines encode to it."""
    with open(tokenizer.encoder_path, encoding="utf-8") as f:
        encoder = json.load(f)
    if SEPARATOR_TOKEN not in encoder:
        raise PretrainDataError(f"{tokenizer.encoder_path}: vocabulary has no {SEPARATOR_TOKEN!r} "
                                "token, needed as the document separator")
    sep = int(encoder[SEPARATOR_TOKEN])
    if sep not in tokenizer.encode("a\nb"):
        raise PretrainDataError(f"tokenizer {tokenizer.encoder_path} does not encode a newline as "
                                f"{SEPARATOR_TOKEN!r} (id {sep})")
    return sep


def book_row(book: Book, tokens: int) -> dict:
    """The manifest's row of one tokenized book."""
    return {"id": book.book_id, "encoding": book.encoding, "tokens": tokens, "chars": len(book.text),
            "header": book.header, "footer": book.footer,
            **({"replaced_bytes": book.replaced_bytes} if book.replaced_bytes else {}),
            **({"encoding_note": book.encoding_note} if book.encoding_note else {})}


def num_sequences(stream_tokens: int, n_ctx: int) -> int:
    """Number of (n_ctx + 1)-token windows at stride n_ctx in a stream of that many tokens."""
    return max(0, (stream_tokens - 1) // n_ctx)


class WindowWriter:
    """The (n_ctx + 1)-token windows of a token stream given piece by piece (``add``), written as GZIP TFRecord
    shards as they fill; ``close()`` names the shards and returns their manifest rows.

    ``cfg``: its ``n_ctx`` and ``shard_size`` (a ``pipelines.pretrain_data.PretrainConfig``); ``lengths``: each
    token's characters and bytes (``gpt_tf.text.text_units.token_text_lengths``), to count the targets' text."""

    def __init__(self, cfg, name: str, out_dir: Path, lengths: Optional[np.ndarray] = None):
        self.tf = import_tensorflow()
        self.n_ctx, self.shard_size, self.name, self.out_dir = cfg.n_ctx, cfg.shard_size, name, out_dir
        self.lengths = lengths
        self.options = self.tf.io.TFRecordOptions(compression_type=COMPRESSION)
        self.pending = np.zeros([0], np.int32)  # the stream from the next window's first token on
        self.stream_tokens = self.sequences = 0
        self.text = np.zeros([2], np.int64)  # characters and bytes of every token after the stream's first
        self.shards, self._writer, self._path = [], None, None

    def add(self, ids) -> None:
        """The next tokens of the stream; every window they complete is written."""
        ids = np.asarray(ids, np.int32)
        if self.lengths is not None and len(ids):
            self.text += self.lengths[ids[0 if self.stream_tokens else 1:]].sum(axis=0)
        self.stream_tokens += len(ids)
        stream, n_ctx = np.concatenate([self.pending, ids]), self.n_ctx
        complete = num_sequences(len(stream), n_ctx)
        for i in range(complete):
            self._write(stream[i * n_ctx: i * n_ctx + n_ctx + 1].tolist())
        self.pending = stream[complete * n_ctx:].copy()

    def _write(self, window: list) -> None:
        if self._writer is None:
            self._path = self.out_dir / f".{self.name}-{len(self.shards):05d}.tfrecord.gz"
            with writing(self._path):
                self._writer = self.tf.io.TFRecordWriter(str(self._path), self.options)
            self.shards.append({"first_sequence": self.sequences})
        feature = self.tf.train.Feature(int64_list=self.tf.train.Int64List(value=window))
        example = self.tf.train.Example(features=self.tf.train.Features(feature={PRETRAIN_FEATURE: feature}))
        with writing(self._path):  # a full disk: WriteError
            self._writer.write(example.SerializeToString())
        self.sequences += 1
        if self.sequences % self.shard_size == 0:
            self._end_shard()

    def _end_shard(self) -> None:
        with writing(self._path):
            self._writer.close()
        self.shards[-1].update(path=self._path, sequences=self.sequences - self.shards[-1]["first_sequence"])
        self._writer = None

    @property
    def dropped_tail(self) -> int:
        """Tokens after the last window's end (the whole stream while there is no window)."""
        return len(self.pending) - 1 if self.sequences else len(self.pending)

    def targets_text(self) -> dict:
        """The windows' targets: their number and the characters and bytes of their text."""
        tail = self.lengths[self.pending[1:]].sum(axis=0) if self.sequences else self.text
        chars, nbytes = (int(x) for x in self.text - tail)
        return {"tokens": self.sequences * self.n_ctx, "chars": chars, "bytes": nbytes}

    def close(self) -> list[dict]:
        """Ends the last shard and names every shard ``{split}-{k}-of-{n}``; their manifest rows."""
        if self._writer is not None:
            self._end_shard()
        rows = []
        for k, shard in enumerate(self.shards):
            path = self.out_dir / shard_file(self.name, k, len(self.shards))
            with writing(path):
                os.replace(shard["path"], path)
            rows.append({"file": path.name, "sequences": shard["sequences"], "first_sequence": shard["first_sequence"],
                         "bytes": path.stat().st_size, "sha256": sha256_file(path)})
        return rows


def write_books(tokenizer, books: Iterable[tuple[Any, Book]], sep: int, cfg, name: str, out_dir: Path,
                lengths: Optional[np.ndarray] = None, total: Optional[int] = None):
    """Tokenize ``books`` (``(ref, Book)`` pairs, read one at a time) into one stream with ``sep`` between books
    and write its windows; returns (the ``WindowWriter``, closed, its shards' rows, the books' manifest rows)."""
    writer, rows = WindowWriter(cfg, name, out_dir, lengths), []
    bar = progress(books, total=total, desc=f"tokenize {name}", unit="book", disable=not cfg.show_progress)
    for i, (_, book) in enumerate(bar):
        ids = encode_book(tokenizer, book.text, sep)
        writer.add(np.concatenate([np.asarray([sep], np.int32), ids]) if i else ids)
        bar.set_postfix(tokens=writer.stream_tokens)
        rows.append(book_row(book, int(len(ids))))
    shards = writer.close()
    return writer, shards, rows


def write_split(stream: np.ndarray, cfg, name: str, out_dir: Path) -> list[dict]:
    """Write the windows of a whole token stream as GZIP TFRecord shards; returns the shard manifest rows."""
    writer = WindowWriter(cfg, name, out_dir)
    writer.add(stream)
    return writer.close()
