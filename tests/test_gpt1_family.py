"""GPT-1 as a keras-hub model family (``gpt_tf/gpt1/``): registration, numerics equal to the project's
model, presets (round trips keep the logits; runs and release shards convert; ``books_tiny`` ships),
the tasks' inputs and errors, generation, and serving of a Python-API classifier in a TF-only process (the
presets' model cards: tests/test_model_cards.py).

Models are the ``test`` shape on books_tiny's 8k BPE (fast); books_tiny itself is loaded where it is the point.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.small_runs import BOOKS_TINY as BOOKS
from tests.small_runs import BOOKS_TINY_BPE as BPE
from tests.small_runs import CHILD_SITE, ENV, TF_ONLY, TWO_PATHS
from tests.small_runs import GPT1_TEXTS as TEXTS
from tests.small_runs import gpt1_backbone as _backbone
from tests.small_runs import gpt1_classifier as _classifier
from tests.small_runs import gpt1_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return gpt1_tokenizer()


def token_inputs(ids):
    """keras-hub's backbone inputs of token ids (``gpt_tf.gpt1.backbone.token_inputs``; imported at first use)."""
    from gpt_tf.gpt1.backbone import token_inputs as inputs

    return inputs(ids)


def test_import_is_light_and_importing_the_family_registers_it_with_keras_hub():
    script = textwrap.dedent(f"""
        import sys
        import gpt_tf
        assert "tensorflow" not in sys.modules and "keras_hub" not in sys.modules, "import gpt_tf must stay light"
        import keras_hub
        assert "gpt_tf.gpt1" not in sys.modules, "importing keras-hub must not import the family behind one's back"
        import gpt_tf.gpt1
        backbone = keras_hub.models.Backbone.from_preset("{BOOKS}")
        classifier = keras_hub.models.TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)
        named = gpt_tf.GPT1TextClassifier.from_preset("books_tiny", num_classes=2)  # the preset's earlier name
        print(type(backbone).__name__, type(classifier).__name__, type(named).__name__,
              {{"gpt1_tiny_books_en", "gpt1_small_books_en"}} <= set(keras_hub.models.Backbone.presets),
              "books_tiny" not in keras_hub.models.Backbone.presets)  # an earlier name loads but is not listed
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd="/", env=ENV, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["GPT1Backbone", "GPT1TextClassifier", "GPT1TextClassifier", "True", "True"]


def test_predict_on_texts_computes_what_the_model_computes_on_their_features(tokenizer):
    classifier = _classifier(tokenizer, "pair_symmetric")
    features = classifier.preprocessor({"sentence1": TEXTS, "sentence2": TEXTS[::-1]})  # a tuple would be (x, y)
    from gpt_tf.data.task_batches import bucket_lengths

    assert features["input_ids"].shape[1] == 2 and features["input_ids"].shape[2] in bucket_lengths(32)
    # two paths (predict's traced graph, an eager call of the model): within TWO_PATHS
    np.testing.assert_allclose(classifier.predict((TEXTS, TEXTS[::-1]), verbose=0),
                               classifier(features).numpy(), **TWO_PATHS)


def test_preprocessor_applies_the_papers_transformations(tokenizer):
    import tensorflow as tf

    import gpt_tf
    from gpt_tf.data.transforms import transform_record

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


def test_causal_lm_preprocessor_takes_one_string_or_a_batch_eagerly_and_in_tf_data(tokenizer):
    """As keras-hub's: one string gives outputs of one rank less, and ``ds.map(preprocessor)`` before ``batch`` (on
    ``(text, label)`` pairs: the labels are replaced) gives the eager batch's values (one pipeline: each takes
    seconds to start, the in-graph tokenizer's)."""
    import tensorflow as tf

    import gpt_tf

    pre = gpt_tf.GPT1CausalLMPreprocessor(tokenizer, sequence_length=16)
    batch = _lm_arrays(pre(TEXTS))
    assert [t.shape for t in batch] == [(3, 16)] * 4  # token_ids, padding_mask, next ids, their mask
    for got, want in zip(_lm_arrays(pre(TEXTS[1])), batch):
        np.testing.assert_array_equal(got, want[1])
    prompt = pre.generate_preprocess(TEXTS[1])
    assert prompt["token_ids"].shape == (16,)
    np.testing.assert_array_equal(prompt["token_ids"], pre.generate_preprocess(TEXTS)["token_ids"][1])
    assert pre.generate_postprocess(prompt) == TEXTS[1]
    labelled = tf.data.Dataset.from_tensor_slices((TEXTS, [0, 1, 2]))
    for got, want in zip(_lm_arrays(next(iter(labelled.map(pre).batch(3)))), batch):
        np.testing.assert_array_equal(got, want)


