"""Fine-tuning model (§3.2–3.3): heads, Eq. 5 loss, padding, transfer (the task metrics: tests/test_metrics.py).

A task model's output is ``model(features)``; its training loss is what Keras's ``train_step`` minimises, the compiled
loss (L2) plus ``model.losses`` (``ExtractStates``'s λ·L1): ``model.compute_loss(x, y, model(x, training=True))``.
The loss tests build the model without dropout, so that a training call is deterministic and comparable.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.config import get_size
from gpt_tf.gpt1.backbone import GPT1Backbone, token_inputs
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.gpt1.text_classifier import task_for_spec, task_spec_of
from gpt_tf.nn import objectives
from gpt_tf.nn import tf_pieces
from gpt_tf.nn.embedding import GPTEmbedding
from gpt_tf.nn.layers import take_at
from gpt_tf.nn.transfer import reset_special_embeddings, transfer_layers
from gpt_tf.tasks import get_task

CONFIG = get_size("test")
QUIET = CONFIG.replace(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)  # no dropout: a training call is repeatable
S, D, E, PAD = (CONFIG.special_id(n) for n in ("start", "delimiter", "extract", "pad"))
GRADS_TWO_PATHS = {"atol": 1e-6, "rtol": 1e-4}  # gradients of one loss by two computation paths


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _features(examples, n_ctx=CONFIG.n_ctx):
    """Contract-shaped features from ``examples`` = list (batch) of lists (views) of token-id lists."""
    batch, views = len(examples), len(examples[0])
    ids = np.full((batch, views, n_ctx), PAD, "int32")
    extract = np.zeros((batch, views), "int32")
    weights = np.zeros((batch, views, n_ctx), "float32")
    for i, example in enumerate(examples):
        for k, seq in enumerate(example):
            ids[i, k, : len(seq)] = seq
            extract[i, k] = len(seq) - 1
            weights[i, k, : len(seq) - 1] = 1.0  # target input_ids[t + 1] is real
    return {"input_ids": ids, "extract_index": extract, "lm_weights": weights}


def _text(rng, low=2, high=8):
    return list(rng.integers(0, CONFIG.vocab_size, rng.integers(low, high)))


def _pair_view(a, b):
    return [S, *a, D, *b, E]


def _model(task, config=CONFIG, seed=0, clf_pdrop=0.1, lm_coef=0.5):
    """The family's task for registry task ``task``, its weights from ``seed``, compiled with its default loss."""
    keras.utils.set_random_seed(seed)
    return task_for_spec(GPT1Backbone.from_gpt_config(config), get_task(task), dropout=clf_pdrop, lm_coef=lm_coef,
                         compile=True)


def _quiet(task, lm_coef=0.5):
    return _model(task, QUIET, clf_pdrop=0.0, lm_coef=lm_coef)


def _training_loss(model, feats, label):
    """What ``train_step`` minimises: the compiled loss of a training call plus ``model.losses`` (λ·L1)."""
    return model.compute_loss(feats, label, model(feats, training=True))


def _task_loss(model, feats, label):
    """L2 alone: the compiled loss object on a training call's output, nothing added."""
    return model.loss(label, model(feats, training=True))


def _grads(model, loss_fn):
    variables = model.backbone.trainable_variables
    with tf.GradientTape() as tape:
        loss = loss_fn()
    return [_np(tf.convert_to_tensor(g)) for g in tape.gradient(loss, variables)]


def _lm_logits(model, feats):
    """The tied LM head at every position of every view, in float64 numpy: ``[B, K, T, V]``."""
    ids = feats["input_ids"]
    states = _np(model.backbone(token_inputs(ids.reshape(-1, ids.shape[-1])))).astype(np.float64)
    table = _np(model.backbone.embed.tokens_embed).astype(np.float64)
    return (states @ table.T).reshape(*ids.shape, -1)


def _nll(logits, targets):
    """The cross-entropy -log softmax(logits)[target] over the last axis, in float64 numpy (one target per row)."""
    logits = np.asarray(logits, np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return logz - np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]


def _manual_lm_loss(lm_logits, feats):
    """Eq. 5's L1 in numpy: each view's mean CE(logits[t], ids[t + 1]) over its real targets (``lm_weights`` > 0),
    then the mean over all views of the batch (the release's normalisation)."""
    ce = _nll(lm_logits[..., :-1, :], feats["input_ids"][..., 1:])
    w = feats["lm_weights"][..., :-1]
    return ((ce * w).sum(-1) / np.maximum(w.sum(-1), 1.0)).mean()


