"""Table 5's LSTM baseline in PyTorch, for `tools.torch_pretrain.train --model=lstm_<preset>` on a GPU machine
without TensorFlow. Imports torch only (no TensorFlow, no gpt_tf, no transformers).

The same network as ``gpt_tf.gpt1.lstm.LSTMBackbone`` inside ``gpt_tf.gpt1.causal_lm.GPT1CausalLM`` (the converted Keras
model gives these logits to ~1e-5: ``tests/test_torch_lstm.py``):

* token + learned position embeddings (``tokens_embed``, ``positions_embed``), summed, embedding dropout;
* per block ``dropout(proj(LSTM(x)))``: one left-to-right LSTM layer of ``d_ff`` units, then (when ``d_ff !=
  n_embd``) a linear projection back to ``n_embd``; no residual, no layer norm;
* the LM head tied to the token table (``h @ tokens_embed.weight^T``).

The LSTM is ``torch.nn.LSTM``. Its gate rows are (i, f, g, o), Keras's kernel columns are [i, f, c, o]: the same
order (g is Keras's c, the cell candidate), with sigmoid gates and tanh for the candidate and the output, Keras's
defaults. So Keras's ``kernel`` is ``weight_ih_l0.T``, its ``recurrent_kernel`` ``weight_hh_l0.T`` and its one
``bias`` ``bias_ih_l0 + bias_hh_l0`` (``gpt_tf.convert.state_dicts.load_torch_lstm``).

Keras's LSTM has one bias, torch's two. ``bias_hh`` is kept at 0 and frozen (``requires_grad=False``): two biases
would each take Adam's normalised step, and their sum would move twice as fast as Keras's one bias.

Initialised by the Keras model's rules (``init_keras_style``): ``kernel`` Glorot-uniform over the whole
``[n_embd, 4·d_ff]`` matrix (Keras's ``glorot_uniform``: limit sqrt(6 / (fan_in + fan_out)), fan_in =
n_embd, fan_out = 4·d_ff; ``xavier_uniform_`` on the transposed ``[4·d_ff, n_embd]`` gives the same limit);
``recurrent_kernel`` orthogonal (Keras's ``Orthogonal`` on ``[d_ff, 4·d_ff]`` gives orthonormal rows, so the
transpose, torch's ``weight_hh``, has orthonormal columns, which is what ``orthogonal_`` gives a ``[4·d_ff, d_ff]``
matrix); ``bias`` 0 except the forget gate's 1 (``unit_forget_bias``); the projection and both embedding tables
N(0, init_std), the projection's bias 0 (``gpt_tf.nn.layers.Conv1D``, ``GPTEmbedding``). The same distributions, not
the same draws (the two frameworks' generators differ).
"""

from __future__ import annotations

import torch
from torch import nn


def init_keras_style(lstm: nn.LSTM) -> None:
    """Keras's LSTM initialisation (see the module doc) on a one-direction ``nn.LSTM``; freezes ``bias_hh``."""
    units = lstm.hidden_size
    with torch.no_grad():
        for layer in range(lstm.num_layers):
            nn.init.xavier_uniform_(getattr(lstm, f"weight_ih_l{layer}"))
            nn.init.orthogonal_(getattr(lstm, f"weight_hh_l{layer}"))
            bias_ih, bias_hh = getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")
            bias_ih.zero_()
            bias_ih[units:2 * units] = 1.0  # the forget gate (rows i, f, g, o)
            bias_hh.zero_()
            bias_hh.requires_grad_(False)


class LSTMBlock(nn.Module):
    """``dropout(proj(LSTM(x)))``: ``[batch, length, n_embd]`` → the same shape (``gpt_tf.gpt1.lstm.LSTMBlock``)."""

    def __init__(self, n_embd: int, units: int, dropout: float, init_std: float):
        super().__init__()
        self.lstm = nn.LSTM(n_embd, units, batch_first=True)
        init_keras_style(self.lstm)
        self.proj = nn.Linear(units, n_embd) if units != n_embd else None
        if self.proj is not None:
            nn.init.normal_(self.proj.weight, std=init_std)
            nn.init.zeros_(self.proj.bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.drop(self.proj(h) if self.proj is not None else h)


class LSTMLanguageModel(nn.Module):
    """Token ids ``[batch, length]`` (length ≤ n_ctx) → next-token logits ``[batch, length, vocab_size]``."""

    def __init__(self, vocab_size: int, n_ctx: int, n_embd: int, n_layer: int, d_ff: int, dropout: float = 0.1,
                 init_std: float = 0.02):
        super().__init__()
        self.tokens_embed = nn.Embedding(vocab_size, n_embd)
        self.positions_embed = nn.Embedding(n_ctx, n_embd)
        nn.init.normal_(self.tokens_embed.weight, std=init_std)
        nn.init.normal_(self.positions_embed.weight, std=init_std)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(LSTMBlock(n_embd, d_ff, dropout, init_std) for _ in range(n_layer))

    def forward(self, ids):
        positions = torch.arange(ids.shape[-1], device=ids.device)
        h = self.drop(self.tokens_embed(ids) + self.positions_embed(positions))
        for block in self.h:
            h = block(h)
        return nn.functional.linear(h, self.tokens_embed.weight)  # the tied head
