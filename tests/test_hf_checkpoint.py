"""GPT-1 as ``transformers`` publishes it (``gpt_tf/convert/hf.py``), offline: a random ``OpenAIGPTLMHeadModel``
(seeded) written by ``save_pretrained``, with ``vocab.json`` + ``merges.txt`` made from GPT-1's released BPE files
in Hugging Face's layout, loads into the family with the logits ``transformers`` computes on the same folder; the
same from ``pytorch_model.bin``, and from an ``hf://`` handle through a Hugging Face cache filled here
(``HF_HUB_OFFLINE=1``); its tokenizer gives the ids of GPT-1's BPE files; every class of the family builds from it;
the command lines convert it, fine-tune from it and export the classifier; a broken checkpoint is one error naming
the file and the tensor, with nothing assigned.

The default suite runs a small shape (2 blocks of 32 dims, 64 positions, GPT-1's 40,478 BPE rows) on TensorFlow; the
test marked ``slow`` runs GPT-1's own shape (12 × 768, 512 positions, 117M parameters) on TensorFlow, JAX and
PyTorch, a process each (this file run as a script): ``python -m pytest -m slow tests/test_hf_checkpoint.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.offline_hubs import GPT1_BPE, HF_REPO as REPO, SMALL, backbone_weights, cached_checkpoint, fill_hub_cache
from tests.offline_hubs import hub_env, transformers_logits
from tests.small_runs import ROOT

FULL = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 512}  # GPT-1 (transformers' defaults)
V = 40478  # GPT-1's BPE tokens
HANDLE = f"hf://{REPO}"
CLOSE = 1e-5  # our float32 logits against transformers': two frameworks' kernels (tests/test_weights.py: 3.4e-6 seen)
TEXTS = ["the man walked into the room and sat down .", "a gripping , beautifully acted film .", "she said nothing ."]


def token_ids(length: int) -> np.ndarray:
    """Two rows of ids over the whole BPE range (its first and last rows included), ``length`` positions."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, (2, length)).astype("int32")
    ids[0, :3], ids[1, :3] = (0, 1, V - 1), (V - 2, 40000, 5)
    return ids


def our_logits(source, ids: np.ndarray) -> np.ndarray:
    """The family's language model from ``source`` (a folder or a handle): the logits of the BPE columns."""
    import keras

    import gpt_tf
    from gpt_tf.convert.hf import from_hf
    from gpt_tf.gpt1.backbone import token_inputs

    lm = from_hf(gpt_tf.GPT1CausalLM, str(source))
    return keras.ops.convert_to_numpy(lm(token_inputs(ids)))[..., :V]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small checkpoint, both weight formats, and an HF_HOME whose cache holds it as ``hf://{REPO}``."""
    return cached_checkpoint(tmp_path_factory.mktemp("hf_small"))


@pytest.fixture
def offline_hub(monkeypatch):
    """``offline_hub(hf_home)``: this process reads the Hugging Face cache at ``hf_home`` only, as ``HF_HOME`` and
    ``HF_HUB_OFFLINE=1`` make it (huggingface_hub reads them when it is imported, so its constants are set too)."""
    from huggingface_hub import constants

    def use(hf_home: Path):
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    return use


# ----------------------------------------------------------------------------- the default suite: the small shape
def test_lm_logits_equal_transformers_on_the_same_folder(small):
    ids = token_ids(SMALL["n_positions"])
    ours, reference = our_logits(small["safetensors"], ids), transformers_logits(small["safetensors"], ids)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=CLOSE)


def test_the_bpe_rows_are_the_checkpoints_and_the_special_rows_are_drawn_afresh(small):
    """The 40,478 rows and the positions copied bit for bit; the four special rows N(0, 0.02), the same at each load."""
    from safetensors.numpy import load_file

    import gpt_tf
    from gpt_tf.convert.hf import from_hf

    state = load_file(small["safetensors"] / "model.safetensors")
    first, second = (from_hf(gpt_tf.GPT1Backbone, str(small["safetensors"])) for _ in range(2))
    table = backbone_weights(first)[0]
    assert table.shape == (V + 4, SMALL["n_embd"])
    np.testing.assert_array_equal(table[:V], state["transformer.tokens_embed.weight"])
    np.testing.assert_array_equal(backbone_weights(first)[1], state["transformer.positions_embed.weight"])
    special = table[V:]
    assert 0.01 < special.std() < 0.03 and abs(special.mean()) < 0.01, special.std()
    np.testing.assert_array_equal(special, backbone_weights(second)[0][V:])
    assert not np.allclose(special, 0) and not any(np.array_equal(row, table[0]) for row in special)


