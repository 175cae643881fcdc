"""Small helpers shared by the data pipelines (pre-training and fine-tuning builds)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from gpt_tf.write_errors import writing

MAX_PIECE_CHARS = 1 << 15  # longer texts are tokenized in pieces cut at spaces
_ENCODE_BUDGET_CHARS = 1 << 18  # characters per encode_batch call (~30 MB of tokenizer memory)


def hash_unit(key: str) -> float:
    """Deterministic number in [0, 1) from a string id (sha256, first 60 bits)."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:15], 16) / 16.0 ** 15


def split_at_spaces(text: str, max_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """``text`` cut at spaces into pieces of at most ``max_chars`` (a longer run without a space is cut anyway).

    Words are space-separated pieces for the tokenizer, so the tokens of the pieces, concatenated,
    are the text's (a cut through a word of over ``max_chars`` characters changes that word only).
    """
    if len(text) <= max_chars:
        return [text]
    pieces, start = [], 0
    while len(text) - start > max_chars:
        cut = text.rfind(" ", start, start + max_chars + 1)
        if cut <= start:
            pieces.append(text[start:start + max_chars])
            start += max_chars
        else:
            pieces.append(text[start:cut])
            start = cut + 1
    pieces.append(text[start:])
    return pieces


def encode_pieces(tokenizer, texts, max_chars: int = MAX_PIECE_CHARS, budget: int = _ENCODE_BUDGET_CHARS):
    """Yields ``(index of the text, token ids)`` for each piece of each text, in order.

    Memory stays bounded whatever the texts' lengths: each text is cut at spaces into pieces of at
    most ``max_chars`` characters, and ``encode_batch`` sees about ``budget`` characters at a time
    (the tokenizer takes ~130 bytes per character: a 10 MB line in one call took 1.3 GB).
    """
    batch, owners, size = [], [], 0
    for i, text in enumerate(texts):
        for piece in split_at_spaces(text, max_chars):
            batch.append(piece)
            owners.append(i)
            size += len(piece)
            if size >= budget:
                yield from zip(owners, tokenizer.encode_batch(batch))
                batch, owners, size = [], [], 0
    if batch:
        yield from zip(owners, tokenizer.encode_batch(batch))


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, through ``encode_pieces`` (bounded memory)."""
    out = [[] for _ in texts]
    for i, ids in encode_pieces(tokenizer, texts):
        out[i].extend(ids)
    return out


def remove_stale_temps(parent: Path, name: str = "", log=logging.getLogger(__name__).warning) -> list[Path]:
    """Deletes ``parent/.{name}.tmp-PID`` / ``.old-PID`` folders whose process is gone (a killed build's or
    export's); ``name`` empty: whatever the name."""
    removed = []
    pattern = re.compile(rf"\.({re.escape(name) if name else '.+'})\.(tmp|old)-(\d+)")
    for path in sorted(Path(parent).iterdir()) if Path(parent).is_dir() else []:
        match = pattern.fullmatch(path.name)
        if match and not pid_alive(int(match.group(3))):
            shutil.rmtree(path, ignore_errors=True)
            log("removed %s, left by process %s that no longer runs", path, match.group(3))
            removed.append(path)
    return removed


def pid_alive(pid: int) -> bool:
    """True if a process with this id runs on this machine (a reused id counts as alive: nothing is removed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def commit_dir(tmp: Path, out: Path) -> None:
    """Move a finished temp folder into place (replacing an old output) with renames."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    with writing(out):
        if out.exists():
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except OSError:
            if old.exists() and not out.exists():
                os.rename(old, out)  # the previous output back in place
            raise
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
