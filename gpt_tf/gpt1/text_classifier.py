"""The GPT-1 fine-tuning tasks as keras-hub tasks: classification (+ entailment, similarity),
regression (STS-B) and multiple choice (Story Cloze, RACE). Their shared graph and compile defaults:
``gpt_tf/gpt1/task.py``."""

from __future__ import annotations

import keras
import keras_hub

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor
from gpt_tf.gpt1.task import check_lm_coef, compile_args, task_graph
from gpt_tf.nn.layers import PACKAGE
from gpt_tf.nn.objectives import SquaredError
from gpt_tf.convert.hf import FROM_PRESET

# How a head combines an input type's views (gpt_tf/nn/task_head.py), and how many views it has (None: any).
VIEWS = {"single": ("first", 1), "pair": ("first", 1), "pair_symmetric": ("sum", 2), "multiple_choice": ("each", None)}


def _input_type(preprocessor, input_type, allowed):
    """The task's input type (``input_type``, else the preprocessor's, else the first ``allowed``), which the
    preprocessor is set to."""
    input_type = input_type or (preprocessor.input_type if preprocessor is not None else allowed[0])
    if input_type not in allowed:
        raise ValueError(f"input_type must be one of {allowed}, got {input_type!r}")
    if preprocessor is not None and preprocessor.input_type != input_type:
        preprocessor.input_type = input_type
    return input_type


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1TextClassifier(keras_hub.models.TextClassifier):
    """GPT-1 fine-tuned for classification (§3.3): W_y on the extract token's final state.

    Args:
        backbone: a ``GPT1Backbone``.
        num_classes: classes (>= 2).
        preprocessor: a ``GPT1TaskPreprocessor`` (``None``: feed features yourself).
        input_type: ``"single"`` (e.g. SST-2, CoLA), ``"pair"`` (entailment: premise, hypothesis) or
            ``"pair_symmetric"`` (similarity, e.g. MRPC, QQP: both orders, their states added).
        dropout: on the extract state before W_y (0.1).
        lm_coef: λ of the auxiliary LM loss (Eq. 5; 0.5).
        label_names: the classes' names (default ``"0"``, ``"1"``, ...): what a served model answers.
        activation: applied to the logits (None: logits out, keras-hub's default).

    ``compile()`` defaults to the paper's recipe (``gpt_tf/gpt1/task.py``); its keyword arguments ``learning_rate``,
    ``warmup_fraction``, ``weight_decay`` and ``clip_norm`` change it, and ``train_steps`` (the updates ``fit`` will
    run) sizes its warm-up and decay. ``from_preset`` of a fine-tuned task preset keeps its head and label names;
    with ``num_classes`` the head is new (keras-hub's rule), and one of another size needs its ``label_names`` too.
    ``serving.export.export_task_at(classifier, path)`` writes a SavedModel whose ``serving_default`` takes raw
    strings (stock TF Serving runs it).

    Example:

    ```python
    import gpt_tf.gpt1, keras_hub
    classifier = keras_hub.models.TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)
    classifier.compile(learning_rate=5e-4, warmup_fraction=0.05, train_steps=1)
    classifier.fit(["a great film", "a dull mess"], [1, 0], batch_size=2)
    classifier.predict(["what a joy"])                     # logits [1, 2]
    pairs = gpt_tf.GPT1TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=3, input_type="pair")
    pairs.predict((["a man sleeps"], ["a person rests"]))
    ```
    """

    backbone_cls = GPT1Backbone
    preprocessor_cls = GPT1TaskPreprocessor
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, backbone, num_classes, preprocessor=None, input_type=None, dropout=0.1, lm_coef=0.5,
                 label_names=None, activation=None, **kwargs):
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        input_type = _input_type(preprocessor, input_type, ("single", "pair", "pair_symmetric"))
        labels = tuple(label_names) if label_names else tuple(str(i) for i in range(num_classes))
        if len(labels) != num_classes:
            raise ValueError(f"num_classes={num_classes} but {len(labels)} label_names ({', '.join(labels)}): a task "
                             "preset's head keeps its label names, so a head of another size needs its own "
                             f"label_names=[...] ({num_classes} names; None: 0..{num_classes - 1})")
        lm_coef = check_lm_coef(lm_coef)
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.activation = keras.activations.get(activation)  # before compile(), whose loss reads it
        # === Functional model ===
        views, num_views = VIEWS[input_type]
        inputs, head = task_graph(backbone, preprocessor, num_classes, views, num_views, dropout, lm_coef)
        outputs = head[:, 0, :] if activation is None else keras.layers.Activation(
            self.activation, dtype=backbone.dtype_policy, name="activation")(head[:, 0, :])
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        # === Config ===
        self.num_classes = num_classes
        self.input_type = input_type
        self.dropout = dropout
        self.lm_coef = lm_coef
        self.label_names = labels

    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """The paper's recipe by default (see the class doc); the loss is the cross-entropy of the logits."""
        from_logits = self.activation != keras.activations.softmax  # keras-hub's rule
        keras_hub.models.Task.compile(self, **compile_args(
            optimizer, loss, metrics, kwargs,
            lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
            lambda: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]))

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes,
                "input_type": self.input_type, "dropout": self.dropout, "lm_coef": self.lm_coef,
                "label_names": list(self.label_names), "activation": keras.activations.serialize(self.activation)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1TextRegressor(keras_hub.models.Task):
    """GPT-1 fine-tuned for a score (STS-B): both orders of the pair, states added, W_y to one number;
    the squared error (+ λ·L1). ``predict`` gives scores ``[B]``.

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
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, backbone, preprocessor=None, input_type="pair_symmetric", dropout=0.1, lm_coef=0.5, **kwargs):
        input_type = _input_type(preprocessor, input_type, ("pair_symmetric", "pair", "single"))
        lm_coef = check_lm_coef(lm_coef)
        # === Layers and functional model ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        views, num_views = VIEWS[input_type]
        inputs, head = task_graph(backbone, preprocessor, 1, views, num_views, dropout, lm_coef)
        super().__init__(inputs=inputs, outputs=head[:, 0, 0], **kwargs)
        # === Config ===
        self.input_type = input_type
        self.dropout = dropout
        self.lm_coef = lm_coef

    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """The paper's recipe by default (``GPT1TextClassifier.compile``); the loss is the squared error."""
        super().compile(**compile_args(optimizer, loss, metrics, kwargs, SquaredError,
                                       lambda: [keras.metrics.MeanSquaredError(name="mse")]))

    def get_config(self):
        return {**super().get_config(), "input_type": self.input_type, "dropout": self.dropout,
                "lm_coef": self.lm_coef}


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1MultipleChoice(keras_hub.models.Task):
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
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, backbone, num_choices=2, preprocessor=None, dropout=0.1, lm_coef=0.5, **kwargs):
        if isinstance(num_choices, bool) or not isinstance(num_choices, int) or num_choices < 2:
            raise ValueError(f"num_choices must be an integer >= 2, got {num_choices!r}")
        if preprocessor is not None:
            preprocessor.input_type, preprocessor.num_choices = "multiple_choice", num_choices
        lm_coef = check_lm_coef(lm_coef)
        # === Layers and functional model ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        inputs, head = task_graph(backbone, preprocessor, 1, "each", None, dropout, lm_coef)
        super().__init__(inputs=inputs, outputs=head[:, :, 0], **kwargs)
        # === Config ===
        self.num_choices = num_choices
        self.dropout = dropout
        self.lm_coef = lm_coef

    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """The paper's recipe by default (``GPT1TextClassifier.compile``); the loss is the cross-entropy over the
        candidates."""
        super().compile(**compile_args(optimizer, loss, metrics, kwargs,
                                       lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                       lambda: [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]))

    def get_config(self):
        return {**super().get_config(), "num_choices": self.num_choices, "dropout": self.dropout,
                "lm_coef": self.lm_coef}


