"""The fine-tuning head (paper §3.2–3.3) as Keras layers: W_y on the final block's state at the extract token.

Inputs are the traversal-style token sequences built by ``gpt_tf/data/transforms.py`` (``input_ids`` ``[B, K, T]``,
``extract_index`` ``[B, K]``, ``lm_weights`` ``[B, K, T]``). All K views of a batch go through the backbone in ONE
call on the reshaped ``[B·K, T]`` batch (``Views``); ``ExtractStates`` runs the backbone's last block at each row's
extract token only (the head reads nothing else) and, in training with λ > 0, at every position instead, adding
Eq. 5's λ·L1 (the auxiliary language-model loss) as its layer loss; ``TaskHead`` maps the extract states to the
task's output:

* ``views="first"`` (single text, pairs): view 0's state → dropout → W_y.
* ``views="sum"`` (similarity): state(a $ b) + state(b $ a), element-wise (§3.3) → dropout → W_y.
* ``views="each"`` (multiple choice): every view's state → dropout → a linear map to one logit each; the loss takes
  the softmax over the K candidates. As in the original release (openai/finetune-transformer-lm, ``clf_pdrop`` with
  ``shape[1] = 1``) the dropout mask is shared by the K candidates of an example.

W_y (``clf``, a ``Conv1D``: a Keras ``Dense``) is N(0, 0.02) with zero bias; with the special-token rows of the
token embedding it is the only new parameter (§3.2). The keras-hub tasks (``gpt_tf/gpt1/task.py``) wire
``Views`` → the backbone's embedding and blocks → ``ExtractStates`` → ``TaskHead`` as their functional graph.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from gpt_tf.nn.layers import PACKAGE, Conv1D, take_at
from gpt_tf.nn.objectives import auxiliary_lm_loss

VIEWS = ("first", "sum", "each")


@keras.saving.register_keras_serializable(package=PACKAGE)
class Views(keras.layers.Layer):
    """``[B, K, ...]`` → ``[B·K, ...]``: every view of every example a row of one backbone batch."""

    def call(self, x):
        return ops.reshape(x, (-1, *ops.shape(x)[2:]))

    def compute_output_spec(self, x):
        return keras.KerasTensor((None, *x.shape[2:]), dtype=x.dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ExtractStates(keras.layers.Layer):
    """The backbone's last block at each row's extract token: ``[B·K, T, d]`` states before it → ``[B·K, 1, d]``.

    Outside training, and in training with ``lm_coef`` 0, the block runs its query, projection and MLP for the
    extract position alone (the same values as at every position, a fraction of the work). In training with
    ``lm_coef`` > 0 it runs at every position, and ``lm_coef`` times the auxiliary LM loss of Eq. 5 (L1: the tied LM
    head's cross-entropy of each next real token, ``auxiliary_lm_loss``) is this layer's loss, which Keras adds to the
    compiled task loss: L3 = L2 + λ·L1.

    ``block`` and ``embedding`` are the backbone's last block and its ``GPTEmbedding`` (the tied LM head); they
    stay the backbone's (saved and loaded with it), this layer has no weights of its own.
    """

    def __init__(self, block, embedding, lm_coef=0.5, **kwargs):
        super().__init__(**kwargs)
        if not float(lm_coef) >= 0.0:
            raise ValueError(f"lm_coef must be >= 0, got {lm_coef}")
        self.lm_coef = float(lm_coef)
        # Not tracked here: the backbone holds (and saves) them.
        object.__setattr__(self, "_wrapped", (block, embedding))

    def call(self, states, extract_index, token_ids, lm_weights, training=False):
        block, embedding = self._wrapped
        positions = ops.cast(extract_index, "int32")
        if not (training and self.lm_coef):
            return block(states, training=training, positions=positions)
        full = block(states, training=True)
        lm = auxiliary_lm_loss(embedding, full, ops.cast(token_ids, "int32"), lm_weights)
        self.add_loss(self.lm_coef * lm)
        return take_at(full, positions, axis=1)

    def compute_output_spec(self, states, extract_index, token_ids, lm_weights, training=False):
        return keras.KerasTensor((states.shape[0], 1, states.shape[-1]), dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "lm_coef": self.lm_coef}


@keras.saving.register_keras_serializable(package=PACKAGE)
class TaskHead(keras.layers.Layer):
    """The extract states of ``Views``' rows (``[B·K, 1, d]``) → ``[B, K', units]``: ``views`` says how an example's K
    views combine (``"first"``, ``"sum"``: K' = 1; ``"each"``: K' = K), then dropout (one mask per example) and W_y."""

    def __init__(self, units, views="first", dropout=0.1, init_std=0.02, **kwargs):
        super().__init__(**kwargs)
        if views not in VIEWS:
            raise ValueError(f"views must be one of {VIEWS}, got {views!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.units, self.views, self.dropout, self.init_std = int(units), views, float(dropout), float(init_std)
        # noise_shape (None, 1, None): one mask per example, shared by its K candidates.
        self.clf_dropout = keras.layers.Dropout(dropout, noise_shape=(None, 1, None), dtype=self.dtype_policy)
        self.clf = Conv1D(self.units, init_std, name="clf", dtype=self.dtype_policy)

    def build(self, states_shape, extract_index_shape=None):
        self.clf.build((None, None, states_shape[-1]))

    def call(self, states, extract_index, training=False):
        batch, views = ops.shape(extract_index)[0], ops.shape(extract_index)[1]
        extracted = ops.reshape(states, (batch, views, states.shape[-1]))
        if self.views == "sum":
            extracted = ops.sum(extracted, axis=1, keepdims=True)  # §3.3: add the two orderings' states
        elif self.views == "first":
            extracted = extracted[:, :1]
        return self.clf(self.clf_dropout(extracted, training=training))

    def compute_output_spec(self, states, extract_index, training=False):
        views = extract_index.shape[1] if self.views == "each" else 1
        return keras.KerasTensor((extract_index.shape[0], views, self.units), dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "views": self.views, "dropout": self.dropout,
                "init_std": self.init_std}


def task_predictions(task, task_out) -> np.ndarray:
    """Class / candidate ids (argmax) or regression scores, as numpy, for ``gpt_tf.metrics``; ``task`` a ``TaskSpec``."""
    values = np.asarray(ops.convert_to_numpy(ops.cast(task_out, "float32")))
    return values if task.head == "regression" else values.argmax(axis=-1)

