"""The vocabulary padded inside the model (``GPTConfig.pad_vocab_to``): in training the tied LM head is
``padded_vocab`` wide, a multiple of N, its extra columns masked, and the real columns, the loss, its gradient and
generation are the unpadded model's; the token table, presets and configs without the setting are as before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.config import GPTConfig, get_size
from gpt_tf.convert import preset_io
from gpt_tf.gpt1.backbone import GPT1Backbone, token_inputs
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.gpt1.causal_lm import GPT1CausalLM
from gpt_tf.gpt1.text_classifier import task_for_spec
from gpt_tf.nn.embedding import GPTEmbedding
from gpt_tf.nn import objectives
from gpt_tf.nn.objectives import lm_loss
from gpt_tf.tasks import get_task
from tests.small_runs import ENV, ROOT

# No dropout: training-mode calls (where the head pads) of two models are then the same function of the weights.
CONFIG = get_size("test", embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
V = CONFIG.total_vocab  # 1004: the LM head's real width (BPE tokens and the special tokens)
MASKED = -1e8  # a padded column's logit is at most this


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x)).astype(np.float32)


def _pair(pad_to, dtype=None):
    """``(unpadded, padded)`` language models with the same weights."""
    keras.utils.set_random_seed(0)
    plain = causal_lm_for(CONFIG, dtype=dtype)
    padded = causal_lm_for(CONFIG.replace(pad_vocab_to=pad_to), dtype=dtype)
    padded.set_weights(plain.get_weights())  # the same variables, the same shapes: the token table is [V, d]
    return plain, padded


def _ids(batch=3, length=12, seed=0):
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, (batch, length)).astype("int32")


def _x(ids):
    """keras-hub's model inputs of ``ids``."""
    return token_inputs(ids)


def _all_negative(lm, seed=0):
    """Every real logit at most -20 (the last block's states all one unit vector ``b``, every token row a negative
    multiple of ``b``): an unmasked padded column (logit 0) would then be the likeliest token."""
    rng = np.random.default_rng(seed)
    ln = lm.backbone.blocks[-1].ln_2
    b = rng.normal(size=CONFIG.n_embd)
    b /= np.linalg.norm(b)
    ln.gamma.assign(np.zeros(CONFIG.n_embd, "float32"))
    ln.beta.assign(b.astype("float32"))
    table = -rng.uniform(20.0, 40.0, (V, 1)) * b[None, :]
    lm.backbone.embed.tokens_embed.assign(table.astype("float32"))
    return lm


# ----------------------------------------------------------------------------- the setting
def test_the_setting_is_off_by_default_and_validated():
    assert GPTConfig().pad_vocab_to == 1 and all(c.pad_vocab_to == 1 for c in map(get_size, ("gpt1", "small", "test")))
    assert CONFIG.padded_vocab == V
    for bad in (0, -128, 1.5, True, "128"):
        with pytest.raises(ValueError, match="pad_vocab_to must be a positive int"):
            CONFIG.replace(pad_vocab_to=bad)
    with pytest.raises(ValueError, match="pad_vocab_to must be a positive int"):
        GPTEmbedding(V, 8, 4, pad_vocab_to=0)


@pytest.mark.parametrize("size,n,want", [("gpt1", 128, 40576), ("small", 128, 16128), ("test", 128, 1024),
                                         ("test", 7, 1008), ("test", 4, 1004), ("test", 2000, 2000)])
def test_padded_width_is_the_least_multiple_of_n_not_below_the_vocabulary(size, n, want):
    config = get_size(size, pad_vocab_to=n)
    assert config.padded_vocab == want
    assert config.padded_vocab % n == 0 and config.total_vocab <= config.padded_vocab < config.total_vocab + n
    assert config.n_params == get_size(size).n_params  # padding adds no weight


# ----------------------------------------------------------------------------- the logits and the loss
@pytest.mark.parametrize("pad_to", [128, 7])
def test_training_logits_are_padded_masked_and_the_real_columns_unchanged(pad_to):
    plain, padded = _pair(pad_to)
    width = CONFIG.replace(pad_vocab_to=pad_to).padded_vocab
    assert padded.backbone.embed.tokens_embed.shape == (V, CONFIG.n_embd)
    ids = _ids()
    want = _np(plain(_x(ids), training=True))
    got = _np(padded(_x(ids), training=True))
    assert want.shape == (3, 12, V) and got.shape == (3, 12, width) and width % pad_to == 0 and width > V
    np.testing.assert_allclose(got[..., :V], want, rtol=1e-5, atol=1e-5)
    assert got[..., V:].max() <= MASKED
    # outside training: the unpadded head, the real width, the same values
    np.testing.assert_allclose(_np(padded(_x(ids))), _np(plain(_x(ids))), rtol=1e-5, atol=1e-5)
    assert _np(padded(_x(ids))).shape == (3, 12, V)
    states = padded.backbone(_x(ids))
    assert _np(padded.backbone.embed.logits(states, training=True)).shape[-1] == width
    assert _np(padded.backbone.embed.logits(states)).shape[-1] == V


