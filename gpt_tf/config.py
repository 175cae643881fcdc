"""Model configuration: one dataclass and the named model sizes (``SIZES``, ``get_size``: ``--model``'s values).

``gpt1`` is the paper's model (§4.1): 12 post-LN decoder blocks, 768 dims, 12 heads,
3072-wide GELU feed-forward, 512 learned positions, 40,478 BPE tokens, dropout 0.1,
N(0, 0.02) init. The smaller sizes keep every design choice and only shrink the model,
so that they train on a 2-core CPU. (A *preset*, as in keras-hub, is a saved model: a shipped name or a
folder; ``gpt_tf/convert/preset_io.py``.)

``model_type="lstm"`` is the paper's LSTM baseline (§5, Table 5) in the same framework: the same
embeddings and tied LM head around ``n_layer`` LSTM layers of ``d_ff`` units (``gpt_tf/gpt1/lstm.py``).
The ``lstm_<size>`` sizes have one LSTM layer with the embedding width of ``<size>`` and
about as many non-embedding parameters as its transformer blocks.
"""

from __future__ import annotations

import dataclasses

# Special tokens appended after the BPE vocabulary, in this order (§3.3: start,
# delimiter and extract tokens; pad for batching fine-tuning inputs).
SPECIAL_TOKENS = ("start", "delimiter", "extract", "pad")
MODEL_TYPES = ("gpt", "lstm")


def pad_vocab_problem(pad_vocab_to) -> str:
    """What is wrong with a ``pad_vocab_to`` value ("" when nothing): a positive int, bools refused."""
    if isinstance(pad_vocab_to, bool) or not isinstance(pad_vocab_to, int) or pad_vocab_to < 1:
        return f"pad_vocab_to must be a positive int, got {pad_vocab_to!r}"
    return ""


