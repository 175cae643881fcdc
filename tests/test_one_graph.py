"""The family's models are written the way keras-hub writes its own: keras-hub's class first in every class's bases,
no override of what Keras runs (``call``, ``fit``, ``train_step``, ...), so the declared functional graph is what
``fit``, ``predict``, the command line's loop and the export run; and the loop's update is the model's own
``train_step``, the one ``fit`` runs."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

# What Keras and keras-hub run on a model; a family class defining one of these would run something other than
# its graph, or train by its own step.
KERAS_RUNS = ("__call__", "call", "fit", "evaluate", "predict", "train_step", "test_step", "predict_step",
              "compute_loss", "compute_metrics", "preprocess_samples", "get_compile_config", "compile_from_config",
              "save_task_weights", "load_task_weights", "save_to_preset", "from_preset")


def _family():
    import gpt_tf.gpt1 as family
    from gpt_tf.gpt1.lstm import LSTMBackbone

    return [getattr(family, name) for name in family.__all__ if name != "LSTMBackbone"] + [LSTMBackbone]


def test_every_class_has_keras_hubs_class_first_and_no_mixin():
    import keras_hub

    for cls in _family():
        first = cls.__bases__[0]
        assert len(cls.__bases__) == 1, f"{cls.__name__} mixes in {cls.__bases__[1:]}"
        assert first.__module__.startswith("keras_hub") or first.__module__.startswith("gpt_tf.gpt1"), cls
        root = next(c for c in cls.__mro__ if c.__module__.startswith("keras_hub"))
        assert issubclass(root, (keras_hub.models.Backbone, keras_hub.models.Task, keras_hub.tokenizers.Tokenizer,
                                 keras_hub.models.Preprocessor)), cls


@pytest.mark.parametrize("name", ["GPT1Backbone", "GPT1CausalLM", "GPT1TextClassifier", "GPT1TextRegressor",
                                  "GPT1MultipleChoice"])
def test_the_models_override_nothing_keras_runs(name):
    import gpt_tf.gpt1 as family

    cls = getattr(family, name)
    from gpt_tf.convert.hf import FROM_PRESET

    # from_preset may be the one dispatch that reads a transformers checkpoint and hands every other preset to
    # keras-hub's own (gpt_tf/convert/hf.py): it loads, it runs nothing.
    own = {attr for klass in cls.__mro__ if klass.__module__.startswith("gpt_tf") for attr, value in vars(klass).items()
           if not (attr == "from_preset" and value is FROM_PRESET)}
    assert not own & set(KERAS_RUNS), f"{name} overrides {sorted(own & set(KERAS_RUNS))}"


def test_the_task_classes_define_only_what_keras_hubs_tasks_do():
    """keras-hub's ``TextClassifier`` subclasses define ``__init__``, ``compile`` and ``get_config``."""
    import gpt_tf.gpt1 as family

    for cls in (family.GPT1TextClassifier, family.GPT1TextRegressor, family.GPT1MultipleChoice):
        methods = {k for k, v in vars(cls).items() if inspect.isfunction(v)}
        assert methods <= {"__init__", "compile", "get_config"}, (cls.__name__, methods)


def test_the_loops_update_is_the_models_train_step(monkeypatch):
    """``TrainLoop.make_update`` calls ``model.train_step`` once per micro-batch and nothing else of the model."""
    import tensorflow as tf

    import gpt_tf
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.text_classifier import task_for_spec
    from gpt_tf.nn.optim import make_optimizer
    from gpt_tf.tasks import get_task
    from gpt_tf.training.loop import TrainLoop

    model = task_for_spec(gpt_tf.GPT1Backbone.from_gpt_config(get_size("test")), get_task("sst2"), dropout=0.0)
    model.compile(optimizer=make_optimizer(1e-3, gradient_accumulation_steps=2, variables=model.trainable_variables),
                  metrics=[])
    calls = []
    original = model.train_step
    monkeypatch.setattr(model, "train_step", lambda batch: calls.append(batch) or original(batch))
    loop = TrainLoop(tf.distribute.get_strategy(), "/nonexistent-run", model.variables, model.optimizer,
                     grad_accum_steps=2)
    x = {"input_ids": np.full((4, 1, 6), 5, "int32"), "extract_index": np.full((4, 1), 5, "int32"),
         "lm_weights": np.concatenate([np.ones((4, 1, 5), "float32"), np.zeros((4, 1, 1), "float32")], -1)}
    batches = iter(tf.data.Dataset.from_tensors((x, np.array([0, 1, 0, 1], "int32"))).repeat())
    update = loop.make_update(model)
    before = [v.numpy().copy() for v in model.trainable_variables]
    update(batches, tf.constant(0.0))
    assert len(calls) == 2  # traced once, two micro-batches
    assert int(model.optimizer.iterations.numpy()) == 1 and int(loop.step.numpy()) == 1  # one update of 2
    assert any(np.abs(a - v.numpy()).max() > 0 for a, v in zip(before, model.trainable_variables))