def test_preprocessors_from_a_preset_take_the_backbones_sequence_length():
    """A preset without ``preprocessor.json`` gives the backbone's ``max_sequence_length`` (books_tiny's 128), through
    the family's class or keras-hub's base class; a ``sequence_length`` given wins."""
    import keras_hub

    import gpt_tf

    classes = (gpt_tf.GPT1CausalLMPreprocessor, keras_hub.models.CausalLMPreprocessor, gpt_tf.GPT1TaskPreprocessor,
               keras_hub.models.TextClassifierPreprocessor)
    loaded = [cls.from_preset("gpt1_tiny_books_en") for cls in classes]
    assert [(type(p).__name__, p.sequence_length) for p in loaded] == [
        ("GPT1CausalLMPreprocessor", 128), ("GPT1CausalLMPreprocessor", 128), ("GPT1TaskPreprocessor", 128),
        ("GPT1TaskPreprocessor", 128)]
    assert loaded[0](TEXTS[0])[0]["token_ids"].shape == (128,)
    assert loaded[2](TEXTS[0])["input_ids"].shape == (1, 128)  # one example: padded to sequence_length
    assert loaded[2](TEXTS)["input_ids"].shape == (3, 1, 128)  # a batch too, by default (keras-hub's one length)
    bucketed = gpt_tf.GPT1TaskPreprocessor.from_preset("gpt1_tiny_books_en", pad_to_bucket=True)
    assert bucketed(TEXTS)["input_ids"].shape == (3, 1, 16)  # a batch: to its bucket
    assert gpt_tf.GPT1CausalLMPreprocessor.from_preset("gpt1_tiny_books_en", sequence_length=20).sequence_length == 20
    with pytest.raises(ValueError, match="sequence_length is not set"):
        gpt_tf.GPT1CausalLMPreprocessor(loaded[0].tokenizer)(TEXTS)


def test_task_preprocessor_pads_to_sequence_length_so_map_then_batch_works(tokenizer):
    """keras-hub's pipeline ``from_tensor_slices((texts, labels)).map(preprocessor).batch(n)`` on texts of different
    lengths: one example is padded to ``sequence_length`` (features of one rank less), so the batches stack. A batch
    is padded to the length bucket of its longest view with ``pad_to_bucket=True``, or to ``sequence_length`` (the
    default, keras-hub's one length); ``features`` pads to ``"length"``, ``"bucket"`` or ``"longest"`` (the served
    models')."""
    import tensorflow as tf

    import gpt_tf

    pre = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=32, pad_to_bucket=True)
    full = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=32)
    features = {k: np.asarray(v) for k, v in full(TEXTS).items()}
    assert {k: v.shape for k, v in features.items()} == {"input_ids": (3, 1, 32), "extract_index": (3, 1),
                                                         "lm_weights": (3, 1, 32)}
    for key, value in pre(TEXTS[1]).items():
        np.testing.assert_array_equal(value, features[key][1])
    got, labels = next(iter(tf.data.Dataset.from_tensor_slices((TEXTS, [1, 0, 1])).map(pre).batch(3)))
    assert labels.numpy().tolist() == [1, 0, 1]
    for key, value in got.items():
        np.testing.assert_array_equal(value, features[key])
    bucketed = pre(TEXTS)
    length = bucketed["input_ids"].shape[2]
    longest = int(features["extract_index"].max()) + 1
    assert length == 16 > longest  # the bucket of the longest view, not 32
    for key in ("input_ids", "lm_weights"):
        np.testing.assert_array_equal(bucketed[key], features[key][:, :, :length])
    np.testing.assert_array_equal(bucketed["extract_index"], features["extract_index"])
    fields = {"sentence": tf.constant(TEXTS)}
    for padding, want in (("length", 32), ("bucket", length), ("longest", longest)):
        out = pre.features(fields, padding=padding)
        assert out["input_ids"].shape == (3, 1, want), padding
        np.testing.assert_array_equal(out["input_ids"], features["input_ids"][:, :, :want])
    with pytest.raises(ValueError, match="padding must be one of"):
        pre.features(fields, padding="bucketed")
    task = gpt_tf.GPT1TextClassifier(_backbone(), 2, pre)
    assert task.preprocess_samples(TEXTS)["input_ids"].shape[2] == length
    assert gpt_tf.GPT1TextClassifier.from_config(task.get_config()).preprocessor.pad_to_bucket is True

    choice = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=32, input_type="multiple_choice", num_choices=2)
    choices = [["yes .", "no , not at all ."], ["maybe .", "never ."]]
    one = choice({"context": TEXTS[0], "choices": choices[0]})
    assert one["input_ids"].shape == (2, 32) and one["extract_index"].shape == (2,)
    batch = choice({"context": TEXTS[:2], "choices": choices})["input_ids"]  # [2, 2, its bucket]
    width = batch.shape[2]
    np.testing.assert_array_equal(one["input_ids"][:, :width], batch[0])
    assert (np.asarray(one["input_ids"])[:, width:] == tokenizer.pad_token_id).all()