def test_pytorch_model_bin_gives_the_same_weights_and_transformers_logits(small):
    import gpt_tf
    from gpt_tf.convert.hf import from_hf

    assert not (small["bin"] / "model.safetensors").exists()
    for a, b in zip(backbone_weights(from_hf(gpt_tf.GPT1Backbone, str(small["bin"]))),
                    backbone_weights(from_hf(gpt_tf.GPT1Backbone, str(small["safetensors"])))):
        np.testing.assert_array_equal(a, b)
    ids = token_ids(16)
    np.testing.assert_allclose(our_logits(small["bin"], ids), transformers_logits(small["bin"], ids), rtol=0, atol=CLOSE)


def test_pytorch_model_bin_without_torch_names_what_to_install(small, monkeypatch):
    import gpt_tf
    from gpt_tf.convert.hf import CheckpointError, from_hf

    backbone_cls = gpt_tf.GPT1Backbone  # Keras imported first: it imports libraries that look for torch themselves
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(CheckpointError) as err:
        from_hf(backbone_cls, str(small["bin"]))
    message = str(err.value)
    assert "\n" not in message and "pytorch_model.bin" in message and "pip install torch" in message, message


def test_the_tokenizer_gives_the_ids_of_gpt1s_bpe_files_and_of_transformers(small, shared_data):
    """``vocab.json`` + ``merges.txt`` read as the project's GPT-1 encoder: the ids of ``encoder_bpe_40000.json`` /
    ``vocab_40000.bpe`` on real sentences, and ``transformers``' own ids where its BERT word split is spaCy's."""
    from transformers import OpenAIGPTTokenizer

    import gpt_tf
    from gpt_tf.convert.hf import from_hf

    ours = from_hf(gpt_tf.GPT1Tokenizer, str(small["safetensors"]))
    released = gpt_tf.GPT1Tokenizer(str(GPT1_BPE))
    rows = (shared_data / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:301]
    sentences = [row.split("\t")[0] for row in rows]
    assert ours.special_token_ids == released.special_token_ids == list(range(V, V + 4))
    assert ours.offline.encode_batch(sentences) == released.offline.encode_batch(sentences)
    # Words and lone punctuation marks: there the two word splits agree (spaCy keeps "..." whole, BERT's splits it)
    plain = [s for s in sentences if set(s) <= set("abcdefghijklmnopqrstuvwxyz ,.!?") and ".." not in s][:40]
    assert len(plain) >= 20
    theirs = OpenAIGPTTokenizer(vocab=str(small["safetensors"] / "vocab.json"),
                                merges=str(small["safetensors"] / "merges.txt"))
    assert ours.offline.encode_batch(plain) == [theirs(s)["input_ids"] for s in plain]


def test_every_class_of_the_family_builds_from_the_checkpoint_by_from_preset(small):
    """Each class's own ``from_preset`` takes the folder, as a user writes it; ``from_hf`` (what it runs) also takes
    keras-hub's base classes for the family's."""
    import keras_hub

    import gpt_tf
    from gpt_tf.convert.hf import from_hf

    folder = str(small["safetensors"])
    lm = gpt_tf.GPT1CausalLM.from_preset(folder)
    assert lm.preprocessor.sequence_length == SMALL["n_positions"]
    assert lm.generate(TEXTS[0], max_length=12).startswith("the man walked")
    built = {
        "classifier": from_hf(keras_hub.models.TextClassifier, folder, num_classes=3, input_type="pair"),
        "classifier_by_its_class": gpt_tf.GPT1TextClassifier.from_preset(folder, num_classes=2),
        "regressor": gpt_tf.GPT1TextRegressor.from_preset(folder, sequence_length=24),
        "choice": gpt_tf.GPT1MultipleChoice.from_preset(folder, num_choices=2),
    }
    assert type(built["classifier"]) is gpt_tf.GPT1TextClassifier and built["classifier"].num_classes == 3
    assert built["regressor"].preprocessor.sequence_length == 24
    for task in built.values():
        for a, b in zip(backbone_weights(task), backbone_weights(lm)):
            np.testing.assert_array_equal(a, b)
    assert built["classifier"].predict((TEXTS[:2], TEXTS[1:]), verbose=0).shape == (2, 3)
    assert built["choice"].predict((TEXTS[:1], [TEXTS[1:]]), verbose=0).shape == (1, 2)
    causal = from_hf(keras_hub.models.CausalLMPreprocessor, folder, sequence_length=8)
    assert type(causal) is gpt_tf.GPT1CausalLMPreprocessor and causal.sequence_length == 8
    assert gpt_tf.GPT1CausalLMPreprocessor.from_preset(folder, sequence_length=8).sequence_length == 8
    task = gpt_tf.GPT1TaskPreprocessor.from_preset(folder)
    assert task.sequence_length == SMALL["n_positions"] and task.tokenizer.vocabulary_size() == V + 4
    assert gpt_tf.GPT1Tokenizer.from_preset(folder).vocabulary_size() == V + 4
    fresh = gpt_tf.GPT1Backbone.from_preset(folder, load_weights=False, dtype="mixed_bfloat16")
    assert fresh.dtype_policy.name == "mixed_bfloat16" and not np.array_equal(backbone_weights(fresh)[2], backbone_weights(lm)[2])
    # A keras-hub preset still goes to keras-hub's own from_preset.
    assert type(gpt_tf.GPT1Backbone.from_preset("gpt1_tiny_books_en")) is gpt_tf.GPT1Backbone


