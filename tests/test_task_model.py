"""Fine-tuning model (§3.2–3.3) and task metrics: heads, Eq. 5 loss, padding, transfer; metrics vs sklearn/scipy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf import metrics
from gpt_tf.config import get_size
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.nn.objectives import task_loss
from gpt_tf.gpt1.text_classifier import task_for_spec
from gpt_tf.nn.layers import take_at
from gpt_tf.nn.task_head import task_predictions
from gpt_tf.nn.transfer import reset_special_embeddings, transfer_layers
from gpt_tf.tasks import get_task

CONFIG = get_size("test")
S, D, E, PAD = (CONFIG.special_id(n) for n in ("start", "delimiter", "extract", "pad"))


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


def _model(task, config=CONFIG, seed=0, clf_pdrop=0.1):
    keras.utils.set_random_seed(seed)
    return task_for_spec(GPT1Backbone.from_gpt_config(config), get_task(task), dropout=clf_pdrop)


def _fwd(model, feats, with_lm=True, training=False):
    """The task's ``task_outputs``, the LM head at every position by default (what Eq. 5's tests read)."""
    return model.task_outputs(feats, training=training, with_lm=with_lm)


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
    np.testing.assert_allclose(_np(_fwd(model, ab)["task"]), _np(_fwd(model, ba)["task"]), atol=1e-6, rtol=0)
    # An order-sensitive pair task (entailment) reads view 0 only and does see the swap.
    single_ab = {k: v[:, :1] for k, v in ab.items()}
    single_ba = {k: v[:, :1] for k, v in ba.items()}
    assert np.abs(_np(_fwd(rte, single_ab)["task"]) - _np(_fwd(rte, single_ba)["task"])).max() > 1e-5


def test_multiple_choice_logits_follow_the_candidates(race, rng):
    context = [_text(rng, 6, 12) for _ in range(2)]
    choices = [[_text(rng) for _ in range(4)] for _ in range(2)]
    feats = _features([[_pair_view(c, x) for x in cs] for c, cs in zip(context, choices)])
    logits = _np(_fwd(race, feats)["task"])
    assert logits.shape == (2, 4)
    perm = np.array([2, 0, 3, 1])
    permuted = {k: v[:, perm] for k, v in feats.items()}
    np.testing.assert_allclose(_np(_fwd(race, permuted)["task"]), logits[:, perm], atol=1e-6, rtol=0)
    # K = 2 (Story Cloze-sized) with the same weights: the same per-candidate scores.
    two = {k: v[:, :2] for k, v in feats.items()}
    np.testing.assert_allclose(_np(_fwd(race, two)["task"]), logits[:, :2], atol=1e-6, rtol=0)
    # L2 is the cross-entropy of the softmax over the K candidates.
    label = np.array([3, 1], "int32")
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-6)
    loss = task_loss(race.task_spec, _fwd(race, feats), feats, label, lm_coef=0.0)
    np.testing.assert_allclose(float(loss["task"]), -np.log(probs[[0, 1], label]).mean(), rtol=1e-5)


def _manual_lm_loss(lm_logits, feats):
    """Eq. 1 on the real tokens, in numpy: sum(CE(logits[t], ids[t + 1]) · w[t]) / sum(w)."""
    logits = lm_logits[..., :-1, :].astype(np.float64)
    targets = feats["input_ids"][..., 1:]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ce = logz - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    w = feats["lm_weights"][..., :-1]
    return (ce * w).sum() / w.sum()


def test_loss_is_eq5_total_equals_task_plus_lambda_times_lm(rng):
    model = _model("sst2")
    feats = _features([[[S, *_text(rng), E]] for _ in range(4)])
    label = np.array([0, 1, 1, 0], "int32")
    outputs = _fwd(model, feats)
    logits = _np(outputs["task"]).astype(np.float64)
    expected_task = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(4), label])
    expected_lm = _manual_lm_loss(_np(outputs["lm"]), feats)
    for lam in (0.0, 0.5, 1.0):
        loss = task_loss(model.task_spec, outputs, feats, label, lm_coef=lam)
        np.testing.assert_allclose(float(loss["task"]), expected_task, rtol=1e-5)
        np.testing.assert_allclose(float(loss["lm"]), expected_lm if lam else 0.0, rtol=1e-5)  # λ = 0 skips L1
        np.testing.assert_allclose(float(loss["total"]), float(loss["task"]) + lam * float(loss["lm"]), rtol=1e-6)


@pytest.mark.parametrize("task", ["sst2", "race"])
def test_lm_head_at_the_real_targets_only_gives_the_same_loss_and_gradients(task, rng):
    model = _model(task)
    views = 4 if task == "race" else 1
    feats = _features([[[S, *_text(rng, 1, 12), E] for _ in range(views)] for _ in range(3)])
    label = np.array([0, 1, 0], "int32")
    sparse = _fwd(model, feats, with_lm="targets")
    assert sparse["lm"].shape[0] == feats["lm_weights"].sum()  # one row per real target, none for padding
    for lam in (0.5, 1.0):
        full_loss, sparse_loss = (task_loss(model.task_spec, o, feats, label, lam) for o in (_fwd(model, feats), sparse))
        for key in ("lm_sum", "lm_tokens", "total"):
            np.testing.assert_allclose(float(sparse_loss[key]), float(full_loss[key]), rtol=1e-5)
    variables = model.backbone.trainable_variables
    grads = []
    for mode in (True, "targets"):
        with tf.GradientTape() as tape:
            loss = task_loss(model.task_spec, _fwd(model, feats, with_lm=mode), feats, label, 0.5)["total"]
        grads.append([tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)])
    for a, b in zip(*grads):
        np.testing.assert_allclose(_np(a), _np(b), atol=1e-6, rtol=1e-4)


def _grads(model, feats, label, lam, key):
    variables = model.backbone.trainable_variables
    with tf.GradientTape() as tape:
        loss = task_loss(model.task_spec, _fwd(model, feats), feats, label, lm_coef=lam)[key]
    return [_np(tf.convert_to_tensor(g)) for g in tape.gradient(loss, variables)]


def test_lambda_zero_gives_no_gradient_from_the_lm_term(rng):
    model = _model("sst2")
    feats = _features([[[S, *_text(rng), E]] for _ in range(3)])
    label = np.array([1, 0, 1], "int32")
    task_only = _grads(model, feats, label, 0.5, "task")
    # bit for bit on every CPU: with λ = 0 the total is L2 plus a constant 0, so its gradient runs L2's ops alone
    for got, want in zip(_grads(model, feats, label, 0.0, "total"), task_only):
        np.testing.assert_array_equal(got, want)
    differ = [np.abs(g - w).max() for g, w in zip(_grads(model, feats, label, 0.5, "total"), task_only)]
    assert max(differ) > 1e-6  # with λ = 0.5 the LM term does move the backbone
    # λ = 0 also runs without LM logits at all.
    outputs = _fwd(model, feats, with_lm=False)
    assert "lm" not in outputs
    assert float(task_loss(model.task_spec, outputs, feats, label, 0.0)["lm"]) == 0.0  # a constant 0, not a computed one
    with pytest.raises(ValueError, match="with_lm"):
        task_loss(model.task_spec, outputs, feats, label, 0.5)


def test_lm_loss_ignores_padding(rng):
    model = _model("rte")
    feats = _features([[_pair_view(_text(rng), _text(rng))] for _ in range(3)])
    label = np.array([0, 1, 0], "int32")
    base = task_loss(model.task_spec, _fwd(model, feats), feats, label, 0.5)
    noisy = dict(feats)
    ids = feats["input_ids"].copy()
    pad = ids == PAD
    ids[pad] = rng.integers(0, CONFIG.vocab_size, pad.sum())
    noisy["input_ids"] = ids
    changed = task_loss(model.task_spec, _fwd(model, noisy), noisy, label, 0.5)
    for key in ("total", "task", "lm", "lm_tokens"):
        np.testing.assert_allclose(float(changed[key]), float(base[key]), rtol=1e-6)
    assert float(base["lm_tokens"]) == feats["lm_weights"].sum()
    real = dict(feats, input_ids=feats["input_ids"].copy())
    real["input_ids"][0, 0, 2] = (real["input_ids"][0, 0, 2] + 1) % CONFIG.vocab_size
    assert abs(float(task_loss(model.task_spec, _fwd(model, real), real, label, 0.5)["lm"]) - float(base["lm"])) > 1e-5


def test_loss_sums_combine_exactly_across_replicas(rng):
    """Splitting a batch and combining the returned sums gives the full-batch losses."""
    model = _model("stsb")
    texts = [(_text(rng), _text(rng, 2, 14)) for _ in range(4)]
    feats = _features([[_pair_view(a, b), _pair_view(b, a)] for a, b in texts])
    label = np.array([0.5, 4.0, 2.5, 1.0], "float32")
    full = task_loss(model.task_spec, _fwd(model, feats), feats, label, 0.5)
    halves = [
        task_loss(model.task_spec, _fwd(model, {k: v[s] for k, v in feats.items()}), {k: v[s] for k, v in feats.items()}, label[s], 0.5)
        for s in (slice(0, 1), slice(1, 4))
    ]
    total = lambda key: sum(float(h[key]) for h in halves)  # noqa: E731
    np.testing.assert_allclose(total("task_sum") / total("examples"), float(full["task"]), rtol=1e-5)
    np.testing.assert_allclose(total("lm_sum") / total("lm_tokens"), float(full["lm"]), rtol=1e-5)
    scores = _np(_fwd(model, feats)["task"])
    np.testing.assert_allclose(float(full["task"]), np.mean((scores - label) ** 2), rtol=1e-5)


@pytest.mark.parametrize("task", ["qnli", "race"])
def test_head_reads_the_state_at_the_extract_token(task, rng):
    model = _model(task)
    views = 1 if task == "qnli" else 4
    examples = [[_pair_view(_text(rng, 2, 10), _text(rng, 1, 9)) for _ in range(views)] for _ in range(2)]
    feats = _features(examples)
    states = model.backbone(model.views(feats["input_ids"]))  # every view as a row, every position
    per_view = keras.ops.reshape(states, (*feats["input_ids"].shape, -1))
    extracted = keras.ops.squeeze(take_at(per_view, feats["extract_index"], axis=2), axis=2)
    w, b = (_np(v) for v in (model.head.clf.w, model.head.clf.b))
    for i, example in enumerate(examples):
        for k, seq in enumerate(example):
            alone = _np(model.backbone(np.array([seq], "int32")))[0, -1]  # the view on its own, unpadded
            np.testing.assert_allclose(_np(extracted)[i, k], alone, atol=1e-5, rtol=0)
    head = _np(extracted) @ w + b
    expected = head[:, 0, :] if task == "qnli" else head[..., 0]
    np.testing.assert_allclose(_np(_fwd(model, feats)["task"]), expected, atol=1e-5, rtol=0)
    assert np.unique(feats["extract_index"]).size > 1  # positions really vary
    # Without the LM head the last block runs at the extract tokens only: the same states and outputs.
    rows = model.views(feats["input_ids"])
    trimmed = model.backbone.states(rows, positions=keras.ops.reshape(feats["extract_index"], (-1,)))
    np.testing.assert_allclose(_np(trimmed).reshape(_np(extracted).shape), _np(extracted), atol=1e-5, rtol=0)
    np.testing.assert_allclose(_np(_fwd(model, feats, with_lm=False)["task"]), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("task", ["mnli", "stsb", "race"])
def test_only_w_y_is_new(task):
    model = _model(task)
    units = {"mnli": 3, "stsb": 1, "race": 1}[task]
    count = lambda vs: sum(int(np.prod(v.shape)) for v in vs)  # noqa: E731
    assert count(model.backbone.trainable_weights) == CONFIG.n_params
    assert count(model.trainable_weights) == CONFIG.n_params + CONFIG.n_embd * units + units
    assert np.all(_np(model.head.clf.b) == 0) and 0.01 < _np(model.head.clf.w).std() < 0.03


def test_wrong_number_of_views_is_rejected(rng):
    feats = _features([[[S, *_text(rng), E]] * 2])
    with pytest.raises(ValueError, match="sst2.*1 view"):
        _fwd(_model("sst2"), feats)


def test_get_config_round_trip_and_keras_file(race, rng, tmp_path):
    feats = _features([[_pair_view(_text(rng), _text(rng)) for _ in range(4)]])
    clone = type(race).from_config(race.get_config())
    spec = clone.task_spec
    assert (spec.input_type, spec.head, spec.num_choices) == ("multiple_choice", "choice", race.task_spec.num_choices)
    assert clone.dropout == race.dropout and clone.backbone.config == race.backbone.config
    assert [v.path for v in clone.weights] == [v.path for v in race.weights]
    clone.set_weights(race.get_weights())  # exact copies, the same eager ops: bit for bit on every CPU
    np.testing.assert_array_equal(_np(_fwd(clone, feats)["task"]), _np(_fwd(race, feats)["task"]))
    race.save(tmp_path / "race.keras")
    loaded = keras.saving.load_model(tmp_path / "race.keras")
    assert type(loaded) is type(race)
    # the .keras file stores the weights exactly: bit for bit on every CPU, as above
    np.testing.assert_array_equal(_np(_fwd(loaded, feats)["task"]), _np(_fwd(race, feats)["task"]))


def test_dropout_only_in_training(race, rng):
    feats = _features([[_pair_view(_text(rng), _text(rng)) for _ in range(4)]])
    # the same eager call twice (training=False is the default): bit for bit on every CPU
    np.testing.assert_array_equal(_np(_fwd(race, feats)["task"]), _np(_fwd(race, feats, training=False)["task"]))
    assert not np.allclose(_np(_fwd(race, feats, training=True)["task"]), _np(_fwd(race, feats)["task"]))


def test_classifier_dropout_mask_is_shared_by_the_candidates(rng):
    """Backbone dropout off, clf_pdrop on: identical candidates keep identical logits in training."""
    quiet = CONFIG.replace(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    model = _model("race", quiet, clf_pdrop=0.5)
    view = _pair_view(_text(rng), _text(rng))
    feats = _features([[view] * 4 for _ in range(3)])
    train = _np(_fwd(model, feats, training=True)["task"])
    np.testing.assert_allclose(train, train[:, :1].repeat(4, 1), atol=1e-6, rtol=0)
    assert not np.allclose(train, _np(_fwd(model, feats)["task"]))  # the head's dropout did act


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


def test_task_predictions_and_compute_metrics():
    mrpc, stsb = get_task("mrpc"), get_task("stsb")
    ids = task_predictions(mrpc, np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 3.0]], "float32"))
    np.testing.assert_array_equal(ids, [1, 0, 1])
    got = metrics.compute_metrics(mrpc, [1, 0, 0], ids)
    assert list(got) == ["f1", "accuracy"]
    assert got["accuracy"] == pytest.approx(2 / 3) and got["f1"] == pytest.approx(2 / 3)
    scores = task_predictions(stsb, np.array([0.5, 3.0, 1.0], "float32"))
    assert list(metrics.compute_metrics(stsb.to_dict(), [1.0, 4.0, 2.0], scores)) == ["pearson", "spearman"]
    with pytest.raises(ValueError, match="3 values"):
        metrics.accuracy([1, 0, 1], [1, 0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_sklearn_and_scipy(seed):
    sk = pytest.importorskip("sklearn.metrics")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    assert metrics.accuracy(y, p) == pytest.approx(sk.accuracy_score(y, p))
    assert metrics.f1(y, p) == pytest.approx(sk.f1_score(y, p))
    assert metrics.matthews(y, p) == pytest.approx(sk.matthews_corrcoef(y, p))
    y3, p3 = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    p3[:80] = y3[:80]
    assert metrics.matthews(y3, p3) == pytest.approx(sk.matthews_corrcoef(y3, p3))
    for constant in (np.zeros(200, int), np.ones(200, int)):  # undefined cases, returned as the literal 0.0
        assert metrics.matthews(y, constant) == sk.matthews_corrcoef(y, constant) == 0.0
        assert metrics.f1(y, constant) == pytest.approx(sk.f1_score(y, constant, zero_division=0.0))
    assert metrics.f1(np.zeros(5), np.zeros(5)) == 0.0
    x = rng.normal(size=300)
    s = 0.6 * x + rng.normal(size=300)
    assert metrics.pearson(x, s) == pytest.approx(stats.pearsonr(x, s)[0], rel=1e-9)
    assert metrics.spearman(x, s) == pytest.approx(stats.spearmanr(x, s)[0], rel=1e-9)
    tied_a, tied_b = rng.integers(0, 6, 300) / 5 * 5, np.round(s * 2)  # STS-B-like scores with many ties
    np.testing.assert_allclose(metrics.rankdata(tied_a), stats.rankdata(tied_a))
    assert metrics.spearman(tied_a, tied_b) == pytest.approx(stats.spearmanr(tied_a, tied_b)[0], rel=1e-9)
    assert metrics.pearson(x, np.full(300, 2.0)) == 0.0  # undefined: reported as 0