def _pooled_lm_loss(lm_logits, feats):
    """The mean CE over all real targets of the batch at once (longer views weigh more): not Eq. 5's L1 here."""
    ce = _nll(lm_logits[..., :-1, :], feats["input_ids"][..., 1:])
    w = feats["lm_weights"][..., :-1]
    return (ce * w).sum() / w.sum()


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="module")
def race():
    return _model("race")


@pytest.mark.parametrize("task", ["mrpc", "stsb"])
def test_similarity_output_is_the_same_for_a_b_and_b_a(task, rng):
    model, rte = _model(task), _model("rte")
    texts = [(_text(rng), _text(rng)) for _ in range(3)]
    ab = _features([[_pair_view(a, b), _pair_view(b, a)] for a, b in texts])
    ba = _features([[_pair_view(b, a), _pair_view(a, b)] for a, b in texts])
    np.testing.assert_allclose(_np(model(ab)), _np(model(ba)), atol=1e-6, rtol=0)
    # An order-sensitive pair task (entailment) reads view 0 only and does see the swap.
    single_ab = {k: v[:, :1] for k, v in ab.items()}
    single_ba = {k: v[:, :1] for k, v in ba.items()}
    assert np.abs(_np(rte(single_ab)) - _np(rte(single_ba))).max() > 1e-5


def test_multiple_choice_logits_follow_the_candidates(race, rng):
    context = [_text(rng, 6, 12) for _ in range(2)]
    choices = [[_text(rng) for _ in range(4)] for _ in range(2)]
    feats = _features([[_pair_view(c, x) for x in cs] for c, cs in zip(context, choices)])
    logits = _np(race(feats))
    assert logits.shape == (2, 4)
    perm = np.array([2, 0, 3, 1])
    permuted = {k: v[:, perm] for k, v in feats.items()}
    np.testing.assert_allclose(_np(race(permuted)), logits[:, perm], atol=1e-6, rtol=0)
    # K = 2 (Story Cloze-sized) with the same weights: the same per-candidate scores.
    two = {k: v[:, :2] for k, v in feats.items()}
    np.testing.assert_allclose(_np(race(two)), logits[:, :2], atol=1e-6, rtol=0)
    # L2 (the compiled loss) is the cross-entropy of the softmax over the K candidates.
    label = np.array([3, 1], "int32")
    loss = race.compute_loss(feats, label, race(feats))  # an inference call: no λ·L1
    np.testing.assert_allclose(float(loss), np.mean(_nll(logits, label)), rtol=1e-5)


@pytest.mark.parametrize("task", ["sst2", "race"])
def test_training_loss_is_eq5_compiled_task_loss_plus_lambda_times_per_view_lm_loss(task, rng):
    """L3 = L2 + λ·L1: L2 the compiled cross-entropy, L1 each view's mean CE over its real next tokens, averaged over
    the views; λ·L1 is the model's one added loss in training (none at λ = 0, none outside training)."""
    views = 4 if task == "race" else 1
    feats = _features([[[S, *_text(rng, 1, 12), E] for _ in range(views)] for _ in range(4)])
    label = np.array([0, 1, 1, 0], "int32")
    for lam in (0.0, 0.5, 1.0):
        model = _quiet(task, lm_coef=lam)  # the same weights each time (the same seed)
        logits = _np(model(feats))
        expected_task, expected_lm = np.mean(_nll(logits, label)), _manual_lm_loss(_lm_logits(model, feats), feats)
        total = _training_loss(model, feats, label)
        if lam:
            assert len(model.losses) == 1
            np.testing.assert_allclose(float(model.losses[0]), lam * expected_lm, rtol=1e-5)
        else:
            assert model.losses == []  # λ = 0: L1 is not computed at all
        np.testing.assert_allclose(float(_task_loss(model, feats, label)), expected_task, rtol=1e-5)
        np.testing.assert_allclose(float(total), expected_task + lam * expected_lm, rtol=1e-5)
        model(feats)
        assert model.losses == []  # outside training there is no λ·L1
    # the views' lengths differ: one mean over all their tokens (not the release's normalisation) would not pass
    assert abs(expected_lm - _pooled_lm_loss(_lm_logits(model, feats), feats)) > 1e-4


