"""The GPT-1 family on JAX, TensorFlow and PyTorch (``KERAS_BACKEND``): one model, the same numbers.

The presets are written once, here (TensorFlow, the ``test`` model size on the shipped books BPE); each backend then
runs in a process of its own (this file run as a script) and does every check: the backbone's states and the
language model's, classifier's, regressor's and multiple choice's outputs from those presets, greedy generation
with and without the key/value cache, ``fit`` with λ·L1 (the auxiliary LM loss, Eq. 5) and the paper's
optimizer, and a preset saved on the backend before it loaded here. The TensorFlow-only features raise one line
there. Outputs of two backends are two computation paths of the same float32 math (``TWO_PATHS``-sized
differences, here within 1e-5); token ids (greedy) are compared exactly.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("tensorflow", "jax", "torch")  # in turn: each loads the preset the one before it fitted and saved
TEXTS = ["a gripping , beautifully acted film .", "a dull mess", "it is what it is , no more and no less .",
         "the man walked into the room and sat down .", "she said nothing .", "what a joy this was !",
         "the worst film of the year .", "a quiet , lovely story ."]
LABELS = [1, 0, 0, 1, 0, 1, 0, 1]
CHOICES = [["yes .", "no ."], ["it rained .", "the sun ate it ."]]
PROMPTS = ["the man walked", "she"]
SHIPPED = "gpt1_tiny_books_en"  # the books model the package ships (its model card names the backends tested here)
CLOSE = {"rtol": 1e-5, "atol": 1e-5}
LM_COEF = 0.5


# ----------------------------------------------------------------------------- in each backend's process
def _outputs(models: dict) -> dict:
    """Every model's output on the fixed inputs, as numpy."""
    import keras

    from gpt_tf.gpt1.backbone import token_inputs

    lm, shipped = models["lm"], models["shipped"]
    features = lm.preprocessor.generate_preprocess(PROMPTS, sequence_length=16)
    return {
        "states": keras.ops.convert_to_numpy(lm.backbone(token_inputs(features["token_ids"]))),
        "lm": keras.ops.convert_to_numpy(lm(features)),
        "shipped": keras.ops.convert_to_numpy(shipped(shipped.preprocessor.generate_preprocess(PROMPTS, sequence_length=16))),
        "classifier": models["classifier"].predict(TEXTS, verbose=0),
        "regressor": models["regressor"].predict((TEXTS[:2], TEXTS[2:4]), verbose=0),
        "choice": models["choice"].predict((TEXTS[:2], CHOICES), verbose=0),
    }


def _generations(lm) -> dict:
    """Greedy token ids of ``generate`` (the cache) and of ``generate_step`` without the cache."""
    import keras

    lm.compile(sampler="greedy")
    texts = lm.generate(PROMPTS, max_length=14)
    inputs = lm.preprocessor.generate_preprocess(PROMPTS, sequence_length=14)
    ids = {cached: keras.ops.convert_to_numpy(lm.generate_step(inputs, use_cache=cached)["token_ids"])
           for cached in (True, False)}
    return {"texts": list(texts), "cached": ids[True].tolist(), "uncached": ids[False].tolist()}


def _tensorflow_only_features_raise(models: dict, folder: Path) -> list:
    """The one-line errors of the TensorFlow-only features (none where Keras runs on TensorFlow)."""
    from gpt_tf import backend
    from gpt_tf.nn.optim import make_optimizer
    from gpt_tf.training.loop import TrainLoop

    def error(call):
        try:
            call()
        except backend.BackendError as err:
            return str(err)
        return None

    if backend.on_tensorflow():
        return []
    from serving.export import export_task_at

    return [error(lambda: export_task_at(models["classifier"], str(folder / "saved_model"))),
            error(lambda: TrainLoop(None, str(folder / "run"), models["lm"].variables, make_optimizer(1e-3))),
            error(lambda: backend.tensorflow_for_command("gpt_tf.train"))]


def _fast_paths(backbone) -> dict:
    """The speed paths of this backend against the written-out arithmetic: the fused attention (training without
    attention dropout, where the backend takes it), ``Dropout16``'s masks, the cross-entropy without a float32 copy."""
    import keras
    from keras import ops

    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.nn import layers
    from gpt_tf.nn.objectives import token_cross_entropy

    quiet = backbone_for(backbone.config.replace(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0))
    quiet.set_weights(backbone.get_weights())
    ids = np.random.default_rng(0).integers(0, backbone.config.vocab_size, (3, 16)).astype("int32")
    calls, attention = [], ops.dot_product_attention
    layers.ops.dot_product_attention = lambda *a, **k: calls.append(1) or attention(*a, **k)
    try:
        fused = ops.convert_to_numpy(quiet(token_inputs(ids), training=True))
    finally:
        layers.ops.dot_product_attention = attention
    for layer in quiet._flatten_layers():  # pylint: disable=protected-access
        if isinstance(layer, layers.CausalSelfAttention):
            layer.fused = lambda training: False
    written = ops.convert_to_numpy(quiet(token_inputs(ids), training=True))
    dropout, ones = layers.Dropout16(0.1, seed=1), ops.ones((256, 1024))
    masks = [ops.convert_to_numpy(dropout(ones, training=True)) for _ in range(2)]
    logits = keras.random.normal((4, 7, 300), stddev=4.0, seed=2)
    targets = np.random.default_rng(3).integers(0, 300, (4, 7))
    keras_ce = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    half = ops.cast(logits, "bfloat16")
    return {"fused_calls": len(calls), "fused_difference": float(np.abs(fused - written).max()),
            "dropped": [float((m == 0).mean()) for m in masks],
            "kept_values": sorted({round(float(v), 6) for v in np.unique(masks[0])}),
            "masks_differ": bool((masks[0] != masks[1]).any()),
            "ce_difference": float(np.abs(ops.convert_to_numpy(token_cross_entropy(logits, targets) - keras_ce)).max()),
            "ce_bfloat16_dtype": str(ops.convert_to_numpy(token_cross_entropy(half, targets)).dtype),
            "ce_bfloat16_difference": float(np.abs(ops.convert_to_numpy(
                token_cross_entropy(half, targets) - token_cross_entropy(ops.cast(half, "float32"), targets))).max())}


