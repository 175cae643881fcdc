"""The three training stacks timed by ``bench/train_throughput.py``, each built in its own worker process.

``build_step(spec)`` returns ``(step, info)``: ``step()`` runs one full training step (forward,
backward, global-norm clipping, AdamW update) on a fixed random batch and returns the loss as a
Python float (so the work has finished when it returns); ``info`` holds the parameter count.

* ``ours``: ``GPT1CausalLM`` + ``make_optimizer`` in a ``tf.function`` (no XLA);
* ``keras_hub``: ``TokenAndPositionEmbedding`` + n × post-LN ``TransformerDecoder`` + the tied
  reverse embedding, the same loss (``lm_loss``) and a Keras AdamW in the same ``tf.function``;
* ``torch``: ``transformers.OpenAIGPTLMHeadModel`` + ``torch.optim.AdamW`` (``fused=True`` by
  default; ``torch.autocast`` for bfloat16), cross-entropy on the float32 logits.
"""

from __future__ import annotations

LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM = 1e-4, 0.01, 1.0


def random_batch(total_vocab, batch, seq, seed=0):
    """One fixed batch of token ids ``[batch, seq + 1]`` → (inputs, next-token targets), int32 numpy."""
    import numpy as np

    ids = np.random.default_rng(seed).integers(0, total_vocab, size=(batch, seq + 1), dtype=np.int32)
    return ids[:, :-1], ids[:, 1:]


def _keras_hub_model(config):
    """The keras-hub stack of ``config``: post-LN decoders and a tied reverse embedding, built."""
    import keras
    import keras_hub

    init = keras.initializers.RandomNormal(stddev=config.init_std)

    def gelu_tanh(x):
        return keras.activations.gelu(x, approximate=True)

    class HubGPT(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.embed = keras_hub.layers.TokenAndPositionEmbedding(
                config.total_vocab, config.n_ctx, config.n_embd, tie_weights=True, embeddings_initializer=init
            )
            self.drop = keras.layers.Dropout(config.embd_pdrop)
            self.blocks = [
                keras_hub.layers.TransformerDecoder(
                    intermediate_dim=config.d_ff,
                    num_heads=config.n_head,
                    dropout=config.resid_pdrop,
                    activation=gelu_tanh,
                    layer_norm_epsilon=config.layer_norm_epsilon,
                    kernel_initializer=init,
                    normalize_first=False,
                )
                for _ in range(config.n_layer)
            ]

        def call(self, token_ids, training=False):
            h = self.drop(self.embed(token_ids), training=training)
            for block in self.blocks:
                h = block(h, training=training)
            return self.embed.token_embedding(h, reverse=True)

    model = HubGPT(name="keras_hub_gpt")
    model(keras.ops.zeros((1, 8), "int32"))
    return model


def _tf_step(spec, config):
    """Ours or the keras-hub stack: model, optimizer and one ``tf.function`` training step."""
    import keras
    import numpy as np
    import tensorflow as tf

    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.objectives import lm_loss
    from gpt_tf.optim import make_optimizer

    keras.utils.set_random_seed(0)
    mixed = spec["precision"] == "bfloat16"
    if mixed:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    if spec["stack"] == "ours":
        model = causal_lm_for(config, dtype="mixed_bfloat16" if mixed else None)
        variables = model.trainable_variables
        optimizer = make_optimizer(variables, LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM)
    else:
        model = _keras_hub_model(config)
        variables = model.trainable_variables
        optimizer = keras.optimizers.AdamW(
            learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY, epsilon=1e-8, global_clipnorm=CLIP_NORM
        )
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if len(v.shape) < 2])
        optimizer.build(variables)

    @tf.function
    def train_step(inputs, targets):
        with tf.GradientTape() as tape:
            total, count = lm_loss(model(inputs, training=True), targets)
            loss = total / count
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    inputs, targets = (tf.constant(a) for a in random_batch(config.total_vocab, spec["batch"], spec["seq"]))
    n_params = int(sum(np.prod(v.shape) for v in variables))
    # The optimizer's name scope holds its ops (clipping and update): the profile's "optimizer" kind.
    return (lambda: float(train_step(inputs, targets))), {"n_params": n_params, "optimizer_scope": optimizer.name}


def _torch_step(spec, config):
    """``transformers.OpenAIGPTLMHeadModel`` with ``torch.optim.AdamW``: one eager training step."""
    import torch
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(spec["threads"])
    if 4 * config.n_embd != config.d_ff:
        raise ValueError(f"OpenAIGPT hard-codes d_ff = 4·n_embd; preset {spec['preset']} has d_ff={config.d_ff}")
    hf_config = transformers.OpenAIGPTConfig(
        vocab_size=config.total_vocab,
        n_positions=config.n_ctx,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        afn="gelu",  # HF maps "gelu" to gelu_new, the tanh approximation
        resid_pdrop=config.resid_pdrop,
        embd_pdrop=config.embd_pdrop,
        attn_pdrop=config.attn_pdrop,
        layer_norm_epsilon=config.layer_norm_epsilon,
        initializer_range=config.init_std,
    )
    model = transformers.OpenAIGPTLMHeadModel(hf_config).train()
    params = list(model.parameters())  # the tied LM head appears once
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # "fused" (one kernel per tensor) is torch's fastest AdamW on CPU: ~5x the default loop at gpt1 size.
    kind = spec.get("torch_adamw", "fused")
    options = {"fused": {"fused": True}, "foreach": {"foreach": True}, "default": {}}[kind]
    optimizer = torch.optim.AdamW(groups, lr=LEARNING_RATE, eps=1e-8, **options)
    batch = random_batch(config.total_vocab, spec["batch"], spec["seq"])
    inputs, targets = (torch.from_numpy(a.astype("int64")) for a in batch)
    bf16 = spec["precision"] == "bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        optimizer.step()
        return float(loss.detach())

    return step, {"n_params": int(sum(p.numel() for p in params))}


def build_step(spec):
    """The training step of ``spec["stack"]`` for ``spec["preset"]`` at ``spec["precision"]``."""
    from gpt_tf.config import get_size

    config = get_size(spec["preset"])
    if spec["seq"] > config.n_ctx:
        raise ValueError(f"--seq={spec['seq']} exceeds n_ctx={config.n_ctx} of preset {spec['preset']}")
    if spec["stack"] == "torch":
        return _torch_step(spec, config)
    if spec["stack"] in ("ours", "keras_hub"):
        return _tf_step(spec, config)
    raise ValueError(f"unknown stack {spec['stack']!r}; choose ours, keras_hub or torch")