def test_an_hf_handle_reads_the_hugging_face_cache_offline(small, offline_hub, tmp_path):
    import gpt_tf
    from gpt_tf.convert.hf import CheckpointError, from_hf, is_hf_checkpoint

    offline_hub(small["hf_home"])
    assert is_hf_checkpoint(HANDLE) and is_hf_checkpoint(str(small["safetensors"]))
    assert not is_hf_checkpoint(str(ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en")) and not is_hf_checkpoint(3)
    for a, b in zip(backbone_weights(from_hf(gpt_tf.GPT1Backbone, HANDLE)),
                    backbone_weights(from_hf(gpt_tf.GPT1Backbone, str(small["safetensors"])))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(CheckpointError) as err:
        from_hf(gpt_tf.GPT1Backbone, "hf://openai-community/not-cached")
    assert "\n" not in str(err.value) and str(err.value).startswith("hf://openai-community/not-cached: "), err.value
    # A keras-hub preset uploaded to the Hub is not a transformers checkpoint (keras-hub loads it itself).
    fill_hub_cache(small["hf_home"] / "hub", "someone/gpt1-preset", ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en")
    assert not is_hf_checkpoint("hf://someone/gpt1-preset")


def test_keras_hubs_own_classes_cannot_load_openai_gpt(small):
    """The docs say so: keras-hub's transformers loader knows a fixed list of model types, "openai-gpt" not among them.
    If an upgrade adds it, this fails: say what changed in docs/real_gpt1.md."""
    import keras_hub

    import gpt_tf.gpt1  # noqa: F401  (the family registered, as a user has it)

    for cls in (keras_hub.models.CausalLM, keras_hub.models.Backbone):
        with pytest.raises(ValueError, match="no converter for huggingface/transformers models with model type "
                                             "`'openai-gpt'`"):
            cls.from_preset(str(small["safetensors"]))


# ----------------------------------------------------------------------------- errors
def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _one_line_error(folder: Path, cls_name: str = "GPT1Backbone") -> str:
    import gpt_tf
    from gpt_tf.convert.hf import CheckpointError, from_hf

    with pytest.raises(CheckpointError) as err:
        from_hf(getattr(gpt_tf, cls_name), str(folder))
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_a_wrong_model_type_names_the_config(small, tmp_path):
    folder = _copy(small["safetensors"], tmp_path / "gpt2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    message = _one_line_error(folder)
    assert message.startswith(str(folder / "config.json")) and "'gpt2'" in message and "'openai-gpt'" in message


def _rewrite_tensors(folder: Path, change) -> None:
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(path)
    change(state)
    save_file(state, path, metadata={"format": "pt"})


@pytest.mark.parametrize("change, named", [
    (lambda s: s.pop("transformer.h.1.mlp.c_fc.bias"), ["missing keys", "h.1.mlp.c_fc.bias"]),
    (lambda s: s.update({"transformer.h.0.attn.c_attn.weight": s["transformer.h.0.attn.c_attn.weight"].T.copy()}),
     ["h.0.attn.c_attn.weight has shape [96, 32]; expected [32, 96]"]),
    (lambda s: s.update({"transformer.h.5.ln_1.weight": s["transformer.h.1.ln_1.weight"]}),
     ["unexpected keys", "h.5.ln_1.weight"]),
])
def test_a_missing_or_misshapen_tensor_names_the_file_and_the_tensor_and_assigns_nothing(small, tmp_path, change, named):
    import gpt_tf
    from gpt_tf.convert.hf import CheckpointError, from_hf, load_checkpoint_weights

    folder = _copy(small["safetensors"], tmp_path / "broken")
    _rewrite_tensors(folder, change)
    message = _one_line_error(folder)
    assert message.startswith(str(folder / "model.safetensors") + ": ") and all(n in message for n in named), message
    backbone = from_hf(gpt_tf.GPT1Backbone, str(small["safetensors"]))
    before = backbone_weights(backbone)
    with pytest.raises(CheckpointError):
        load_checkpoint_weights(backbone, str(folder))
    for a, b in zip(backbone_weights(backbone), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("broken, named", [
    ("vocab", "vocab.json: 40477 tokens, but"),
    ("merges", "no merges.txt"),
    ("weights", "no weights (model.safetensors, pytorch_model.bin"),
    ("truncated", "model.safetensors: not readable as safetensors with numpy"),
    ("positions", "max_sequence_length=128 is longer than the checkpoint's 64 positions"),
])
def test_a_broken_tokenizer_or_missing_weights_name_the_file(small, tmp_path, broken, named):
    import gpt_tf
    from gpt_tf.convert.hf import CheckpointError, from_hf

    folder = _copy(small["safetensors"], tmp_path / broken)
    if broken == "vocab":
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        last = max(vocab, key=vocab.get)
        (folder / "vocab.json").write_text(json.dumps({k: v for k, v in vocab.items() if k != last}), encoding="utf-8")
    elif broken == "merges":
        (folder / "merges.txt").unlink()
    elif broken == "weights":
        (folder / "model.safetensors").unlink()
    elif broken == "truncated":
        path = folder / "model.safetensors"
        path.write_bytes(path.read_bytes()[:1000])
    if broken == "positions":
        with pytest.raises(CheckpointError, match=named):
            from_hf(gpt_tf.GPT1Backbone, str(folder), max_sequence_length=128)
        return
    message = _one_line_error(folder, "GPT1CausalLM")
    assert named in message and str(folder) in message, message


# ----------------------------------------------------------------------------- GPT-1's own shape (slow)
BACKENDS = ("tensorflow", "jax", "torch")


def child(folders: dict, hf_home: str, reference: str) -> None:
    """In a process of the backend ``KERAS_BACKEND`` names: our logits from the safetensors folder, the ``.bin``
    folder and the ``hf://`` handle (the cache at ``hf_home``, offline), each against ``transformers``'; prints JSON."""
    import keras

    expected = np.load(reference)
    ids = token_ids(expected.shape[1])
    diffs = {}
    for name, source in (("safetensors", folders["safetensors"]), ("bin", folders["bin"]), ("hf", HANDLE)):
        diffs[name] = float(np.abs(our_logits(source, ids) - expected).max())
    print(json.dumps({"backend": keras.config.backend(), "max_abs_diff": diffs}))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpt1s_own_shape_gives_transformers_logits_on_every_backend(backend, tmp_path_factory):
    """117M parameters (12 × 768, 512 positions, 40,478 BPE rows) from both weight formats and the offline Hub
    cache: the logits of all 512 positions within 1e-5 of transformers' on TensorFlow, JAX and PyTorch."""
    root = tmp_path_factory.getbasetemp() / "hf_full"
    if not (root / "reference.npy").exists():
        root.mkdir(exist_ok=True)
        folders = cached_checkpoint(root, FULL)
        np.save(root / "reference.npy", transformers_logits(folders["safetensors"], token_ids(FULL["n_positions"])))
    folders = {"safetensors": str(root / "safetensors"), "bin": str(root / "bin")}
    proc = subprocess.run([sys.executable, __file__, json.dumps(folders), str(root / "hf_home"),
                           str(root / "reference.npy")], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**hub_env(root / "hf_home"), "KERAS_BACKEND": backend}, check=False)
    assert proc.returncode == 0, f"{backend}:\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n{backend}: max |ours - transformers| over [2, 512, {V}] logits: {report['max_abs_diff']}")
    assert report["backend"] == backend
    assert all(d <= CLOSE for d in report["max_abs_diff"].values()), report


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    child(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3])
