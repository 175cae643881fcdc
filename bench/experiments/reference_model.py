"""``transformers``' PyTorch ``OpenAIGPTModel`` as a fine-tuning model: the reference side of
``bench/experiments/reference_finetune.py``.

Written from the paper (§3.2-3.3), not from ``gpt_tf/task_model.py``: the final block's state at each
view's extract token, the two orders' states added for a similarity pair, one dropout mask per example
shared by its K candidates, a linear head, and Eq. 5's L3 = L2 + λ·L1 with L1 the LM cross-entropy over
the real next tokens (``lm_weights``) through the tied token table. The start is taken from a project
``GPTTaskModel`` (``from_project``: its backbone through ``gpt_tf.weights.to_hf_state_dict``, special
rows included, and its W_y), so both sides begin from the same numbers.

Imports torch and transformers: a bench / test reference only (the ``dev`` extra).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import transformers
from torch import nn
from torch.nn import functional as F


def hf_config(config) -> "transformers.OpenAIGPTConfig":
    """The ``OpenAIGPTConfig`` of a ``gpt_tf`` ``GPTConfig`` (special tokens in the vocabulary)."""
    if config.d_ff != 4 * config.n_embd or config.model_type != "gpt":
        raise ValueError(f"transformers' OpenAIGPT is a transformer with d_ff = 4 * n_embd; got {config}")
    return transformers.OpenAIGPTConfig(
        vocab_size=config.total_vocab, n_positions=config.n_ctx, n_embd=config.n_embd, n_layer=config.n_layer,
        n_head=config.n_head, afn="gelu", resid_pdrop=config.resid_pdrop, embd_pdrop=config.embd_pdrop,
        attn_pdrop=config.attn_pdrop, layer_norm_epsilon=config.layer_norm_epsilon, initializer_range=config.init_std)


class ReferenceTaskModel(nn.Module):
    """``OpenAIGPTModel`` + a linear head; ``forward`` takes the project's batch features as tensors."""

    def __init__(self, config, task, clf_pdrop: float = 0.1):
        super().__init__()
        self.transformer = transformers.OpenAIGPTModel(hf_config(config))
        self.clf = nn.Linear(config.n_embd, task.head_units)
        self.input_type, self.head, self.clf_pdrop = task.input_type, task.head, clf_pdrop

    @classmethod
    def from_project(cls, model, clf_pdrop: float = 0.1) -> "ReferenceTaskModel":
        """The same weights as a project ``GPTTaskModel`` (backbone, special-token rows and W_y)."""
        from gpt_tf.weights import to_hf_state_dict

        ref = cls(model.config, model.task, clf_pdrop)
        state = to_hf_state_dict(model.backbone, prefix="", lm_head=False, include_special=True)
        missing, unexpected = ref.transformer.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()},
                                                              strict=False)
        missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "position_ids"]
        if missing or unexpected:
            raise KeyError(f"OpenAIGPTModel state dict mismatch: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            ref.clf.weight.copy_(torch.from_numpy(np.array(model.clf.w.numpy()).T))
            ref.clf.bias.copy_(torch.from_numpy(np.array(model.clf.b.numpy())))
        return ref

    def forward(self, input_ids, extract_index):
        """``input_ids`` [B, K, T], ``extract_index`` [B, K] -> (task output, final states [B, K, T, d])."""
        batch, views, length = input_ids.shape
        h = self.transformer(input_ids=input_ids.reshape(batch * views, length)).last_hidden_state
        h = h.reshape(batch, views, length, -1)
        index = extract_index.long()[:, :, None, None].expand(batch, views, 1, h.shape[-1])
        extracted = torch.gather(h, 2, index)[:, :, 0]  # [B, K, d]
        if self.input_type == "pair_symmetric":
            x = extracted.sum(1, keepdim=True)
        elif self.input_type == "multiple_choice":
            x = extracted
        else:
            x = extracted[:, :1]
        if self.training and self.clf_pdrop:  # one mask per example, shared by its candidates
            x = x * F.dropout(torch.ones(batch, 1, x.shape[-1]), self.clf_pdrop, training=True)
        logits = self.clf(x)
        if self.head == "classification":
            return logits[:, 0, :], h
        if self.head == "regression":
            return logits[:, 0, 0], h
        return logits[..., 0], h

    def losses(self, batch: dict, label, lm_coef: float) -> dict:
        """Eq. 5 on one batch: ``task`` (mean CE / MSE), ``lm`` (mean next-token CE where ``lm_weights``
        is 1) and ``total`` = task + λ·lm."""
        out, h = self(batch["input_ids"], batch["extract_index"])
        if self.head == "regression":
            task = F.mse_loss(out, label.float())
        else:
            task = F.cross_entropy(out, label.long())
        lm = torch.zeros(())
        if lm_coef:
            real = batch["lm_weights"] > 0  # [B, K, T]: the next token t + 1 is a real one
            targets = torch.roll(batch["input_ids"].long(), -1, dims=-1)[real]
            logits = h[real] @ self.transformer.tokens_embed.weight.T
            lm = F.cross_entropy(logits, targets, reduction="sum") / max(int(real.sum()), 1)
        return {"total": task + lm_coef * lm, "task": task, "lm": lm, "out": out}


def to_torch(features: dict, label) -> tuple[dict, "torch.Tensor"]:
    """A project batch (numpy / eager tensors) as torch tensors."""
    batch = {k: torch.from_numpy(np.array(features[k])) for k in ("input_ids", "extract_index", "lm_weights")}
    return batch, torch.from_numpy(np.array(label))


def learning_rate(step: int, peak: float, warmup: int, total: int) -> float:
    """The fine-tuning schedule (``gpt_tf.optim.WarmupDecay`` 'linear'): 0 -> peak over ``warmup``
    updates, then linear to 0 at ``total``; ``step`` counts updates from 0."""
    if step < warmup:
        return peak * step / warmup
    return peak * (1.0 - min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0))


def warmup_steps(fraction: float, total: int) -> int:
    return math.ceil(fraction * total)
