"""GPT-1's released weights (openai/finetune-transformer-lm), both ways.

``params_shapes.json`` lists 146 shapes; the arrays are flattened, concatenated in that order and split into
``params_0.npy`` … ``params_9.npy``. Array 0 is the position table ``[512, 768]``, array 1 the token table
``[40478, 768]`` (no special tokens: the paper appends them at fine-tuning, so our special rows keep their
N(0, 0.02) init), then 12 arrays per block in the order of ``layout.block_slots``. Conv weights carry a leading
receptive-field axis ``[1, in, out]``. The loader validates every array before assigning any.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpt_tf.convert.layout import all_block_slots, assign_all, backbone_of, to_numpy, with_rows

RELEASE_SHAPES_FILE = "params_shapes.json"


def release_shapes(config) -> list[list[int]]:
    """The shapes ``params_shapes.json`` lists for a model of ``config`` (release order)."""
    d, f = config.n_embd, config.d_ff
    block = [[1, d, 3 * d], [3 * d], [1, d, d], [d], [d], [d], [1, d, f], [f], [1, f, d], [d], [d], [d]]
    return [[config.n_ctx, d], [config.vocab_size, d]] + block * config.n_layer


def _release_slots(model):
    """``(release_name, variable)`` for every release array, in release order."""
    embed = backbone_of(model).embed
    head = [("model/pe (positions)", embed.positions_embed), ("model/we (tokens)", embed.tokens_embed)]
    return head + [(name, var) for _, name, var in all_block_slots(model)]


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
    config = backbone_of(model).config
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
    n_ctx = backbone_of(model).config.n_ctx
    assignments = []
    for index, ((_, variable), array) in enumerate(zip(_release_slots(model), arrays)):
        array = array.astype(np.float32, copy=False)
        if index == 0:
            array = array[:n_ctx]
        elif index == 1:
            array = with_rows(variable, array)
        elif array.ndim == 3:
            array = array[0]
        assignments.append((variable, array))
    assign_all(assignments)


def save_gpt1_release(model, out_dir, n_shards: int = 10) -> list[Path]:
    """Writes ``model`` in the release format; returns the written paths (shards, then shapes file).

    The token table is written without the special-token rows, as in the release.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = backbone_of(model).config
    arrays = []
    for index, (_, variable) in enumerate(_release_slots(model)):
        array = to_numpy(variable)
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
