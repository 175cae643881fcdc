"""``GPT1Backbone``: GPT-1's decoder (token ids → the final block's states) as a ``keras_hub.models.Backbone``.

The project's one backbone: pre-training's language model (``GPT1CausalLM``), the fine-tuning head
(the keras-hub tasks, ``gpt_tf/gpt1/task.py``), layer transfer and the weight converters all take it.
A functional Keras model, as keras-hub builds its own: ``{"token_ids", "padding_mask"}`` → ``GPTEmbedding``
(token + learned position tables, the tied LM head) → ``num_layers`` post-LN ``TransformerBlock``s
(``gpt_tf/nn/layers.py``) → the final states, every projection a Keras ``Dense`` and the token table a Keras
``ReversibleEmbedding``, so ``summary()``, ``plot_model``, ``enable_lora`` and ``quantize`` act on it. Beside the
graph, ``states`` runs the same layers for every block's states (layer-transfer studies) or the last block at one
position per row only (generation without the cache). Its hyperparameters are attributes under keras-hub's names
(``vocabulary_size``, ``num_layers``, ...); ``config`` gives them as the command line's ``GPTConfig``
(``gpt_tf/config.py``; ``from_gpt_config`` builds a backbone from one); the LSTM baseline of Table 5 is a subclass
that swaps the blocks (``gpt_tf/gpt1/lstm.py``). Weights saved by the earlier subclassed layout load too
(``load_weights``).
"""

from __future__ import annotations

import keras
import keras_hub
from keras import ops

from gpt_tf.config import GPTConfig
from gpt_tf.convert.old_layout import is_old_layout, load_old_layout
from gpt_tf.nn.embedding import GPTEmbedding
from gpt_tf.nn.layers import PACKAGE, TransformerBlock
from gpt_tf.convert.hf import FROM_PRESET


