"""PyTorch state dicts: ``transformers``' ``OpenAIGPT*`` (both ways), Table 5's LSTM, and ``.npz`` parts of either.

``transformers``' ``OpenAIGPTModel`` / ``OpenAIGPTLMHeadModel`` keys read ``transformer.h.0.attn.c_attn.weight``;
its ``Conv1D`` stores ``[in, out]`` like ours (``layout.block_slots`` maps the keys). The LSTM baseline's
(``tools/torch_pretrain/lstm_model.py``) shares the embedding keys and has one ``torch.nn.LSTM`` (+ a projection)
per block. A state dict saved as ``.npz`` parts (``read_state_dict``; ``tools/torch_pretrain``'s
``weights-<step>.part<k>.npz``) may store a tensor too large for one part as row blocks ``<key>#rows<i>``
(written by ``tools/torch_pretrain/pieces.py``, which runs where gpt_tf is not installed), joined here.
Every loader checks all keys and shapes before it assigns anything, so a failed load leaves the model untouched.
"""

from __future__ import annotations

import re

import numpy as np

from gpt_tf.convert.layout import all_block_slots, assign_all, backbone_of, to_numpy, with_rows

HF_PREFIX = "transformer."
# Buffers that Hugging Face checkpoints may carry but that hold no weights.
_HF_IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|position_ids)$")
ROWS = "#rows"  # <key>#rows<i>: row block i of a tensor stored in several .npz parts


def read_state_dict(paths) -> dict:
    """The float32 state dict saved in the ``.npz`` files ``paths`` (one, or the parts of one), its row-block
    tensors whole again; ValueError naming a key two parts both hold or row blocks that are not 0..n-1."""
    state, blocks = {}, {}
    for path in paths:
        with np.load(path) as part:
            for key in part.files:
                name, split, i = key.partition(ROWS)
                held = blocks.setdefault(name, {}) if split else state
                index = int(i) if split else key
                if index in held:
                    raise ValueError(f"{path}: key {key!r} is also in an earlier part")
                held[index] = part[key].astype(np.float32)
    for name, parts in blocks.items():
        if name in state:
            raise ValueError(f"{name}: stored both whole and as row blocks in the weight parts")
        if sorted(parts) != list(range(len(parts))):
            raise ValueError(f"{name}: row blocks {sorted(parts)} of the weight parts are not 0..{len(parts) - 1}")
        state[name] = np.concatenate([parts[i] for i in range(len(parts))])
    return state


def load_torch_state_dict(model, state) -> None:
    """A PyTorch state dict into ``model`` by its network: ``load_torch_lstm`` for the LSTM baseline, else
    ``load_hf_state_dict``."""
    (load_torch_lstm if backbone_of(model).config.model_type == "lstm" else load_hf_state_dict)(model, state)


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


def embedding_arrays(config, state):
    """Checked token and position arrays from a (prefix-stripped) HF state dict."""
    tokens = to_numpy(state["tokens_embed.weight"])
    d = config.n_embd
    if tokens.ndim != 2 or tokens.shape[1] != d or tokens.shape[0] not in (config.vocab_size, config.total_vocab):
        raise ValueError(
            f"tokens_embed.weight has shape {list(tokens.shape)}; expected [{config.vocab_size}, {d}] "
            f"(vocab_size) or [{config.total_vocab}, {d}] (with the {config.n_special} special tokens)"
        )
    if "lm_head.weight" in state:
        head = to_numpy(state["lm_head.weight"])
        if head.shape != tokens.shape or not np.array_equal(head, tokens):
            raise ValueError("lm_head.weight differs from tokens_embed.weight; this model ties them (Eq. 2)")
    positions = to_numpy(state["positions_embed.weight"])
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
    backbone = backbone_of(model)
    config = backbone.config
    state = _strip_prefix(state_dict)
    slots = all_block_slots(model)
    _check_keys(state, ["tokens_embed.weight", "positions_embed.weight"] + [key for key, _, _ in slots])
    tokens, positions = embedding_arrays(config, state)
    assignments = [(backbone.embed.tokens_embed, with_rows(backbone.embed.tokens_embed, tokens)),
                   (backbone.embed.positions_embed, positions)]
    for key, _, variable in slots:
        array = to_numpy(state[key])
        if tuple(array.shape) != tuple(variable.shape):
            raise ValueError(f"{key} has shape {list(array.shape)}; expected {list(variable.shape)}")
        assignments.append((variable, array))
    assign_all(assignments)