def test_loss_and_its_gradient_are_the_unpadded_models():
    plain, padded = _pair(128)
    ids = _ids(length=CONFIG.n_ctx + 1)
    results = []
    for lm in (plain, padded):
        with tf.GradientTape() as tape:
            total, count = lm_loss(lm(_x(ids[:, :-1]), training=True), ids[:, 1:])
        results.append((float(total / count), tape.gradient(total, lm.trainable_variables)))
    (want, want_grads), (got, got_grads) = results
    assert abs(got - want) <= 1e-6 * abs(want)
    for a, b in zip(want_grads, got_grads):
        assert a.shape == b.shape
        np.testing.assert_allclose(_np(b), _np(a), rtol=1e-4, atol=1e-6)


def test_padded_columns_get_no_probability_even_where_every_real_logit_is_low():
    _, padded = _pair(128)
    _all_negative(padded)
    logits = _np(padded(_x(_ids()), training=True))
    assert logits[..., :V].max() <= -20.0 and logits.shape[-1] == 1024
    assert (logits.argmax(-1) < V).all()
    assert _np(keras.ops.softmax(logits, axis=-1))[..., V:].max() == 0.0


def test_the_tasks_lm_logits_pad_in_training_with_the_same_auxiliary_loss(monkeypatch):
    """A task's training call runs the padded LM head for L1 (``ExtractStates``'s λ·L1, its one added loss), at the
    real next tokens only (TensorFlow's way) and at every position (the other backends'): the same L1 as unpadded."""
    def classifier(config):
        keras.utils.set_random_seed(0)
        return task_for_spec(GPT1Backbone.from_gpt_config(config), get_task("sst2"), dropout=0.0, lm_coef=0.5)

    plain, padded = classifier(CONFIG), classifier(CONFIG.replace(pad_vocab_to=128))
    padded.set_weights(plain.get_weights())
    ids = _ids(batch=2, length=10)
    features = {"input_ids": ids[:, None, :], "extract_index": np.full((2, 1), 9, "int32"),
                "lm_weights": np.ones((2, 1, 10), "float32") * (np.arange(10) < 7)}
    widths = []
    logits = GPTEmbedding.logits

    def recorded(self, *args, **kwargs):
        out = logits(self, *args, **kwargs)
        widths.append(int(out.shape[-1]))
        return out

    monkeypatch.setattr(GPTEmbedding, "logits", recorded)
    for every_position in (False, True):
        if every_position:
            monkeypatch.setattr(objectives, "backend", types.SimpleNamespace(tf_pieces=lambda: None))
        lm_losses = []
        for model, width in ((plain, V), (padded, 1024)):
            widths.clear()
            model(features, training=True)
            assert len(model.losses) == 1
            lm_losses.append(float(model.losses[0]))
            assert widths == [width], (every_position, widths)  # the LM head ran once, at this width
        want, got = lm_losses
        assert abs(got - want) <= 1e-6 * abs(want), every_position


def test_int8_head_is_not_padded_and_stays_correct():
    plain, padded = _pair(128)
    for lm in (plain, padded):
        lm.quantize("int8")
    ids = _ids()
    got = _np(padded(_x(ids), training=True))
    assert got.shape[-1] == V
    np.testing.assert_allclose(got, _np(plain(_x(ids), training=True)), rtol=1e-5, atol=1e-5)


def test_under_mixed_bfloat16():
    plain, padded = _pair(128, dtype="mixed_bfloat16")
    ids = _ids(length=CONFIG.n_ctx + 1)
    want, got = plain(_x(ids[:, :-1]), training=True), padded(_x(ids[:, :-1]), training=True)
    assert keras.backend.standardize_dtype(got.dtype) == "bfloat16" and got.shape[-1] == 1024
    want, got = _np(want), _np(got)
    np.testing.assert_allclose(got[..., :V], want, rtol=1e-2, atol=1e-2)
    assert np.isfinite(got).all() and got[..., V:].max() <= MASKED  # -1e9 in bfloat16: finite, still masked
    (a, n), (b, m) = lm_loss(want, ids[:, 1:]), lm_loss(got, ids[:, 1:])
    assert float(n) == float(m) and abs(float(b) - float(a)) <= 1e-3 * abs(float(a))