def _loaded(folder: Path, name: str) -> dict:
    """The logits of the classifier that backend ``name`` fitted and saved, loaded here."""
    import gpt_tf

    loaded = gpt_tf.GPT1TextClassifier.from_preset(str(folder / f"{name}_fitted"))
    return {"from": name, "logits": loaded.predict(TEXTS, verbose=0).tolist()}


def child(name: str, folder: Path) -> None:
    """One backend's checks; writes ``<folder>/<name>.json`` and ``<name>_fitted`` (a classifier preset)."""
    import keras

    import gpt_tf

    assert keras.config.backend() == name, keras.config.backend()
    if name == "jax":  # the dev extra's CPU build
        import jax

        assert [d.platform for d in jax.devices()] == ["cpu"], jax.devices()
    keras.utils.set_random_seed(0)
    classes = {"lm": gpt_tf.GPT1CausalLM, "classifier": gpt_tf.GPT1TextClassifier,
               "regressor": gpt_tf.GPT1TextRegressor, "choice": gpt_tf.GPT1MultipleChoice}
    models = {key: cls.from_preset(str(folder / key)) for key, cls in classes.items()}
    models["shipped"] = gpt_tf.GPT1CausalLM.from_preset(SHIPPED)
    report = {"outputs": {k: v.tolist() for k, v in _outputs(models).items()},
              "generate": _generations(models["lm"]), "generate_shipped": _generations(models["shipped"])}
    before = BACKENDS[BACKENDS.index(name) - 1]
    if (folder / f"{before}_fitted").is_dir():  # the preset the backend before this one fitted and saved
        report["loaded"] = _loaded(folder, before)
    classifier = models["classifier"]
    # λ is the preset's (lm_coef, a constructor argument); the schedule spans fit's 4 epochs of 2 updates
    classifier.compile(learning_rate=1e-3, warmup_fraction=0.1, train_steps=4 * len(TEXTS) // 4)
    history = classifier.fit(TEXTS, LABELS, batch_size=4, epochs=4, verbose=0).history
    classifier.save_to_preset(str(folder / f"{name}_fitted"))
    report["fit"] = {"loss": history["loss"], "optimizer": type(classifier.optimizer).__name__,
                     "lm_coef": classifier.get_layer("extract").lm_coef,
                     "updates": int(keras.ops.convert_to_numpy(classifier.optimizer.iterations)),
                     "logits": classifier.predict(TEXTS, verbose=0).tolist()}
    report["errors"] = _tensorflow_only_features_raise(models, folder)
    report["fast_paths"] = _fast_paths(models["lm"].backbone)
    (folder / f"{name}.json").write_text(json.dumps(report))


# ----------------------------------------------------------------------------- the test
@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    """The presets, written here (TensorFlow), then every backend's report, in turn."""
    import keras

    import gpt_tf
    from tests.small_runs import ENV, gpt1_backbone, gpt1_tokenizer

    folder = tmp_path_factory.mktemp("backends")
    keras.utils.set_random_seed(0)
    tokenizer, backbone = gpt1_tokenizer(), gpt1_backbone()
    task = gpt_tf.GPT1TaskPreprocessor
    models = {"lm": gpt_tf.GPT1CausalLM(backbone, gpt_tf.GPT1CausalLMPreprocessor(tokenizer)),
              "classifier": gpt_tf.GPT1TextClassifier(backbone, 2, task(tokenizer), lm_coef=LM_COEF),
              "regressor": gpt_tf.GPT1TextRegressor(backbone, task(tokenizer)),
              "choice": gpt_tf.GPT1MultipleChoice(backbone, 2, task(tokenizer))}
    for key, model in models.items():
        model.save_to_preset(str(folder / key))
    models["shipped"] = gpt_tf.GPT1CausalLM.from_preset(SHIPPED)
    here = {k: v.tolist() for k, v in _outputs(models).items()}
    out = {}
    for name in BACKENDS:
        proc = subprocess.run([sys.executable, __file__, name, str(folder)], cwd=ROOT, capture_output=True, text=True,
                              env={**ENV, "KERAS_BACKEND": name}, timeout=600, check=False)
        assert proc.returncode == 0, f"{name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
        out[name] = json.loads((folder / f"{name}.json").read_text())
    out[BACKENDS[0]]["loaded"] = _loaded(folder, BACKENDS[-1])  # the last backend's preset, here (TensorFlow)
    return {"written": here, **out}


@pytest.mark.parametrize("name", BACKENDS)
def test_every_model_of_the_family_gives_the_presets_outputs(reports, name):
    for key, want in reports["written"].items():
        np.testing.assert_allclose(reports[name]["outputs"][key], want, **CLOSE, err_msg=f"{name}: {key}")


@pytest.mark.parametrize("model", ["generate", "generate_shipped"])
def test_greedy_generation_is_the_same_with_and_without_the_cache_on_every_backend(reports, model):
    tensorflow = reports["tensorflow"][model]
    for name in BACKENDS:
        got = reports[name][model]
        assert got["cached"] == got["uncached"], name
        assert got == tensorflow, f"{name} generated other tokens than tensorflow"
        assert len(got["texts"]) == 2 and all(got["texts"]) and got["texts"][0].startswith(PROMPTS[0])


@pytest.mark.parametrize("name", BACKENDS)
def test_fit_with_the_auxiliary_lm_loss_lowers_the_loss(reports, name):
    fit = reports[name]["fit"]
    assert fit["optimizer"] == "GPTAdamW" and fit["lm_coef"] == LM_COEF and fit["updates"] == 8
    # L1 of an untrained LM is about ln(V) per token: the first epoch's loss holds λ·L1 (~4.5) beside L2 (~0.7)
    assert fit["loss"][0] > 0.8 * LM_COEF * math.log(8004), fit["loss"]
    assert fit["loss"][-1] < fit["loss"][0] - 0.1, fit["loss"]


@pytest.mark.parametrize("name", BACKENDS)
def test_a_preset_saved_on_one_backend_loads_on_another(reports, name):
    loaded = reports[name]["loaded"]
    np.testing.assert_allclose(loaded["logits"], reports[loaded["from"]]["fit"]["logits"], **CLOSE)


def test_tensorflow_only_features_say_so_in_one_line(reports):
    assert reports["tensorflow"]["errors"] == []
    for name in ("jax", "torch"):
        errors = reports[name]["errors"]
        assert len(errors) == 3 and all(e and "\n" not in e for e in errors), errors
        assert "exporting GPT1TextClassifier" in errors[0] and f"Keras runs on {name}" in errors[0], errors[0]
        assert "training loop" in errors[1] and "KERAS_BACKEND=tensorflow" in errors[1], errors[1]
        assert f"imported on {name}" in errors[2], errors[2]


@pytest.mark.parametrize("name", BACKENDS)
def test_the_fast_paths_compute_the_written_out_arithmetic(reports, name):
    """The fused attention where the backend takes it (JAX, PyTorch; TensorFlow keeps its own pieces), 16-bit dropout
    masks at the exact rate, the cross-entropy without a float32 copy of the logits."""
    fast = reports[name]["fast_paths"]
    assert fast["fused_calls"] == (0 if name == "tensorflow" else 2), fast  # the test size's two blocks
    assert fast["fused_difference"] <= 2e-5, fast
    assert all(abs(d - 0.1) < 0.003 for d in fast["dropped"]) and fast["masks_differ"], fast
    assert fast["kept_values"] == [0.0, round(1 / 0.9, 6)], fast
    assert fast["ce_difference"] <= 1e-5, fast
    assert fast["ce_bfloat16_dtype"] == "float32" and fast["ce_bfloat16_difference"] <= 1e-5, fast


def test_the_command_lines_take_tensorflow_and_say_so(monkeypatch, tmp_path):
    """``python -m ...`` commands run on TensorFlow whatever ``KERAS_BACKEND`` or Keras's config file says, with one
    line saying so: the change their process starts again under (gpt_tf/restart.py), this process's left alone."""
    from gpt_tf import backend

    monkeypatch.delitem(sys.modules, "keras", raising=False)  # as a command sees itself before Keras starts
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    changes, line = backend.tensorflow_for_command("gpt_tf.train")
    assert changes == {"KERAS_BACKEND": "tensorflow"} and os.environ["KERAS_BACKEND"] == "jax"
    assert line.startswith("gpt_tf.train: runs on TensorFlow") and "KERAS_BACKEND=jax" in line
    monkeypatch.delenv("KERAS_BACKEND")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert backend.tensorflow_for_command("gpt_tf.train") == ({}, "")  # no config file: TensorFlow
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    changes, line = backend.tensorflow_for_command("gpt_tf.train")
    assert changes == {"KERAS_BACKEND": "tensorflow"} and "the backend torch of Keras's keras.json" in line
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert backend.tensorflow_for_command("gpt_tf.train") == ({}, "")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    child(sys.argv[1], Path(sys.argv[2]))
