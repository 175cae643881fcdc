"""Weight import/export: the released GPT-1 shards and Hugging Face ``OpenAIGPT`` state dicts.

Release format (openai/finetune-transformer-lm): ``params_shapes.json`` lists 146 shapes;
the arrays are flattened, concatenated in that order and split into ``params_0.npy`` …
``params_9.npy``. Array 0 is the position table ``[512, 768]``, array 1 the token table
``[40478, 768]`` (no special tokens: the paper appends them at fine-tuning, so our special
rows keep their N(0, 0.02) init), then 12 arrays per block in the order of
:func:`_block_slots`. Conv weights carry a leading receptive-field axis ``[1, in, out]``.

Hugging Face format (``OpenAIGPTModel`` / ``OpenAIGPTLMHeadModel``): keys such as
``transformer.h.0.attn.c_attn.weight``; its ``Conv1D`` stores ``[in, out]`` like ours.

Every loader validates all arrays before assigning any, so a failed load leaves the model
untouched.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import keras
import numpy as np

RELEASE_SHAPES_FILE = "params_shapes.json"
HF_PREFIX = "transformer."
# Buffers that Hugging Face checkpoints may carry but that hold no weights.
_HF_IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|position_ids)$")


def _block_slots(block, index):
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


def _all_block_slots(model):
    """Block slots of every layer, in release order."""
    backbone = _backbone(model)
    return [slot for i, block in enumerate(backbone.blocks) for slot in _block_slots(block, i)]


def _backbone(model):
    """Accepts a ``GPT1CausalLM`` (any model holding a ``backbone``) or a ``GPT1Backbone``."""
    return getattr(model, "backbone", model)


def _to_numpy(value) -> np.ndarray:
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


def _assign_all(assignments):
    """Assigns ``(variable, array)`` pairs; shapes were checked by the caller."""
    for variable, array in assignments:
        variable.assign(keras.ops.cast(array, variable.dtype))


def _with_rows(variable, rows: np.ndarray) -> np.ndarray:
    """The variable's value with its first ``len(rows)`` rows replaced (special tokens keep theirs)."""
    if rows.shape[0] == variable.shape[0]:
        return rows
    full = _to_numpy(variable).copy()
    full[: rows.shape[0]] = rows
    return full


# ----------------------------------------------------------------------------- release format


def release_shapes(config) -> list[list[int]]:
    """The shapes ``params_shapes.json`` lists for a model of ``config`` (release order)."""
    d, f = config.n_embd, config.d_ff
    block = [[1, d, 3 * d], [3 * d], [1, d, d], [d], [d], [d], [1, d, f], [f], [1, f, d], [d], [d], [d]]
    return [[config.n_ctx, d], [config.vocab_size, d]] + block * config.n_layer


def _release_slots(model):
    """``(release_name, variable)`` for every release array, in release order."""
    embed = _backbone(model).embed
    head = [("model/pe (positions)", embed.positions_embed), ("model/we (tokens)", embed.tokens_embed)]
    return head + [(name, var) for _, name, var in _all_block_slots(model)]


def _read_shapes(shapes_path: Path) -> list[tuple[int, ...]]:
    """Reads and checks ``params_shapes.json``: a JSON list of lists of non-negative ints."""
    if not shapes_path.is_file():
        raise FileNotFoundError(f"release shapes file not found: {shapes_path}")
    try:
        shapes = json.loads(shapes_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{shapes_path}: not valid JSON ({err})") from err
    if not isinstance(shapes, list):
        raise ValueError(f"{shapes_path}: expected a JSON list of shapes, found {type(shapes).__name__}")
    for i, shape in enumerate(shapes):
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"{shapes_path}: entry {i} is not a list of non-negative ints: {shape!r}")
    return [tuple(shape) for shape in shapes]


def _check_release_shapes(model, shapes, shapes_path):
    """Raises a ``ValueError`` naming the array index, the expected and the found shape."""
    config = _backbone(model).config
    slots = _release_slots(model)
    if len(shapes) != len(slots):
        raise ValueError(
            f"{shapes_path}: lists {len(shapes)} arrays, but a model with n_layer={config.n_layer} needs "
            f"{len(slots)} (2 embeddings + 12 per block)"
        )
    for index, ((name, variable), found) in enumerate(zip(slots, shapes)):
        expected = _expected_release_shape(config, index, variable)
        if index == 0:  # position table: a longer release table is cut to the model's n_ctx
            ok = len(found) == 2 and found[1] == config.n_embd and found[0] >= config.n_ctx
            expected = f"[>= n_ctx={config.n_ctx}, {config.n_embd}]"
        else:
            ok = list(found) == expected
        if not ok:
            raise ValueError(f"{shapes_path}: array {index} ({name}) has shape {list(found)}; expected {expected}")


