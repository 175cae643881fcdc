"""Layer transfer (paper §5, Fig. 2) and the special-token rows fine-tuning starts afresh (§3.3).

``transfer_layers`` copies the embeddings and the first k blocks of one backbone into another (GPT or the LSTM
baseline); ``reset_special_embeddings`` re-draws the rows of the start, delimiter, extract and pad tokens, which a
pre-trained language model holds but never trained.
"""

from __future__ import annotations

import numpy as np
from keras import ops


def _backbone_of(model):
    """The backbone of a ``GPT1CausalLM`` or keras-hub task, or the backbone itself (GPT or LSTM)."""
    return getattr(model, "backbone", model)


def transfer_layers(src, dst, n_layers: int) -> list[str]:
    """Copies the embeddings and the first ``n_layers`` blocks from ``src`` into ``dst`` (paper Fig. 2).

    ``n_layers = 0`` transfers the token and position embeddings only (Fig. 2's leftmost point:
    "transferring embeddings improves performance"); ``n_layers = dst.n_layer`` is full transfer.
    Blocks past ``n_layers`` keep their fresh initialisation. ``src``/``dst`` may be backbones or
    models holding one. Position rows are copied up to ``dst``'s ``n_ctx`` (which may be shorter).
    The special-token rows are copied too; call ``reset_special_embeddings`` to re-draw them.
    Returns the paths of the destination variables that were overwritten.
    """
    src, dst = _backbone_of(src), _backbone_of(dst)
    if not 0 <= n_layers <= min(len(src.blocks), len(dst.blocks)):
        raise ValueError(f"n_layers={n_layers} must be in [0, {min(len(src.blocks), len(dst.blocks))}]")
    s, d = src.config, dst.config
    if (s.vocab_size, s.n_special, s.n_embd) != (d.vocab_size, d.n_special, d.n_embd) or d.n_ctx > s.n_ctx:
        raise ValueError(
            f"cannot transfer embeddings: source vocab/special/width/n_ctx = {s.vocab_size}/{s.n_special}/"
            f"{s.n_embd}/{s.n_ctx}, destination {d.vocab_size}/{d.n_special}/{d.n_embd}/{d.n_ctx} "
            "(the first three must match and the destination n_ctx must not be longer)"
        )
    pairs = [
        (src.embed.tokens_embed, dst.embed.tokens_embed, None),
        (src.embed.positions_embed, dst.embed.positions_embed, d.n_ctx),
    ]
    for i in range(n_layers):
        src_vars, dst_vars = src.blocks[i].weights, dst.blocks[i].weights
        if [tuple(v.shape) for v in src_vars] != [tuple(v.shape) for v in dst_vars]:
            raise ValueError(f"block {i}: source and destination weight shapes differ")
        pairs.extend((a, b, None) for a, b in zip(src_vars, dst_vars))
    for source, target, rows in pairs:
        value = ops.convert_to_numpy(source)
        target.assign(value[:rows] if rows is not None else value)
    return [target.path for _, target, _ in pairs]


def reset_special_embeddings(backbone, seed: int = 0) -> None:
    """Re-draws the special-token rows (ids ≥ vocab_size) of ``tokens_embed`` from N(0, init_std).

    A pre-trained LM has these rows but never trained them; fine-tuning starts them afresh (§3.3).
    Deterministic in ``seed``; the BPE rows are left untouched.
    """
    backbone = _backbone_of(backbone)
    config, table = backbone.config, backbone.embed.tokens_embed
    values = np.array(ops.convert_to_numpy(table))
    rng = np.random.default_rng(seed)
    values[config.vocab_size :] = rng.normal(0.0, config.init_std, values[config.vocab_size :].shape)
    table.assign(values)