# ----------------------------------------------------------------------------- generation
@pytest.mark.parametrize("sampler", ["greedy", "top_k", "random"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_never_gives_an_id_past_the_vocabulary(sampler, use_cache):
    _, padded = _pair(128)
    _all_negative(padded)
    padded.use_sampler(keras_hub.samplers.get(sampler))
    length, prompt = 16, 3
    ids = np.zeros((2, length), "int32")
    ids[:, :prompt] = _ids(batch=2, length=prompt)
    mask = np.zeros((2, length), "int32")
    mask[:, :prompt] = 1
    out = keras.ops.convert_to_numpy(padded.generate_step({"token_ids": ids, "padding_mask": mask},
                                                          use_cache=use_cache)["token_ids"])
    assert out.shape == (2, length) and (out[:, :prompt] == ids[:, :prompt]).all()
    assert (out[:, prompt:] < CONFIG.vocab_size).all() and (out >= 0).all()  # no special token, no padded column


# ----------------------------------------------------------------------------- configs and presets
def test_configs_round_trip_and_configs_without_the_setting_load_unpadded(tmp_path):
    config = CONFIG.replace(pad_vocab_to=128)
    assert GPTConfig(**json.loads(json.dumps(config.to_dict()))) == config
    assert GPTConfig(**{k: v for k, v in config.to_dict().items() if k != "pad_vocab_to"}).pad_vocab_to == 1

    _, padded = _pair(128)
    backbone = padded.backbone
    assert backbone.get_config()["pad_vocabulary_to"] == 128
    assert GPT1Backbone.from_config(backbone.get_config()).config == config
    assert GPT1CausalLM.from_config(padded.get_config()).backbone.config == config
    embed = backbone.embed
    assert GPTEmbedding.from_config(embed.get_config()).padded_vocab == 1024
    assert GPTEmbedding.from_config({k: v for k, v in embed.get_config().items()
                                     if k != "pad_vocab_to"}).padded_vocab == V
    old = {k: v for k, v in backbone.get_config().items() if k != "pad_vocabulary_to"}  # a config from before it
    assert GPT1Backbone.from_config(old).config.pad_vocab_to == 1
    assert "pad_vocabulary_to" not in GPT1Backbone.from_gpt_config(CONFIG).get_config()  # unpadded: as before

    backbone.save_to_preset(str(tmp_path / "preset"))
    assert json.loads((tmp_path / "preset" / "config.json").read_text())["config"]["pad_vocabulary_to"] == 128
    assert preset_io.preset_config(str(tmp_path / "preset")) == config
    loaded = GPT1Backbone.from_preset(str(tmp_path / "preset"))
    assert loaded.config == config and loaded.embed.padded_vocab == 1024
    ids = _ids()
    np.testing.assert_array_equal(_np(loaded.embed.logits(loaded(_x(ids)), training=True)),
                                  _np(backbone.embed.logits(backbone(_x(ids)), training=True)))


# ----------------------------------------------------------------------------- JAX
JAX_CHECK = textwrap.dedent("""
    import json, sys
    import keras, numpy as np
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.objectives import lm_loss

    assert keras.backend.backend() == "jax"
    config = get_size("test", embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    keras.utils.set_random_seed(0)
    plain, padded = causal_lm_for(config), causal_lm_for(config.replace(pad_vocab_to=128))
    padded.set_weights(plain.get_weights())
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (3, 13)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}  # keras-hub's inputs
    want = np.asarray(plain(x, training=True))
    got = np.asarray(padded(x, training=True))
    losses = [float(lm_loss(x, ids[:, 1:])[0]) for x in (want, got)]
    fitted = []  # Keras's train step, compiled by XLA: two updates of each model from the same weights
    for lm in (plain, padded):
        lm.compile(optimizer=keras.optimizers.SGD(0.1), weighted_metrics=[], jit_compile=True)
        fitted.append(lm.fit(x, ids[:, 1:], batch_size=3, epochs=2, verbose=0).history["loss"])
    json.dump({"shape": list(got.shape), "real": float(np.abs(got[..., :config.total_vocab] - want).max()),
               "padded": float(got[..., config.total_vocab:].max()), "losses": losses, "fitted": fitted,
               "eval_width": int(np.asarray(padded({"token_ids": ids, "padding_mask": np.ones_like(ids)})).shape[-1])},
              sys.stdout)
""")


def test_on_jax_the_padded_logits_real_columns_match_and_fit_makes_the_same_updates():
    proc = subprocess.run([sys.executable, "-c", JAX_CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**ENV, "KERAS_BACKEND": "jax"}, check=False)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["shape"] == [3, 12, 1024] and report["eval_width"] == V
    assert report["real"] <= 1e-5 and report["padded"] <= MASKED
    want, got = report["losses"]
    assert abs(got - want) <= 1e-6 * abs(want)
    want, got = report["fitted"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
