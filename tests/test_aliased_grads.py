"""gpt_tf.speed.aliased_grads: the padded weight gradient of rows 4 KiB apart, when it is measured faster, and
that a graph takes it where the speed choices name its shape."""

import json

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.speed import aliased_grads, choices
from gpt_tf.speed.choices import SpeedChoices
from gpt_tf.nn.layers import Conv1D


@pytest.fixture
def tuned(fresh_choices):
    """A fresh cache folder, the process's speed choices restored after the test (conftest.fresh_choices)."""
    return fresh_choices()


@pytest.mark.parametrize("nx, units", [(256, 1024), (1024, 256), (96, 2048)])
def test_the_padded_weight_gradient_equals_the_plain_one(nx, units):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(24, nx)), tf.float32)
    dy = tf.constant(rng.normal(size=(24, units)), tf.float32)
    padded = aliased_grads.weight_grad(x, dy, pad=True)
    assert padded.shape == (nx, units)
    np.testing.assert_allclose(padded, tf.matmul(x, dy, transpose_a=True), rtol=1e-5, atol=1e-5)


def test_dense_padded_grad_has_the_values_and_gradients_of_matmul_plus_bias():
    rng = np.random.default_rng(1)
    x, w, b = (tf.constant(rng.normal(size=s), tf.float32) for s in ((16, 256), (256, 1024), (1024,)))
    upstream = tf.constant(rng.normal(size=(16, 1024)), tf.float32)
    results = []
    for fn in (aliased_grads.dense_padded_grad, lambda x, w, b: tf.nn.bias_add(tf.matmul(x, w), b)):
        with tf.GradientTape() as tape:
            tape.watch([x, w, b])
            y = fn(x, w, b)
        results.append([y, *tape.gradient(y, [x, w, b], output_gradients=upstream)])
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def _never(*args):
    raise AssertionError("measured")


def test_no_measuring_without_an_aliased_operand(tuned):
    assert not aliased_grads.decide(384, 1536, tf.float32, _never)  # rows of 1.5 and 6 KiB
    assert not aliased_grads.decide(1024, 1536, tf.bfloat16, _never)  # 2 KiB rows in bfloat16
    assert not (tuned / "gpt_tf" / aliased_grads.CACHE_FILE).exists()


def test_the_measured_decision_is_cached_per_shape(tuned):
    calls = []

    def fake(nx, units, dtype):
        calls.append((nx, units))
        # 256 x 1024: padded 40% faster; 768 x 3072: padded 3% faster, within the 5% margin
        return {"plain": 1.0, "padded": 0.6 if nx == 256 else 0.97}

    assert aliased_grads.decide(256, 1024, tf.float32, fake)
    assert not aliased_grads.decide(768, 3072, tf.float32, fake)
    cache = json.loads((tuned / "gpt_tf" / aliased_grads.CACHE_FILE).read_text())
    assert sorted(entry["pad"] for entry in cache.values()) == [False, True]
    assert aliased_grads.decide(256, 1024, tf.float32, _never)  # read from the file: measured once
    assert calls == [(256, 1024), (768, 3072)]


def test_what_is_padded_is_what_the_speed_choices_name(tuned):
    assert not aliased_grads.pads(256, 1024, tf.float32)  # the defaults pad nothing
    with choices.using(SpeedChoices(padded_grads=("256x1024 float32",))):
        assert aliased_grads.pads(256, 1024, tf.float32)
        assert not aliased_grads.pads(256, 1024, tf.bfloat16) and not aliased_grads.pads(1024, 256, tf.float32)
    with choices.using(SpeedChoices(padded_grads=(choices.EVERY,))):
        assert aliased_grads.pads(1024, 256, tf.float32) and aliased_grads.pads(768, 1024, tf.float32)
        assert not aliased_grads.pads(384, 1536, tf.float32)  # no aliased operand: nothing to pad


def test_the_measurement_times_both_ways():
    seconds = aliased_grads.measure(256, 1024, tf.float32)
    assert set(seconds) == {"plain", "padded"} and all(s > 0 for s in seconds.values())


def _training_step(layer, x):
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
        return y, tape.gradient(y, layer.trainable_variables, output_gradients=tf.ones_like(y) * 0.5)

    return step, step(x)


def test_conv1d_trains_through_the_padded_gradient_where_chosen_and_evaluates_plainly(tuned, monkeypatch):
    monkeypatch.setattr(aliased_grads, "measure", _never)  # tracing reads the choices, never times
    x = tf.random.stateless_normal((2, 8, 256), seed=(0, 1))
    layer = Conv1D(1024)
    layer.build(x.shape)
    with choices.using(SpeedChoices()):
        plain_step, (y0, grads0) = _training_step(layer, x)
    with choices.using(SpeedChoices(padded_grads=("256x1024 float32",))):
        padded_step, (y1, grads1) = _training_step(layer, x)
    def op_types(step):
        return {op.type for op in step.get_concrete_function(x).graph.get_operations()}

    assert "Pad" in op_types(padded_step) and "Pad" not in op_types(plain_step)
    np.testing.assert_allclose(y1, y0, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads1, grads0, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # Evaluation never takes it (serving and exports run plain MatMul + BiasAdd)
    inference = tf.function(lambda x: layer(x, training=False)).get_concrete_function(x).graph
    assert "IdentityN" not in {op.type for op in inference.get_operations()}


def test_the_model_shapes_are_its_dense_layers():
    from gpt_tf.config import get_size

    assert aliased_grads.dense_shapes(get_size("tiny")) == [(256, 768), (256, 256), (256, 1024), (1024, 256)]
    lstm = get_size("lstm_tiny")
    assert aliased_grads.dense_shapes(lstm) == [(lstm.d_ff, lstm.n_embd)]  # its projection back to n_embd