@pytest.mark.parametrize("task", ["sst2", "race"])
def test_lm_head_at_the_real_targets_only_gives_the_same_loss_and_gradients(task, rng, monkeypatch):
    """On TensorFlow L1 runs the LM head at the real next tokens only (``tf_pieces.real_targets``); the head at every
    position with the padding weighted 0 (the other backends' way) gives the same loss and gradients."""
    model = _quiet(task)
    views = 4 if task == "race" else 1
    feats = _features([[[S, *_text(rng, 1, 12), E] for _ in range(views)] for _ in range(3)])
    label = np.array([0, 1, 0], "int32")
    rows = []
    real_targets = tf_pieces.real_targets

    def counted(states, token_ids, lm_weights):
        out = real_targets(states, token_ids, lm_weights)
        rows.append(int(out[0].shape[0]))
        return out

    monkeypatch.setattr(tf_pieces, "real_targets", counted)
    sparse_loss = float(_training_loss(model, feats, label))
    sparse_lm = float(model.losses[0])
    sparse_grads = _grads(model, lambda: _training_loss(model, feats, label))
    assert rows and set(rows) == {feats["lm_weights"].sum()}  # one row per real target, none for padding
    monkeypatch.setattr(objectives, "backend", types.SimpleNamespace(tf_pieces=lambda: None))
    rows.clear()
    full_loss = float(_training_loss(model, feats, label))
    np.testing.assert_allclose(float(model.losses[0]), sparse_lm, rtol=1e-5)
    np.testing.assert_allclose(full_loss, sparse_loss, rtol=1e-5)
    full_grads = _grads(model, lambda: _training_loss(model, feats, label))
    assert not rows  # the every-position path ran
    for a, b in zip(full_grads, sparse_grads):
        np.testing.assert_allclose(a, b, **GRADS_TWO_PATHS)


def test_lambda_zero_gives_no_gradient_from_the_lm_term(rng, monkeypatch):
    feats = _features([[[S, *_text(rng), E]] for _ in range(3)])
    label = np.array([1, 0, 1], "int32")
    heads = []
    logits = GPTEmbedding.logits
    monkeypatch.setattr(GPTEmbedding, "logits", lambda self, *a, **k: heads.append(1) or logits(self, *a, **k))
    zero, half = _quiet("sst2", lm_coef=0.0), _quiet("sst2", lm_coef=0.5)  # the same weights
    task_only = _grads(zero, lambda: _task_loss(zero, feats, label))
    # bit for bit on every CPU: with λ = 0 the training loss is L2 alone (no added 0), its gradient L2's ops alone
    for got, want in zip(_grads(zero, lambda: _training_loss(zero, feats, label)), task_only):
        np.testing.assert_array_equal(got, want)
    assert not heads  # λ = 0 runs without LM logits at all (the last block at the extract tokens only)
    # L2's gradient is the same with the last block at every position (λ > 0's path): two paths of one value
    for got, want in zip(_grads(half, lambda: _task_loss(half, feats, label)), task_only):
        np.testing.assert_allclose(got, want, **GRADS_TWO_PATHS)
    differ = [np.abs(g - w).max() for g, w in zip(_grads(half, lambda: _training_loss(half, feats, label)), task_only)]
    assert heads and max(differ) > 1e-6  # with λ = 0.5 the LM term does move the backbone


def test_lm_loss_ignores_padding(rng):
    model = _quiet("rte")
    feats = _features([[_pair_view(_text(rng), _text(rng))] for _ in range(3)])
    label = np.array([0, 1, 0], "int32")

    def losses(f):
        total = float(_training_loss(model, f, label))
        return total, float(model.losses[0])

    base = losses(feats)
    noisy = dict(feats)
    ids = feats["input_ids"].copy()
    pad = ids == PAD
    ids[pad] = rng.integers(0, CONFIG.vocab_size, pad.sum())
    noisy["input_ids"] = ids
    np.testing.assert_allclose(losses(noisy), base, rtol=1e-6)
    real = dict(feats, input_ids=feats["input_ids"].copy())
    real["input_ids"][0, 0, 2] = (real["input_ids"][0, 0, 2] + 1) % CONFIG.vocab_size
    assert abs(losses(real)[1] - base[1]) > 1e-5