def to_hf_state_dict(model, prefix: str = HF_PREFIX, lm_head: bool = True, include_special: bool = False) -> dict:
    """Exports ``model`` as a ``transformers`` ``OpenAIGPTLMHeadModel`` state dict of float32 numpy arrays.

    Args:
        prefix: key prefix (``"transformer."`` for the LM-head model, ``""`` for ``OpenAIGPTModel``).
        lm_head: also write the tied ``lm_head.weight``.
        include_special: keep the special-token rows (then the HF ``vocab_size`` must be ``total_vocab``).
    """
    backbone = backbone_of(model)
    config = backbone.config
    tokens = to_numpy(backbone.embed.tokens_embed)
    if not include_special:
        tokens = tokens[: config.vocab_size]
    state = {f"{prefix}tokens_embed.weight": tokens,
             f"{prefix}positions_embed.weight": to_numpy(backbone.embed.positions_embed)}
    for key, _, variable in all_block_slots(model):
        state[prefix + key] = to_numpy(variable)
    if lm_head:
        state["lm_head.weight"] = tokens
    return state


def load_torch_lstm(model, state: dict) -> None:
    """``tools.torch_pretrain.lstm_model``'s state dict into a gpt_tf LSTM model (``GPT1CausalLM`` or
    ``LSTMBackbone``): the embeddings as ``load_hf_state_dict`` loads them (``vocab_size`` rows: the special tokens
    keep their init); per block, Keras's LSTM ``kernel`` = ``weight_ih_l0.T`` and ``recurrent_kernel`` =
    ``weight_hh_l0.T`` (torch's gate rows (i, f, g, o) are Keras's columns [i, f, c, o], the same order), its one
    ``bias`` = ``bias_ih_l0 + bias_hh_l0``, ``c_proj`` = the ``proj`` Linear transposed. Every key and shape is
    checked before anything is assigned."""
    backbone = backbone_of(model)
    if backbone.config.model_type != "lstm":
        raise ValueError(f"load_torch_lstm needs an LSTM model, got model_type={backbone.config.model_type!r}")
    state = {k: to_numpy(v) for k, v in state.items()}
    tokens, positions = embedding_arrays(backbone.config, state)
    assignments = [(backbone.embed.tokens_embed, with_rows(backbone.embed.tokens_embed, tokens)),
                   (backbone.embed.positions_embed, positions)]
    expected = {"tokens_embed.weight", "positions_embed.weight"}
    for i, block in enumerate(backbone.blocks):
        cell, key = block.lstm.cell, f"h.{i}."
        names = [key + "lstm.weight_ih_l0", key + "lstm.weight_hh_l0", key + "lstm.bias_ih_l0", key + "lstm.bias_hh_l0"]
        if block.proj is not None:
            names += [key + "proj.weight", key + "proj.bias"]
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(f"the LSTM state dict lacks {missing}")
        expected.update(names)
        pairs = [(cell.kernel, state[names[0]].T, names[0]), (cell.recurrent_kernel, state[names[1]].T, names[1]),
                 (cell.bias, state[names[2]] + state[names[3]], names[2])]
        if block.proj is not None:
            pairs += [(block.proj.w, state[names[4]].T, names[4]), (block.proj.b, state[names[5]], names[5])]
        for variable, array, name in pairs:
            if tuple(array.shape) != tuple(variable.shape):
                raise ValueError(f"{name} gives shape {list(array.shape)}; expected {list(variable.shape)} (transposed)")
            assignments.append((variable, array))
    unexpected = sorted(set(state) - expected - {"lm_head.weight"})
    if unexpected:
        raise ValueError(f"the LSTM state dict has keys this model does not: {unexpected}")
    assign_all(assignments)
