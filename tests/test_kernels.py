"""gpt_tf's fused CPU kernels (gpt_tf/speed/kernels): the same values as the stock ops they replace, used
where they should be, and the stock ops where they cannot run. In CI the kernels must build."""

import os

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.speed import choices, kernels
from gpt_tf.speed.choices import SpeedChoices
from gpt_tf.speed.kernels.build import KernelBuildError, library_path


@pytest.fixture(scope="module")
def lib():
    lib = kernels.ops()
    if lib is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the fused kernels must build in CI: {kernels.status()}")
        pytest.skip(kernels.status())
    return lib


def _op_types(concrete) -> set:
    """Every op type in a traced function, the functions it calls included (a custom gradient's ops
    can sit in one)."""
    graph_def = concrete.graph.as_graph_def()
    return {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}


def _stock_gelu_and_grad(x, dy):
    with tf.GradientTape() as tape:
        tape.watch(x)
        xf = tf.cast(x, tf.float32)
        y = tf.cast(tf.nn.gelu(xf, approximate=True), x.dtype)
    return y, tape.gradient(y, x, output_gradients=dy)


def _exact_gelu_and_grad(x, dy):
    """The tanh GELU and dy times its derivative in float64 (numpy)."""
    x, dy = (tf.cast(t, tf.float64).numpy() for t in (x, dy))
    k, a = np.sqrt(2 / np.pi), 0.044715
    t = np.tanh(k * (x + a * x ** 3))
    return 0.5 * x * (1 + t), dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * a * x * x))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_fused_gelu_is_as_exact_as_the_stock_gelu_and_its_gradient(lib, dtype):
    """Forward and gradient against the float64 formula: the kernel's error is no larger than that of
    TF's ``tf.nn.gelu`` (tanh form) and its autodiff gradient, computed in float32 and rounded to the
    input dtype, the path it replaces (where 1 + tanh cancels, for x < -3, both lose digits alike)."""
    rng = np.random.default_rng(0)
    x = tf.cast(tf.constant(np.concatenate([rng.normal(size=4000) * 3, [0.0, -20.0, 20.0, 1e-3]]), tf.float32), dtype)
    dy = tf.cast(tf.constant(rng.normal(size=x.shape[0]), tf.float32), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = kernels.fused_gelu(x)
    dx = tape.gradient(y, x, output_gradients=dy)
    assert y.dtype == dx.dtype == dtype
    stock_y, stock_dx = _stock_gelu_and_grad(x, dy)
    for name, got, stock, exact in zip(("y", "dx"), (y, dx), (stock_y, stock_dx), _exact_gelu_and_grad(x, dy)):
        err = np.abs(tf.cast(got, tf.float64).numpy() - exact).max()
        stock_err = np.abs(tf.cast(stock, tf.float64).numpy() - exact).max()
        assert err <= 1.25 * stock_err + 1e-7, (name, err, stock_err)
        assert err < (2e-2 if dtype == tf.bfloat16 else 2e-5) * np.abs(exact).max(), (name, err)


def _block(policy="float32"):
    from gpt_tf.nn.layers import TransformerBlock

    block = TransformerBlock(n_head=2, d_ff=64, attn_pdrop=0.0, resid_pdrop=0.0, dtype=policy)
    block.build((None, None, 32))
    return block


FUSED_OPS = {"GptGelu", "GptGeluGrad", "GptLayerNorm", "GptLayerNormGrad"}


def test_fused_kernels_are_what_training_runs_and_inference_keeps_the_stock_ops(lib):
    """A block in training runs GptGelu / GptLayerNorm and their gradients (no Tanh); in inference, TF's
    GELU, which oneDNN fuses into the matmul, and the graph layer norm: stock TF Serving loads an
    exported graph (it holds no custom op)."""
    block = _block("mixed_bfloat16")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(block(x, training=True), tf.float32))
        return tape.gradient(loss, block.trainable_variables)

    train_ops = _op_types(step.get_concrete_function(tf.TensorSpec([2, 5, 32])))
    assert FUSED_OPS <= train_ops and "Tanh" not in train_ops, sorted(train_ops)
    infer = tf.function(lambda x: block(x, training=False)).get_concrete_function(tf.TensorSpec([2, 5, 32]))
    assert not _op_types(infer) & FUSED_OPS