def padded_width(total_vocab: int, pad_vocab_to: int) -> int:
    """``total_vocab`` rounded up to a multiple of ``pad_vocab_to``: the LM head's width in training."""
    return -(-total_vocab // pad_vocab_to) * pad_vocab_to


# GPTConfig's fields (the release's names, the command line's) -> GPT1Backbone's arguments (keras-hub's names).
BACKBONE_NAMES = {"n_special": "num_special_tokens", "n_ctx": "max_sequence_length", "n_embd": "hidden_dim",
                  "n_layer": "num_layers", "n_head": "num_heads", "d_ff": "intermediate_dim",
                  "embd_pdrop": "embedding_dropout", "attn_pdrop": "attention_dropout", "resid_pdrop": "dropout",
                  "layer_norm_epsilon": "layer_norm_epsilon", "init_std": "init_std", "pad_vocab_to": "pad_vocabulary_to"}


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of the GPT decoder. Field names follow the paper's code.

    ``pad_vocab_to`` (default 1: off; no size turns it on) pads the vocabulary inside the model, for GPU runs, whose
    matmuls are faster when the LM head's output width is a multiple of 128 (``small``'s 16,004 and GPT-1's 40,482 rows
    are not): in training, the tied LM head multiplies by the token table zero-padded to ``padded_vocab`` rows and
    gives logits ``[..., padded_vocab]`` whose columns from ``total_vocab`` on are -1e9, so the softmax, the
    cross-entropy and an argmax never give them probability (``gpt_tf/nn/embedding.py``). Outside training the head
    is the unpadded one, ``[..., total_vocab]``, the same values: generation, scoring, evaluation and the export read
    the real width, and a trained model's outputs do not depend on the setting. The token table keeps its
    ``[total_vocab, n_embd]`` shape (presets, weight files, conversions and tokenizers are unchanged), and
    ``n_params`` and ``flops_per_token`` count the real vocabulary.
    """

    vocab_size: int = 40478  # BPE tokens; special tokens come after these ids.
    n_special: int = len(SPECIAL_TOKENS)
    n_ctx: int = 512
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    d_ff: int = 3072  # feed-forward width; for model_type "lstm", the LSTM's units
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    init_std: float = 0.02
    model_type: str = "gpt"  # "gpt": transformer blocks; "lstm": the LSTM baseline
    # The LM head's width in training rounded up to a multiple of this (1: no padding; e.g. 128 for a GPU run).
    pad_vocab_to: int = 1

    def __post_init__(self):
        problems = []
        if self.model_type not in MODEL_TYPES:
            problems.append(f"model_type={self.model_type!r} is not one of {MODEL_TYPES}")
        if self.n_embd % self.n_head:
            problems.append(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        for name in ("vocab_size", "n_ctx", "n_embd", "n_layer", "n_head", "d_ff"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if pad_vocab_problem(self.pad_vocab_to):
            problems.append(pad_vocab_problem(self.pad_vocab_to))
        if self.n_special < 0:
            problems.append(f"n_special must be >= 0, got {self.n_special}")
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                problems.append(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if problems:
            raise ValueError("Invalid GPTConfig: " + "; ".join(problems))

    @property
    def total_vocab(self) -> int:
        """Rows of the token embedding: BPE tokens plus special tokens."""
        return self.vocab_size + self.n_special

    @property
    def padded_vocab(self) -> int:
        """The LM head's width in training: ``total_vocab`` rounded up to a multiple of ``pad_vocab_to``."""
        return padded_width(self.total_vocab, self.pad_vocab_to)

    def special_id(self, name: str) -> int:
        """Id of a special token (``start``, ``delimiter``, ``extract`` or ``pad``)."""
        if name not in SPECIAL_TOKENS[: self.n_special]:
            raise KeyError(f"unknown special token {name!r}; have {SPECIAL_TOKENS[: self.n_special]}")
        return self.vocab_size + SPECIAL_TOKENS.index(name)

    @property
    def n_params(self) -> int:
        """Number of parameters (the tied LM head counted once)."""
        d, f = self.n_embd, self.d_ff
        if self.model_type == "lstm":  # kernels, recurrent kernels, biases; projection back to d when f != d
            block = 4 * f * (d + f) + 4 * f + (f * d + d if f != d else 0)
        else:
            block = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d  # attn, mlp, two layer norms
        return self.total_vocab * d + self.n_ctx * d + self.n_layer * block

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token: 6N + 12·L·d·T (PaLM appendix B convention).

        N counts the non-embedding weights plus the LM-head matmul (tied embedding);
        the position table is a lookup and is left out. An LSTM has no attention term.
        """
        t = seq_len or self.n_ctx
        n = self.n_params - self.n_ctx * self.n_embd
        attention = 12 * self.n_layer * self.n_embd * t if self.model_type == "gpt" else 0
        return 6 * n + attention

    def backbone_kwargs(self) -> dict:
        """``GPT1Backbone``'s arguments (keras-hub's names) for this config: ``vocabulary_size`` counts the special
        rows; ``pad_vocabulary_to`` only when set (a config without it, as every config before it, reads as 1). The
        model type is the class's (``GPT1Backbone`` or the LSTM baseline's subclass)."""
        kwargs = {"vocabulary_size": self.total_vocab, **{new: getattr(self, old) for old, new in BACKBONE_NAMES.items()}}
        if self.pad_vocab_to == 1:
            del kwargs["pad_vocabulary_to"]
        return kwargs

    @classmethod
    def from_backbone_kwargs(cls, kwargs: dict, model_type: str = "gpt") -> "GPTConfig":
        """The config of ``GPT1Backbone`` arguments (``backbone_kwargs``'s inverse; missing ones at their default)."""
        fields = {old: kwargs[new] for old, new in BACKBONE_NAMES.items() if new in kwargs}
        n_special = fields.get("n_special", cls.n_special)
        return cls(vocab_size=int(kwargs["vocabulary_size"]) - n_special, model_type=model_type, **fields)

    def replace(self, **changes) -> "GPTConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SIZES: dict[str, GPTConfig] = {
    # The paper's model.
    "gpt1": GPTConfig(),
    # ~19M parameters with a 16k vocab; a real small LM for books on CPU.
    "small": GPTConfig(vocab_size=16000, n_ctx=256, n_embd=384, n_layer=6, n_head=6, d_ff=1536),
    # ~5M parameters with an 8k vocab; the embedded Shakespeare default.
    "tiny": GPTConfig(vocab_size=8000, n_ctx=128, n_embd=256, n_layer=4, n_head=4, d_ff=1024),
    # For unit tests: trains in seconds.
    "test": GPTConfig(vocab_size=1000, n_ctx=32, n_embd=32, n_layer=2, n_head=4, d_ff=128),
    # The LSTM baseline, one layer, sized to a transformer size: its width and ~its non-embedding parameters
    # (lstm_small 10.64M vs small 10.65M; lstm_tiny 3.17M vs tiny 3.16M).
    "lstm_small": GPTConfig(vocab_size=16000, n_ctx=256, n_embd=384, n_layer=1, n_head=1, d_ff=1408, model_type="lstm"),
    "lstm_tiny": GPTConfig(vocab_size=8000, n_ctx=128, n_embd=256, n_layer=1, n_head=1, d_ff=744, model_type="lstm"),
    "lstm_test": GPTConfig(vocab_size=1000, n_ctx=32, n_embd=32, n_layer=1, n_head=1, d_ff=64, model_type="lstm"),
}


def get_size(name: str, **overrides) -> GPTConfig:
    """The model size ``name``'s config, with fields replaced by ``overrides`` (e.g. a tokenizer's vocab size)."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {sorted(SIZES)}")
    return SIZES[name].replace(**overrides) if overrides else SIZES[name]