def _lm_arrays(outputs) -> list:
    """The language model preprocessor's ``(x, y, sample_weight)`` as arrays: token ids, padding mask, y, weights."""
    x, y, sample_weight = outputs
    return [np.asarray(t) for t in (x["token_ids"], x["padding_mask"], y, sample_weight)]


def test_task_presets_round_trip_with_identical_logits(tokenizer, tmp_path):
    import keras_hub

    classifier = _classifier(tokenizer, num_classes=3)
    classifier.save_to_preset(str(tmp_path / "task"))
    assert {"config.json", "model.weights.h5", "tokenizer.json", "metadata.json", "task.json",
            "preprocessor.json"} <= {p.name for p in (tmp_path / "task").iterdir()}
    assert (tmp_path / "task" / "assets" / "tokenizer" / "vocab.bpe").is_file()
    reloaded = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "task"))
    assert type(reloaded) is type(classifier) and reloaded.num_classes == 3
    # Bit for bit on every CPU: the weights are stored and read exactly, and each side runs the same ops on the same
    # shapes (the same traced predict, then the same eager backbone call), which round the same way run after run.
    np.testing.assert_array_equal(reloaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))
    backbone = keras_hub.models.Backbone.from_preset(str(tmp_path / "task"))
    x = token_inputs(np.array([[1, 2, 3]]))
    np.testing.assert_array_equal(backbone(x), classifier.backbone(x))


def test_the_loops_language_model_starts_from_a_preset(tmp_path):
    from gpt_tf.convert.pretrained import pretrained_model_config, restore_pretrained_lm
    from gpt_tf.gpt1.build import causal_lm_for

    backbone = _backbone(seed=4)
    backbone.save_to_preset(str(tmp_path))
    lm = causal_lm_for(pretrained_model_config(str(tmp_path)))
    restore_pretrained_lm(lm, str(tmp_path))
    x = token_inputs(np.array([[5, 6, 7, 8]]))
    # Bit for bit on every CPU: exact weights, and the LM's call is these same eager ops on the same shapes.
    np.testing.assert_array_equal(lm(x), backbone.embed.logits(backbone(x)))


def test_release_shards_and_runs_convert_to_presets(tokenizer, tmp_path):
    import keras_hub

    from gpt_tf.convert import presets
    from gpt_tf.gpt1.causal_lm import GPT1CausalLM
    from gpt_tf.convert.release import save_gpt1_release

    lm = GPT1CausalLM(_backbone(seed=5))  # random weights, written in the release's format
    save_gpt1_release(lm, tmp_path / "shards")
    presets.preset_from_gpt1_shards(str(tmp_path / "shards"), str(BPE), str(tmp_path / "p"), model="test")
    converted = keras_hub.models.Backbone.from_preset(str(tmp_path / "p"))
    x = token_inputs(np.array([[5, 6, 7, 8, 9]]))
    # the release carries no special-token rows (they keep their init): the BPE tokens' logits are equal, bit for bit
    # on every CPU (the shards hold the exact float32 values; both sides run the same eager ops on the same shapes)
    np.testing.assert_array_equal(converted.embed.logits(converted(x))[..., :8000], lm(x)[..., :8000])


def test_clear_errors_for_num_classes_labels_and_unknown_presets(tokenizer, tmp_path):
    import re

    import gpt_tf

    for bad in (0, 1, 2.0):
        with pytest.raises(ValueError, match=f"num_classes must be an integer >= 2, got {bad!r}"):
            gpt_tf.GPT1TextClassifier(_backbone(), num_classes=bad)
    for bad in (1, True, 2.0):
        with pytest.raises(ValueError, match=f"num_choices must be an integer >= 2, got {bad!r}"):
            gpt_tf.GPT1MultipleChoice(_backbone(), num_choices=bad)
    for bad in (-0.5, True):
        with pytest.raises(ValueError, match=f"lm_coef must be >= 0, got {bad!r}"):
            gpt_tf.GPT1TextClassifier(_backbone(), num_classes=2, lm_coef=bad)
    # keras-hub's own errors (the family adds none): the name or folder given, and what a preset holds
    with pytest.raises(ValueError, match=r"Unknown preset identifier(.|\n)*Received: preset='no_such_preset'"):
        gpt_tf.GPT1TextClassifier.from_preset("no_such_preset", num_classes=2)
    with pytest.raises(ValueError, match=r"Unknown preset identifier(.|\n)*" + re.escape(str(tmp_path / "gone"))):
        gpt_tf.GPT1Backbone.from_preset(str(tmp_path / "gone"))
    with pytest.raises(ValueError, match=f"Preset {re.escape(str(tmp_path))} has no config.json"):
        gpt_tf.GPT1Tokenizer.from_preset(str(tmp_path))
    classifier = _classifier(tokenizer, num_classes=3)
    classifier.save_to_preset(str(tmp_path / "three"))
    with pytest.raises(ValueError, match=r"num_classes=2 but 3 label_names \(0, 1, 2\): .* needs its own label_names"):
        gpt_tf.GPT1TextClassifier.from_preset(str(tmp_path / "three"), num_classes=2)
    fresh = gpt_tf.GPT1TextClassifier.from_preset(str(tmp_path / "three"), num_classes=2, label_names=["no", "yes"])
    assert fresh.label_names == ("no", "yes")
    with pytest.raises(Exception, match=r"label value of 5 which is outside the valid range of \[0, 3\)"):
        classifier.fit(TEXTS, [0, 1, 5], batch_size=3, verbose=0)  # the compiled loss's own check