def test_xla_compiled_training_falls_back_to_the_stock_ops(lib):
    """XLA cannot compile a custom op: inside ``jit_compile`` functions (``--jit_compile``) a block in
    training traces the stock GELU and layer norm, and gives the fused path's values and gradients."""
    block = _block()
    x = tf.random.stateless_normal([2, 5, 32], seed=[1, 2])

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = block(x, training=True)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y, *tape.gradient(loss, [x, *block.trainable_variables])]

    fused, xla = tf.function(step), tf.function(step, jit_compile=True)
    for a, b in zip(xla(x), fused(x)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
    graph_ops, xla_ops = _op_types(fused.get_concrete_function(x)), _op_types(xla.get_concrete_function(x))
    assert FUSED_OPS <= graph_ops and not FUSED_OPS & xla_ops and "Tanh" in xla_ops


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 7), (36, 16, 256), (1, 40)])
def test_fused_layer_norm_matches_the_graph_layer_norm(lib, dtype, shape):
    """Values and the three gradients against ``layers.layer_norm`` (Keras's arithmetic): to float32
    rounding, and in bfloat16 to one rounding of the output (the float32 sums differ in order). [36, 16,
    256] is 576 rows: more than one block of rows sums dgamma and dbeta where two threads run."""
    from gpt_tf.nn.layers import layer_norm

    rng = np.random.default_rng(4)
    d = shape[-1]
    x = tf.cast(tf.constant(rng.normal(size=shape) * 3 + 1, tf.float32), dtype)
    dy = tf.cast(tf.constant(rng.normal(size=shape), tf.float32), dtype)
    gamma, beta = (tf.constant(rng.normal(size=d), tf.float32) for _ in range(2))
    results = []
    for norm in (layer_norm, kernels.fused_layer_norm):
        with tf.GradientTape() as tape:
            tape.watch([x, gamma, beta])
            y = norm(x, gamma, beta, 1e-5)
        results.append([y, *tape.gradient(y, [x, gamma, beta], output_gradients=dy)])
    for name, got, want in zip(("y", "dx", "dgamma", "dbeta"), *results[::-1]):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        got, want = (tf.cast(t, tf.float64).numpy() for t in (got, want))
        scale = np.abs(want).max()
        tol = 2.0 ** -8 if dtype == tf.bfloat16 and name in ("y", "dx") else 1e-5
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale, err_msg=name)


def test_fused_layer_norm_names_mismatched_shapes(lib):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"GptLayerNorm: x \[2,3,5\] does not end in gamma's \[4\]"):
        lib.gpt_layer_norm(tf.zeros([2, 3, 5]), tf.ones([4]), tf.zeros([4]), epsilon=1e-5)


@pytest.mark.parametrize("grad_dtype", [tf.float32, tf.bfloat16])
def test_fused_adamw_matches_clip_decay_then_resource_apply_adam(lib, grad_dtype):
    """Three fused updates = the stock path: the gradient times the clipping factor, ``var -= lr·wd·var``,
    then TF's ResourceApplyAdam (ε outside the bias correction, as Keras), to float32 rounding; a bf16
    gradient is read as its float32 value."""
    rng = np.random.default_rng(1)
    shape = (37, 53)  # not a multiple of any vector width
    w0, m0, v0 = rng.normal(size=shape), rng.normal(size=shape) * 0.01, rng.random(shape) * 1e-4
    fused = [tf.Variable(a, dtype=tf.float32) for a in (w0, m0, v0)]
    stock = [tf.Variable(a, dtype=tf.float32) for a in (w0, m0, v0)]
    lr, wd, b1, b2, eps = 1e-3, 0.1, 0.9, 0.999, 1e-8  # decay 1e-4·w per update: far above the tolerance
    for t, factor in zip(range(1, 4), (1.0, 0.37, 1.0)):
        g = tf.cast(tf.constant(rng.normal(size=shape), tf.float32), grad_dtype)
        alpha = tf.constant(lr) * tf.sqrt(1.0 - tf.constant(b2 ** t)) / (1.0 - tf.constant(b1 ** t))  # as ApplyAdam
        kernels.fused_adamw(*fused, g, tf.stack([alpha, *tf.constant([lr * wd, b1, b2, eps, factor], tf.float32)]))
        w, m, v = stock
        w.assign_sub(w * (lr * wd))
        tf.raw_ops.ResourceApplyAdam(var=w.handle, m=m.handle, v=v.handle, beta1_power=b1 ** t, beta2_power=b2 ** t,
                                     lr=lr, beta1=b1, beta2=b2, epsilon=eps, grad=tf.cast(g, tf.float32) * factor)
    for name, a, b in zip("wmv", fused, stock):
        # float32 rounding at the arrays' scale (one kernel contracts a·b + c into one rounding, TF's two)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6 * np.abs(b.numpy()).max(), err_msg=name)
    assert not np.allclose(fused[0].numpy(), w0)  # it moved


