"""GPT-1 as a keras-hub model family (``gpt_tf/gpt1/``): registration, numerics equal to the project's
model, presets (round trips keep the logits; runs and release shards convert; ``books_tiny`` ships),
the tasks' inputs and errors, generation, and serving of a Python-API classifier in a TF-only process.

Models are the ``test`` shape on books_tiny's 8k BPE (fast); books_tiny itself is loaded where it is the point.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.small_runs import ENV, ROOT, TF_ONLY

BOOKS = ROOT / "gpt_tf" / "presets" / "books_tiny"
BPE = BOOKS / "assets" / "tokenizer"
TEXTS = ["a gripping , beautifully acted film .", "a dull mess", "it is what it is , no more and no less ."]


@pytest.fixture(scope="module")
def tokenizer():
    import gpt_tf

    return gpt_tf.GPT1Tokenizer(str(BPE))


def _backbone(seed=0, **overrides):
    import keras

    import gpt_tf
    from gpt_tf.config import get_preset

    keras.utils.set_random_seed(seed)
    return gpt_tf.GPT1Backbone.from_gpt_config(get_preset("test", vocab_size=8000, **overrides))


def _classifier(tokenizer, input_type="single", num_classes=2):
    import gpt_tf

    preprocessor = gpt_tf.GPT1TaskPreprocessor(tokenizer, input_type=input_type)
    return gpt_tf.GPT1TextClassifier(_backbone(), num_classes=num_classes, preprocessor=preprocessor)


def test_import_is_light_and_keras_hub_resolves_gpt1_presets():
    script = textwrap.dedent(f"""
        import sys
        import gpt_tf
        assert "tensorflow" not in sys.modules and "keras_hub" not in sys.modules, "import gpt_tf must stay light"
        import keras_hub
        backbone = keras_hub.models.Backbone.from_preset("{BOOKS}")
        classifier = keras_hub.models.TextClassifier.from_preset("{BOOKS}", num_classes=2)
        named = gpt_tf.GPT1TextClassifier.from_preset("books_tiny", num_classes=2)
        print(type(backbone).__name__, type(classifier).__name__, type(named).__name__,
              "books_tiny" in keras_hub.models.Backbone.presets)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd="/", env=ENV, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["GPT1Backbone", "GPT1TextClassifier", "GPT1TextClassifier", "True"]


def test_backbone_and_classifier_compute_what_the_projects_model_computes(tokenizer):
    from gpt_tf.backbone import GPTBackbone
    from gpt_tf.task_model import GPTTaskModel

    classifier = _classifier(tokenizer, "pair_symmetric")
    reference = GPTTaskModel(GPTBackbone(classifier.backbone.config), classifier.task_spec, clf_pdrop=0.0)
    for a, b in zip(classifier.task_model.weights, reference.weights):
        b.assign(a)
    features = classifier.preprocessor({"sentence1": TEXTS, "sentence2": TEXTS[::-1]})  # a tuple would be (x, y)
    from pipelines.task_batches import bucket_lengths

    assert features["input_ids"].shape[1] == 2 and features["input_ids"].shape[2] in bucket_lengths(32)
    np.testing.assert_array_equal(classifier.predict((TEXTS, TEXTS[::-1]), verbose=0),
                                  reference(features, with_lm=False)["task"].numpy())


def test_preprocessor_applies_the_papers_transformations(tokenizer):
    import tensorflow as tf

    import gpt_tf
    from pipelines.transforms import transform_record

    ids = {name: tokenizer.offline.encode(t) for name, t in zip("ab", TEXTS)}
    for input_type in ("single", "pair", "pair_symmetric"):
        pre = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=32, input_type=input_type)
        fields = dict(zip(("premise", "hypothesis") if input_type == "pair" else ("sentence1", "sentence2"),
                          (TEXTS[:1], TEXTS[1:2]))) if input_type != "single" else TEXTS[:1]
        got = pre(fields)
        record = {"tokens_a": tf.constant(ids["a"]), "tokens_b": tf.constant(ids["b"] if input_type != "single" else []
                                                                              , tf.int32),
                  "choice_tokens": tf.zeros([0], tf.int32), "choice_lengths": tf.zeros([0], tf.int32),
                  "label": tf.constant(-1.0)}
        want, _ = transform_record(pre._task(), record, 32, tokenizer.special_ids())
        length = got["input_ids"].shape[2]
        np.testing.assert_array_equal(got["input_ids"][0], want["input_ids"][:, :length])
        np.testing.assert_array_equal(got["extract_index"][0], want["extract_index"])
    choice = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=32, input_type="multiple_choice", num_choices=2)
    got = choice({"context": ["she opened the door ."], "choices": [["she walked in .", "the door ate her ."]]})
    assert got["input_ids"].shape[:2] == (1, 2)
    assert (got["input_ids"].numpy()[0, :, 0] == tokenizer.start_token_id).all()


def test_task_presets_round_trip_with_identical_logits(tokenizer, tmp_path):
    import keras_hub

    classifier = _classifier(tokenizer, num_classes=3)
    classifier.save_to_preset(str(tmp_path / "task"))
    assert {"config.json", "model.weights.h5", "tokenizer.json", "metadata.json", "task.json",
            "preprocessor.json"} <= {p.name for p in (tmp_path / "task").iterdir()}
    assert (tmp_path / "task" / "assets" / "tokenizer" / "vocab.bpe").is_file()
    reloaded = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "task"))
    assert type(reloaded) is type(classifier) and reloaded.num_classes == 3
    np.testing.assert_array_equal(reloaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))
    backbone = keras_hub.models.Backbone.from_preset(str(tmp_path / "task"))
    np.testing.assert_array_equal(backbone(np.array([[1, 2, 3]])), classifier.backbone(np.array([[1, 2, 3]])))


