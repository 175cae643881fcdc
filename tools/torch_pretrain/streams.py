"""The token-stream file that crosses to the GPU machine: ``train`` / ``valid`` uint16 streams and their ``meta``.

``.npz`` is numpy's zip (deflate). ``.npz.xz`` is the same npz, uncompressed, inside an xz (LZMA) stream: about
25% smaller for BPE ids (books_tiny's 36.7M tokens: 44.9 MB as ``.npz``, 33.9 MB as ``.npz.xz``), which is what
lets books_tiny's streams travel beside the repository's tracked files within 64 MiB. numpy and
the standard library only: both sides (``convert`` with TensorFlow, ``train`` without) read and write it.
"""

from __future__ import annotations

import io
import json
import lzma
import os

import numpy as np

XZ = ".xz"


def save_streams(path: str, meta: dict, streams: dict) -> None:
    """Writes ``meta`` (JSON) and the named streams to ``path`` (``.npz``, or ``.npz.xz``: see the module doc)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not path.endswith(XZ):
        np.savez_compressed(path, meta=json.dumps(meta), **streams)
        return
    buffer = io.BytesIO()
    np.savez(buffer, meta=json.dumps(meta), **streams)
    tmp = f"{path}.tmp-{os.getpid()}"
    with lzma.open(tmp, "wb", preset=6) as out:
        out.write(buffer.getbuffer())
    os.replace(tmp, path)


def load_streams(path: str) -> tuple[dict, dict]:
    """``(meta, {name: stream})`` of a file written by ``save_streams``."""
    source = io.BytesIO(lzma.open(path).read()) if path.endswith(XZ) else path
    with np.load(source) as data:
        return json.loads(str(data["meta"])), {name: data[name] for name in data.files if name != "meta"}