def test_gpt_adamw_gives_the_same_updates_with_and_without_the_kernel(lib):
    """``GPTAdamW`` end to end (decay on matrices only, 3 updates, the first two clipped): fused against stock, as
    the speed choices say."""
    from gpt_tf.nn.optim import make_optimizer

    rng = np.random.default_rng(2)
    init = [rng.normal(size=(8, 6)), rng.normal(size=(6,)), rng.normal(size=(5, 8))]
    grads = [[size * rng.normal(size=a.shape) for a in init] for size in (1.0, 1.0, 0.01)]  # norms ~10, ~10, ~0.1
    results = []
    for use_kernel in (True, False):
        with choices.using(SpeedChoices(fused_kernels=use_kernel)):  # read as the update is traced
            variables = [tf.Variable(a, dtype=tf.float32) for a in init]
            opt = make_optimizer(learning_rate=1e-2, weight_decay=0.1, clip_norm=1.0, variables=variables)
            apply = tf.function(lambda gs: opt.apply(gs, variables))
            assert ("GptFusedAdamW" in _op_types(apply.get_concrete_function([tf.TensorSpec(a.shape) for a in init])))\
                == use_kernel
            for step in grads:
                apply([tf.constant(g, tf.float32) for g in step])
        results.append([v.numpy() for v in variables])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_gpt_adamw_compiled_with_xla_runs_the_stock_update(lib):
    """XLA cannot compile the kernel: a ``jit_compile`` update traces the stock ops and gives the
    fused update's values (``bench.train_throughput --mode=optimizer`` times that path)."""
    from gpt_tf.nn.optim import make_optimizer

    rng = np.random.default_rng(3)
    init, grad = rng.normal(size=(8, 6)), rng.normal(size=(8, 6))
    results = []
    for jit in (False, True):
        variables = [tf.Variable(init, dtype=tf.float32)]
        opt = make_optimizer(learning_rate=1e-2, weight_decay=0.1, clip_norm=1.0, variables=variables)
        apply = tf.function(lambda gs: opt.apply(gs, variables), jit_compile=jit)
        apply([tf.constant(grad, tf.float32)])
        results.append(variables[0].numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-7)


