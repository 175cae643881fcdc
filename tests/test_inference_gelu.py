"""gpt_tf.speed.inference_gelu: the GELU kernel in the project's own evaluation passes, never elsewhere."""

import json

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.speed import inference_gelu, kernels
from gpt_tf.nn.layers import Conv1D

needs_kernels = pytest.mark.skipif(kernels.ops() is None, reason="the fused kernels do not load here: " + kernels.status())


@pytest.fixture
def tuned(fresh_choices):
    """Autotuning on, a fresh cache folder and no decision remembered (conftest.fresh_choices)."""
    return fresh_choices(inference_gelu)


def _traced_ops(layer, x, in_passes: bool) -> set:
    def call(t):
        if in_passes:
            with inference_gelu.passes():
                return layer(t, training=False)
        return layer(t, training=False)

    graph = tf.function(call).get_concrete_function(tf.TensorSpec(x.shape, x.dtype)).graph
    return {op.type for op in graph.get_operations()}


@needs_kernels
def test_only_evaluation_passes_run_the_kernel_and_it_gives_the_stock_values(tuned, monkeypatch):
    monkeypatch.setenv(inference_gelu.ENV, "1")
    layer = Conv1D(96, 0.02, activation="gelu")
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 5, 32)), tf.float32)
    stock = layer(x, training=False)
    assert "GptGelu" not in _traced_ops(layer, x, in_passes=False)  # exports, serving, Keras predict
    assert "GptGelu" in _traced_ops(layer, x, in_passes=True)
    with inference_gelu.passes():
        fused = tf.function(lambda t: layer(t, training=False))(x)
    np.testing.assert_allclose(fused, stock, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv(inference_gelu.ENV, "0")
    assert "GptGelu" not in _traced_ops(layer, x, in_passes=True)


@needs_kernels
def test_the_choice_is_measured_once_per_shape_and_cached(tuned):
    y = tf.zeros((4, 64))
    timings = iter([{"stock": 1.0, "kernel": 0.9}, {"stock": 1.0, "kernel": 0.97}])
    calls = []

    def measure(nx, units, dtype):
        calls.append((nx, units, tf.as_dtype(dtype).name))
        return next(timings)

    with inference_gelu.passes():
        assert inference_gelu.uses_kernel(y, 16, measure) is True  # 1.11x: the kernel
        assert inference_gelu.uses_kernel(y, 16, measure) is True  # remembered: not measured again
        assert inference_gelu.uses_kernel(y, 32, measure) is False  # 1.03x: under the 5% it must win by
    assert calls == [(16, 64, "float32"), (32, 64, "float32")]
    cache = json.loads((tuned / "gpt_tf" / inference_gelu.CACHE_FILE).read_text())
    assert sorted(v["kernel"] for v in cache.values()) == [False, True]
    inference_gelu._decided.clear()  # a new process reads the file
    with inference_gelu.passes():
        assert inference_gelu.uses_kernel(y, 16, lambda *a: pytest.fail("measured again")) is True
    assert inference_gelu.uses_kernel(y, 16, lambda *a: pytest.fail("outside passes()")) is False


def test_off_when_autotuning_is(monkeypatch):
    monkeypatch.setenv("GPT_TF_AUTOTUNE", "0")
    monkeypatch.setenv(inference_gelu.ENV, "1")
    with inference_gelu.passes():
        assert inference_gelu.uses_kernel(tf.zeros((4, 64)), 16) is False


@needs_kernels
def test_the_measurement_times_both_ways(tuned):
    seconds = inference_gelu.measure(64, 256, tf.float32)
    assert set(seconds) == {"stock", "kernel"} and all(s > 0 for s in seconds.values())


def test_status_says_what_evaluation_runs(tuned, monkeypatch):
    from gpt_tf.config import get_size

    monkeypatch.setenv(inference_gelu.ENV, "0")
    line = inference_gelu.status(get_size("test"))
    assert line.startswith("GELU in evaluation: ") and "GPT_TF_INFERENCE_GELU=0" in line
    assert ("the stock ops (oneDNN" in line) if kernels.ops() is not None else ("do not run here" in line)
    assert "no GELU layer" in inference_gelu.status(get_size("lstm_test"))
    monkeypatch.setenv("GPT_TF_AUTOTUNE", "0")
    assert "GPT_TF_AUTOTUNE=0" in inference_gelu.status(get_size("test"))


def test_the_timed_stock_way_is_the_layers_gelu():
    from gpt_tf.nn.layers import gelu

    x = tf.constant(np.random.default_rng(2).normal(size=(6, 8)), tf.float32)
    w, b = tf.eye(8), tf.zeros((8,))
    # x @ I + 0 is x exactly (products with 0 and 1, sums of zeros), then the same GELU op: bit for bit on every CPU
    np.testing.assert_array_equal(inference_gelu.dense_gelu(x, w, b, kernel=False), gelu(x))