def test_public_classes_document_an_example_and_summarise(tokenizer):
    import gpt_tf

    for name in gpt_tf.__all__:
        doc = getattr(gpt_tf, name).__doc__ or ""
        assert "Example" in doc and "```python" in doc and "from_preset" in doc, name
    lines = []
    _classifier(tokenizer).summary(print_fn=lambda line, **_: lines.append(line))
    text = "\n".join(lines)
    assert "gpt1_text_classifier" in text.lower() and "Total params" in text, text


def test_tokenizer_special_tokens_follow_the_bpe_ids(tokenizer):
    bpe = tokenizer.bpe_vocabulary_size
    assert tokenizer.special_tokens == ["_start_", "_delimiter_", "_classify_", "_pad_"]
    assert tokenizer.special_token_ids == [bpe, bpe + 1, bpe + 2, bpe + 3] == [
        tokenizer.start_token_id, tokenizer.delimiter_token_id, tokenizer.extract_token_id, tokenizer.pad_token_id]
    assert tokenizer.token_to_id("_classify_") == bpe + 2 and tokenizer.id_to_token(bpe + 3) == "_pad_"
    assert tokenizer.vocabulary_size() == len(tokenizer.get_vocabulary()) == bpe + 4
    import gpt_tf

    empty = gpt_tf.GPT1Tokenizer()
    assert not empty.loaded and empty.start_token_id is None
    with pytest.raises(ValueError, match="no vocabulary"):
        empty.special_token_ids


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
    """``serving.export.export_task_at(classifier, path)`` of a classifier built in Python (the SavedModel of
    ``serving.export.export_task``, at ``path``): ``serving_default`` takes raw strings, the graph holds core
    TF ops only (no TF-Text op, no custom op: also where the speed choices take every custom path they have), and it
    answers where only ``tensorflow`` is imported."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    from gpt_tf.speed import choices

    classifier = _classifier(tokenizer)
    from serving.export import export_task_at

    every = choices.SpeedChoices(padded_grads=(choices.EVERY,), inference_gelu=(choices.EVERY,))
    with choices.using(every):
        paths = [export_task_at(classifier, str(tmp_path / "keras_export"))]
    assert paths[0] == str(tmp_path / "keras_export")
    for path in paths:
        proto = saved_model_pb2.SavedModel.FromString(open(f"{path}/saved_model.pb", "rb").read())
        library = {f.signature.name for g in proto.meta_graphs for f in g.graph_def.library.function}
        ops = {n.op for g in proto.meta_graphs for n in g.graph_def.node}
        ops |= {n.op for g in proto.meta_graphs for f in g.graph_def.library.function for n in f.node_def}
        assert sorted(op for op in ops - library if not hasattr(tf.raw_ops, op)) == []  # core TF ops only
        inputs = proto.meta_graphs[0].signature_def["serving_default"].inputs
        assert {k: v.dtype for k, v in inputs.items()} == {"sentence": tf.string.as_datatype_enum}
    expected = tf.nn.softmax(classifier.predict(TEXTS, verbose=0)).numpy()
    script = TF_ONLY + textwrap.dedent(f"""
        got = [tf.saved_model.load(path).signatures["serving_default"](sentence=tf.constant({TEXTS!r}))
               for path in {[str(p) for p in paths]!r}]
        print(json.dumps({{"p": [out["probabilities"].numpy().tolist() for out in got],
                          "modules": sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED))}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False,
                          env={**ENV, "PYTHONPATH": CHILD_SITE, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == []
    for probabilities in got["p"]:
        np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    with pytest.raises(FileExistsError, match="keras_export already exists"):
        export_task_at(classifier, str(tmp_path / "keras_export"))