def test_build_failure_is_a_named_reason_and_the_stock_ops_run(monkeypatch, tmp_path):
    """No usable compiler: ``library_path`` says which and why; ``status()`` says the stock ops run."""
    monkeypatch.setenv("GPT_TF_KERNEL_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(KernelBuildError, match="/bin/false"):
        library_path()
    assert not list(tmp_path.iterdir())  # no half-written library left behind
    lib, line = kernels._load.__wrapped__()
    assert lib is None and "stock ops run" in line and "/bin/false" in line


def test_the_speed_choices_turn_the_kernels_off():
    with choices.using(SpeedChoices(fused_kernels=False)):
        assert kernels.ops() is None and kernels.status() == ("fused CPU kernels: off (the speed choices); "
                                                              "TensorFlow's stock ops run")
        assert not kernels.can_fuse(tf.zeros((2, 2)))


def test_a_checkout_reached_through_links_reuses_the_build_and_other_sources_do_not(monkeypatch, tmp_path):
    """The build's name holds the sources' text and TensorFlow's real folders, not the paths they were
    reached by: the walk-through test's project (links to gpt_tf/ and .venv) and git worktrees load the
    build setup.sh made instead of compiling their own (~36 CPU-seconds each); other sources or another
    TensorFlow still get their own build."""
    from pathlib import Path

    from gpt_tf.speed.kernels import build

    key = build.cache_key("g++", "g++ 12")
    code, tf_dir = tmp_path / "code", tmp_path / "tensorflow"
    code.symlink_to(build.SOURCE.parent)
    real_tf = os.path.dirname(tf.sysconfig.get_include())
    tf_dir.symlink_to(real_tf)
    compile_flags, link_flags = tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()

    def tf_at(folder):  # TensorFlow's flags as if it were installed at ``folder``
        moved = lambda flags: lambda: [f.replace(real_tf, str(folder)) for f in flags]  # noqa: E731
        monkeypatch.setattr(tf.sysconfig, "get_compile_flags", moved(compile_flags))
        monkeypatch.setattr(tf.sysconfig, "get_link_flags", moved(link_flags))

    tf_at(tf_dir)
    monkeypatch.setattr(build, "SOURCE", code / build.SOURCE.name)
    monkeypatch.setattr(build, "HEADERS", tuple(code / h.name for h in build.HEADERS))
    assert any(str(tf_dir) in f for f in build._command("g++", Path("x")))  # the command names the links
    assert build.cache_key("g++", "g++ 12") == key
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in (build.SOURCE, *build.HEADERS):
        (copy / path.name).write_text(path.read_text())
    (copy / build.SOURCE.name).write_text(build.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(build, "SOURCE", copy / build.SOURCE.name)
    monkeypatch.setattr(build, "HEADERS", tuple(copy / h.name for h in build.HEADERS))
    assert build.cache_key("g++", "g++ 12") != key
    (copy / build.SOURCE.name).write_text(code.joinpath(build.SOURCE.name).read_text())
    assert build.cache_key("g++", "g++ 12") == key  # a copy with the same text is the same build
    other_tf = tmp_path / "other_tensorflow"
    other_tf.mkdir()
    tf_at(other_tf)
    assert build.cache_key("g++", "g++ 12") != key


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5), (7, 33, 129)])
def test_fused_dropout_is_dropout16_to_the_bit(lib, monkeypatch, dtype, shape):
    """The same seed gives the same mask, outputs and gradient as ``Dropout16``'s graph (TF's Philox
    stream, 16 bits per element; [7, 33, 129] spans many 128-draw blocks and ends mid-block)."""
    from gpt_tf.nn.layers import Dropout16

    rng = np.random.default_rng(5)
    x = tf.cast(tf.constant(rng.normal(size=shape), tf.float32), dtype)
    dy = tf.cast(tf.constant(rng.normal(size=shape), tf.float32), dtype)

    def run():
        layer = Dropout16(0.1, seed=1234, dtype="float32" if dtype == tf.float32 else "mixed_bfloat16")

        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
            return y, tape.gradient(y, x, output_gradients=dy)

        fn = tf.function(step)
        return [t.numpy() for t in fn(x)], _op_types(fn.get_concrete_function(x))

    (y, dx), fused_ops = run()
    monkeypatch.setattr(kernels, "can_fuse", lambda x: False)
    (graph_y, graph_dx), graph_ops = run()
    assert {"GptDropout", "GptDropoutGrad"} <= fused_ops and not {"GptDropout", "GptDropoutGrad"} & graph_ops
    # the same mask (integer draws) and one multiplication by the same scale per element: bit for bit on every CPU
    np.testing.assert_array_equal(y, graph_y)
    np.testing.assert_array_equal(dx, graph_dx)
    kept = graph_y != 0
    assert 0.85 < kept.mean() < 0.95 or kept.size < 100  # it drops about a tenth


def test_fused_dropout_keeps_nothing_of_a_dropped_nan(lib):
    """A dropped element is 0 whatever it held (as the graph's select), a kept NaN stays NaN."""
    x = tf.fill([4096], float("nan"))
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant([3, 4], tf.int64))
    y, keep = lib.gpt_dropout(x, key, counter, threshold=round(0.5 * 65536) - 32768, scale=2.0)
    y, keep = y.numpy(), keep.numpy()
    assert 0 < keep.sum() < keep.size
    assert (y[~keep] == 0).all() and np.isnan(y[keep]).all()