def _expected_release_shape(config, index, variable) -> list[int]:
    """Release shape of array ``index``: tokens without specials, conv weights as ``[1, in, out]``."""
    if index == 1:
        return [config.vocab_size, config.n_embd]
    shape = [int(n) for n in variable.shape]
    return [1, *shape] if index > 1 and len(shape) == 2 else shape


def _read_shards(params_dir: Path, n_shards: int) -> np.ndarray:
    """Concatenates ``params_0.npy`` … ``params_{n-1}.npy`` into one flat float32 array."""
    paths = [params_dir / f"params_{n}.npy" for n in range(n_shards)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"missing release shard file(s) in {params_dir}: {', '.join(missing)}")
    parts = []
    for path in paths:
        try:
            parts.append(np.load(path).reshape(-1))
        except (ValueError, OSError) as err:
            raise ValueError(f"{path}: not a readable .npy array ({err})") from err
    return np.concatenate(parts, 0)


def load_gpt1_release(model, params_dir, shapes_path=None, n_shards: int = 10) -> None:
    """Loads the released GPT-1 weights (``params_*.npy`` + ``params_shapes.json``) into ``model``.

    Args:
        model: a ``GPT1CausalLM`` or ``GPT1Backbone`` whose ``vocab_size`` equals the
            release's token rows (40,478) and whose ``n_ctx`` is at most the release's 512.
        params_dir: folder holding the shards (and ``params_shapes.json`` unless given).
        shapes_path: the shapes file, if not in ``params_dir``.
        n_shards: number of shard files (10 in the release).
    """
    params_dir = Path(params_dir)
    shapes_path = Path(shapes_path) if shapes_path is not None else params_dir / RELEASE_SHAPES_FILE
    shapes = _read_shapes(shapes_path)
    _check_release_shapes(model, shapes, shapes_path)
    flat = _read_shards(params_dir, n_shards)
    sizes = [int(np.prod(shape)) for shape in shapes]
    if flat.size != sum(sizes):
        raise ValueError(
            f"shards params_0..{n_shards - 1}.npy in {params_dir} hold {flat.size} values in all, "
            f"but {shapes_path} describes {sum(sizes)}"
        )
    arrays = [a.reshape(s) for a, s in zip(np.split(flat, np.cumsum(sizes))[:-1], shapes)]
    n_ctx = _backbone(model).config.n_ctx
    assignments = []
    for index, ((_, variable), array) in enumerate(zip(_release_slots(model), arrays)):
        array = array.astype(np.float32, copy=False)
        if index == 0:
            array = array[:n_ctx]
        elif index == 1:
            array = _with_rows(variable, array)
        elif array.ndim == 3:
            array = array[0]
        assignments.append((variable, array))
    _assign_all(assignments)


