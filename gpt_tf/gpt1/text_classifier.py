"""The GPT-1 fine-tuning tasks as keras-hub tasks: classification (+ entailment, similarity),
regression (STS-B) and multiple choice (Story Cloze, RACE). Shared machinery: ``gpt_tf/gpt1/task.py``."""

from __future__ import annotations

import keras
import keras_hub

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor
from gpt_tf.gpt1.task import GPT1TaskMixin
from gpt_tf.nn.layers import PACKAGE
from gpt_tf.tasks import TaskSpec


def _check_input_type(preprocessor, input_type, allowed):
    input_type = input_type or (preprocessor.input_type if preprocessor is not None else allowed[0])
    if input_type not in allowed:
        raise ValueError(f"input_type must be one of {allowed}, got {input_type!r}")
    if preprocessor is not None and preprocessor.input_type != input_type:
        preprocessor.input_type = input_type
    return input_type


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1TextClassifier(GPT1TaskMixin, keras_hub.models.TextClassifier):
    """GPT-1 fine-tuned for classification (§3.3): W_y on the extract token's final state.

    Args:
        backbone: a ``GPT1Backbone``.
        num_classes: classes (>= 2).
        preprocessor: a ``GPT1TaskPreprocessor`` (``None``: feed features yourself).
        input_type: ``"single"`` (e.g. SST-2, CoLA), ``"pair"`` (entailment: premise, hypothesis) or
            ``"pair_symmetric"`` (similarity, e.g. MRPC, QQP: both orders, their states added).
        dropout: on the extract state before W_y (0.1).
        lm_coef: λ of the auxiliary LM loss (Eq. 5; 0.5).

    ``compile()`` defaults to the paper's recipe (``gpt_tf/gpt1/task.py``); its extra keyword arguments
    ``learning_rate``, ``warmup_fraction``, ``weight_decay``, ``clip_norm`` and ``lm_coef`` change it.
    ``from_preset`` of a fine-tuned task preset keeps its head and label names; with ``num_classes`` the
    head is new (keras-hub's rule), and one of another size needs its ``label_names`` too.
    ``serving.export.export_task_at(classifier, path)`` writes a SavedModel whose ``serving_default`` takes raw
    strings (stock TF Serving runs it).

    Example:

    ```python
    import gpt_tf.gpt1, keras_hub
    classifier = keras_hub.models.TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)
    classifier.compile(learning_rate=5e-4, warmup_fraction=0.05)
    classifier.fit(["a great film", "a dull mess"], [1, 0], batch_size=2)
    classifier.predict(["what a joy"])                     # logits [1, 2]
    pairs = gpt_tf.GPT1TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=3, input_type="pair")
    pairs.predict((["a man sleeps"], ["a person rests"]))
    ```
    """

    backbone_cls = GPT1Backbone
    preprocessor_cls = GPT1TaskPreprocessor

    def __init__(self, backbone, num_classes, preprocessor=None, input_type=None, dropout=0.1, lm_coef=0.5,
                 label_names=None, activation=None, compile=True, **kwargs):  # pylint: disable=redefined-builtin
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        input_type = _check_input_type(preprocessor, input_type, ("single", "pair", "pair_symmetric"))
        labels = tuple(label_names) if label_names else tuple(str(i) for i in range(num_classes))
        if len(labels) != num_classes:
            raise ValueError(f"num_classes={num_classes} but {len(labels)} label_names ({', '.join(labels)}): a task "
                             "preset's head keeps its label names, so a head of another size needs its own "
                             f"label_names=[...] ({num_classes} names; None: 0..{num_classes - 1})")
        spec = kwargs.pop("task_spec", None) or TaskSpec("keras_classifier", input_type, "classification", labels,
                                                          ("accuracy",))
        self.num_classes, self.input_type, self.label_names = num_classes, input_type, labels
        self.activation = activation
        self._setup(backbone, preprocessor, spec, dropout, lm_coef, **kwargs)
        if compile:
            self.compile()

    def _default_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def get_config(self):
        return {**keras_hub.models.Task.get_config(self), **self._task_config(), "num_classes": self.num_classes,
                "input_type": self.input_type, "label_names": list(self.label_names)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1TextRegressor(GPT1TaskMixin, keras_hub.models.Task):
    """GPT-1 fine-tuned for a score (STS-B): both orders of the pair, states added, W_y to one number;
    mean squared error (+ λ·L1). ``predict`` gives scores ``[B]``.

    Example:

    ```python
    import gpt_tf
    sts = gpt_tf.GPT1TextRegressor.from_preset("gpt1_tiny_books_en")
    sts.fit((["a man sings"], ["a man is singing"]), [4.8], batch_size=1)
    sts.predict((["a cat"], ["a dog"]))
    ```
    """

    backbone_cls = GPT1Backbone
    preprocessor_cls = GPT1TaskPreprocessor

    def __init__(self, backbone, preprocessor=None, input_type="pair_symmetric", dropout=0.1, lm_coef=0.5,
                 compile=True, **kwargs):  # pylint: disable=redefined-builtin
        input_type = _check_input_type(preprocessor, input_type, ("pair_symmetric", "pair", "single"))
        spec = kwargs.pop("task_spec", None) or TaskSpec("keras_regressor", input_type, "regression", (), ("pearson",))
        self.input_type = input_type
        self._setup(backbone, preprocessor, spec, dropout, lm_coef, **kwargs)
        if compile:
            self.compile()

    def _default_metrics(self):
        return [keras.metrics.MeanSquaredError(name="mse")]

    def get_config(self):
        return {**keras_hub.models.Task.get_config(self), **self._task_config(), "input_type": self.input_type}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1MultipleChoice(GPT1TaskMixin, keras_hub.models.Task):
    """GPT-1 fine-tuned for multiple choice (Story Cloze: 2 endings; RACE: 4 answers): one view
    ``<s> context $ choice_k <e>`` per candidate, a logit each, softmax over the candidates.

    Inputs: ``(context [B], choices [B, num_choices])`` (RACE: the article and question joined as
    the context), labels the index of the right candidate. ``predict`` gives logits ``[B, K]``.

    Example:

    ```python
    import gpt_tf
    cloze = gpt_tf.GPT1MultipleChoice.from_preset("gpt1_tiny_books_en", num_choices=2)
    cloze.predict((["She opened the door."], [["She walked in.", "The door ate her."]]))
    ```
    """

    backbone_cls = GPT1Backbone
    preprocessor_cls = GPT1TaskPreprocessor

    def __init__(self, backbone, num_choices=2, preprocessor=None, dropout=0.1, lm_coef=0.5, compile=True,
                 **kwargs):  # pylint: disable=redefined-builtin
        if not isinstance(num_choices, int) or num_choices < 2:
            raise ValueError(f"num_choices must be an integer >= 2, got {num_choices!r}")
        if preprocessor is not None:
            preprocessor.input_type, preprocessor.num_choices = "multiple_choice", num_choices
        labels = tuple(str(i) for i in range(num_choices))
        spec = kwargs.pop("task_spec", None) or TaskSpec("keras_choice", "multiple_choice", "choice", labels,
                                                          ("accuracy",), num_choices=num_choices)
        self.num_choices = num_choices
        self._setup(backbone, preprocessor, spec, dropout, lm_coef, **kwargs)
        if compile:
            self.compile()

    def _default_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def get_config(self):
        return {**keras_hub.models.Task.get_config(self), **self._task_config(), "num_choices": self.num_choices}


def task_for_spec(backbone, spec: TaskSpec, dropout=0.1, preprocessor=None, lm_coef=0.5, **kwargs):
    """The family's task for a registry ``TaskSpec`` (``gpt_tf.tasks``; the command line's ``--task``) on
    ``backbone``: ``GPT1TextRegressor`` for a regression head, ``GPT1MultipleChoice`` for choice, else
    ``GPT1TextClassifier`` with the task's label names; ``task_spec`` is ``spec`` itself (its name, metrics and labels
    what the CLI reports). Uncompiled (the CLI's loop brings its optimizer)."""
    kwargs = {"task_spec": spec, "compile": False, "dropout": dropout, "lm_coef": lm_coef, **kwargs}
    if spec.head == "regression":
        return GPT1TextRegressor(backbone, preprocessor, input_type=spec.input_type, **kwargs)
    if spec.head == "choice":
        return GPT1MultipleChoice(backbone, spec.num_choices or 2, preprocessor, **kwargs)
    return GPT1TextClassifier(backbone, len(spec.label_names), preprocessor, input_type=spec.input_type,
                              label_names=spec.label_names, **kwargs)
