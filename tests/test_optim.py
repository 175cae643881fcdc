"""The optimizer (§4.1): AdamW with decoupled weight decay on rank >= 2 weights, clipped by global norm."""

import numpy as np
import tensorflow as tf

from gpt_tf.nn.optim import make_optimizer


def _reference_step(params, moments, grads, t, lr, wd, clip, b1=0.9, b2=0.999, eps=1e-8):
    """One update as the module doc states it, in float64 NumPy; returns the norm before clipping."""
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
    scale = clip / max(norm, clip)
    for p, (m, v), g in zip(params, moments, grads):
        g = g * scale
        if p.ndim >= 2:
            p -= lr * wd * p
        m += (g - m) * (1 - b1)
        v += (g * g - v) * (1 - b2)
        p -= lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return norm


def _apply(optimizer):
    """``optimizer.apply`` in a traced function (as ``train_step`` runs it); returns the norm it kept."""

    @tf.function
    def apply(grads, variables):
        optimizer.apply(grads, variables)
        return optimizer.global_norm.value

    return apply


def test_apply_is_clipped_adamw_with_decay_on_matrices_only():
    rng = np.random.default_rng(0)
    shapes = [(6, 4), (4,), (3, 5, 2)]
    start = [rng.normal(size=s).astype(np.float32) for s in shapes]
    variables = [tf.Variable(p) for p in start]
    optimizer = make_optimizer(learning_rate=0.1, weight_decay=0.05, clip_norm=1.0, variables=variables)
    params = [p.astype(np.float64) for p in start]
    moments = [(np.zeros(s), np.zeros(s)) for s in shapes]
    apply = _apply(optimizer)
    for t, size in enumerate([3.0, 0.01, 2.0], start=1):  # norms above and below the clip norm
        grads = [(size * rng.normal(size=s)).astype(np.float32) for s in shapes]
        norm = apply([tf.constant(g) for g in grads], variables)
        expected = _reference_step(params, moments, [g.astype(np.float64) for g in grads], t, 0.1, 0.05, 1.0)
        np.testing.assert_allclose(float(norm), expected, rtol=1e-5)
        for v, p in zip(variables, params):
            np.testing.assert_allclose(v.numpy(), p, rtol=1e-5, atol=1e-6)
    assert not np.allclose(variables[1].numpy(), start[1])  # the bias moved, by Adam alone


def test_clip_factor_is_what_clip_by_global_norm_multiplies_by():
    """The factor the fused update takes (`clip_factor`): tf.clip_by_global_norm's, NaN for an infinite
    norm included; 1 at or below the clip norm and for a NaN norm (where the unfused path does not clip)."""
    from gpt_tf.nn.optim import clip_factor

    for norm in (0.5, 1.0, 3.0, 1e30, float("inf")):
        g = tf.constant([1.0])
        want = float(tf.clip_by_global_norm([g], 1.0, use_norm=tf.constant(norm))[0][0][0]) if norm > 1.0 else 1.0
        got = float(clip_factor(tf.constant(norm), 1.0))
        assert got == want or (np.isnan(got) and np.isnan(want)), (norm, got, want)
    assert float(clip_factor(tf.constant(float("nan")), 1.0)) == 1.0


def test_clip_norm_is_the_dense_gradients_norm_when_a_token_repeats():
    """A gather's gradient (IndexedSlices, a row per occurrence) is clipped by the norm of its summed rows."""
    table = tf.Variable(tf.ones([5, 3]))
    optimizer = make_optimizer(learning_rate=0.1, weight_decay=0.0, clip_norm=1.0, variables=[table])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [1, 1, 1, 2]))
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    norm = _apply(optimizer)([grad], [table])
    np.testing.assert_allclose(float(norm), np.sqrt(3 * 3**2 + 3 * 1**2), rtol=1e-6)  # rows 1 and 2 of the dense gradient
    np.testing.assert_allclose(table.numpy()[[0, 3, 4]], 1.0)  # untouched rows: no gradient, no decay


def test_accumulated_micro_batches_make_the_update_of_their_mean():
    """``gradient_accumulation_steps=2``: two ``apply`` calls make one update with the mean of their gradients, the
    learning-rate schedule and Adam's bias correction counting updates, not micro-batches (the CLI's loop and
    ``fit`` accumulate so)."""
    from gpt_tf.nn.optim import WarmupDecay

    rng = np.random.default_rng(1)
    shapes = [(5, 3), (3,)]
    start = [rng.normal(size=s).astype(np.float32) for s in shapes]
    variables = [tf.Variable(p) for p in start]
    schedule = WarmupDecay(0.1, 0, 4, "linear")  # 0.1, 0.075, ... by update: a micro-batch count would skip one
    optimizer = make_optimizer(schedule, weight_decay=0.05, clip_norm=1.0, gradient_accumulation_steps=2,
                               variables=variables)
    params = [p.astype(np.float64) for p in start]
    moments = [(np.zeros(s), np.zeros(s)) for s in shapes]
    apply = _apply(optimizer)
    for t, size in enumerate([3.0, 0.02], start=1):  # clipped, then not
        micro = [[(size * rng.normal(size=s)).astype(np.float32) for s in shapes] for _ in range(2)]
        apply([tf.constant(g) for g in micro[0]], variables)
        for v, p in zip(variables, start if t == 1 else after):
            np.testing.assert_array_equal(v.numpy(), p)  # the first micro-batch only accumulates
        norm = apply([tf.constant(g) for g in micro[1]], variables)
        mean = [(a.astype(np.float64) + b) / 2 for a, b in zip(*micro)]
        expected = _reference_step(params, moments, mean, t, 0.1 * (1 - (t - 1) / 4), 0.05, 1.0)
        np.testing.assert_allclose(float(norm), expected, rtol=1e-5)
        for v, p in zip(variables, params):
            np.testing.assert_allclose(v.numpy(), p, rtol=1e-5, atol=1e-6)
        after = [v.numpy() for v in variables]
    assert int(optimizer.iterations) == 2  # updates, not micro-batches
