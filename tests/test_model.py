"""The GPT language model: shapes, causality, the tied LM head, config and .keras round trips."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.config import get_size
from gpt_tf.gpt1.backbone import token_inputs
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.gpt1.causal_lm import GPT1CausalLM

CONFIG = get_size("test")


def _np(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else keras.ops.convert_to_numpy(x))


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return causal_lm_for(CONFIG)


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(0).integers(0, CONFIG.total_vocab, (2, CONFIG.n_ctx)).astype("int32")


def test_output_shapes(model, ids):
    assert _np(model(token_inputs(ids))).shape == (2, CONFIG.n_ctx, CONFIG.total_vocab)
    assert _np(model(token_inputs(ids[:, :5]))).shape == (2, 5, CONFIG.total_vocab)
    states = model.backbone.states(ids, return_all_states=True)
    assert len(states) == CONFIG.n_layer
    assert all(_np(s).shape == (2, CONFIG.n_ctx, CONFIG.n_embd) for s in states)


def test_parameter_count_matches_config_with_one_tied_table(model):
    """No separate output projection: the LM head reuses tokens_embed."""
    assert sum(int(np.prod(v.shape)) for v in model.trainable_weights) == CONFIG.n_params


def test_eval_mode_is_deterministic_and_training_mode_uses_dropout(model, ids):
    # the same eager call twice (training=False is the default): the same ops round alike, bit for bit on every CPU
    np.testing.assert_array_equal(_np(model(token_inputs(ids))), _np(model(token_inputs(ids), training=False)))
    assert not np.allclose(_np(model(token_inputs(ids), training=True)), _np(model(token_inputs(ids))))


@pytest.mark.parametrize("position", [0, 7, CONFIG.n_ctx - 1])
def test_future_tokens_never_change_earlier_logits(model, ids, position):
    changed = ids.copy()
    changed[:, position] = (changed[:, position] + 1) % CONFIG.total_vocab
    before, after = _np(model(token_inputs(ids))), _np(model(token_inputs(changed)))
    np.testing.assert_allclose(after[:, :position], before[:, :position], atol=1e-6, rtol=0)
    assert np.abs(after[:, position:] - before[:, position:]).max() > 1e-4  # the change is visible from here on


def test_logits_are_hidden_states_times_token_embedding(model, ids):
    h = _np(model.backbone(token_inputs(ids)))
    expected = h @ _np(model.backbone.embed.tokens_embed).T
    np.testing.assert_allclose(_np(model(token_inputs(ids))), expected, atol=1e-5, rtol=1e-5)


def test_lm_head_gradient_reaches_tokens_embed(model):
    """Rows of tokens never fed as input get gradient only through the tied head."""
    inputs = np.arange(10, dtype="int32")[None]
    targets = np.arange(1, 11, dtype="int32")[None]
    table = model.backbone.embed.tokens_embed
    with tf.GradientTape() as tape:
        logits = model(token_inputs(inputs))
        loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))
    grad = _np(tf.convert_to_tensor(tape.gradient(loss, table.value)))
    unused = grad[20:]
    assert np.abs(unused).max() > 0
    assert np.all(np.abs(unused).sum(axis=1) > 0)  # every output row, specials included, gets a gradient


def test_get_config_round_trip(model, ids):
    clone = GPT1CausalLM.from_config(model.get_config())
    assert clone.backbone.config == model.backbone.config == CONFIG
    # the hyperparameters are the backbone's attributes, under keras-hub's names (GPTConfig.backbone_kwargs's)
    kwargs = CONFIG.backbone_kwargs()
    assert {k: getattr(clone.backbone, k) for k in kwargs} == kwargs and kwargs["vocabulary_size"] == CONFIG.total_vocab
    assert [tuple(v.shape) for v in clone.weights] == [tuple(v.shape) for v in model.weights]
    assert [v.path for v in clone.weights] == [v.path for v in model.weights]
    assert not np.allclose(_np(clone(token_inputs(ids))), _np(model(token_inputs(ids))))  # fresh init differs …
    clone.set_weights(model.get_weights())  # exact copies, the same eager ops: bit for bit on every CPU
    np.testing.assert_array_equal(_np(clone(token_inputs(ids))), _np(model(token_inputs(ids))))  # … copied weights agree


def test_keras_file_round_trip(model, ids, tmp_path):
    path = tmp_path / "gpt.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, GPT1CausalLM)
    assert loaded.backbone.config == model.backbone.config
    # the .keras file stores the float32 weights exactly and the same eager ops run: bit for bit on every CPU
    np.testing.assert_array_equal(_np(loaded(token_inputs(ids))), _np(model(token_inputs(ids))))


def test_checkpoint_keys_do_not_depend_on_what_the_process_built_before(model):
    from gpt_tf.nn.optim import make_optimizer
    from gpt_tf.runs.checkpoints import variables_by_key

    first, second = (make_optimizer(1e-3, variables=model.trainable_variables) for _ in range(2))  # gpt_adam_w, gpt_adam_w_1
    assert second.variables[0].path != first.variables[0].path
    assert list(variables_by_key(first.variables)) == list(variables_by_key(second.variables))
    other = GPT1CausalLM.from_config(model.get_config())  # new dropout seed generators
    assert list(variables_by_key(other.variables)) == list(variables_by_key(model.variables))


def _dropout16_mask(shape, signature_shape, seed=7):
    from gpt_tf.nn.layers import Dropout16

    layer = Dropout16(0.1, seed=seed)
    run = tf.function(lambda t: layer(t, training=True), input_signature=[tf.TensorSpec(signature_shape)])
    return _np(run(tf.ones(shape))).reshape(-1)


def test_dropout16_takes_its_16_bit_path_when_the_length_is_dynamic():
    """Length-bucketed batches reach the layers with a dynamic length; the mask must still come from
    16-bit draws (not Keras's float draws): the same seed gives the same mask as with a static shape,
    an odd size the first draws of the next even one, and the drop rate and 1/(1 - rate) scale are exact."""
    static = _dropout16_mask([3, 334, 5], [3, 334, 5])
    # masks of integer draws times one constant scale: bit for bit on every CPU
    np.testing.assert_array_equal(_dropout16_mask([3, 334, 5], [None, None, 5]), static)
    np.testing.assert_array_equal(_dropout16_mask([5009], [None]), static[:5009])
    assert set(np.unique(static).tolist()) == {0.0, np.float32(1 / 0.9)}
    assert abs((static == 0).mean() - 0.1) < 0.01


def _executed_op_types(fn, *args) -> set:
    """The op types ``fn`` (a tf.function) ran, after grappler's rewrites (from a tf.profiler trace)."""
    import tempfile

    from bench._profiles import tf_compute_events

    fn(*args)  # trace and optimise first
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    fn(*args)
    tf.profiler.experimental.stop()
    return {name.rsplit(":", 1)[-1] for name, _ in tf_compute_events(logdir)}


def test_mlp_inference_runs_the_gelu_inside_the_fused_matmul_where_onednn_rewrites_are_on():
    """oneDNN fuses MatMul + BiasAdd + GELU only when they share a name scope (gpt_tf.nn.layers.Conv1D):
    evaluation and serving then run no element-wise GELU ops at all. TensorFlow turns those rewrites on
    by default on CPUs with AVX-512 and off on AVX2-only ones (``TF_ENABLE_ONEDNN_OPTS`` decides); where
    they are off, grappler's remapper still fuses the bias into the matmul but the tanh GELU runs apart."""
    from tensorflow.python.util import _pywrap_util_port

    from gpt_tf.nn.layers import MLP

    mlp = MLP(64)
    mlp.build((None, None, 32))
    run = tf.function(lambda t: mlp(t, training=False), input_signature=[tf.TensorSpec([None, None, 32])])
    ops = _executed_op_types(run, tf.random.normal([2, 5, 32]))
    if _pywrap_util_port.IsMklEnabled():
        assert "Tanh" not in ops and "Pow" not in ops, sorted(ops)
        assert any("FusedMatMul" in op for op in ops), sorted(ops)
    else:
        assert "Tanh" in ops, " ".join(sorted(ops))  # the GELU runs element-wise (the bias may still fuse)


def test_mixed_precision_embedding_casts_the_gathered_rows_not_the_table():
    """Under mixed_bfloat16 the token table stays float32: the rows are gathered, then cast (Keras's
    autocast would cast the whole [vocab, d] table on every call); the output is that cast exactly."""
    from gpt_tf.nn.embedding import GPTEmbedding

    layer = GPTEmbedding(300, 16, 8, embd_pdrop=0.1, dtype="mixed_bfloat16")
    layer.build()
    ids = tf.constant([[1, 7, 299, 3]])
    run = tf.function(lambda t: layer(t, training=False))
    graph = run.get_concrete_function(ids).graph
    cast_shapes = [op.inputs[0].shape.as_list() for op in graph.get_operations() if op.type == "Cast"]
    assert [300, 8] not in cast_shapes, cast_shapes
    out = run(ids)
    assert out.dtype == tf.bfloat16
    table, positions = _np(layer.tokens_embed), _np(layer.positions_embed)  # float32, read outside any autocast
    assert table.dtype == np.float32
    expected = tf.cast(table[[1, 7, 299, 3]] + positions[:4], tf.bfloat16)
    # one float32 addition and one rounding to bfloat16 per element, the same on both sides: bit for bit on every CPU
    np.testing.assert_array_equal(_np(out[0]).astype(np.float32), _np(expected).astype(np.float32))


def test_mixed_precision_training_runs_the_gelu_and_its_gradient_in_float32(monkeypatch):
    """Without the fused kernel (gpt_tf/speed/kernels: tests/test_kernels.py), nothing fuses the GELU in
    training (its gradient needs the pre-activation), and CPU element-wise kernels are ~2x slower in
    bfloat16: under mixed_bfloat16 the stock GELU and its gradient run in float32."""
    from gpt_tf.speed import kernels
    from gpt_tf.nn.layers import MLP

    monkeypatch.setattr(kernels, "ops", lambda: None)

    mlp = MLP(64, dtype="mixed_bfloat16")
    mlp.build((None, None, 32))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = mlp(x, training=True)
            loss = tf.reduce_sum(tf.cast(y, tf.float32))
        return y, tape.gradient(loss, mlp.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec([2, 5, 32])).graph
    tanh_types = {op.type: op.get_attr("T") for op in graph.get_operations() if op.type in ("Tanh", "TanhGrad")}
    assert tanh_types == {"Tanh": tf.float32, "TanhGrad": tf.float32}, tanh_types
    y, grads = step(tf.random.normal([2, 5, 32]))
    assert y.dtype == tf.bfloat16 and all(g.dtype == tf.float32 for g in grads)


@pytest.mark.parametrize("policy, tol", [("float32", 2e-6), ("mixed_bfloat16", 0.05)])
def test_layer_norm_matches_keras_values_and_gradients(policy, tol):
    """`LayerNorm`'s hand-written gradient gives Keras LayerNormalization's values and gradients (x, gain,
    bias); in bfloat16 within the input's rounding (one bf16 ulp at |x| ~ 4 is 0.016)."""
    from gpt_tf.nn.layers import LayerNorm

    rng = np.random.default_rng(0)
    ours, keras_ln = LayerNorm(epsilon=1e-5, dtype=policy), keras.layers.LayerNormalization(epsilon=1e-5, dtype=policy)
    for layer in (ours, keras_ln):
        layer.build((None, 7, 64))
    gain, bias = rng.normal(size=64).astype("float32"), rng.normal(size=64).astype("float32")
    for layer in (ours, keras_ln):
        layer.gamma.assign(gain)
        layer.beta.assign(bias)
    x = tf.constant(rng.normal(size=(3, 7, 64)) * 4 + 2, tf.float32)
    dy = tf.constant(rng.normal(size=(3, 7, 64)), tf.float32)
    results = []
    for layer in (ours, keras_ln):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
        results.append([y, *tape.gradient(y, [x, layer.gamma, layer.beta], output_gradients=tf.cast(dy, y.dtype))])
    assert results[0][0].dtype == results[1][0].dtype
    for name, a, b in zip(["y", "dx", "dgain", "dbias"], *results):
        a, b = _np(tf.cast(a, tf.float32)), _np(tf.cast(b, tf.float32))
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()) / 4, err_msg=name)
    assert LayerNorm.from_config(ours.get_config()).epsilon == 1e-5


