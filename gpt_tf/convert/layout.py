"""Where each weight of a ``GPT1Backbone`` sits in the formats it is converted to and from, and what they share.

A block's 12 weights in the release's order, each with its ``transformers`` key and its release name
(``block_slots``); a model's arrays read as float32 numpy whatever holds them (``to_numpy``: numpy, a Keras
variable, a torch tensor); a token table with fewer rows than the model's (no special tokens) put over the
model's own rows (``with_rows``); and every array assigned only once all of them were checked
(``assign_all``), so a failed load leaves the model untouched.
"""

from __future__ import annotations

import keras
import numpy as np


def backbone_of(model):
    """Accepts a ``GPT1CausalLM`` (any model holding a ``backbone``) or a ``GPT1Backbone``."""
    return getattr(model, "backbone", model)


def block_slots(block, index):
    """The 12 weights of one block in release order: ``(hf_key, release_name, variable)``."""
    hf, tf = f"h.{index}.", f"model/h{index}/"
    layers = (("attn.c_attn", block.attn.c_attn), ("attn.c_proj", block.attn.c_proj), ("ln_1", block.ln_1),
              ("mlp.c_fc", block.mlp.c_fc), ("mlp.c_proj", block.mlp.c_proj), ("ln_2", block.ln_2))
    slots = []
    for scope, layer in layers:
        path = tf + scope.replace(".", "/")
        if scope.startswith("ln_"):
            slots += [(f"{hf}{scope}.weight", f"{path}/g", layer.gamma), (f"{hf}{scope}.bias", f"{path}/b", layer.beta)]
        else:
            slots += [(f"{hf}{scope}.weight", f"{path}/w", layer.w), (f"{hf}{scope}.bias", f"{path}/b", layer.b)]
    return slots


def all_block_slots(model):
    """Block slots of every layer, in release order."""
    return [slot for i, block in enumerate(backbone_of(model).blocks) for slot in block_slots(block, i)]


def to_numpy(value) -> np.ndarray:
    """A float32 numpy array from a numpy array, a Keras variable or a torch tensor."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        value = value.detach().cpu()
        if not value.dtype.is_floating_point or value.dtype.itemsize < 4:
            value = value.float()
        return value.numpy().astype(np.float32, copy=False)
    if isinstance(value, np.ndarray):
        return value.astype(np.float32, copy=False)
    value = value.numpy() if hasattr(value, "numpy") else keras.ops.convert_to_numpy(value)  # Keras variable
    return np.asarray(value).astype(np.float32, copy=False)


def assign_all(assignments):
    """Assigns ``(variable, array)`` pairs; shapes were checked by the caller."""
    for variable, array in assignments:
        variable.assign(keras.ops.cast(array, variable.dtype))


def with_rows(variable, rows: np.ndarray) -> np.ndarray:
    """The variable's value with its first ``len(rows)`` rows replaced (special tokens keep theirs)."""
    if rows.shape[0] == variable.shape[0]:
        return rows
    full = to_numpy(variable).copy()
    full[: rows.shape[0]] = rows
    return full
