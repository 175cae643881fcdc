"""gpt_tf.speed.inference_gelu: the GELU kernel in the project's own evaluation passes where the speed choices name its
shape (measured faster), never elsewhere."""

import json

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.speed import choices, inference_gelu, kernels
from gpt_tf.speed.choices import SpeedChoices
from gpt_tf.nn.layers import Conv1D

needs_kernels = pytest.mark.skipif(kernels.ops() is None, reason="the fused kernels do not load here: " + kernels.status())


@pytest.fixture
def tuned(fresh_choices):
    """A fresh cache folder, the process's speed choices restored after the test (conftest.fresh_choices)."""
    return fresh_choices()


def _never(*args):
    raise AssertionError("measured")


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
    monkeypatch.setattr(inference_gelu, "measure", _never)  # tracing reads the choices, never times
    layer = Conv1D(96, 0.02, activation="gelu")
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 5, 32)), tf.float32)
    stock = layer(x, training=False)
    with choices.using(SpeedChoices(inference_gelu=("32x96 float32",))):
        assert "GptGelu" not in _traced_ops(layer, x, in_passes=False)  # exports, serving, Keras predict
        assert "GptGelu" in _traced_ops(layer, x, in_passes=True)
        with inference_gelu.passes():
            fused = tf.function(lambda t: layer(t, training=False))(x)
    np.testing.assert_allclose(fused, stock, rtol=1e-5, atol=1e-6)
    for other in (SpeedChoices(), SpeedChoices(inference_gelu=("32x96 bfloat16", "64x96 float32")),
                  SpeedChoices(inference_gelu=(choices.EVERY,), fused_kernels=False)):
        with choices.using(other):
            assert "GptGelu" not in _traced_ops(layer, x, in_passes=True), other


@needs_kernels
def test_the_choice_is_measured_once_per_shape_and_onednn_setting_and_cached(tuned):
    timings = iter([{"stock": 1.0, "kernel": 0.9}, {"stock": 1.0, "kernel": 0.97}, {"stock": 1.0, "kernel": 1.2}])
    calls = []

    def measure(nx, units, dtype):
        calls.append((nx, units, tf.as_dtype(dtype).name))
        return next(timings)

    assert inference_gelu.decide(16, 64, tf.float32, True, measure) is True  # 1.11x: the kernel
    assert inference_gelu.decide(32, 64, tf.float32, True, measure) is False  # 1.03x: under the 5% it must win by
    assert inference_gelu.decide(16, 64, tf.float32, False, measure) is False  # oneDNN off: another entry
    assert calls == [(16, 64, "float32"), (32, 64, "float32"), (16, 64, "float32")]
    cache = json.loads((tuned / "gpt_tf" / inference_gelu.CACHE_FILE).read_text())
    assert sorted(v["kernel"] for v in cache.values()) == [False, False, True]
    assert inference_gelu.decide(16, 64, tf.float32, True, _never) is True  # read from the file


def test_nothing_is_measured_where_the_kernels_do_not_run(tuned):
    with choices.using(SpeedChoices(fused_kernels=False)):
        assert inference_gelu.decide(16, 64, tf.float32, True, _never) is False
    assert not (tuned / "gpt_tf" / inference_gelu.CACHE_FILE).exists()


@needs_kernels
def test_the_measurement_times_both_ways(tuned):
    seconds = inference_gelu.measure(64, 256, tf.float32)
    assert set(seconds) == {"stock", "kernel"} and all(s > 0 for s in seconds.values())


def test_the_models_gelu_layer_is_its_c_fc():
    from gpt_tf.config import get_size

    assert inference_gelu.gelu_shapes(get_size("tiny")) == [(256, 1024)]
    assert inference_gelu.gelu_shapes(get_size("lstm_test")) == []


def test_the_timed_stock_way_is_the_layers_gelu():
    from gpt_tf.nn.layers import gelu

    x = tf.constant(np.random.default_rng(2).normal(size=(6, 8)), tf.float32)
    w, b = tf.eye(8), tf.zeros((8,))
    # x @ I + 0 is x exactly (products with 0 and 1, sums of zeros), then the same GELU op: bit for bit on every CPU
    np.testing.assert_array_equal(inference_gelu.dense_gelu(x, w, b, kernel=False), gelu(x))
