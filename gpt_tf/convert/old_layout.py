"""Weights files of the earlier ``GPT1Backbone`` layout, read into today's.

Before the backbone was a functional keras-hub model, its ``model.weights.h5`` held a subclassed model's tree:
``embed/vars/{0,1}`` (the token and position tables) and ``blocks/<block>/{attn/c_attn, attn/c_proj, ln_1,
mlp/c_fc, mlp/c_proj, ln_2}/vars/{0,1}``, the blocks named ``transformer_block``, ``transformer_block_1``, ... in
order. Today's file is Keras's layout of the functional model (``layers/embed/...``, ``layers/h0/...``). The arrays
are the same; only their places moved. ``is_old_layout`` tells the two apart, ``old_layout_arrays`` reads an
old file in the release's order (``layout.all_block_slots``), ``load_old_layout`` assigns them (every shape checked
before any is assigned), and ``python -m gpt_tf.convert --preset=OLD --preset_dir=NEW`` re-saves a preset
folder in today's layout.
"""

from __future__ import annotations

import re

import h5py
import numpy as np

from gpt_tf.convert.layout import all_block_slots, assign_all, backbone_of

# A block's six layers in release order, each with its two arrays (kernel or gain first, then bias).
_BLOCK_LAYERS = ("attn/c_attn", "attn/c_proj", "ln_1", "mlp/c_fc", "mlp/c_proj", "ln_2")


def is_old_layout(path) -> bool:
    """Whether the ``.weights.h5`` file at ``path`` is in the earlier subclassed layout (``embed`` and ``blocks`` at
    its top level)."""
    with h5py.File(path, "r") as f:
        return "blocks" in f and "embed" in f and "layers" not in f


def _block_order(name: str) -> int:
    match = re.fullmatch(r"transformer_block(?:_(\d+))?", name)
    if match is None:
        raise ValueError(f"not a transformer block of the earlier layout: {name!r}")
    return int(match.group(1) or 0)


def old_layout_arrays(path) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """``(tokens, positions, block arrays in release order)`` of an earlier-layout weights file, as float32."""
    with h5py.File(path, "r") as f:
        tokens, positions = (np.asarray(f[f"embed/vars/{i}"], np.float32) for i in (0, 1))
        blocks = []
        for name in sorted(f["blocks"], key=_block_order):
            for layer in _BLOCK_LAYERS:
                group = f"blocks/{name}/{layer}/vars"
                if group not in f:
                    raise ValueError(f"{path}: {group} is missing (an earlier-layout GPT-1 file has one per block)")
                blocks += [np.asarray(f[f"{group}/{i}"], np.float32) for i in (0, 1)]
    return tokens, positions, blocks


def load_old_layout(model, path) -> None:
    """The earlier-layout weights file ``path`` into ``model`` (a ``GPT1Backbone`` or a model holding one) of the
    same shape; ValueError naming the first array that does not fit, before anything is assigned."""
    backbone = backbone_of(model)
    tokens, positions, blocks = old_layout_arrays(path)
    slots = all_block_slots(backbone)
    if len(blocks) != len(slots):
        raise ValueError(f"{path}: {len(blocks) // 12} blocks in the file, {len(slots) // 12} in the model")
    pairs = [(backbone.embed.tokens_embed, tokens, "embed tokens"),
             (backbone.embed.positions_embed, positions, "embed positions")]
    pairs += [(variable, array, name) for (_, name, variable), array in zip(slots, blocks)]
    for variable, array, name in pairs:
        if tuple(variable.shape) != array.shape:
            raise ValueError(f"{path}: {name} is {array.shape} in the file, {tuple(variable.shape)} in the model")
    assign_all([(variable, array) for variable, array, _ in pairs])
