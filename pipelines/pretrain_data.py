"""Books -> sharded GZIP TFRecords of contiguous token windows for language-model pre-training.

    python -m pipelines.pretrain_data --input_dir=DIR[,DIR...] --output_dir=DIR --tokenizer_dir=DIR \
        [--n_ctx=512] [--valid_fraction=0.05 | --valid_dir=DIR] [--shard_size=2048] \
        [--train_tokenizer_vocab=N] [--overwrite]

Input. `--input_dir` names one folder of books or several (a comma-separated list, or the flag repeated), read in
the order given (`pipelines.corpus`): their books are one training corpus, read one book at a time, so memory stays
the same whatever the corpus's size (a BPE being trained holds the distinct words and their counts).

Token stream and windows: `pipelines.book_stream` (books joined by ONE separator token, the
tokenizer's newline '\\n</w>'; contiguous (n_ctx + 1)-token windows at stride n_ctx, tail dropped).

Records. `tf.train.Example` with one feature `input_ids`: int64 list of length n_ctx + 1.
Files `{split}-{k:05d}-of-{n:05d}.tfrecord.gz`, GZIP-compressed, `shard_size` records each (the
last one fewer), next to `manifest.json` (each split's folders, books, encodings, token counts, the characters and
bytes of the text its windows' targets encode (`gpt_tf.text.text_units`), shards with sha256, skipped files,
tokenizer files with sha256, config and its hash, the command).

Splits. `--valid_dir` names a folder of held-out books; otherwise a book is held out when
sha256(book id) / 2**256 < valid_fraction (book id = path relative to its folder, without '.txt'), at least one
book when valid_fraction > 0. Same input -> byte-identical shards; output is built in a temp folder
and renamed into place; an output with the same config hash makes a re-run a no-op.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

from gpt_tf.text import word_split
from gpt_tf.console import start_command
from gpt_tf.text.text_units import token_text_lengths
from gpt_tf.write_errors import refused_build
from pipelines import corpus
from pipelines.book_stream import SEPARATOR_TOKEN, PretrainDataError, separator_id, write_books
from gpt_tf.data.common import command_line, commit_dir, hash_unit, remove_stale_temps, run_cli, tokenizer_files
from gpt_tf.data.records import COMPRESSION, PRETRAIN_FEATURE, find_manifest, sha256_file, tokenizer_entry, \
    write_manifest

FORMAT_VERSION = 1
DEFAULT_VALID_FRACTION = 0.05
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """Everything that decides the output (plus `overwrite`, `show_progress`, `command`)."""

    input_dir: Union[str, Sequence[str]]  # a folder of books, or several (one corpus, read in this order)
    output_dir: str
    tokenizer_dir: str
    n_ctx: int = 512
    valid_fraction: Optional[float] = None  # None: DEFAULT_VALID_FRACTION unless valid_dir is set
    valid_dir: Optional[str] = None
    shard_size: int = 2048  # records per shard
    train_tokenizer_vocab: Optional[int] = None
    overwrite: bool = False
    show_progress: bool = True
    command: Optional[str] = None  # the CLI command line, recorded in the manifest


def input_dirs(cfg: PretrainConfig) -> tuple[str, ...]:
    """The training folders of ``cfg`` (its ``input_dir``: one folder, or several)."""
    return (cfg.input_dir,) if isinstance(cfg.input_dir, str) else tuple(cfg.input_dir)


def validate_config(cfg: PretrainConfig) -> None:
    """Check flags and input folders before any work; raises PretrainDataError naming the flag."""
    if cfg.n_ctx < 2:
        raise PretrainDataError(f"--n_ctx must be at least 2, got {cfg.n_ctx}")
    if cfg.shard_size < 1:
        raise PretrainDataError(f"--shard_size must be at least 1, got {cfg.shard_size}")
    if cfg.valid_dir is not None and cfg.valid_fraction is not None:
        raise PretrainDataError("give either --valid_dir or --valid_fraction, not both")
    if cfg.valid_fraction is not None and not 0.0 <= cfg.valid_fraction < 1.0:
        raise PretrainDataError(f"--valid_fraction must be in [0, 1), got {cfg.valid_fraction}")
    if cfg.train_tokenizer_vocab is not None and cfg.train_tokenizer_vocab < 1:
        raise PretrainDataError(f"--train_tokenizer_vocab must be positive, got {cfg.train_tokenizer_vocab}")
    corpus.require_folders(input_dirs(cfg), "--input_dir")
    named = [("--input_dir", folder) for folder in input_dirs(cfg)]
    if cfg.valid_dir is not None:
        corpus.require_folders([cfg.valid_dir], "--valid_dir")
        named.append(("--valid_dir", cfg.valid_dir))
    corpus.require_apart(named)
    if cfg.train_tokenizer_vocab is None and not Path(cfg.tokenizer_dir).is_dir():
        raise PretrainDataError(f"--tokenizer_dir: folder {cfg.tokenizer_dir!r} does not exist "
                                "(pass --train_tokenizer_vocab=N to train one there)")


def config_hash(cfg: PretrainConfig) -> str:
    """sha256 over the format, the options that shape the output and the input files' contents."""
    valid = ({"dir": corpus.fingerprint(cfg.valid_dir)} if cfg.valid_dir is not None
             else {"fraction": _valid_fraction(cfg)})
    tokenizer = ({"train_vocab": cfg.train_tokenizer_vocab} if cfg.train_tokenizer_vocab is not None
                 else {"files": [[p.name, sha256_file(p)] for p in tokenizer_files(cfg.tokenizer_dir)]})
    folders = input_dirs(cfg)  # one folder: its fingerprint alone (the key of the builds before several were taken)
    inputs = corpus.fingerprint(folders[0]) if len(folders) == 1 else [corpus.fingerprint(f) for f in folders]
    key = {"format": FORMAT_VERSION, "n_ctx": cfg.n_ctx, "shard_size": cfg.shard_size,
           "separator": SEPARATOR_TOKEN, "input": inputs, "valid": valid,
           "tokenizer": tokenizer, "word_split": word_split.fingerprint()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _valid_fraction(cfg: PretrainConfig) -> float:
    return DEFAULT_VALID_FRACTION if cfg.valid_fraction is None else cfg.valid_fraction


def split_by_hash(books: Sequence, fraction: float) -> tuple[list, list]:
    """(train, valid) of books (anything with a ``book_id``): a book is held out if its id hashes below `fraction`;
    at least one is when fraction > 0 (the lowest hash), and at least one stays in train."""
    if fraction <= 0:
        return list(books), []
    if len(books) < 2:
        raise PretrainDataError(f"--valid_fraction={fraction} needs at least 2 books, found "
                                f"{len(books)}; pass --valid_fraction=0 or --valid_dir")
    chosen = {b.book_id for b in books if hash_unit(b.book_id) < fraction}
    chosen = chosen or {min(books, key=lambda b: hash_unit(b.book_id)).book_id}
    if len(chosen) == len(books):
        chosen.discard(max(books, key=lambda b: hash_unit(b.book_id)).book_id)
    return [b for b in books if b.book_id not in chosen], [b for b in books if b.book_id in chosen]


def load_or_train_tokenizer(cfg: PretrainConfig, train_books: Sequence[corpus.BookRef]):
    """Train a BPE on the train books (read again, one at a time) into --tokenizer_dir (if asked), else load it."""
    from gpt_tf.text.tokenizer import GPTTokenizer

    if cfg.train_tokenizer_vocab is None:
        return GPTTokenizer.from_dir(cfg.tokenizer_dir), False
    folder = Path(cfg.tokenizer_dir)
    if tokenizer_files(cfg.tokenizer_dir) and not cfg.overwrite:
        raise PretrainDataError(f"--tokenizer_dir {folder} already holds a tokenizer; pass --overwrite "
                                "to retrain it there, or drop --train_tokenizer_vocab to use it")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".train-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        GPTTokenizer.train(corpus.texts(train_books), cfg.train_tokenizer_vocab, str(tmp),
                           show_progress=cfg.show_progress and sys.stderr.isatty())  # else blank lines on stdout
        for path in sorted(tmp.iterdir()):
            os.replace(path, folder / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return GPTTokenizer.from_dir(str(folder)), True


def _is_up_to_date(cfg: PretrainConfig, chash: str) -> Optional[dict]:
    """The existing manifest when the output already holds this exact build, else None.
    Raises if the output holds something else and --overwrite was not given."""
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise PretrainDataError(f"--output_dir {out} exists and is not a folder")
    if not out.exists() or not any(out.iterdir()):
        return None
    manifest = find_manifest(out)
    if manifest and manifest.get("config_hash") == chash and _outputs_intact(manifest, out, cfg):
        return manifest
    if not cfg.overwrite:
        found = manifest.get("config_hash", "?")[:12] if manifest else "no manifest"
        raise PretrainDataError(f"--output_dir {out} already holds different data ({found} vs "
                                f"{chash[:12]}); pass --overwrite to replace it")
    return None


def _outputs_intact(manifest: dict, out: Path, cfg: PretrainConfig) -> bool:
    """All shards listed in `manifest` exist with their size, and the tokenizer files in
    --tokenizer_dir still are the ones the shards were made with."""
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            path = out / shard["file"]
            if not path.is_file() or path.stat().st_size != shard["bytes"]:
                return False
    folder = Path(cfg.tokenizer_dir)
    return all((folder / f["name"]).is_file() and sha256_file(folder / f["name"]) == f["sha256"]
               for f in manifest["tokenizer"]["files"])


def _split_manifest(sources: Sequence[str], books: Sequence[corpus.BookRef], writer, shards, rows, skipped) -> dict:
    """Manifest section of one split: its folders, books (with several folders, each one's folder by its index),
    tokens, windows, the text of their targets, shards and skipped files."""
    several = len(sources) > 1
    if several:
        rows = [{**row, "dir": ref.folder} for ref, row in zip(books, rows, strict=True)]
    return {**({} if several else {"source_dir": sources[0]}), "source_dirs": list(sources),
            "num_books": len(rows), "book_tokens": sum(r["tokens"] for r in rows),
            "separator_tokens": max(0, len(rows) - 1), "stream_tokens": writer.stream_tokens,
            "sequences": writer.sequences, "dropped_tail_tokens": writer.dropped_tail,
            "targets": writer.targets_text(),
            "encodings": dict(sorted(collections.Counter(r["encoding"] for r in rows).items())),
            "replaced_bytes": sum(r.get("replaced_bytes", 0) for r in rows),
            "num_shards": len(shards), "shards": shards, "books": rows,
            "skipped": [{"id": s.book_id, "reason": s.reason, **({"dir": k} if several else {})} for k, s in skipped]}


def build_pretraining_data(cfg: PretrainConfig) -> dict:
    """Build (or find up to date) the TFRecords of `cfg`; returns the manifest."""
    validate_config(cfg)
    chash = config_hash(cfg)
    existing = _is_up_to_date(cfg, chash)
    if existing is not None:
        _log.warning("%s already holds this build (config hash %s); nothing to do", cfg.output_dir, chash[:12])
        return existing
    train, skipped = corpus.scan(input_dirs(cfg), "--input_dir", cfg.show_progress)
    if cfg.valid_dir is not None:
        valid, valid_skipped = corpus.scan([cfg.valid_dir], "--valid_dir", cfg.show_progress)
        sources = (input_dirs(cfg), (cfg.valid_dir,))
    else:
        (train, valid), valid_skipped = split_by_hash(train, _valid_fraction(cfg)), []
        sources = (input_dirs(cfg), input_dirs(cfg))
    tokenizer, trained = load_or_train_tokenizer(cfg, train)
    sep, lengths = separator_id(tokenizer), token_text_lengths(tokenizer)
    out = Path(cfg.output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out.parent, out.name)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        splits = {}
        for name, books, source, skip in (("train", train, sources[0], skipped),
                                          ("valid", valid, sources[1], valid_skipped)):
            if not books:
                continue
            writer, shards, rows = write_books(tokenizer, corpus.stream(books), sep, cfg, name, tmp, lengths,
                                               total=len(books))
            if writer.sequences == 0:
                raise PretrainDataError(f"split {name!r} has {writer.stream_tokens} tokens, fewer than "
                                        f"--n_ctx + 1 = {cfg.n_ctx + 1}: no sequence to write")
            splits[name] = _split_manifest(source, books, writer, shards, rows, skip)
        manifest = _manifest(cfg, chash, tokenizer, trained, sep, splits)
        write_manifest(tmp, manifest)
        commit_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _manifest(cfg: PretrainConfig, chash: str, tokenizer, trained: bool, sep: int, splits: dict) -> dict:
    """The whole manifest.json content."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("show_progress", "command")}
    config["input_dir"] = cfg.input_dir if isinstance(cfg.input_dir, str) else list(cfg.input_dir)
    return {
        "format_version": FORMAT_VERSION, "config_hash": chash, "command": cfg.command, "config": config,
        "n_ctx": cfg.n_ctx, "sequence_length": cfg.n_ctx + 1, "stride": cfg.n_ctx,
        "record": {"feature": PRETRAIN_FEATURE, "dtype": "int64", "shape": [cfg.n_ctx + 1],
                   "compression": COMPRESSION},
        "separator": {"token": SEPARATOR_TOKEN, "id": sep},
        "tokenizer": tokenizer_entry(tokenizer, cfg.tokenizer_dir, trained=trained),
        "totals": {key: sum(s[field] if field != "skipped" else len(s[field]) for s in splits.values())
                   for key, field in (("books", "num_books"), ("book_tokens", "book_tokens"),
                                      ("stream_tokens", "stream_tokens"), ("sequences", "sequences"),
                                      ("shards", "num_shards"), ("skipped", "skipped"))},
        "splits": splits,
    }


def _define_flags(flags) -> None:
    """The CLI flags (defined only when this module runs as the program)."""
    flags.DEFINE_multi_string("input_dir", None, "Folder of .txt books (nested folders allowed); several: a "
                              "comma-separated list, or the flag repeated (one corpus, read in that order).",
                              required=True)
    flags.DEFINE_string("output_dir", None, "Folder to write TFRecord shards and manifest.json into.",
                        required=True)
    flags.DEFINE_string("tokenizer_dir", None, "Folder of the BPE (encoder json + merges).", required=True)
    flags.DEFINE_integer("n_ctx", 512, "Context length: records hold n_ctx + 1 tokens.")
    flags.DEFINE_float("valid_fraction", None, f"Held-out fraction of books by id hash (default "
                       f"{DEFAULT_VALID_FRACTION}); exclusive with --valid_dir.")
    flags.DEFINE_string("valid_dir", None, "Folder of held-out books (instead of --valid_fraction).")
    flags.DEFINE_integer("shard_size", 2048, "Records per TFRecord shard.")
    flags.DEFINE_integer("train_tokenizer_vocab", None, "Train a BPE of this size on the train books "
                         "into --tokenizer_dir first.")
    flags.DEFINE_boolean("overwrite", False, "Replace a different existing output / tokenizer.")
    flags.DEFINE_boolean("progress", True, "Show progress bars.")


def main(argv) -> None:
    """CLI entry point: flags -> PretrainConfig -> build_pretraining_data."""
    from absl import flags

    if len(argv) > 1:
        raise SystemExit(f"error: unexpected arguments {argv[1:]}")
    start_command()  # before any work: the process started again where TensorFlow must start otherwise
    f = flags.FLAGS
    folders = [folder for value in f.input_dir for folder in value.split(",") if folder]
    cfg = PretrainConfig(input_dir=folders[0] if len(folders) == 1 else tuple(folders), output_dir=f.output_dir,
                         tokenizer_dir=f.tokenizer_dir,
                         n_ctx=f.n_ctx, valid_fraction=f.valid_fraction, valid_dir=f.valid_dir,
                         shard_size=f.shard_size, train_tokenizer_vocab=f.train_tokenizer_vocab,
                         overwrite=f.overwrite, show_progress=f.progress,
                         command=command_line("pipelines.pretrain_data"))
    try:
        manifest = build_pretraining_data(cfg)
    except PretrainDataError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:
        sys.exit(refused_build(err, cfg.output_dir))
    totals = manifest["totals"]
    print(f"{cfg.output_dir}: {totals['books']} books, {totals['book_tokens']} tokens, "
          f"{totals['sequences']} sequences of {cfg.n_ctx + 1} tokens in {totals['shards']} shards "
          f"({totals['skipped']} files skipped)")


if __name__ == "__main__":
    run_cli(_define_flags, main)