def test_token_cross_entropy_matches_tf_values_and_gradients():
    """`token_cross_entropy` (softmax-based, with a written-out gradient) equals TF's fused sparse
    softmax cross-entropy in value and gradient, over leading dims, on logits spread wide enough that
    the target's probability underflows float32 (its log would be -inf), and inside a tf.function;
    `lm_loss` uses it."""
    from gpt_tf.nn.objectives import lm_loss, token_cross_entropy

    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(2, 3, 5, 97)) * 8, tf.float32)
    targets = tf.constant(rng.integers(0, 97, (2, 3, 5)), tf.int32)
    logits = tf.tensor_scatter_nd_update(logits, [[0, 0, 0, 3]], [-200.0])  # p[target] = 0 in float32
    targets = tf.tensor_scatter_nd_update(targets, [[0, 0, 0]], [3])
    upstream = tf.constant(rng.normal(size=(2, 3, 5)), tf.float32)

    def value_and_grad(fn):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = fn(logits, targets)
        return loss, tape.gradient(loss, logits, output_gradients=upstream)

    ours = value_and_grad(token_cross_entropy)
    graph = tf.function(lambda: value_and_grad(token_cross_entropy))()
    ref = value_and_grad(lambda x, t: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=t, logits=x))
    assert float(ref[0][0, 0, 0]) > 150  # the underflowing target: a finite, large loss in both
    for got in (ours, graph):
        np.testing.assert_allclose(_np(got[0]), _np(ref[0]), rtol=2e-6, atol=2e-5)
        np.testing.assert_allclose(_np(got[1]), _np(ref[1]), rtol=2e-6, atol=2e-6)
    total, count = lm_loss(logits, targets, tf.ones_like(upstream))
    np.testing.assert_allclose(float(total), float(tf.reduce_sum(ref[0])), rtol=1e-6)
    assert float(count) == 30