def test_losses_combine_exactly_across_splits_of_a_batch(rng):
    """Every loss is a mean over examples (L1 per view, then over the views): the mean of two halves' training losses
    is the whole batch's, as Keras combines replicas and accumulated micro-batches; an uneven split, weighted by its
    examples, too."""
    model = _quiet("stsb")
    texts = [(_text(rng), _text(rng, 2, 14)) for _ in range(4)]
    feats = _features([[_pair_view(a, b), _pair_view(b, a)] for a, b in texts])
    label = np.array([0.5, 4.0, 2.5, 1.0], "float32")
    whole = float(_training_loss(model, feats, label))
    part = lambda s: float(_training_loss(model, {k: v[s] for k, v in feats.items()}, label[s]))  # noqa: E731
    np.testing.assert_allclose((part(slice(0, 2)) + part(slice(2, 4))) / 2, whole, rtol=1e-5)
    np.testing.assert_allclose((1 * part(slice(0, 1)) + 3 * part(slice(1, 4))) / 4, whole, rtol=1e-5)
    scores = _np(model(feats))
    assert scores.shape == (4,)
    np.testing.assert_allclose(float(model.compute_loss(feats, label, model(feats))), np.mean((scores - label) ** 2),
                               rtol=1e-5)  # L2: the squared error, a mean over examples
    np.testing.assert_allclose(whole, np.mean((scores - label) ** 2) + 0.5 * _manual_lm_loss(_lm_logits(model, feats),
                                                                                             feats), rtol=1e-5)


@pytest.mark.parametrize("task", ["qnli", "race"])
def test_head_reads_the_state_at_the_extract_token(task, rng):
    """The graph runs the last block at the extract tokens only (``ExtractStates``): the full backbone's state there,
    gathered, and in training with λ > 0 the block at every position, gathered, give the same outputs."""
    model = _quiet(task)
    views = 1 if task == "qnli" else 4
    examples = [[_pair_view(_text(rng, 2, 10), _text(rng, 1, 9)) for _ in range(views)] for _ in range(2)]
    feats = _features(examples)
    rows = feats["input_ids"].reshape(-1, CONFIG.n_ctx)  # every view a row
    states = model.backbone(token_inputs(rows))  # every position
    per_view = keras.ops.reshape(states, (*feats["input_ids"].shape, -1))
    extracted = keras.ops.squeeze(take_at(per_view, feats["extract_index"], axis=2), axis=2)
    clf = model.get_layer("head").clf
    w, b = _np(clf.w), _np(clf.b)
    for i, example in enumerate(examples):
        for k, seq in enumerate(example):
            alone = _np(model.backbone(token_inputs(np.array([seq], "int32"))))[0, -1]  # the view on its own, unpadded
            np.testing.assert_allclose(_np(extracted)[i, k], alone, atol=1e-5, rtol=0)
    head = _np(extracted) @ w + b
    expected = head[:, 0, :] if task == "qnli" else head[..., 0]
    np.testing.assert_allclose(_np(model(feats)), expected, atol=1e-5, rtol=0)
    assert np.unique(feats["extract_index"]).size > 1  # positions really vary
    # The backbone's own shortcut (the last block at given positions) gives the same states …
    trimmed = model.backbone.states(rows, positions=keras.ops.reshape(feats["extract_index"], (-1,)))
    np.testing.assert_allclose(_np(trimmed).reshape(_np(extracted).shape), _np(extracted), atol=1e-5, rtol=0)
    # … and the training path with λ > 0 (the block at every position, then gathered) the same outputs.
    np.testing.assert_allclose(_np(model(feats, training=True)), expected, atol=1e-5, rtol=0)
    assert len(model.losses) == 1


@pytest.mark.parametrize("task", ["mnli", "stsb", "race"])
def test_only_w_y_is_new(task):
    model = _model(task)
    units = {"mnli": 3, "stsb": 1, "race": 1}[task]
    count = lambda vs: sum(int(np.prod(v.shape)) for v in vs)  # noqa: E731
    assert count(model.backbone.trainable_weights) == CONFIG.n_params
    assert count(model.trainable_weights) == CONFIG.n_params + CONFIG.n_embd * units + units
    assert model.get_layer("extract").weights == []  # the last block and the LM head stay the backbone's
    head = model.get_layer("head").clf
    assert np.all(_np(head.b) == 0) and 0.01 < _np(head.w).std() < 0.03


def test_wrong_number_of_views_is_rejected(rng):
    feats = _features([[[S, *_text(rng), E]] * 2])
    with pytest.raises(ValueError, match=r"input_ids.*expected shape=\(None, 1, None\)"):
        _model("sst2")(feats)


