"""What the GPT-1 fine-tuning tasks share: the functional graph, Eq. 5's loss, the paper's optimiser, ``fit``.

Each task is a functional Keras model, as keras-hub builds its tasks: ``{"input_ids", "extract_index",
"lm_weights"}`` → ``Views`` (the K views as rows) → its ``GPT1Backbone`` → ``TaskHead`` (W_y on the
extract-token state, the symmetric sum, multiple choice: ``gpt_tf/nn/task_head.py``). The command line's
fine-tuning trains these same classes (``task_for_spec``). ``task_outputs`` runs the graph's layers with the
choices the graph cannot make: without the LM head the last block runs at the extract tokens only (the same
values, a fraction of its work), and with it the LM logits for L1 come out beside the task's (at the real next
tokens only on TensorFlow); ``call`` (what ``predict``, ``evaluate`` and Keras's train steps run) is
``task_outputs``. The loss is the fine-tuning objective of ``gpt_tf/nn/objectives.py``, the one the CLI's loop
minimises: ``compute_loss`` is Eq. 5, L3 = L2 + λ·L1 (λ = ``lm_coef``, 0.5 by default), L1 at the real
next tokens only. On TensorFlow, ``train_step`` normalises it by the global batch's examples and LM tokens
(``global_counts``, ``finetune_update_loss``) and sums the replicas' gradients once before clipping, as
the loop does (``gpt_tf.nn.optim.all_reduce_and_apply``): on one device or under ``MirroredStrategy``
the update is the loop's. On JAX and PyTorch, Keras's own train step of that backend runs: ``call`` in training
returns the LM's logits beside the task's (λ > 0) and ``compute_loss`` takes Eq. 5 from them, per batch (on one
device, the same normalisation). ``compile()``'s defaults are the paper's (§4.1, §3.2): ``GPTAdamW`` (decay
0.01 on matrices only, clipping at norm 1, the fused kernel where it runs), a linear warm-up over
0.2% of the updates then linear decay to 0 over the updates ``fit`` will run.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops
from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

import gpt_tf.gpt1.batching as batching
from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor
from gpt_tf import backend
from gpt_tf.nn.optim import GPTAdamW, WarmupDecay, all_reduce_and_apply, make_optimizer
from gpt_tf.convert.preset_io import FindsPresets
from gpt_tf.nn.recipes import PAPER_FINETUNE
from gpt_tf.nn.objectives import finetune_loss, finetune_update_loss, global_counts
from gpt_tf.nn.task_head import TaskHead, Views
from gpt_tf.tasks import TaskSpec

# compile()'s keywords and their defaults: the paper's recipe (gpt_tf/nn/recipes.py).
COMPILE_RECIPE = ("learning_rate", "warmup_fraction", "weight_decay", "clip_norm", "lm_coef")


def _weights_file(filepath):
    """``filepath`` when it names a ``.weights.h5`` file, as keras-hub's task weights require; else its error."""
    if not str(filepath).endswith(".weights.h5"):
        raise ValueError(f"The filename must end in `.weights.h5`. Received: filepath={filepath}")
    return filepath


