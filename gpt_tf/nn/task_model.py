"""Supervised fine-tuning model (paper §3.2–3.3): the pre-trained backbone plus a linear head W_y.

Inputs are the traversal-style token sequences built by ``pipelines/transforms.py``
(``features["input_ids"]`` ``[B, K, T]``, ``extract_index`` ``[B, K]``, ``lm_weights`` ``[B, K, T]``).
All K views of a batch go through the backbone in ONE call on the reshaped ``[B·K, T]`` batch;
the final block's state at each view's extract token feeds the head:

* ``single`` / ``pair`` (classification, entailment): view 0's state → dropout → W_y.
* ``pair_symmetric`` (similarity): state(a $ b) + state(b $ a), element-wise (§3.3) → dropout → W_y.
* ``multiple_choice``: every view's state → dropout → a linear map to one logit; the task output is
  ``[B, K]`` and the loss takes the softmax over the K candidates. As in the original release
  (openai/finetune-transformer-lm, ``clf_pdrop`` with ``shape[1] = 1``) the dropout mask is shared
  by the K candidates of an example, so they are compared under the same noise.

The tied LM head gives ``outputs["lm"]`` ``[B, K, T, total_vocab]`` for the auxiliary objective
L1 (Eq. 5: L3 = L2 + λ·L1; the loss is ``gpt_tf/nn/objectives.py``'s). W_y is N(0, 0.02) with zero
bias; with the special-token rows of the token embedding it is the only new parameter (§3.2).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from gpt_tf import backend
from gpt_tf.nn.layers import PACKAGE, Conv1D, take_at
from gpt_tf.tasks import as_task_spec


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPTTaskModel(keras.Model):
    """Backbone + W_y: ``features`` → ``{"task": ..., "lm": [B, K, T, total_vocab]}``.

    ``task`` output: logits ``[B, num_classes]`` (classification), scores ``[B]`` (regression) or
    candidate logits ``[B, K]`` (choice). ``call(..., with_lm=False)`` skips the LM head (it is the
    largest matmul) when the auxiliary loss is off or for evaluation; ``"lm"`` is then absent.
    """

    def __init__(self, backbone, task, clf_pdrop: float = 0.1, **kwargs):
        """``backbone``: a ``GPT1Backbone`` (or its Keras config); ``task``: a ``TaskSpec`` (or its dict)."""
        super().__init__(**kwargs)
        if isinstance(backbone, dict):
            backbone = keras.saving.deserialize_keras_object(backbone)
        if not 0.0 <= clf_pdrop < 1.0:
            raise ValueError(f"clf_pdrop must be in [0, 1), got {clf_pdrop}")
        self.backbone = backbone
        self.task = as_task_spec(task)
        self.clf_pdrop = clf_pdrop
        config, policy = backbone.config, self.dtype_policy
        # noise_shape (None, 1, None): one mask per example, shared by its K candidates.
        self.clf_dropout = keras.layers.Dropout(clf_pdrop, noise_shape=(None, 1, None), dtype=policy)
        self.clf = Conv1D(self.task.head_units, config.init_std, name="clf", dtype=policy)
        self.clf.build((None, None, config.n_embd))
        self.built = True

    @property
    def config(self):
        return self.backbone.config

    def _check_views(self, input_ids):
        """Static checks of ``input_ids``: rank 3 and the K the input type requires."""
        if len(input_ids.shape) != 3:
            raise ValueError(f"features['input_ids'] must be [batch, views, length], got shape {input_ids.shape}")
        got = input_ids.shape[1]
        if got is not None and not self.task.accepts_views(got):
            raise ValueError(
                f"task {self.task.name!r} ({self.task.input_type}) needs {self.task.num_views} view(s) per example, "
                f"got input_ids of shape {input_ids.shape}"
            )

    def extract_states(self, features, training=False, all_states=True):
        """Final-block states ``[B, K, T, d]`` (None unless ``all_states``) and the states at the
        extract tokens ``[B, K, d]``. Without ``all_states`` the last block runs only at the extract
        tokens (``GPT1Backbone.call(positions=...)``): the same values, a fraction of its work."""
        input_ids = ops.convert_to_tensor(features["input_ids"], "int32")
        self._check_views(input_ids)
        batch, views, length = ops.shape(input_ids)[0], ops.shape(input_ids)[1], ops.shape(input_ids)[2]
        flat_ids = ops.reshape(input_ids, (-1, length))  # one backbone call for all views
        index = ops.convert_to_tensor(features["extract_index"], "int32")
        if not all_states:
            flat = self.backbone(flat_ids, training=training, positions=ops.reshape(index, (-1,)))
            return None, ops.reshape(flat, (batch, views, self.config.n_embd))
        states = ops.reshape(self.backbone(flat_ids, training=training), (batch, views, length, self.config.n_embd))
        return states, ops.squeeze(take_at(states, index, axis=2), axis=2)

    def call(self, features, training=False, with_lm=True):
        """``with_lm``: True, the LM logits at every position (``"lm"`` ``[B, K, T, V]``); False, none;
        ``"targets"``, only where ``features["lm_weights"] > 0`` (a real next token: what L1 counts),
        as ``"lm"`` ``[N, V]`` with their targets ``"lm_targets"`` [N] and weights ``"lm_target_weights"``
        [N]: padding and the last token then cost no LM-head work (the fine-tuning loop's choice; on TensorFlow: the
        other backends compile for static shapes, and take every position as with True, the same L1)."""
        states, extracted = self.extract_states(features, training=training, all_states=bool(with_lm))
        input_type, head = self.task.input_type, self.task.head
        if input_type == "pair_symmetric":
            h = ops.sum(extracted, axis=1, keepdims=True)  # §3.3: add the two orderings' states
        elif input_type == "multiple_choice":
            h = extracted
        else:
            h = extracted[:, :1]
        logits = self.clf(self.clf_dropout(h, training=training))  # [B, K', units]
        if head == "classification":
            task_out = logits[:, 0, :]
        elif head == "regression":
            task_out = logits[:, 0, 0]
        else:
            task_out = logits[..., 0]
        outputs = {"task": task_out}
        pieces = backend.tf_pieces()
        if with_lm == "targets" and pieces is not None:  # a shape known at run time: TensorFlow's graphs only
            weights = ops.convert_to_tensor(features["lm_weights"], "float32")
            input_ids = ops.convert_to_tensor(features["input_ids"], "int32")
            at_targets, outputs["lm_targets"], outputs["lm_target_weights"] = pieces.real_targets(states, input_ids,
                                                                                               weights)
            outputs["lm"] = self.backbone.embed.logits(at_targets)
        elif with_lm:
            outputs["lm"] = self.backbone.embed.logits(states)
        return outputs

    def get_config(self):
        return {
            **super().get_config(),
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "task": self.task.to_dict(),
            "clf_pdrop": self.clf_pdrop,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def task_predictions(task, task_out) -> np.ndarray:
    """Class / candidate ids (argmax) or regression scores, as numpy, for ``gpt_tf.metrics``."""
    values = np.asarray(ops.convert_to_numpy(ops.cast(task_out, "float32")))
    return values if as_task_spec(task).head == "regression" else values.argmax(axis=-1)


def _backbone_of(model):
    """The backbone of a ``GPT1CausalLM`` / ``GPTTaskModel`` / keras-hub task, or the backbone itself (GPT or LSTM)."""
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