def task_for_spec(backbone, spec, dropout=0.1, preprocessor=None, lm_coef=0.5, **kwargs):
    """The family's task for a registry ``TaskSpec`` (``gpt_tf.tasks``; the command line's ``--task``) on
    ``backbone``: ``GPT1TextRegressor`` for a regression head, ``GPT1MultipleChoice`` for choice, else
    ``GPT1TextClassifier`` with the task's label names. Uncompiled unless ``compile=True`` is given."""
    kwargs = {"compile": False, "dropout": dropout, "lm_coef": lm_coef, **kwargs}
    if spec.head == "regression":
        return GPT1TextRegressor(backbone, preprocessor, input_type=spec.input_type, **kwargs)
    if spec.head == "choice":
        return GPT1MultipleChoice(backbone, spec.num_choices or 2, preprocessor, **kwargs)
    return GPT1TextClassifier(backbone, len(spec.label_names), preprocessor, input_type=spec.input_type,
                              label_names=spec.label_names, **kwargs)


def task_spec_of(task, name: str = ""):
    """The registry ``TaskSpec`` a family task answers as (input type, head, label names; what an export serves):
    ``task_for_spec``'s inverse. ``name``: the spec's name (default: the model's)."""
    from gpt_tf.tasks import TaskSpec  # pylint: disable=import-outside-toplevel

    name = name or task.name
    if isinstance(task, GPT1TextRegressor):
        return TaskSpec(name, task.input_type, "regression", (), ("pearson", "spearman"))
    if isinstance(task, GPT1MultipleChoice):
        return TaskSpec(name, "multiple_choice", "choice", tuple(str(i) for i in range(task.num_choices)),
                        ("accuracy",), num_choices=task.num_choices)
    return TaskSpec(name, task.input_type, "classification", task.label_names, ("accuracy",))
