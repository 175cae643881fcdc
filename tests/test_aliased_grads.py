"""gpt_tf.speed.aliased_grads: the padded weight gradient of rows 4 KiB apart, and when it is taken."""

import json

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.speed import aliased_grads
from gpt_tf.nn.layers import Conv1D


@pytest.fixture
def tuned(fresh_choices):
    """Autotuning on, a fresh cache folder and no decision remembered (conftest.fresh_choices)."""
    return fresh_choices(aliased_grads)


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


def test_no_decision_without_an_aliased_operand_or_with_autotuning_off(tuned, monkeypatch):
    def never(*args):
        raise AssertionError("measured")

    assert not aliased_grads.pads(384, 1536, tf.float32, never)  # rows of 1.5 and 6 KiB
    assert not aliased_grads.pads(1024, 1536, tf.bfloat16, never)  # 2 KiB rows in bfloat16
    monkeypatch.setenv("GPT_TF_AUTOTUNE", "0")
    assert not aliased_grads.pads(256, 1024, tf.float32, never)
    assert not (tuned / "gpt_tf" / aliased_grads.CACHE_FILE).exists()


def test_the_measured_decision_is_cached_per_shape_and_a_setting_by_hand_wins(tuned, monkeypatch):
    calls = []

    def fake(nx, units, dtype):
        calls.append((nx, units))
        # 256 x 1024: padded 40% faster; 768 x 3072: padded 3% faster, within the 5% margin
        return {"plain": 1.0, "padded": 0.6 if nx == 256 else 0.97}

    assert aliased_grads.pads(256, 1024, tf.float32, fake)
    assert not aliased_grads.pads(768, 3072, tf.float32, fake)
    cache = json.loads((tuned / "gpt_tf" / aliased_grads.CACHE_FILE).read_text())
    assert sorted(entry["pad"] for entry in cache.values()) == [False, True]
    monkeypatch.setattr(aliased_grads, "_decided", {})  # a new process reads the file, measures nothing
    assert aliased_grads.pads(256, 1024, tf.float32, fake) and calls == [(256, 1024), (768, 3072)]
    monkeypatch.setenv(aliased_grads.ENV, "0")
    assert not aliased_grads.pads(256, 1024, tf.float32, fake)
    monkeypatch.setenv(aliased_grads.ENV, "1")
    assert aliased_grads.pads(768, 3072, tf.float32, fake) and len(calls) == 2


def test_the_measurement_times_both_ways_also_inside_a_traced_graph():
    seen = {}

    @tf.function
    def traced():
        seen.update(aliased_grads.measure(256, 1024, tf.float32))
        return tf.constant(0)

    traced()
    assert set(seen) == {"plain", "padded"} and all(s > 0 for s in seen.values())


def _training_step(layer, x):
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = layer(x, training=True)
        return y, tape.gradient(y, layer.trainable_variables, output_gradients=tf.ones_like(y) * 0.5)

    return step, step(x)


def test_conv1d_trains_through_the_padded_gradient_where_chosen_and_evaluates_plainly(tuned, monkeypatch):
    x = tf.random.stateless_normal((2, 8, 256), seed=(0, 1))
    layer = Conv1D(1024)
    layer.build(x.shape)
    monkeypatch.setenv(aliased_grads.ENV, "0")
    plain_step, (y0, grads0) = _training_step(layer, x)
    monkeypatch.setenv(aliased_grads.ENV, "1")
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


def test_the_cli_line_names_the_padded_shapes(tuned, monkeypatch):
    from gpt_tf.config import get_size

    tiny, small = get_size("tiny"), get_size("small")
    assert aliased_grads.dense_shapes(tiny) == [(256, 768), (256, 256), (256, 1024), (1024, 256)]
    monkeypatch.setattr(aliased_grads, "measure", lambda nx, units, dtype: {"plain": 1.0, "padded": 0.6})
    line = aliased_grads.status(tiny)
    assert line.startswith("padded weight gradients: 256x1024, 1024x256 (timed per machine and shape, ")
    assert "none (no weight rows" in aliased_grads.status(small)  # 384, 1152, 1536: no 4 KiB rows
    assert "none (no weight rows" in aliased_grads.status(tiny, "bfloat16")  # 2 KiB rows in bfloat16
    monkeypatch.setenv(aliased_grads.ENV, "0")
    assert aliased_grads.status(tiny) == ("padded weight gradients: none (2 aliased shapes faster plain) "
                                          "(GPT_TF_PAD_WEIGHT_GRADS=0)")
    monkeypatch.setenv("GPT_TF_AUTOTUNE", "0")
    assert aliased_grads.status(tiny) == "padded weight gradients: off (GPT_TF_AUTOTUNE=0)"