def token_inputs(token_ids) -> dict:
    """keras-hub's backbone inputs ``{"token_ids", "padding_mask"}`` for token ids alone: a mask of ones (attention is
    causal and padding comes last, so the models never read it)."""
    token_ids = ops.convert_to_tensor(token_ids, "int32")
    return {"token_ids": token_ids, "padding_mask": ops.ones_like(token_ids)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1Backbone(keras_hub.models.Backbone):
    """GPT-1 (Radford et al. 2018): token ids ``[batch, length]`` → final states ``[batch, length, hidden_dim]``.

    Post-LN decoder blocks with learned positions and a token embedding tied to the LM head
    (``backbone.embed.logits(states)``). Right padding needs no mask: attention is causal.

    Args:
        vocabulary_size: rows of the token embedding: the BPE tokens, then ``num_special_tokens``
            rows (start, delimiter, extract, pad; paper §3.3). GPT-1: 40478 + 4.
        num_layers: decoder blocks (12 for GPT-1).
        num_heads: attention heads per block (12 for GPT-1).
        hidden_dim: the states' width (768 for GPT-1).
        intermediate_dim: the feed-forward layer's width (3072 for GPT-1).
        max_sequence_length: ``n_ctx``, 512 for GPT-1.
        dropout: residual dropout; ``attention_dropout`` and ``embedding_dropout`` likewise (0.1).
        layer_norm_epsilon: 1e-5.
        init_std: the weights' N(0, init_std) initialisation (0.02).
        pad_vocabulary_to: in training, the LM head's width rounded up to a multiple of this, the extra columns
            -1e9 (``GPTConfig.pad_vocab_to``: for GPU matmuls, e.g. 128); 1, the default, pads nothing. The token
            table and every output outside training keep ``vocabulary_size``.
        dtype: e.g. ``"float32"`` or ``"mixed_bfloat16"``.

    ``enable_lora(rank)`` puts low-rank adapters on the fused query/key/value projections (``c_attn``) and trains
    only them (keras-hub's ``enable_lora``); ``quantize("int8")`` quantizes every projection and the token table.

    Example:

    ```python
    import gpt_tf.gpt1, keras_hub, numpy as np
    backbone = keras_hub.models.Backbone.from_preset("gpt1_tiny_books_en")    # a GPT1Backbone
    states = backbone({"token_ids": np.array([[1, 2, 3]]), "padding_mask": np.ones((1, 3))})   # [1, 3, 256]
    small = gpt_tf.GPT1Backbone(vocabulary_size=1004, num_layers=2, num_heads=4, hidden_dim=32,
                                intermediate_dim=128, max_sequence_length=32)
    small.summary()
    ```
    """

    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)
    model_type = "gpt"  # the GPTConfig.model_type it builds (the LSTM baseline's subclass: "lstm")
    supports_cache = True  # its blocks take a key/value cache (GPT1CausalLM.call_with_cache)

    def __init__(self, vocabulary_size=40482, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072,
                 max_sequence_length=512, dropout=0.1, attention_dropout=0.1, embedding_dropout=0.1,
                 num_special_tokens=4, layer_norm_epsilon=1e-5, init_std=0.02, pad_vocabulary_to=1, dtype=None,
                 **kwargs):
        # === Layers ===
        self.embed = GPTEmbedding(vocabulary_size, max_sequence_length, hidden_dim, embedding_dropout, init_std,
                                  name="embed", dtype=dtype, pad_vocab_to=pad_vocabulary_to)
        self.blocks = [self.make_block(i, num_heads, intermediate_dim, attention_dropout, dropout, layer_norm_epsilon,
                                       init_std, dtype) for i in range(num_layers)]
        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")  # causal: right padding is free
        super().__init__(inputs={"token_ids": token_ids, "padding_mask": padding_mask},
                         outputs=self.states(token_ids), dtype=dtype, **kwargs)
        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.embedding_dropout = embedding_dropout
        self.num_special_tokens = num_special_tokens
        self.layer_norm_epsilon = layer_norm_epsilon
        self.init_std = init_std
        self.pad_vocabulary_to = pad_vocabulary_to

    @property
    def config(self) -> GPTConfig:
        """The hyperparameters as the command line's ``GPTConfig`` (the release's field names: ``n_embd``, ...)."""
        return GPTConfig.from_backbone_kwargs(self._hyperparameters(), model_type=self.model_type)

    def _hyperparameters(self) -> dict:
        return {"vocabulary_size": self.vocabulary_size, "num_layers": self.num_layers, "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim, "intermediate_dim": self.intermediate_dim,
                "max_sequence_length": self.max_sequence_length, "dropout": self.dropout,
                "attention_dropout": self.attention_dropout, "embedding_dropout": self.embedding_dropout,
                "num_special_tokens": self.num_special_tokens, "layer_norm_epsilon": self.layer_norm_epsilon,
                "init_std": self.init_std, "pad_vocabulary_to": self.pad_vocabulary_to}

    @classmethod
    def from_gpt_config(cls, config, **kwargs) -> "GPT1Backbone":
        """A backbone for a ``GPTConfig`` of its ``model_type`` (e.g. ``gpt_tf.config.get_size("tiny")``; any type:
        ``gpt_tf.gpt1.build.backbone_for``)."""
        if config.model_type != cls.model_type:
            raise ValueError(f"{cls.__name__} builds model_type={cls.model_type!r}, not {config.model_type!r} "
                             "(gpt_tf.gpt1.build.backbone_for builds either)")
        return cls(**config.backbone_kwargs(), **kwargs)

    @staticmethod
    def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
        """A ``keras.distribution.LayoutMap`` that splits the weights over the mesh's model axis (keras-hub's
        ``get_layout_map``), for ``keras.distribution.ModelParallel(layout_map=..., batch_dim_name="batch")``.

        Megatron's split of a block: the feed-forward's ``c_fc`` by columns and its ``c_proj`` by rows, the fused
        query/key/value projection ``c_attn`` by columns and the attention's ``c_proj`` by rows, so each pair needs
        one reduction. The token table (tied to the LM head) and the position table are split over the hidden
        dimension, not the vocabulary: GPT-1's 40,482 rows do not divide by 4 or 8, its 768 columns by every
        usual model axis (a JAX sharding must divide the dimension evenly). The layer norms and the biases added
        after a reduction stay whole on every device; the data's batch dimension goes over
        ``data_parallel_dim_name``, which the weights do not use.

        Example (8 devices, 2 replicas of a model split 4 ways):

        ```python
        mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
        layout_map = gpt_tf.GPT1Backbone.get_layout_map(mesh)
        keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout_map,
                                                                              batch_dim_name="batch"))
        ```
        """
        for axis in (model_parallel_dim_name, data_parallel_dim_name):
            if axis not in device_mesh.axis_names:
                raise ValueError(f"{axis!r} is not an axis of the device mesh {device_mesh.axis_names}")
        model = model_parallel_dim_name
        layout_map = keras.distribution.LayoutMap(device_mesh)
        block = r"(.*/)?h\d+/"  # the blocks' paths: h0/attn/c_attn/kernel, ... (a task model may prefix them)
        for path, axes in ((r"(.*/)?embed/tokens_embed/embeddings", (None, model)),
                           (r"(.*/)?embed/positions_embed/positions_embed", (None, model)),
                           (block + "attn/c_attn/kernel", (None, model)), (block + "attn/c_attn/bias", (model,)),
                           (block + "attn/c_proj/kernel", (model, None)),
                           (block + "mlp/c_fc/kernel", (None, model)), (block + "mlp/c_fc/bias", (model,)),
                           (block + "mlp/c_proj/kernel", (model, None))):
            layout_map[path] = axes
        return layout_map

    def make_block(self, i, num_heads, intermediate_dim, attention_dropout, dropout, layer_norm_epsilon, init_std,
                   dtype):
        """Block ``i``: a post-LN transformer block (the LSTM baseline overrides this)."""
        return TransformerBlock(num_heads, intermediate_dim, attention_dropout, dropout, layer_norm_epsilon, init_std,
                                name=f"h{i}", dtype=dtype)

    @property
    def token_embedding(self):
        """The token table, a Keras ``ReversibleEmbedding`` tied to the LM head (keras-hub's name)."""
        return self.embed.token_embedding

    def default_lora_layer_names(self):
        """LoRA's targets: the fused query/key/value projection of every block (GPT-1 computes Q, K and V in one
        matmul, ``c_attn``; keras-hub's default names ``query``/``value`` do not exist here)."""
        return ["c_attn"]

    def enable_lora(self, rank, target_layer_names=None):
        """keras-hub's ``enable_lora``: every weight frozen, low-rank adapters (``rank``) on the target projections
        (default ``c_attn``: ``default_lora_layer_names``), and only the adapters trained (the targets' biases stay
        frozen too). ``save_lora_weights`` / ``load_lora_weights`` keep them apart from the backbone's weights."""
        super().enable_lora(rank, target_layer_names=target_layer_names)
        for layer in self._flatten_layers(include_self=False):
            if getattr(layer, "lora_enabled", False) and getattr(layer, "bias", None) is not None:
                layer.bias.trainable = False

    def states(self, token_ids, training=False, return_all_states=False, positions=None):
        """The layers' wiring, once: the functional graph is this on symbolic ids. States ``[batch, length, n_embd]``
        (or every block's, a list); with ``positions`` [batch], only the final state at that position of each row,
        ``[batch, 1, n_embd]``: the last block then runs its query, projection and MLP for that position alone (a task
        head's input; the same values as the graph's, a fraction of the last block's work)."""
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

    def load_weights(self, filepath, *args, **kwargs):
        """Keras's ``load_weights``; a weights file of the earlier subclassed layout (``gpt_tf/convert/old_layout.py``)
        loads too."""
        if str(filepath).endswith(".weights.h5") and is_old_layout(filepath):
            return load_old_layout(self, filepath)
        return super().load_weights(filepath, *args, **kwargs)

    def get_config(self):
        config = {**super().get_config(), **self._hyperparameters()}
        if self.pad_vocabulary_to == 1:  # written only when set: configs without it load as before
            del config["pad_vocabulary_to"]
        return config
