"""keras-hub's own test harness on the GPT-1 family, as keras-hub's ``gpt2/*_test.py`` run it on GPT-2.

keras-hub ships the checks its models pass (``TestCase.run_backbone_test``: serialization, eager and compiled calls,
variable lengths, mixed precision, quantization policies; ``run_task_test``: the preprocessor's structure against
the model's inputs, ``predict`` and ``fit`` on strings, datasets and split preprocessing; ``run_preset_test``,
``run_model_saving_test``, ``run_preprocessing_layer_test``, ``run_serialization_test``). Its ``TestCase`` lives in
keras-hub's source tree (it has no public name): this file is the one place it is imported. It runs here on
TensorFlow, and most of it again on JAX and PyTorch, each in a process of its own
(``test_the_harness_passes_on_the_other_backends``); ``tests/test_backends.py`` compares the backends' numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

try:  # keras-hub's harness needs grain (the dev extra's)
    from keras_hub.src.tests.test_case import TestCase
except ImportError as err:  # pragma: no cover - a dev install has it
    pytest.skip(f"keras-hub's test harness cannot be imported: {err}", allow_module_level=True)

from tests.small_runs import BOOKS_TINY, BOOKS_TINY_BPE

SHAPE = dict(vocabulary_size=8004, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
             max_sequence_length=16)


class GPT1BackboneTest(TestCase):
    def setUp(self):
        self.init_kwargs = dict(SHAPE)
        self.input_data = {"token_ids": np.ones((2, 5), "int32"), "padding_mask": np.ones((2, 5), "int32")}

    def test_backbone_basics(self):
        import gpt_tf

        self.run_backbone_test(cls=gpt_tf.GPT1Backbone, init_kwargs=self.init_kwargs, input_data=self.input_data,
                               expected_output_shape=(2, 5, 16))

    def test_saved_model(self):
        import gpt_tf

        self.run_model_saving_test(cls=gpt_tf.GPT1Backbone, init_kwargs=self.init_kwargs, input_data=self.input_data)

    def test_preset(self):
        import gpt_tf

        self.run_preset_test(cls=gpt_tf.GPT1Backbone, preset=str(BOOKS_TINY), input_data=self.input_data,
                             expected_output_shape=(2, 5, 256))


class GPT1TokenizerTest(TestCase):
    def test_tokenizer_basics(self):
        import gpt_tf

        self.run_preprocessing_layer_test(cls=gpt_tf.GPT1Tokenizer, init_kwargs={"vocabulary": str(BOOKS_TINY_BPE)},
                                          input_data=["the man walked", "into the room ."])

    def test_preset(self):
        import gpt_tf

        self.run_preset_test(cls=gpt_tf.GPT1Tokenizer, preset=str(BOOKS_TINY), input_data=["the man walked"])


class GPT1CausalLMTest(TestCase):
    def setUp(self):
        import gpt_tf

        self.preprocessor = gpt_tf.GPT1CausalLMPreprocessor(gpt_tf.GPT1Tokenizer(str(BOOKS_TINY_BPE)),
                                                            sequence_length=8)
        self.backbone = gpt_tf.GPT1Backbone(**SHAPE)
        self.init_kwargs = {"preprocessor": self.preprocessor, "backbone": self.backbone}
        self.train_data = (["the quick brown fox .", "the earth is round ."],)

    def test_causal_lm_basics(self):
        import gpt_tf

        self.run_task_test(cls=gpt_tf.GPT1CausalLM, init_kwargs=self.init_kwargs, train_data=self.train_data,
                           expected_output_shape=(2, 8, 8004))

    def test_saved_model(self):
        import gpt_tf

        x = {"token_ids": np.array([[5, 6, 7, 8]], "int32"), "padding_mask": np.ones((1, 4), "int32")}
        self.run_model_saving_test(cls=gpt_tf.GPT1CausalLM, init_kwargs={"backbone": self.backbone}, input_data=x)

    def test_serialization(self):
        import gpt_tf

        self.run_serialization_test(gpt_tf.GPT1CausalLM(**self.init_kwargs))


class GPT1TasksTest(TestCase):
    """``run_task_test`` on the three fine-tuning tasks: the preprocessor's output against the model's inputs,
    ``predict`` on texts, on a batched dataset and with preprocessing split off (``ds.map(preprocessor)``), ``fit``
    likewise, and ``fit`` refused before ``compile``."""

    def _kwargs(self, **preprocessor_kwargs):
        import gpt_tf

        tokenizer = gpt_tf.GPT1Tokenizer(str(BOOKS_TINY_BPE))
        return {"backbone": gpt_tf.GPT1Backbone(**SHAPE),
                "preprocessor": gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=16, **preprocessor_kwargs)}

    def test_classifier(self):
        import gpt_tf

        self.run_task_test(cls=gpt_tf.GPT1TextClassifier, init_kwargs={**self._kwargs(), "num_classes": 2},
                           train_data=(["the quick brown fox .", "the earth is round ."], [1, 0]),
                           expected_output_shape=(2, 2))

    def test_regressor(self):
        import gpt_tf

        pairs = (["a man sings .", "a cat sleeps ."], ["a man is singing .", "a dog runs ."])
        self.run_task_test(cls=gpt_tf.GPT1TextRegressor, init_kwargs=self._kwargs(input_type="pair_symmetric"),
                           train_data=(pairs, [4.5, 0.5]), expected_output_shape=(2,))

    def test_multiple_choice(self):
        import gpt_tf

        x = (["she opened the door .", "it rained ."], [["she walked in .", "the door ate her ."],
                                                        ["the street was wet .", "the sun ate it ."]])
        self.run_task_test(cls=gpt_tf.GPT1MultipleChoice, init_kwargs={**self._kwargs(), "num_choices": 2},
                           train_data=(x, [0, 0]), expected_output_shape=(2, 2))


# On JAX and PyTorch, in a process of each backend: the backbone's, the tokenizer's, the language model's and the
# classifier's checks. The regressor's and multiple choice's run_task_test take minutes each on JAX (XLA compiles
# every shape the harness feeds), so those two run on TensorFlow alone.
ON_OTHER_BACKENDS = "GPT1BackboneTest or GPT1TokenizerTest or test_causal_lm_basics or test_classifier"


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_harness_passes_on_the_other_backends(backend):
    import importlib.util
    import os
    import subprocess
    import sys

    from tests.small_runs import ENV, ROOT

    if importlib.util.find_spec(backend) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{backend} is not installed (the dev extra's)")
        pytest.skip(f"{backend} is not installed (the dev extra's)")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
           "-k", f"({ON_OTHER_BACKENDS}) and not other_backends"]
    env = {k: v for k, v in ENV.items() if not k.startswith("PYTEST_")}  # the child is a session of its own
    done = subprocess.run(cmd, cwd=ROOT, env={**env, "KERAS_BACKEND": backend}, capture_output=True, text=True,
                          timeout=1200)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
