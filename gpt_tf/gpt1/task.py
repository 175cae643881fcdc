"""What the GPT-1 fine-tuning tasks share: their functional graph and the paper's ``compile()`` defaults.

Each task is a functional Keras model, as keras-hub builds its tasks, and that graph is what runs: ``fit``,
``evaluate``, ``predict``, the command line's loop and the SavedModel export all call the model. ``task_graph``
wires it from the backbone's own layers:

    {"input_ids" [B, K, T], "extract_index" [B, K], "lm_weights" [B, K, T]}
      → Views (the K views as rows of one batch) → the backbone's embedding and blocks but the last
      → ExtractStates (the last block at the extract tokens; in training with λ > 0 at every position, λ·L1 its loss)
      → TaskHead (W_y) → the task's output

The loss is Keras's: the head's loss from ``compile()`` (L2: the cross-entropy, or the squared error) plus the
``ExtractStates`` layer's λ·L1, so ``fit``'s own ``train_step`` minimises Eq. 5, L3 = L2 + λ·L1, on every backend
(``gpt_tf/nn/task_head.py``, ``gpt_tf/nn/objectives.py``). ``compile()``'s defaults are the paper's (§4.1, §3.2):
``GPTAdamW`` (decay 0.01 on matrices only, clipping at norm 1), a linear warm-up over 0.2% of ``train_steps`` then
linear decay to 0 at ``train_steps`` (the updates the caller will run; without it the rate stays at its peak).
"""

from __future__ import annotations

import keras

from gpt_tf import backend
from gpt_tf.nn.recipes import PAPER_FINETUNE, paper_optimizer
from gpt_tf.nn.task_head import ExtractStates, TaskHead, Views

# compile()'s keywords and their defaults: the paper's recipe (gpt_tf/nn/recipes.py).
COMPILE_RECIPE = ("learning_rate", "warmup_fraction", "weight_decay", "clip_norm")


def task_graph(backbone, preprocessor, units: int, views: str, num_views, dropout: float, lm_coef: float):
    """``(inputs, head_output [B, K', units])``: the task's functional graph on ``backbone``'s layers (the module doc).
    ``num_views``: the K of ``input_ids`` (None: any number, multiple choice). ``preprocessor`` (or None) is checked
    against the backbone and given its ``sequence_length`` where it has none."""
    n_ctx = backbone.max_sequence_length
    if preprocessor is not None:
        if preprocessor.sequence_length is None:
            preprocessor.sequence_length = n_ctx
        if preprocessor.sequence_length > n_ctx:
            raise ValueError(f"preprocessor sequence_length={preprocessor.sequence_length} is longer than the "
                             f"backbone's max_sequence_length={n_ctx}")
        tokenizer = preprocessor.tokenizer
        if tokenizer.loaded and tokenizer.vocabulary_size() != backbone.vocabulary_size:  # else: assets come later
            raise ValueError(f"the tokenizer has {tokenizer.vocabulary_size()} ids (BPE + specials) but the backbone "
                             f"{backbone.vocabulary_size}")
    inputs = {"input_ids": keras.Input((num_views, None), dtype="int32", name="input_ids"),
              "extract_index": keras.Input((num_views,), dtype="int32", name="extract_index"),
              "lm_weights": keras.Input((num_views, None), dtype="float32", name="lm_weights")}
    rows = Views(name="views")
    token_ids, positions, lm_weights = (rows(inputs[k]) for k in ("input_ids", "extract_index", "lm_weights"))
    states = backbone.embed(token_ids)
    for block in backbone.blocks[:-1]:
        states = block(states)
    extract = ExtractStates(backbone.blocks[-1], backbone.embed, lm_coef, name="extract",
                            dtype=backbone.dtype_policy)(states, positions, token_ids, lm_weights)
    head = TaskHead(units, views, dropout, backbone.init_std, name="head", dtype=backbone.dtype_policy)
    return inputs, head(extract, inputs["extract_index"])


def compile_args(optimizer, loss, metrics, kwargs: dict, default_loss, default_metrics) -> dict:
    """A family task's ``compile()`` arguments: the paper's optimizer for ``"auto"`` (``COMPILE_RECIPE``'s keywords
    in ``kwargs`` change it, ``train_steps`` sizes its schedule), the head's loss and metrics for ``"auto"``, the rest
    of ``kwargs`` Keras's; on TensorFlow no XLA (the fused kernels are TensorFlow ops; JAX compiles its steps)."""
    recipe = {k: kwargs.pop(k) for k in (*COMPILE_RECIPE, "train_steps") if k in kwargs}
    if optimizer == "auto":
        given = {k: recipe.get(k, PAPER_FINETUNE[k]) for k in COMPILE_RECIPE}
        optimizer = paper_optimizer(**given, train_steps=recipe.get("train_steps"))
    elif set(recipe) - {"train_steps"}:
        raise ValueError(f"{sorted(set(recipe))} set the paper's optimizer: give them with optimizer='auto' only")
    if backend.on_tensorflow():
        kwargs.setdefault("jit_compile", False)
    return {"optimizer": optimizer, "loss": default_loss() if loss == "auto" else loss,
            "metrics": default_metrics() if metrics == "auto" else metrics, **kwargs}


def check_lm_coef(lm_coef) -> float:
    if isinstance(lm_coef, bool) or not float(lm_coef) >= 0.0:
        raise ValueError(f"lm_coef must be >= 0, got {lm_coef!r}")
    return float(lm_coef)
