"""The fine-tuning head (paper §3.2–3.3) as Keras layers: W_y on the final block's state at the extract token.

Inputs are the traversal-style token sequences built by ``gpt_tf/data/transforms.py`` (``input_ids`` ``[B, K, T]``,
``extract_index`` ``[B, K]``). All K views of a batch go through the backbone in ONE call on the reshaped
``[B·K, T]`` batch (``Views``); ``TaskHead`` reads the final state at each view's extract token:

* ``single`` / ``pair`` (classification, entailment): view 0's state → dropout → W_y.
* ``pair_symmetric`` (similarity): state(a $ b) + state(b $ a), element-wise (§3.3) → dropout → W_y.
* ``multiple_choice``: every view's state → dropout → a linear map to one logit; the task output is
  ``[B, K]`` and the loss takes the softmax over the K candidates. As in the original release
  (openai/finetune-transformer-lm, ``clf_pdrop`` with ``shape[1] = 1``) the dropout mask is shared
  by the K candidates of an example, so they are compared under the same noise.

W_y (``clf``, a ``Conv1D``: a Keras ``Dense``) is N(0, 0.02) with zero bias; with the special-token rows of the
token embedding it is the only new parameter (§3.2). The keras-hub tasks (``gpt_tf/gpt1/task.py``) wire
``Views`` → backbone → ``TaskHead`` as their functional graph.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from gpt_tf.nn.layers import PACKAGE, Conv1D, take_at
from gpt_tf.tasks import as_task_spec


@keras.saving.register_keras_serializable(package=PACKAGE)
class Views(keras.layers.Layer):
    """``input_ids`` ``[B, K, T]`` → ``[B·K, T]``: every view of every example a row of one backbone batch."""

    def call(self, input_ids):
        return ops.reshape(input_ids, (-1, ops.shape(input_ids)[-1]))

    def compute_output_spec(self, input_ids):
        return keras.KerasTensor((None, input_ids.shape[-1]), dtype=input_ids.dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class TaskHead(keras.layers.Layer):
    """The final states of ``Views``' rows → the task output: logits ``[B, num_classes]`` (classification), scores
    ``[B]`` (regression) or candidate logits ``[B, K]`` (choice). ``task``: a ``TaskSpec`` (or its dict)."""

    def __init__(self, task, clf_pdrop=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= clf_pdrop < 1.0:
            raise ValueError(f"clf_pdrop must be in [0, 1), got {clf_pdrop}")
        self.task = as_task_spec(task)
        self.clf_pdrop = clf_pdrop
        self.init_std = init_std
        # noise_shape (None, 1, None): one mask per example, shared by its K candidates.
        self.clf_dropout = keras.layers.Dropout(clf_pdrop, noise_shape=(None, 1, None), dtype=self.dtype_policy)
        self.clf = Conv1D(self.task.head_units, init_std, name="clf", dtype=self.dtype_policy)

    def build(self, states_shape, extract_index_shape=None):
        self.clf.build((None, None, states_shape[-1]))

    def call(self, states, extract_index, training=False, at_extract=False):
        """``states``: ``[B·K, T, d]``, every position of every view; with ``at_extract``, ``[B·K, 1, d]``, each row's
        state at its extract token already (``GPT1Backbone.states(positions=...)``)."""
        index = ops.cast(extract_index, "int32")
        batch, views, width = ops.shape(index)[0], ops.shape(index)[1], states.shape[-1]
        if at_extract:
            extracted = ops.reshape(states, (batch, views, width))
        else:
            per_view = ops.reshape(states, (batch, views, ops.shape(states)[1], width))
            extracted = ops.squeeze(take_at(per_view, index, axis=2), axis=2)
        input_type, head = self.task.input_type, self.task.head
        if input_type == "pair_symmetric":
            h = ops.sum(extracted, axis=1, keepdims=True)  # §3.3: add the two orderings' states
        elif input_type == "multiple_choice":
            h = extracted
        else:
            h = extracted[:, :1]
        logits = self.clf(self.clf_dropout(h, training=training))  # [B, K', units]
        if head == "classification":
            return logits[:, 0, :]
        if head == "regression":
            return logits[:, 0, 0]
        return logits[..., 0]

    def compute_output_spec(self, states, extract_index, training=False, at_extract=False):
        batch, views = extract_index.shape[0], extract_index.shape[1]
        shape = {"classification": (batch, self.task.head_units), "regression": (batch,)}.get(self.task.head,
                                                                                              (batch, views))
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "task": self.task.to_dict(), "clf_pdrop": self.clf_pdrop,
                "init_std": self.init_std}


def task_predictions(task, task_out) -> np.ndarray:
    """Class / candidate ids (argmax) or regression scores, as numpy, for ``gpt_tf.metrics``."""
    values = np.asarray(ops.convert_to_numpy(ops.cast(task_out, "float32")))
    return values if as_task_spec(task).head == "regression" else values.argmax(axis=-1)
