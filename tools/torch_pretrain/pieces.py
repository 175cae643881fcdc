"""What `tools.torch_pretrain.train` writes to disk: the weights it hands back, and a piece's resume state.

``weights-<step>.part<k>.npz``: the model's state dict in files of at most ``PART_BYTES`` (the device tool
returns files of up to 16 MiB); a tensor larger than that (``small``'s 16k × 384 token table: 24.6 MB) is
stored as row blocks ``<name>#rows<i>``, which ``gpt_tf.convert.state_dicts.read_state_dict`` puts back together
(``ROWS`` is its name there too: a test holds them equal). ``state-<step>.part<k>`` + ``state.json``: one
``torch.save`` of everything a later piece needs, behind an atomically replaced index. Imports numpy only (torch
is passed in), like ``train``: no TensorFlow, no gpt_tf.
"""

from __future__ import annotations

import glob
import io
import json
import math
import os
import re

import numpy as np

PART_BYTES = 15 * 2**20  # files of at most this size (the device tool returns files of up to 16 MiB)
PIECE_EXIT = 75  # a piece stopped with its state saved: run the same command again (EX_TEMPFAIL)
ROWS = "#rows"  # <name>#rows<i>: row block i of a tensor larger than PART_BYTES


def _row_blocks(key: str, value: np.ndarray):
    """``(key, value)``, or the row blocks of a tensor larger than ``PART_BYTES``, each within it."""
    if value.nbytes <= PART_BYTES or value.ndim == 0 or value.shape[0] < 2:
        yield key, value
        return
    rows = max(1, PART_BYTES // (value.nbytes // value.shape[0]))
    for i, start in enumerate(range(0, value.shape[0], rows)):
        yield f"{key}{ROWS}{i}", value[start:start + rows]


def save_weights(torch, model, out_dir: str, step: int, dtype) -> list[str]:
    """The state dict as ``weights-<step>.part<k>.npz`` files of at most PART_BYTES each; returns their paths.

    ``lm_head.weight`` (tied to ``tokens_embed.weight``) and the causal-mask buffers are left out.
    """
    state = {k: v.detach().float().cpu().numpy().astype(dtype) for k, v in model.state_dict().items()
             if not re.search(r"\.attn\.(bias|masked_bias)$", k) and k != "lm_head.weight"}
    return save_arrays(state, out_dir, step)


def save_arrays(state: dict, out_dir: str, step: int) -> list[str]:
    """Named numpy arrays as ``weights-<step>.part<k>.npz`` files of at most PART_BYTES each (row blocks for a
    larger one); returns their paths. ``tools.jax_pretrain`` writes its Keras model's weights with it too."""
    parts, size = [{}], 0
    for key, value in ((k, block) for name, tensor in state.items() for k, block in _row_blocks(name, tensor)):
        if parts[-1] and size + value.nbytes > PART_BYTES:
            parts.append({})
            size = 0
        parts[-1][key], size = value, size + value.nbytes
    paths = [os.path.join(out_dir, f"weights-{step}.part{k}.npz") for k in range(len(parts))]
    for path, part in zip(paths, parts):
        np.savez(path, **part)
    return paths


def save_state(torch, out_dir: str, state: dict) -> list[str]:
    """``state`` (one ``torch.save``) as ``state-<step>.part<k>`` files of at most PART_BYTES, then ``state.json``
    naming them (replaced atomically): a piece killed at any moment leaves the previous state whole."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data, step = buffer.getvalue(), state["step"]
    names = [f"state-{step}.part{k}" for k in range(max(1, math.ceil(len(data) / PART_BYTES)))]
    for k, name in enumerate(names):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data[k * PART_BYTES:(k + 1) * PART_BYTES])
            f.flush()
            os.fsync(f.fileno())
    tmp = os.path.join(out_dir, f".state.json.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"step": step, "parts": names, "bytes": len(data)}, f)
    os.replace(tmp, os.path.join(out_dir, "state.json"))
    for path in glob.glob(os.path.join(out_dir, "state-*.part*")):  # the previous piece's
        if os.path.basename(path) not in names:
            os.remove(path)
    return [os.path.join(out_dir, name) for name in names]


def load_state(torch, out_dir: str, device: str):
    """The last piece's state (None when there is none)."""
    path = os.path.join(out_dir, "state.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        index = json.load(f)
    data = b"".join(open(os.path.join(out_dir, name), "rb").read() for name in index["parts"])
    if len(data) != index["bytes"]:
        raise ValueError(f"{out_dir}: the state files hold {len(data)} bytes, state.json says {index['bytes']}")
    return torch.load(io.BytesIO(data), map_location=device, weights_only=False)


def remove_state(out_dir: str) -> None:
    for path in glob.glob(os.path.join(out_dir, "state-*.part*")) + glob.glob(os.path.join(out_dir, "state.json")):
        os.remove(path)