class GPT1TaskMixin(FindsPresets):
    """Mixed into each keras-hub task class (before it): see the module doc."""

    def _setup(self, backbone, preprocessor, spec: TaskSpec, dropout: float, lm_coef: float, **kwargs):
        """The layers, then the functional graph ``{"input_ids", "extract_index", "lm_weights"}`` → task output
        (keras-hub's ``Task.__init__`` with ``inputs`` and ``outputs``; ``kwargs`` go to it)."""
        if not 0.0 <= float(lm_coef):
            raise ValueError(f"lm_coef must be >= 0, got {lm_coef}")
        n_ctx = backbone.config.n_ctx
        if preprocessor is not None:
            if preprocessor.sequence_length is None:
                preprocessor.sequence_length = n_ctx
            if preprocessor.sequence_length > n_ctx:
                raise ValueError(f"preprocessor sequence_length={preprocessor.sequence_length} is longer than the "
                                 f"backbone's max_sequence_length={n_ctx}")
            loaded = preprocessor.tokenizer.loaded  # else: its assets come later (from_preset)
            vocab = preprocessor.tokenizer.vocabulary_size() if loaded else backbone.config.total_vocab
            if vocab != backbone.config.total_vocab:
                raise ValueError(f"the tokenizer has {vocab} ids (BPE + specials) but the backbone "
                                 f"{backbone.config.total_vocab}")
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.task_spec = spec
        self.dropout = float(dropout)
        self.lm_coef = float(lm_coef)
        self.views = Views(name="views")
        self.head = TaskHead(spec, dropout, backbone.config.init_std, dtype=backbone.dtype_policy, name="head")
        # === Functional model ===
        k = None if spec.input_type == "multiple_choice" else spec.num_views  # any number of candidates
        inputs = {"input_ids": keras.Input((k, None), dtype="int32", name="input_ids"),
                  "extract_index": keras.Input((k,), dtype="int32", name="extract_index"),
                  "lm_weights": keras.Input((k, None), dtype="float32", name="lm_weights")}
        outputs = self.head(self.backbone(self.views(inputs["input_ids"])), inputs["extract_index"])
        super(GPT1TaskMixin, self).__init__(inputs=inputs, outputs=outputs, compile=False, **kwargs)

    # ------------------------------------------------------------------ preset weights
    def _not_task_weights(self) -> list:
        """What ``task.weights.h5`` leaves out: the backbone's layers (in ``model.weights.h5``) and the optimizer,
        whose moments would double the file (the paper's optimizer is made at ``compile``, so a task loaded from a
        preset already has them); training resumes from the command line's checkpoints, not from presets."""
        optimizer = getattr(self, "optimizer", None)  # none before compile (a task built with compile=False)
        return [*self.backbone._flatten_layers(), *([optimizer] if optimizer is not None else [])]  # pylint: disable=protected-access

    def save_task_weights(self, filepath):
        """keras-hub's, without the optimizer's state (``_not_task_weights``)."""
        keras.saving.save_weights(self, filepath=_weights_file(filepath), objects_to_skip=self._not_task_weights())

    def load_task_weights(self, filepath):
        """keras-hub's; an optimizer state in the file (presets saved before it was left out) is not read."""
        keras.saving.load_weights(self, _weights_file(filepath), objects_to_skip=self._not_task_weights())

    # ------------------------------------------------------------------ outputs
    def _check_views(self, input_ids):
        """Static checks of ``input_ids``: rank 3 and the K the input type requires."""
        if len(input_ids.shape) != 3:
            raise ValueError(f"features['input_ids'] must be [batch, views, length], got shape {input_ids.shape}")
        got = input_ids.shape[1]
        if got is not None and not self.task_spec.accepts_views(got):
            raise ValueError(
                f"task {self.task_spec.name!r} ({self.task_spec.input_type}) needs {self.task_spec.num_views} view(s) "
                f"per example, got input_ids of shape {input_ids.shape}")

    def task_outputs(self, features, training=False, with_lm=False) -> dict:
        """``features`` → ``{"task": ...}`` (the graph's output), and with ``with_lm`` the LM logits for L1:
        True, at every position (``"lm"`` ``[B, K, T, V]``); ``"targets"``, only where ``features["lm_weights"] > 0``
        (a real next token: what L1 counts), as ``"lm"`` ``[N, V]`` with their targets ``"lm_targets"`` [N] and
        weights ``"lm_target_weights"`` [N]: padding and the last token then cost no LM-head work (the fine-tuning
        loop's choice; on TensorFlow: the other backends compile for static shapes, and take every position as
        with True, the same L1). In training with ``pad_vocab_to`` > 1 the LM logits are the padded head's
        (``GPTEmbedding.logits``: ``V`` rounded up, the extra columns masked; the same L1). Without the LM head the
        last block runs at the extract tokens only."""
        input_ids = ops.convert_to_tensor(features["input_ids"], "int32")
        self._check_views(input_ids)
        index = ops.convert_to_tensor(features["extract_index"], "int32")
        rows = self.views(input_ids)
        if not with_lm:
            last = self.backbone.states(rows, training=training, positions=ops.reshape(index, (-1,)))
            return {"task": self.head(last, index, training=training, at_extract=True)}
        states = self.backbone(rows, training=training)
        outputs = {"task": self.head(states, index, training=training)}
        shape = ops.shape(input_ids)
        states = ops.reshape(states, (shape[0], shape[1], shape[2], states.shape[-1]))
        pieces = backend.tf_pieces()
        if with_lm == "targets" and pieces is not None:  # a shape known at run time: TensorFlow's graphs only
            weights = ops.convert_to_tensor(features["lm_weights"], "float32")
            at_targets, outputs["lm_targets"], outputs["lm_target_weights"] = pieces.real_targets(states, input_ids,
                                                                                               weights)
            outputs["lm"] = self.backbone.embed.logits(at_targets, training=training)
        else:
            outputs["lm"] = self.backbone.embed.logits(states, training=training)
        return outputs

    def call(self, inputs, training=False, mask=None):  # pylint: disable=unused-argument
        """The task output: class logits ``[B, C]``, scores ``[B]`` or candidate logits ``[B, K]`` (``task_outputs``). In
        training with λ > 0, ``task_outputs``'s outputs dict: the task's and the LM's (what ``compute_loss`` needs; Keras's
        train step of JAX and PyTorch calls this)."""
        if training and self.lm_coef:
            return self.task_outputs(inputs, training=True, with_lm="targets")
        return self.task_outputs(inputs, training=training)["task"]

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Eq. 5 on this batch (``finetune_loss``). ``y_pred``: the task output, or ``task_outputs``'s outputs dict
        (with the LM's, in training)."""
        outputs = y_pred if isinstance(y_pred, dict) else {"task": y_pred}
        lm_coef = self.lm_coef if "lm" in outputs else 0.0
        return finetune_loss(self.task_spec, outputs, x, self._checked_labels(y), lm_coef)[0]

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Keras's, on the task output (``y_pred`` may be the outputs dict of ``call`` in training)."""
        return super().compute_metrics(x, y, y_pred["task"] if isinstance(y_pred, dict) else y_pred, sample_weight)

    def _checked_labels(self, y):
        """``y``, after in-graph checks on TensorFlow (a clear error, before the loss's own) that class labels are in
        0..num_classes-1 (``fit`` checks labels in memory on every backend: ``check_labels``)."""
        if self.task_spec.head == "regression" or y is None or not backend.on_tensorflow():
            return y
        n, labels = self.task_spec.num_labels, tf.cast(y, tf.int32)
        checks = [tf.debugging.assert_less(labels, n, message=label_error(n)),
                  tf.debugging.assert_non_negative(labels, message="a label is negative")]
        with tf.control_dependencies(checks):
            return tf.identity(y)

    def check_labels(self, y) -> None:
        """Class labels in memory: a ValueError unless each is in 0..num_classes-1."""
        if self.task_spec.head == "regression" or y is None or isinstance(y, tf.data.Dataset):
            return
        labels = np.asarray(y)
        if labels.size and (labels.min() < 0 or labels.max() >= self.task_spec.num_labels):
            raise ValueError(label_error(self.task_spec.num_labels) + f" (got labels {labels.min()}..{labels.max()})")

    def train_step(self, *args):
        """On TensorFlow, the loop's update (see the module doc); elsewhere Keras's train step of the backend."""
        if not backend.on_tensorflow():
            return super().train_step(*args)
        x, y, _ = keras.utils.unpack_x_y_sample_weight(args[0])
        ctx = tf.distribute.get_replica_context()
        counts = global_counts(x, y, self.lm_coef)
        variables = self.trainable_variables
        with tf.GradientTape() as tape:
            loss, _, outputs = finetune_update_loss(self, self.task_spec, x, self._checked_labels(y), counts,
                                                    self.lm_coef)
        grads = tape.gradient(loss, variables)
        if isinstance(self.optimizer, GPTAdamW):
            all_reduce_and_apply(grads, variables, self.optimizer)
        else:  # a Keras optimizer sums the replicas' gradients itself
            self.optimizer.apply(grads, variables)
        loss_metric = next(m for m in self.metrics if m.name == "loss")  # compile()'s loss tracker (Keras's first)
        loss_metric.update_state(ctx.all_reduce(tf.distribute.ReduceOp.SUM, loss))
        return self.compute_metrics(x, y, outputs["task"])

    # ------------------------------------------------------------------ optimiser
    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """The paper's recipe by default (``gpt_tf/nn/recipes.py``; the ``COMPILE_RECIPE`` keywords override it); the
        loss is ``compute_loss``'s."""
        self._compiled_with = {"optimizer": optimizer, "loss": loss, "metrics": metrics, **kwargs}
        optimizer = self._paper_compile(optimizer, kwargs)
        if metrics == "auto":
            metrics = self._default_metrics()
        keras.Model.compile(self, optimizer=optimizer, loss=None, metrics=metrics, **kwargs)

    def get_compile_config(self):
        """The ``compile()`` call as given (the paper's recipe keywords included), so that a saved task loads compiled
        as it was: Keras's ``load_model`` hands it to ``compile_from_config``."""
        compiled = getattr(self, "_compiled_with", None)
        return None if compiled is None else keras.saving.serialize_keras_object(compiled)

    def compile_from_config(self, config):
        self.compile(**keras.saving.deserialize_keras_object(config))

    def _paper_compile(self, optimizer, kwargs):
        """Pops the recipe's arguments from ``kwargs``; for ``optimizer="auto"`` builds the paper's."""
        recipe = {k: kwargs.pop(k, PAPER_FINETUNE[k]) for k in COMPILE_RECIPE}
        self.lm_coef = float(recipe["lm_coef"])
        if backend.on_tensorflow():  # the fused kernels, the loop's update: no XLA (JAX compiles its steps)
            kwargs.setdefault("jit_compile", False)
        self._auto_schedule = None
        if optimizer == "auto":
            schedule = WarmupDecay(recipe["learning_rate"], 0, 1, "linear")
            optimizer = make_optimizer(self.trainable_variables, schedule, recipe["weight_decay"], recipe["clip_norm"])
            self._auto_schedule = (schedule, recipe["warmup_fraction"])
            self._auto_variables = [id(v) for v in self.trainable_variables]
        return optimizer

    def _plan_schedule(self, x, batch_size, epochs, steps_per_epoch):
        """Sets the auto schedule's length to the updates this ``fit`` runs (warm-up, then decay to 0)."""
        if getattr(self, "_auto_schedule", None) is None:
            return
        steps = steps_per_epoch
        if steps is None and isinstance(x, tf.data.Dataset):
            n = int(x.cardinality())
            steps = n if n > 0 else None
        elif steps is None:
            first = x[next(iter(x))] if isinstance(x, dict) else (x[0] if isinstance(x, tuple) else x)
            steps = math.ceil(len(first) / (batch_size or 32))
        if steps is None:
            raise ValueError("fit: the dataset's length is unknown; pass steps_per_epoch (the schedule needs it)")
        schedule, fraction = self._auto_schedule
        total = int(keras.ops.convert_to_numpy(self.optimizer.iterations)) + steps * epochs
        schedule.total_steps, schedule.warmup_steps = total, math.ceil(fraction * steps * epochs)
        self.train_function = None  # retrace with the new schedule

    def preprocess_samples(self, x, y=None, sample_weight=None):
        """keras-hub's, for the batches its ``fit`` / ``evaluate`` / ``predict`` / ``*_on_batch`` form (they map it
        after ``batch``): the preprocessor pads each batch only to its length bucket (``pad_to_bucket=True``), which
        the bucket order of texts in memory (``gpt_tf/gpt1/batching.py``) makes pay."""
        if not isinstance(self.preprocessor, GPT1TaskPreprocessor):
            return super().preprocess_samples(x, y, sample_weight)
        return self.preprocessor(x, y=y, sample_weight=sample_weight, pad_to_bucket=True)

    def _pretokenize(self, x):
        from gpt_tf.gpt1.preprocessor import pretokenize  # pylint: disable=import-outside-toplevel
        if self.preprocessor is None:
            return x
        return pretokenize(x, self.preprocessor.tokenizer, self.preprocessor.input_type)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, steps_per_epoch=None, validation_data=None, **kwargs):
        """Keras's ``fit``. Texts in memory are tokenized first (offline tokenizer), then fed in the CLI's length
        buckets (``gpt_tf/gpt1/batching.py``): every epoch a fresh random plan of batches that each hold texts of
        one bucket, padded to it, so short texts do not pay for long ones' padding. With ``compile()``'s default
        optimizer the schedule spans this call."""
        if getattr(self, "_auto_schedule", None) is not None and \
                [id(v) for v in self.trainable_variables] != self._auto_variables:
            self.compile(**self._compiled_with)  # enable_lora or frozen layers since compile(): an optimizer for these
        raw = x
        if isinstance(validation_data, tuple) and not isinstance(validation_data[0], tf.data.Dataset):
            validation_data = (self._pretokenize(validation_data[0]), *validation_data[1:])
        x = self._pretokenize(x)
        self.check_labels(y)
        planned = None
        if kwargs.pop("shuffle", True) and y is not None and not isinstance(x, tf.data.Dataset):
            if self._plannable(x) and not kwargs.get("validation_split"):
                planned = self._planned(x, y, batch_size or 32, epochs, steps_per_epoch, kwargs)
            if planned is None:  # keras-hub's PipelineModel would ignore `shuffle`
                x, y, kwargs = _shuffled(x, y, kwargs)
        if planned is not None:
            x, y, kwargs, steps_per_epoch = planned
            self._plan_schedule(None, batch_size, epochs, steps_per_epoch)
        else:
            self._plan_schedule(raw, batch_size, epochs, steps_per_epoch)
        # shuffle=False: done above (Keras would only warn that it cannot shuffle the dataset keras-hub builds)
        return super().fit(x, y, batch_size=batch_size, epochs=epochs, steps_per_epoch=steps_per_epoch,
                           validation_data=validation_data, shuffle=False, **kwargs)

    def evaluate(self, x=None, y=None, **kwargs):
        """Keras's ``evaluate``; texts in memory run sorted by length bucket (the metrics do not depend on order)."""
        x = self._pretokenize(x)
        if self._plannable(x):
            order = batching.sorted_order(self._lengths(x), self.preprocessor.sequence_length)
            x, y, kwargs = _in_order(x, y, kwargs, order)
        return super().evaluate(x, y, **kwargs)

    def predict(self, x, **kwargs):
        """Keras's ``predict``; texts in memory run sorted by length bucket, the outputs come back in their order."""
        x = self._pretokenize(x)
        if not self._plannable(x):
            return super().predict(x, **kwargs)
        order = batching.sorted_order(self._lengths(x), self.preprocessor.sequence_length)
        return batching.restore(super().predict(batching.take(x, order), **kwargs), order)

    def _plannable(self, x) -> bool:
        return self.preprocessor is not None and batching.plannable(x)

    def _lengths(self, x):
        return batching.lengths(x, self.preprocessor.input_type, self.preprocessor.sequence_length)

    def _planned(self, x, y, batch_size, epochs, steps_per_epoch, kwargs):
        """``(x, y, kwargs, steps_per_epoch)`` in ``epoch_plan``'s order for the whole call, or None where the
        examples make no full batch. The seed comes from numpy's global generator (``keras.utils.set_random_seed``
        makes it repeatable)."""
        lengths = self._lengths(x)
        steps = steps_per_epoch or int(tf.size(lengths)) // batch_size
        order = batching.fit_order(lengths, self.preprocessor.sequence_length, batch_size, steps * epochs,
                                   seed=int(np.random.randint(2**31 - 1)))
        if not len(order):
            return None
        return (*_in_order(x, y, kwargs, order), steps)

    def _task_config(self) -> dict:
        return {"dropout": self.dropout, "lm_coef": self.lm_coef}


def label_error(n: int) -> str:
    return f"a label is >= num_classes={n} (labels are 0..{n - 1}); build the task with the right num_classes"


def _shuffled(x, y, kwargs):
    """``x`` (a dict of per-example tensors), ``y`` and any ``sample_weight`` in one random order
    (numpy's global generator: ``keras.utils.set_random_seed`` makes it repeatable)."""
    return _in_order(x, np.asarray(y), kwargs, np.random.permutation(len(y)))


def _in_order(x, y, kwargs, order):
    """``x``, ``y`` and any ``sample_weight`` in ``kwargs`` at the example indices ``order`` (``batching.take``)."""
    if kwargs.get("sample_weight") is not None:
        kwargs = {**kwargs, "sample_weight": batching.take(kwargs["sample_weight"], order)}
    return batching.take(x, order), batching.take(y, order), kwargs
