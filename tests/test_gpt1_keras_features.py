"""What Keras and keras-hub do to a model, done to the GPT-1 family: it is a functional model on Keras layers.

``summary`` and ``plot_model`` show its graph; ``enable_lora`` trains the adapters alone; ``quantize("int8")``
quantizes every projection and the token table, and the int8 model saves, loads and exports; weights saved in the
earlier subclassed layout load, and ``gpt_tf.convert --preset`` re-saves them. Models are the ``test`` shape on the
tiny preset's 8k BPE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.small_runs import CHILD_SITE, ENV, TF_ONLY
from tests.small_runs import GPT1_TEXTS as TEXTS
from tests.small_runs import gpt1_backbone as _backbone
from tests.small_runs import gpt1_tokenizer

IDS = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]], "int32")
X = {"token_ids": IDS, "padding_mask": np.ones_like(IDS)}  # keras-hub's inputs (gpt_tf.gpt1.backbone.token_inputs)
PROJECTIONS = ("c_attn", "c_proj", "c_fc")


@pytest.fixture(scope="module")
def tokenizer():
    return gpt1_tokenizer()


def _leaves(model):
    return [layer for layer in model._flatten_layers(include_self=False) if not layer._layers]


def test_the_backbone_and_lm_are_functional_graphs_of_keras_layers(tmp_path):
    import keras

    import gpt_tf

    backbone = _backbone()
    assert set(backbone.input) == {"token_ids", "padding_mask"}  # a functional model's symbolic inputs and outputs
    assert isinstance(backbone.output, keras.KerasTensor) and backbone.output.shape == (None, None, 32)
    lm = gpt_tf.GPT1CausalLM(backbone)
    assert lm.input["token_ids"] is backbone.input["token_ids"] and lm.output.shape == (None, None, backbone.config.total_vocab)
    lines = []
    lm.summary(print_fn=lines.append, expand_nested=True)
    text = "\n".join(lines)
    for name in ("gpt1_backbone", "GPTEmbedding", "TransformerBlock", "token_ids", "padding_mask"):
        assert name in text, name
    projections = [layer for layer in _leaves(backbone) if layer.name in PROJECTIONS]
    assert len(projections) == 4 * backbone.config.n_layer
    assert all(isinstance(layer, keras.layers.Dense) for layer in projections)
    assert isinstance(backbone.token_embedding, keras.layers.ReversibleEmbedding)
    # the graph equals the layers run one by one, and the LM head is the token table's transpose
    np.testing.assert_array_equal(backbone(X), backbone.states(IDS))
    np.testing.assert_array_equal(lm(X), backbone.embed.logits(backbone(X)))
    keras.utils.model_to_dot(lm, expand_nested=True)  # plot_model's graph (pydot), without writing a picture


def test_lora_trains_the_adapters_alone_through_a_task(tokenizer):
    import keras

    import gpt_tf

    classifier = gpt_tf.GPT1TextClassifier(_backbone(), num_classes=2,
                                           preprocessor=gpt_tf.GPT1TaskPreprocessor(tokenizer))
    classifier.compile(learning_rate=1e-2, warmup_fraction=0.0)  # before LoRA: the optimizer is built by fit
    backbone = classifier.backbone
    backbone.enable_lora(4)
    names = sorted({v.path.split("/")[-1] for v in backbone.trainable_weights})
    assert names == ["lora_kernel_a", "lora_kernel_b"]
    assert len(backbone.trainable_weights) == 2 * backbone.config.n_layer
    head = [v for v in classifier.trainable_weights if not any(v is w for w in backbone.weights)]
    assert head and all("clf" in v.path for v in head)  # W_y trains with the adapters
    frozen = {v.path: np.array(v) for v in backbone.weights if "lora" not in v.path}
    adapters = {v.path: np.array(v) for v in backbone.trainable_weights}
    keras.utils.set_random_seed(1)
    classifier.fit(TEXTS, [0, 1, 0], batch_size=3, epochs=2, verbose=0)
    for v in backbone.weights:
        if v.path in frozen:
            np.testing.assert_array_equal(np.array(v), frozen[v.path], err_msg=v.path)  # frozen: not one bit moved
    assert any(not np.array_equal(np.array(v), adapters[v.path]) for v in backbone.trainable_weights)


def test_int8_quantizes_every_projection_and_the_token_table_and_saves_loads_and_exports(tokenizer, tmp_path):
    import keras

    import gpt_tf

    keras.utils.set_random_seed(0)
    lm = gpt_tf.GPT1CausalLM(_backbone(), gpt_tf.GPT1CausalLMPreprocessor(tokenizer, sequence_length=16))
    before = np.asarray(lm(X))
    lm.quantize("int8")
    quantized = {layer.path: layer.quantization_mode for layer in _leaves(lm) if layer.quantization_mode}
    expected = {f"h{i}/{scope}" for i in range(lm.backbone.config.n_layer)
                for scope in ("attn/c_attn", "attn/c_proj", "mlp/c_fc", "mlp/c_proj")} | {"embed/tokens_embed"}
    assert set(quantized) == expected and set(quantized.values()) == {"int8"}
    after = np.asarray(lm(X))
    assert 0 < np.abs(after - before).max() < 0.05 * np.abs(before).max()  # int8's rounding, not another model
    lm.save(tmp_path / "lm.keras")
    np.testing.assert_array_equal(keras.saving.load_model(tmp_path / "lm.keras")(X), after)
    lm.save_to_preset(tmp_path / "preset")
    np.testing.assert_array_equal(gpt_tf.GPT1CausalLM.from_preset(str(tmp_path / "preset"))(X), after)
    classifier = gpt_tf.GPT1TextClassifier(_backbone(), num_classes=2,
                                           preprocessor=gpt_tf.GPT1TaskPreprocessor(tokenizer))
    classifier.quantize("int8")
    assert all(layer.quantization_mode == "int8" for layer in _leaves(classifier.backbone) if layer.name in PROJECTIONS)
    import tensorflow as tf

    want = tf.nn.softmax(classifier.predict(TEXTS, verbose=0)).numpy()
    from serving.export import export_task_at

    path = export_task_at(classifier, str(tmp_path / "exported"))
    script = ("import json, sys, tensorflow as tf\n"
              f"out = tf.saved_model.load({path!r}).signatures['serving_default'](sentence=tf.constant({TEXTS!r}))\n"
              "print(json.dumps(out['probabilities'].numpy().tolist()))\n")
    proc = subprocess.run([sys.executable, "-c", TF_ONLY + script], capture_output=True, text=True, timeout=300,
                          check=False, env={**ENV, "PYTHONPATH": CHILD_SITE, "TF_CPP_MIN_LOG_LEVEL": "3"},
                          cwd=str(tmp_path))  # TensorFlow alone: stock TF Serving's situation
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(json.loads(proc.stdout.strip().splitlines()[-1]), want, atol=1e-5)


def test_int8_on_tensorflow_computes_kerass_int8_arithmetic(tokenizer):
    """The int8 projections' and LM head's TensorFlow path (the int8 product as a float32 MatMul) gives Keras's own
    int8 call's numbers: the same integers at these inner sizes (≤ 1040), so equal to the bit."""
    import keras

    import gpt_tf

    keras.utils.set_random_seed(0)
    lm = gpt_tf.GPT1CausalLM(_backbone(), gpt_tf.GPT1CausalLMPreprocessor(tokenizer, sequence_length=16))
    lm.quantize("int8")
    h = np.random.default_rng(0).normal(size=(2, 6, 32)).astype("float32") * 3
    layers = [layer for layer in _leaves(lm.backbone) if layer.name in PROJECTIONS]
    assert layers
    for layer in layers:
        x = h if layer.kernel.shape[0] == 32 else np.tile(h, (1, 1, layer.kernel.shape[0] // 32))
        np.testing.assert_array_equal(layer(x), keras.layers.Dense._int8_call(layer, x), err_msg=layer.path)
    table = lm.backbone.token_embedding
    np.testing.assert_array_equal(table(h, reverse=True), keras.layers.ReversibleEmbedding._int8_call(table, h, reverse=True))


def test_weights_in_fewer_bytes_keep_the_models_numbers_and_export_to_smaller_core_op_savedmodels(tokenizer,
                                                                                                  tmp_path):
    """``weight_formats.with_weights``: a copy holding bfloat16, int8 or weight-only int8 weights (the float model
    untouched) gives logits within the format's rounding of float32's (bfloat16's LM head: float32 logits), and
    generates, and a task exports (``serving.export --weights``) to a smaller SavedModel of core
    TF ops that a TensorFlow-only process answers as the model in memory does."""
    import keras
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    import gpt_tf
    from gpt_tf.gpt1.weight_formats import WEIGHTS, weights_of, with_weights
    from serving.export import export_task_at

    lm = gpt_tf.GPT1CausalLM(_backbone(), gpt_tf.GPT1CausalLMPreprocessor(tokenizer, sequence_length=16))
    lm.compile(sampler="greedy")
    want, text = np.asarray(lm(X)), lm.generate(TEXTS[:2], max_length=16)
    for weights in WEIGHTS:
        copy = with_weights(lm, weights)
        assert weights_of(copy) == weights and weights_of(lm) == "float32"
        got = copy(X)
        assert keras.backend.standardize_dtype(got.dtype) == "float32"
        assert np.abs(np.asarray(got) - want).max() < 0.05 * np.abs(want).max(), weights
        copy.compile(sampler="greedy")  # random weights: near ties, so the same text is not asked for
        assert [t[:8] for t in copy.generate(TEXTS[:2], max_length=16)] == [t[:8] for t in text], weights
    with pytest.raises(ValueError, match="weights must be one of"):
        with_weights(lm, "int4")
    classifier = gpt_tf.GPT1TextClassifier(_backbone(), num_classes=2, preprocessor=gpt_tf.GPT1TaskPreprocessor(tokenizer))
    sizes = {}
    for weights in ("float32", "bfloat16"):  # int8: test_int8_quantizes_every_projection_...
        model = with_weights(classifier, weights)
        expected = tf.nn.softmax(model.predict(TEXTS, verbose=0)).numpy()
        path = export_task_at(model, str(tmp_path / weights))
        sizes[weights] = sum(f.stat().st_size for f in (tmp_path / weights / "variables").iterdir())
        proto = saved_model_pb2.SavedModel.FromString(open(f"{path}/saved_model.pb", "rb").read())
        ops = {n.op for g in proto.meta_graphs for f in g.graph_def.library.function for n in f.node_def}
        assert not {op for op in ops if op.startswith(("Gpt", "Quantized", "_"))}, weights
        script = ("import json, sys, tensorflow as tf\n"
                  f"out = tf.saved_model.load({path!r}).signatures['serving_default'](sentence=tf.constant({TEXTS!r}))\n"
                  "print(json.dumps(out['probabilities'].numpy().tolist()))\n")
        proc = subprocess.run([sys.executable, "-c", TF_ONLY + script], capture_output=True, text=True, timeout=300,
                              check=False, env={**ENV, "PYTHONPATH": CHILD_SITE, "TF_CPP_MIN_LOG_LEVEL": "3"},
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        np.testing.assert_allclose(json.loads(proc.stdout.strip().splitlines()[-1]), expected, atol=1e-2)
    assert sizes["bfloat16"] < 0.6 * sizes["float32"], sizes


def test_a_task_preset_holds_the_head_and_as_keras_hubs_the_optimizers_state(tokenizer, tmp_path):
    """``save_to_preset`` after ``fit``: ``task.weights.h5`` holds W_y (the backbone is ``model.weights.h5``) and, as
    keras-hub's own tasks save it, the optimizer's state; the preset loads to the same predictions, and so does one
    of an uncompiled task (no optimizer state: what the command line's conversion writes)."""
    import gpt_tf

    classifier = gpt_tf.GPT1TextClassifier(_backbone(), num_classes=2,
                                           preprocessor=gpt_tf.GPT1TaskPreprocessor(tokenizer))
    classifier.compile(learning_rate=1e-2, warmup_fraction=0.0)
    classifier.fit(TEXTS, [0, 1, 0], batch_size=3, verbose=0)
    assert classifier.optimizer.variables  # Adam's moments exist: the case in point
    want = classifier.predict(TEXTS, verbose=0)
    classifier.save_to_preset(tmp_path / "preset")
    stored = _datasets(tmp_path / "preset" / "task.weights.h5")
    optimizer = {name: shape for name, shape in stored.items() if name.startswith("optimizer")}
    model = {name: shape for name, shape in stored.items() if name not in optimizer}
    head = [v for v in classifier.weights if not any(v is w for w in classifier.backbone.weights)]
    assert model and sum(map(np.prod, model.values())) == sum(np.prod(v.shape) for v in head)  # W_y alone
    assert optimizer and max(map(np.prod, optimizer.values())) == classifier.backbone.embed.tokens_embed.numpy().size
    np.testing.assert_array_equal(gpt_tf.GPT1TextClassifier.from_preset(str(tmp_path / "preset")).predict(TEXTS, verbose=0), want)
    bare = gpt_tf.GPT1TextClassifier(classifier.backbone, 2, classifier.preprocessor, compile=False)  # as converted
    bare.get_layer("head").set_weights(classifier.get_layer("head").get_weights())
    bare.save_to_preset(tmp_path / "bare")
    assert not any(name.startswith("optimizer") for name in _datasets(tmp_path / "bare" / "task.weights.h5"))
    np.testing.assert_array_equal(gpt_tf.GPT1TextClassifier.from_preset(str(tmp_path / "bare")).predict(TEXTS, verbose=0), want)


def test_a_saved_task_keeps_its_lambda_and_its_compile_config(tokenizer, tmp_path):
    """``model.save`` keeps the task's arguments (λ is ``lm_coef``, a constructor argument) and Keras's compile config,
    whose optimizer, ``GPTAdamW`` on the paper's ``WarmupDecay``, deserialises as it was. As with keras-hub's own
    tasks (a custom ``compile``), ``load_model`` leaves the compiling to the caller (Keras says so); compiled with the
    saved config, the loaded task has the recipe it was saved with."""
    import json
    import warnings
    import zipfile

    import keras

    import gpt_tf
    from gpt_tf.nn.optim import GPTAdamW, WarmupDecay

    classifier = gpt_tf.GPT1TextClassifier(_backbone(), num_classes=2, lm_coef=0.25,
                                           preprocessor=gpt_tf.GPT1TaskPreprocessor(tokenizer))
    classifier.compile(learning_rate=1e-3, warmup_fraction=0.1, train_steps=100)
    classifier.save(tmp_path / "task.keras")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.saving.load_model(tmp_path / "task.keras")
    assert [w for w in caught if "`compile()` was not called" in str(w.message)]  # Keras's word on a custom compile
    assert loaded.lm_coef == 0.25 and loaded.get_layer("extract").lm_coef == 0.25
    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))
    saved = json.loads(zipfile.ZipFile(tmp_path / "task.keras").read("config.json"))["compile_config"]
    config = keras.saving.deserialize_keras_object(saved)
    optimizer = config["optimizer"]
    assert type(optimizer) is GPTAdamW and (optimizer.clip_norm, optimizer.weight_decay) == (1.0, 0.01)
    schedule = optimizer._learning_rate  # pylint: disable=protected-access
    assert type(schedule) is WarmupDecay and schedule.get_config() == {"peak": 1e-3, "warmup_steps": 10,
                                                                        "total_steps": 100, "decay": "linear"}
    loaded.compile(**config)
    mine, theirs = (dict(m.optimizer.get_config(), name=None) for m in (loaded, classifier))
    assert mine == theirs
    assert type(loaded.loss) is type(classifier.loss)


def _datasets(path) -> dict:
    """An .h5 file's arrays: name -> shape."""
    import h5py

    found = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: found.update({name: obj.shape}) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_weights_of_the_earlier_layout_load_and_convert_to_todays(tokenizer, tmp_path):
    """A preset of the earlier subclassed layout (written here by hand, as that code laid its arrays out) loads
    through ``from_preset`` and re-saves with ``python -m gpt_tf.convert --preset``; the logits are the same."""
    import h5py

    import gpt_tf
    from gpt_tf.convert.layout import all_block_slots

    source = _backbone(seed=3)
    source.save_to_preset(str(tmp_path / "new"))
    tokenizer.save_to_preset(str(tmp_path / "new"))
    want = np.asarray(source(X))
    old = tmp_path / "old"
    old.mkdir()
    for name in os.listdir(tmp_path / "new"):
        if name != "model.weights.h5":
            os.replace(tmp_path / "new" / name, old / name)
    with h5py.File(old / "model.weights.h5", "w") as f:
        for k, table in enumerate((source.embed.tokens_embed, source.embed.positions_embed)):
            f[f"embed/vars/{k}"] = np.array(table).astype("float16")
        layers = ("attn/c_attn", "attn/c_proj", "ln_1", "mlp/c_fc", "mlp/c_proj", "ln_2")
        slots = all_block_slots(source)
        for i in range(source.config.n_layer):
            block = "transformer_block" + (f"_{i}" if i else "")
            for j, layer in enumerate(layers):
                for k in (0, 1):
                    f[f"blocks/{block}/{layer}/vars/{k}"] = np.array(slots[12 * i + 2 * j + k][2]).astype("float16")
    got = gpt_tf.GPT1Backbone.from_preset(str(old))
    np.testing.assert_allclose(np.asarray(got(X)), want, atol=2e-2)  # float16 storage: the arrays' roundings
    proc = subprocess.run([sys.executable, "-m", "gpt_tf.convert", f"--preset={old}", f"--preset_dir={tmp_path / 'resaved'}"],
                          capture_output=True, text=True, timeout=300, check=False, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(tmp_path / "resaved" / "model.weights.h5") as f:
        assert "layers" in f and "blocks" not in f
        stored = set()
        f.visititems(lambda _, item: stored.add(str(item.dtype)) if isinstance(item, h5py.Dataset) else None)
    assert stored == {"float16"}  # float16 storage stays float16
    np.testing.assert_array_equal(gpt_tf.GPT1Backbone.from_preset(str(tmp_path / "resaved"))(X), got(X))
    with h5py.File(old / "model.weights.h5", "a") as f:
        del f["blocks/transformer_block_1/ln_2"]
    with pytest.raises(ValueError, match="transformer_block_1/ln_2/vars is missing"):
        gpt_tf.GPT1Backbone.from_preset(str(old))
