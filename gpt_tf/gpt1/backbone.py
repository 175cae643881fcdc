"""``GPT1Backbone``: GPT-1's decoder (token ids → the final block's states) as a ``keras_hub.models.Backbone``.

The project's one backbone: pre-training's language model (``GPT1CausalLM``), the fine-tuning head
(``GPTTaskModel``, ``gpt_tf/nn/task_model.py``), layer transfer and the weight converters all take it.
``GPTEmbedding`` (token + learned position tables, the tied LM head) then ``num_layers`` post-LN
``TransformerBlock``s (``gpt_tf/nn/layers.py``); on request every block's states (layer-transfer studies), or
the last block at one position per row only (a task head's input). ``config`` is its ``GPTConfig``
(``gpt_tf/config.py``; ``from_gpt_config`` builds one from it); the LSTM baseline of Table 5 is a subclass
that swaps the blocks (``gpt_tf/gpt1/lstm.py``).
"""

from __future__ import annotations

import keras
import keras_hub

from gpt_tf.gpt1.keras_hub_adapter import name_tasks_in_metadata
from gpt_tf.nn.layers import PACKAGE, GPTEmbedding, TransformerBlock
from gpt_tf.convert.preset_io import FindsPresets, backbone_kwargs, config_from_kwargs


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1Backbone(FindsPresets, keras_hub.models.Backbone):
    """GPT-1 (Radford et al. 2018): token ids ``[batch, length]`` → final states ``[batch, length, hidden_dim]``.

    Post-LN decoder blocks with learned positions and a token embedding tied to the LM head
    (``backbone.embed.logits(states)``). Right padding needs no mask: attention is causal.

    Args:
        vocabulary_size: rows of the token embedding: the BPE tokens, then ``num_special_tokens``
            rows (start, delimiter, extract, pad; paper §3.3). GPT-1: 40478 + 4.
        num_layers, num_heads, hidden_dim, intermediate_dim: 12, 12, 768, 3072 for GPT-1.
        max_sequence_length: ``n_ctx``, 512 for GPT-1.
        dropout: residual dropout; ``attention_dropout`` and ``embedding_dropout`` likewise (0.1).
        layer_norm_epsilon, init_std: 1e-5 and N(0, 0.02).
        dtype: e.g. ``"float32"`` or ``"mixed_bfloat16"``.

    LoRA (``enable_lora``) is not supported: fine-tune every weight, as the paper does, or freeze layers.

    Example:

    ```python
    import gpt_tf, keras_hub, numpy as np
    backbone = keras_hub.models.Backbone.from_preset("gpt1_tiny_books_en")    # a GPT1Backbone
    states = backbone(np.array([[1, 2, 3]]))                                  # [1, 3, 256]
    small = gpt_tf.GPT1Backbone(vocabulary_size=1004, num_layers=2, num_heads=4, hidden_dim=32,
                                intermediate_dim=128, max_sequence_length=32)
    small.summary()
    ```
    """

    model_type = "gpt"  # the GPTConfig.model_type it builds (the LSTM baseline's subclass: "lstm")
    supports_cache = True  # its blocks take a key/value cache (GPT1CausalLM.call_with_cache)

    def __init__(self, vocabulary_size=40482, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072,
                 max_sequence_length=512, dropout=0.1, attention_dropout=0.1, embedding_dropout=0.1,
                 num_special_tokens=4, layer_norm_epsilon=1e-5, init_std=0.02, dtype=None, **kwargs):
        config = config_from_kwargs(dict(
            vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=num_heads, hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim, max_sequence_length=max_sequence_length, dropout=dropout,
            attention_dropout=attention_dropout, embedding_dropout=embedding_dropout,
            num_special_tokens=num_special_tokens, layer_norm_epsilon=layer_norm_epsilon, init_std=init_std),
            model_type=self.model_type)
        super().__init__(dtype=dtype, **kwargs)  # sets the dtype policy the layers below are built in
        self.config = config
        c, policy = config, self.dtype_policy
        self.embed = GPTEmbedding(c.total_vocab, c.n_ctx, c.n_embd, c.embd_pdrop, c.init_std, name="embed",
                                  dtype=policy)
        self.blocks = [self.make_block(i) for i in range(c.n_layer)]
        self.embed.build()
        for block in self.blocks:
            block.build((None, None, c.n_embd))
        self.built = True

    @classmethod
    def from_gpt_config(cls, config, **kwargs) -> "GPT1Backbone":
        """A backbone for a ``GPTConfig`` of its ``model_type`` (e.g. ``gpt_tf.config.get_size("tiny")``; any type:
        ``gpt_tf.gpt1.build.backbone_for``)."""
        if config.model_type != cls.model_type:
            raise ValueError(f"{cls.__name__} builds model_type={cls.model_type!r}, not {config.model_type!r} "
                             "(gpt_tf.gpt1.build.backbone_for builds either)")
        return cls(**backbone_kwargs(config), **kwargs)

    def make_block(self, i):
        """Block ``i``: a post-LN transformer block (the LSTM baseline overrides this)."""
        c = self.config
        return TransformerBlock(c.n_head, c.d_ff, c.attn_pdrop, c.resid_pdrop, c.layer_norm_epsilon, c.init_std,
                                name=f"h{i}", dtype=self.dtype_policy)

    @property
    def token_embedding(self):
        return self.embed

    def call(self, inputs, training=False, return_all_states=False, positions=None):
        """``inputs``: token ids, or keras-hub's ``{"token_ids", "padding_mask"}`` (the mask is not needed: attention
        is causal and padding comes last). States ``[batch, length, n_embd]`` (or every block's, a list); with
        ``positions`` [batch], only the final state at that position of each row, ``[batch, 1, n_embd]``: the last
        block then runs its query, projection and MLP for that position alone (a task head's input)."""
        token_ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        if positions is not None and return_all_states:
            raise ValueError("positions and return_all_states do not go together")
        h = self.embed(token_ids, training=training)
        states = []
        for i, block in enumerate(self.blocks):
            last = i == len(self.blocks) - 1
            h = block(h, training=training, positions=positions) if last and positions is not None else \
                block(h, training=training)
            states.append(h)
        return states if return_all_states else h

    def enable_lora(self, rank, target_layer_names=None):
        """Not supported: keras-hub's LoRA adapts ``Dense`` / ``EinsumDense`` kernels, and GPT-1's attention and MLP
        kernels are ``Conv1D`` layers (``c_attn``, ``c_proj``, ``c_fc``) without low-rank adapters. Raises."""
        raise NotImplementedError(
            f"{type(self).__name__} does not support LoRA (enable_lora(rank={rank})): its attention and MLP kernels "
            "(Conv1D c_attn, c_proj, c_fc) have no low-rank adapters. Fine-tune every weight (the paper's recipe: "
            "task.compile() then fit) or freeze layers with `layer.trainable = False`.")

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's ``save_to_preset``; ``metadata.json`` then names the family's task classes
        (``GPT1TextClassifier``, ...) that load this backbone."""
        super().save_to_preset(preset_dir, max_shard_size=max_shard_size)
        name_tasks_in_metadata(preset_dir, type(self))

    def get_config(self):
        return {**super().get_config(), **backbone_kwargs(self.config)}