@pytest.mark.parametrize("task", ["sst2", "mnli", "mrpc", "stsb", "race", "story_cloze"])
def test_task_spec_of_is_task_for_specs_inverse(task):
    spec = get_task(task)
    model = task_for_spec(GPT1Backbone.from_gpt_config(CONFIG), spec)
    got = task_spec_of(model, spec.name)
    assert (got.name, got.input_type, got.head, got.num_views, got.num_choices) == \
        (spec.name, spec.input_type, spec.head, spec.num_views, spec.num_choices)
    if spec.head == "classification":
        assert got.label_names == spec.label_names  # what an export of it answers
    assert not model.compiled  # task_for_spec: uncompiled (the CLI's loop compiles it with its optimizer)


def test_get_config_round_trip_and_keras_file(race, rng, tmp_path):
    feats = _features([[_pair_view(_text(rng), _text(rng)) for _ in range(4)]])
    clone = type(race).from_config(race.get_config())
    spec = task_spec_of(clone)
    assert (spec.input_type, spec.head, spec.num_choices) == ("multiple_choice", "choice", race.num_choices)
    assert (clone.dropout, clone.lm_coef) == (race.dropout, race.lm_coef)
    assert clone.backbone.config == race.backbone.config
    assert clone.get_layer("extract").lm_coef == race.lm_coef == 0.5
    assert [v.path for v in clone.weights] == [v.path for v in race.weights]
    clone.set_weights(race.get_weights())  # exact copies, the same eager ops: bit for bit on every CPU
    np.testing.assert_array_equal(_np(clone(feats)), _np(race(feats)))
    race.save(tmp_path / "race.keras")
    loaded = keras.saving.load_model(tmp_path / "race.keras")
    assert type(loaded) is type(race)
    # the .keras file stores the weights exactly: bit for bit on every CPU, as above
    np.testing.assert_array_equal(_np(loaded(feats)), _np(race(feats)))


def test_dropout_only_in_training(race, rng):
    feats = _features([[_pair_view(_text(rng), _text(rng)) for _ in range(4)]])
    # the same eager call twice (training=False is the default): bit for bit on every CPU
    np.testing.assert_array_equal(_np(race(feats)), _np(race(feats, training=False)))
    assert not np.allclose(_np(race(feats, training=True)), _np(race(feats)))


def test_classifier_dropout_mask_is_shared_by_the_candidates(rng):
    """Backbone dropout off, clf_pdrop on: identical candidates keep identical logits in training."""
    model = _model("race", QUIET, clf_pdrop=0.5)
    view = _pair_view(_text(rng), _text(rng))
    feats = _features([[view] * 4 for _ in range(3)])
    train = _np(model(feats, training=True))
    np.testing.assert_allclose(train, train[:, :1].repeat(4, 1), atol=1e-6, rtol=0)
    assert not np.allclose(train, _np(model(feats)))  # the head's dropout did act


def test_transfer_layers_copies_embeddings_and_first_blocks():
    keras.utils.set_random_seed(1)
    source = causal_lm_for(CONFIG)
    equal = lambda a, b: np.array_equal(_np(a), _np(b))  # noqa: E731  (copies: bit for bit on every CPU)
    for n in (0, 1, CONFIG.n_layer):
        target = _model("sst2", seed=2 + n)
        paths = transfer_layers(source, target, n)
        assert len(paths) == 2 + n * len(target.backbone.blocks[0].weights)
        assert equal(source.backbone.embed.tokens_embed, target.backbone.embed.tokens_embed)
        assert equal(source.backbone.embed.positions_embed, target.backbone.embed.positions_embed)
        for i, (src, dst) in enumerate(zip(source.backbone.blocks, target.backbone.blocks)):
            same = [equal(a, b) for a, b in zip(src.weights, dst.weights) if _np(a).std() > 0]  # not 0/1 inits
            assert all(same) if i < n else not any(same), (n, i)
    with pytest.raises(ValueError, match="n_layers"):
        transfer_layers(source, target, CONFIG.n_layer + 1)


def test_reset_special_embeddings_redraws_only_special_rows():
    model = _model("sst2")
    before = _np(model.backbone.embed.tokens_embed).copy()
    reset_special_embeddings(model.backbone, seed=3)
    after = _np(model.backbone.embed.tokens_embed)
    # untouched rows, and numpy's seeded draws: bit for bit on every CPU
    np.testing.assert_array_equal(after[: CONFIG.vocab_size], before[: CONFIG.vocab_size])
    assert not np.any(after[CONFIG.vocab_size :] == before[CONFIG.vocab_size :])
    assert 0.01 < after[CONFIG.vocab_size :].std() < 0.03
    reset_special_embeddings(model, seed=3)
    np.testing.assert_array_equal(_np(model.backbone.embed.tokens_embed), after)  # deterministic in the seed
