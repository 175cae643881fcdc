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
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Sequence

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


def tokenize_split(tokenizer, books: Sequence[Book], sep: int, name: str, show_progress: bool):
    """Tokenize books; returns (token stream with separators, per-book manifest rows)."""
    pieces, rows = [], []
    bar = progress(books, desc=f"tokenize {name}", unit="book", disable=not show_progress)
    total = 0
    for i, book in enumerate(bar):
        ids = encode_book(tokenizer, book.text, sep)
        if i:
            pieces.append(np.asarray([sep], dtype=np.int32))
        pieces.append(ids)
        total += len(ids)
        bar.set_postfix(tokens=total)
        rows.append({"id": book.book_id, "encoding": book.encoding, "tokens": int(len(ids)),
                     "chars": len(book.text), "header": book.header, "footer": book.footer,
                     **({"replaced_bytes": book.replaced_bytes} if book.replaced_bytes else {}),
                     **({"encoding_note": book.encoding_note} if book.encoding_note else {})})
    return (np.concatenate(pieces) if pieces else np.zeros([0], np.int32)), rows


def num_sequences(stream_tokens: int, n_ctx: int) -> int:
    """Number of (n_ctx + 1)-token windows at stride n_ctx in a stream of that many tokens."""
    return max(0, (stream_tokens - 1) // n_ctx)


def write_split(stream: np.ndarray, cfg, name: str, out_dir: Path) -> list[dict]:
    """Write the windows of one split as GZIP TFRecord shards; returns the shard manifest rows.

    ``cfg``: its ``n_ctx``, ``shard_size`` and ``show_progress`` (a ``pipelines.pretrain_data.PretrainConfig``)."""
    tf = import_tensorflow()
    n_ctx, n_seq = cfg.n_ctx, num_sequences(len(stream), cfg.n_ctx)
    n_shards = math.ceil(n_seq / cfg.shard_size)
    options = tf.io.TFRecordOptions(compression_type=COMPRESSION)
    shards = []
    with progress(total=n_seq, desc=f"write {name}", unit="seq", disable=not cfg.show_progress) as bar:
        for k in range(n_shards):
            path = out_dir / shard_file(name, k, n_shards)
            first, last = k * cfg.shard_size, min(n_seq, (k + 1) * cfg.shard_size)
            with writing(path), tf.io.TFRecordWriter(str(path), options) as writer:  # a full disk: WriteError
                for i in range(first, last):
                    window = stream[i * n_ctx: i * n_ctx + n_ctx + 1].tolist()
                    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=window))
                    example = tf.train.Example(features=tf.train.Features(feature={PRETRAIN_FEATURE: feature}))
                    writer.write(example.SerializeToString())
            bar.update(last - first)
            shards.append({"file": path.name, "sequences": last - first, "first_sequence": first,
                           "bytes": path.stat().st_size, "sha256": sha256_file(path)})
    return shards