def test_core_restores_a_preset_without_keras_hub_classes(tmp_path):
    from gpt_tf.checkpoints import pretrained_model_config, restore_pretrained_lm
    from gpt_tf.model import GPTLanguageModel

    backbone = _backbone(seed=4)
    backbone.save_to_preset(str(tmp_path))
    lm = GPTLanguageModel.from_config_preset(pretrained_model_config(str(tmp_path)))
    restore_pretrained_lm(lm, str(tmp_path))
    x = np.array([[5, 6, 7, 8]])
    np.testing.assert_array_equal(lm(x), backbone.embed.logits(backbone(x)))


def test_release_shards_and_runs_convert_to_presets(tokenizer, tmp_path):
    import keras_hub

    from gpt_tf.gpt1 import presets
    from gpt_tf.model import GPTLanguageModel
    from gpt_tf.weights import save_gpt1_release

    lm = GPTLanguageModel(_backbone(seed=5))  # random weights, written in the release's format
    save_gpt1_release(lm, tmp_path / "shards")
    presets.preset_from_gpt1_shards(str(tmp_path / "shards"), str(BPE), str(tmp_path / "p"), model="test")
    converted = keras_hub.models.Backbone.from_preset(str(tmp_path / "p"))
    x = np.array([[5, 6, 7, 8, 9]])
    # the release carries no special-token rows (they keep their init): the BPE tokens' logits are equal
    np.testing.assert_array_equal(converted.embed.logits(converted(x))[..., :8000], lm(x)[..., :8000])


def test_clear_errors_for_num_classes_labels_and_unknown_presets(tokenizer):
    import gpt_tf

    with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
        gpt_tf.GPT1TextClassifier(_backbone(), num_classes=1)
    with pytest.raises(ValueError, match=r"(?s)Unknown preset identifier.*no_such_preset"):
        gpt_tf.GPT1TextClassifier.from_preset("no_such_preset", num_classes=2)
    classifier = _classifier(tokenizer)
    with pytest.raises(Exception, match=r"label is >= num_classes=2"):
        classifier.fit(TEXTS, [0, 1, 5], batch_size=3, verbose=0)


def test_regression_and_multiple_choice_fit_and_predict(tokenizer):
    import gpt_tf

    sts = gpt_tf.GPT1TextRegressor(_backbone(), gpt_tf.GPT1TaskPreprocessor(tokenizer))
    sts.fit((TEXTS, TEXTS[::-1]), [4.5, 0.5, 2.0], batch_size=3, verbose=0)
    assert sts.predict((TEXTS, TEXTS[::-1]), verbose=0).shape == (3,)
    cloze = gpt_tf.GPT1MultipleChoice(_backbone(), num_choices=2, preprocessor=gpt_tf.GPT1TaskPreprocessor(tokenizer))
    cloze.fit((TEXTS[:2], [["yes .", "no ."], ["maybe .", "never ."]]), [0, 1], batch_size=2, verbose=0)
    assert cloze.predict((TEXTS[:1], [["yes .", "no ."]]), verbose=0).shape == (1, 2)


def test_causal_lm_generates_text_and_never_a_special_token(tokenizer):
    import gpt_tf

    lm = gpt_tf.GPT1CausalLM(_backbone(), gpt_tf.GPT1CausalLMPreprocessor(tokenizer))
    lm.compile(sampler="greedy")
    out = lm.generate(["the man walked", "she"], max_length=12)
    assert len(out) == 2 and all(isinstance(t, str) and t for t in out)
    ids = lm.preprocessor.generate_preprocess(out, sequence_length=32)["token_ids"].numpy()
    assert ids.max() < tokenizer.pad_token_id + 1
    with pytest.raises(ValueError, match="longer than the model's context"):
        lm.generate("the", max_length=99)


def test_a_python_api_classifier_serves_raw_strings_in_a_tensorflow_only_process(tokenizer, tmp_path):
    import tensorflow as tf

    from serving.export import export_task

    classifier = _classifier(tokenizer)
    path = export_task(classifier, str(tmp_path), "api_sst2")
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((tmp_path / "api_sst2" / "1" / "saved_model.pb").read_bytes())
    library = {f.signature.name for g in proto.meta_graphs for f in g.graph_def.library.function}
    ops = {n.op for g in proto.meta_graphs for n in g.graph_def.node}
    ops |= {n.op for g in proto.meta_graphs for f in g.graph_def.library.function for n in f.node_def}
    assert sorted(op for op in ops - library if not hasattr(tf.raw_ops, op)) == []  # core TF ops only
    expected = tf.nn.softmax(classifier.predict(TEXTS, verbose=0)).numpy()
    script = TF_ONLY + textwrap.dedent(f"""
        out = tf.saved_model.load("{path}").signatures["serving_default"](sentence=tf.constant({TEXTS!r}))
        print(json.dumps({{"p": out["probabilities"].numpy().tolist(),
                          "modules": sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED))}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                          env={**ENV, "PYTHONPATH": "", "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == []
    np.testing.assert_allclose(got["p"], expected, atol=1e-5)
