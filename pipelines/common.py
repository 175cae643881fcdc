"""Small helpers shared by the data pipelines (pre-training and fine-tuning builds)."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path


def hash_unit(key: str) -> float:
    """Deterministic number in [0, 1) from a string id (sha256, first 60 bits)."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:15], 16) / 16.0 ** 15


def commit_dir(tmp: Path, out: Path) -> None:
    """Move a finished temp folder into place (replacing an old output) with renames."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def tokenizer_files(tokenizer_dir: str) -> list[Path]:
    """The tokenizer's vocabulary/merges files in a folder (*.json and *.bpe), sorted."""
    folder = Path(tokenizer_dir)
    return sorted(p for p in folder.iterdir() if p.suffix in (".json", ".bpe")) if folder.is_dir() else []


def command_line(module: str) -> str:
    """The command that is running, as a shell line, for manifests."""
    return shlex.join([sys.executable, "-m", module, *sys.argv[1:]])


def run_cli(define_flags, main) -> None:
    """Entry point of a pipeline CLI: define its absl flags, log plainly, run ``main``."""
    from absl import app, flags

    define_flags(flags)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    app.run(main)