def _int8_reference(x, w, scale, transpose, quantize_inputs):
    """Keras's int8 product, de-scaled, in numpy: the inputs quantized per row by their absolute maximum (the integer
    sums exact in int64), or weight-only (float64 sums)."""
    wt = (w.T if transpose else w).astype(np.int64)
    if not quantize_inputs:
        return (x.astype(np.float64) @ wt) / scale
    s = np.float32(127.0) / (np.abs(x).max(-1, keepdims=True) + np.float32(1e-7))
    q = np.clip(np.round(x * s), -127, 127).astype(np.int64)
    return (q @ wt).astype(np.float32) / (scale * s)


@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("transpose", [False, True])
def test_weight_matmul_is_kerass_int8_product_and_float32_sums_of_bf16(lib, rows, transpose):
    """The few-row kernel: int8 weights with Keras's input quantizer give its integer sums, de-scaled as Keras does;
    weight-only int8 and bfloat16 weights their float32 sums (to float32 rounding). Shapes not a multiple of the
    kernel's blocks (100 x 77), GPT-1's (768 x 2304), and one whose few rows are summed in chunks of K of which the
    last is not a whole group of rows (1001 x 130)."""
    del lib
    rng = np.random.default_rng(rows)
    for k, n in ((100, 77), (768, 2304), (1001, 130)):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        shape = (n, k) if transpose else (k, n)
        w = rng.integers(-127, 128, shape).astype(np.int8)
        scale = rng.uniform(50, 200, n).astype(np.float32)
        for quantize in (True, False):
            got = kernels.weight_matmul(tf.constant(x), tf.constant(w), tf.constant(scale), transpose, quantize)
            want = _int8_reference(x, w, scale, transpose, quantize)
            np.testing.assert_allclose(got.numpy(), want, rtol=2e-6, atol=2e-6 * np.abs(want).max(), err_msg=quantize)
        wb = tf.cast(rng.standard_normal(shape).astype(np.float32), tf.bfloat16)
        got = kernels.weight_matmul(tf.constant(x), wb, tf.zeros([0]), transpose)
        wf = tf.cast(wb, tf.float32).numpy().astype(np.float64)
        want = x.astype(np.float64) @ (wf.T if transpose else wf)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_products_against_fewer_bytes_take_the_kernel_for_few_rows_and_core_ops_in_portable_graphs(lib):
    """``tf_weights``: a few rows (static or not) run the weight kernel, many rows TensorFlow's products; inside
    ``kernels.portable()`` (the exports) no op of this library and no oneDNN-only op, and the same numbers."""
    from gpt_tf.nn import tf_weights

    del lib
    rng = np.random.default_rng(0)
    w = tf.constant(rng.integers(-127, 128, (64, 48)).astype(np.int8))
    scale = tf.constant(rng.uniform(50, 200, 48).astype(np.float32))
    wb = tf.cast(rng.standard_normal((64, 48)).astype(np.float32), tf.bfloat16)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)

    def products(v):
        return (tf_weights.int8_matmul(v, w, scale, True), tf_weights.int8_matmul(v, w, scale, False),
                tf_weights.bf16_matmul(v, wb, tf.float32))

    few = tf.function(products).get_concrete_function(tf.TensorSpec([1, 1, 64]))
    many = tf.function(products).get_concrete_function(tf.TensorSpec([8, 32, 64]))
    unknown = tf.function(products).get_concrete_function(tf.TensorSpec([None, None, 64]))
    assert "GptWeightMatmul" in _op_types(few) and "GptWeightMatmul" not in _op_types(many)
    assert {"GptWeightMatmul", "If"} <= _op_types(unknown) or {"GptWeightMatmul", "StatelessIf"} <= _op_types(unknown)
    with kernels.portable():
        portable = tf.function(products).get_concrete_function(tf.TensorSpec([None, None, 64]))
    assert not {op for op in _op_types(portable) if op.startswith(("Gpt", "Quantized", "_"))}
    for got, want in zip(portable(tf.constant(x)), unknown(tf.constant(x))):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5 * np.abs(want.numpy()).max())