def save_gpt1_release(model, out_dir, n_shards: int = 10) -> list[Path]:
    """Writes ``model`` in the release format; returns the written paths (shards, then shapes file).

    The token table is written without the special-token rows, as in the release.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = _backbone(model).config
    arrays = []
    for index, (_, variable) in enumerate(_release_slots(model)):
        array = _to_numpy(variable)
        if index == 1:
            array = array[: config.vocab_size]
        elif index > 1 and array.ndim == 2:
            array = array[None]
        arrays.append(array)
    shapes = [list(a.shape) for a in arrays]
    flat = np.concatenate([a.reshape(-1) for a in arrays], 0)
    paths = []
    for n, shard in enumerate(np.array_split(flat, n_shards)):
        path = out_dir / f"params_{n}.npy"
        np.save(path, shard)
        paths.append(path)
    shapes_path = out_dir / RELEASE_SHAPES_FILE
    shapes_path.write_text(json.dumps(shapes))
    return paths + [shapes_path]


# ----------------------------------------------------------------------------- Hugging Face format


def _strip_prefix(state_dict) -> dict:
    """Keys without the ``transformer.`` prefix (``lm_head.weight`` kept as is)."""
    out = {}
    for key, value in state_dict.items():
        short = key[len(HF_PREFIX):] if key.startswith(HF_PREFIX) else key
        if short in out:
            raise ValueError(f"state dict has key {short!r} both with and without the {HF_PREFIX!r} prefix")
        out[short] = value
    return out


def _check_keys(state, expected):
    """Raises ``KeyError`` listing missing and unexpected keys."""
    allowed = set(expected) | {"lm_head.weight"}
    missing = [k for k in expected if k not in state]
    unexpected = sorted(k for k in state if k not in allowed and not _HF_IGNORED.match(k))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {missing}")
        if unexpected:
            parts.append(f"unexpected keys: {unexpected}")
        raise KeyError("state dict does not match the model (" + "; ".join(parts) + ")")


def _embedding_arrays(config, state):
    """Checked token and position arrays from a (prefix-stripped) HF state dict."""
    tokens = _to_numpy(state["tokens_embed.weight"])
    d = config.n_embd
    if tokens.ndim != 2 or tokens.shape[1] != d or tokens.shape[0] not in (config.vocab_size, config.total_vocab):
        raise ValueError(
            f"tokens_embed.weight has shape {list(tokens.shape)}; expected [{config.vocab_size}, {d}] "
            f"(vocab_size) or [{config.total_vocab}, {d}] (with the {config.n_special} special tokens)"
        )
    if "lm_head.weight" in state:
        head = _to_numpy(state["lm_head.weight"])
        if head.shape != tokens.shape or not np.array_equal(head, tokens):
            raise ValueError("lm_head.weight differs from tokens_embed.weight; this model ties them (Eq. 2)")
    positions = _to_numpy(state["positions_embed.weight"])
    if positions.ndim != 2 or positions.shape[1] != d or positions.shape[0] < config.n_ctx:
        raise ValueError(
            f"positions_embed.weight has shape {list(positions.shape)}; expected [>= n_ctx={config.n_ctx}, {d}]"
        )
    return tokens, positions[: config.n_ctx]


def load_hf_state_dict(model, state_dict) -> None:
    """Loads a ``transformers`` ``OpenAIGPTModel`` / ``OpenAIGPTLMHeadModel`` state dict into ``model``.

    Values may be numpy arrays or torch tensors; keys may carry the ``transformer.`` prefix.
    ``lm_head.weight`` is tied, so it must equal ``tokens_embed.weight``; causal-mask buffers
    (``attn.bias``) are ignored. The token table may have ``vocab_size`` rows (special-token
    rows keep their init) or ``total_vocab`` rows.
    """
    backbone = _backbone(model)
    config = backbone.config
    state = _strip_prefix(state_dict)
    slots = _all_block_slots(model)
    _check_keys(state, ["tokens_embed.weight", "positions_embed.weight"] + [key for key, _, _ in slots])
    tokens, positions = _embedding_arrays(config, state)
    assignments = [(backbone.embed.tokens_embed, _with_rows(backbone.embed.tokens_embed, tokens)),
                   (backbone.embed.positions_embed, positions)]
    for key, _, variable in slots:
        array = _to_numpy(state[key])
        if tuple(array.shape) != tuple(variable.shape):
            raise ValueError(f"{key} has shape {list(array.shape)}; expected {list(variable.shape)}")
        assignments.append((variable, array))
    _assign_all(assignments)


def to_hf_state_dict(model, prefix: str = HF_PREFIX, lm_head: bool = True, include_special: bool = False) -> dict:
    """Exports ``model`` as a ``transformers`` ``OpenAIGPTLMHeadModel`` state dict of float32 numpy arrays.

    Args:
        prefix: key prefix (``"transformer."`` for the LM-head model, ``""`` for ``OpenAIGPTModel``).
        lm_head: also write the tied ``lm_head.weight``.
        include_special: keep the special-token rows (then the HF ``vocab_size`` must be ``total_vocab``).
    """
    backbone = _backbone(model)
    config = backbone.config
    tokens = _to_numpy(backbone.embed.tokens_embed)
    if not include_special:
        tokens = tokens[: config.vocab_size]
    state = {f"{prefix}tokens_embed.weight": tokens,
             f"{prefix}positions_embed.weight": _to_numpy(backbone.embed.positions_embed)}
    for key, _, variable in _all_block_slots(model):
        state[prefix + key] = _to_numpy(variable)
    if lm_head:
        state["lm_head.weight"] = tokens
    return state
