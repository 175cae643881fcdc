"""What ``gpt_tf/gpt1/keras_hub_adapter.py`` relies on in keras-hub, checked against the installed keras-hub: a
failure says "keras-hub <version> changed: <what>; update gpt_tf/gpt1/keras_hub_adapter.py". And the rest of the
family keeps to keras-hub's public API: no ``keras_hub.src`` import outside the adapter."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.offline_hubs import FakeHubs
from tests.small_runs import BOOKS_TINY, ROOT
from tests.small_runs import gpt1_backbone as _backbone

# What keras-hub's metadata.json lists for a GPT1Backbone preset: each family task's first base class, keras-hub's own
# (no mixin comes before it), sorted and deduplicated.
KERAS_HUB_TASKS = ["CausalLM", "Task", "TextClassifier"]


def expect(condition: bool, what: str) -> None:
    from gpt_tf.gpt1.keras_hub_adapter import changed

    if not condition:
        pytest.fail(changed(what), pytrace=False)


def test_shipped_presets_resolve_by_name_through_keras_hub():
    """``register_presets``: keras-hub's built-in preset table takes the shipped presets' folders as handles and lists
    each with its description; an earlier name (an alias) loads its preset by name but is not listed."""
    import keras_hub

    import gpt_tf
    from gpt_tf.convert.preset_io import PRESET_ALIASES, shipped_presets
    from gpt_tf.gpt1.presets import DESCRIPTIONS

    names = [name for name in shipped_presets() if name not in PRESET_ALIASES]
    assert {"gpt1_tiny_books_en", "gpt1_small_books_en"} <= set(names)
    listed = keras_hub.models.Backbone.presets
    expect(set(names) <= set(listed), "registered presets are not listed in keras_hub.models.Backbone.presets")
    expect(set(names) <= set(gpt_tf.GPT1Backbone.presets), "registered presets are not the GPT1Backbone's")
    for name in names:
        metadata = listed[name].get("metadata", {})
        expect(metadata.get("description") == DESCRIPTIONS[name], f"the listing lost {name}'s description")
        expect(metadata.get("params", 0) > 0, f"the listing lost {name}'s parameter count")
    for listing in (listed, gpt_tf.GPT1Backbone.presets, keras_hub.models.TextClassifier.presets):
        assert not set(PRESET_ALIASES) & set(listing), "an earlier name is listed as a preset of its own"
    tokenizers = {}
    for name in names:
        backbone = keras_hub.models.Backbone.from_preset(name, load_weights=False)
        expect(type(backbone) is gpt_tf.GPT1Backbone, f"from_preset({name!r}) built a {type(backbone).__name__}")
        tokenizers[name] = keras_hub.tokenizers.Tokenizer.from_preset(name)
        expect(type(tokenizers[name]) is gpt_tf.GPT1Tokenizer and tokenizers[name].loaded,
               f"Tokenizer.from_preset({name!r}) did not load the preset's BPE files")
    for alias, name in PRESET_ALIASES.items():  # one load by each earlier name: its preset's BPE
        tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(alias)
        expect(type(tokenizer) is gpt_tf.GPT1Tokenizer and tokenizer.get_vocabulary() ==
               tokenizers[name].get_vocabulary(), f"Tokenizer.from_preset({alias!r}) did not load {name}'s BPE")


def test_preprocessing_function_converts_once_and_only_eagerly():
    """``preprocessing_function``: eager calls get tensors and give Python lists for ragged outputs; a decorated call
    inside another (a preprocessor calling its tokenizer) and calls in a graph (tf.data) keep tensors."""
    import tensorflow as tf

    from gpt_tf.gpt1.keras_hub_adapter import preprocessing_function

    class Toy:
        @preprocessing_function
        def inner(self, x):
            assert isinstance(x, tf.Tensor) and x.dtype == tf.string, type(x)
            return tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3]), [2, 1])

        @preprocessing_function
        def outer(self, x):
            return {"inner_is_ragged": isinstance(self.inner(x), tf.RaggedTensor), "ids": self.inner(x)}

    toy = Toy()
    expect(toy.inner(["a", "b"]) == [[1, 2], [3]], "an eager call no longer returns ragged outputs as lists")
    out = toy.outer(["a", "b"])
    expect(out["inner_is_ragged"] is True, "a decorated call inside another converts its outputs")
    expect(out["ids"] == [[1, 2], [3]], "the outer call no longer converts its outputs")
    graph = tf.data.Dataset.from_tensors(tf.constant(["a", "b"])).map(toy.inner)
    expect(isinstance(next(iter(graph)), tf.RaggedTensor), "a call in tf.data converts its outputs")


def test_preprocessors_of_a_preset_without_their_config_get_the_backbone_config(monkeypatch):
    """``preset_sequence_length``: keras-hub builds the preprocessor of a preset without ``preprocessor.json`` through
    the class's ``_add_missing_kwargs(loader, kwargs)``, ``loader.config`` the preset's ``config.json``."""
    import keras_hub

    import gpt_tf
    import gpt_tf.gpt1.causal_lm_preprocessor as module

    loaders, original = [], module.preset_sequence_length

    def recorded(loader):
        loaders.append(loader)
        return original(loader)

    monkeypatch.setattr(module, "preset_sequence_length", recorded)
    keras_hub.models.CausalLMPreprocessor.from_preset("gpt1_tiny_books_en")
    expect(len(loaders) == 1, "from_preset of a preset without preprocessor.json no longer calls the class's "
           "_add_missing_kwargs")
    config = getattr(loaders[0], "config", None)
    expect(isinstance(config, dict) and config.get("config", {}).get("max_sequence_length") == 128,
           "the preset loader's `config` is not the preset's config.json")
    expect(gpt_tf.GPT1TaskPreprocessor.from_preset("gpt1_tiny_books_en").sequence_length == 128,
           "from_preset of a preset without preprocessor.json gives no sequence_length")


def test_saved_presets_list_the_tasks_keras_hub_finds_for_the_backbone(tmp_path):
    """keras-hub writes ``metadata.json`` itself (the family adds nothing): its ``tasks`` list holds the first base
    class of every registered task whose ``backbone_cls`` is the backbone's, so the family's tasks appear as the
    keras-hub classes they subclass directly (``from_preset`` of those resolves to the family's classes)."""
    _backbone().save_to_preset(str(tmp_path))
    path = tmp_path / "metadata.json"
    expect(path.is_file(), "Backbone.save_to_preset writes no metadata.json")
    tasks = json.loads(path.read_text()).get("tasks")
    expect(tasks is not None, "metadata.json has no 'tasks'")
    assert tasks == KERAS_HUB_TASKS


def test_upload_to_a_hugging_face_repository_holding_a_card_uploads_the_folders_card(tmp_path, monkeypatch):
    """``upload_preset``: ``keras_hub.upload_preset`` (the hubs' calls mocked) to a Hugging Face repository that holds
    a ``README.md`` uploads the folder's own card and leaves it in the folder; the family's upload relies on it."""
    import keras_hub

    hubs = FakeHubs(tmp_path / "hub").install(monkeypatch)
    hubs.create_repo("me/carded")
    (hubs.repo("me/carded") / "README.md").write_text("an older card\n")
    folder = tmp_path / "preset"
    shutil.copytree(BOOKS_TINY, folder)
    card = (folder / "README.md").read_bytes()
    keras_hub.upload_preset("hf://me/carded", str(folder))
    expect("upload_folder" in hubs.calls, "upload_preset to hf:// no longer calls huggingface_hub.upload_folder")
    expect((hubs.repo("me/carded") / "README.md").read_bytes() == card, "upload_preset to a Hugging Face "
           "repository holding a README.md no longer uploads the folder's own card")
    expect((folder / "README.md").is_file() and (folder / "README.md").read_bytes() == card,
           "upload_preset to a Hugging Face repository holding a README.md changes the folder's card")


def test_keras_hub_is_used_through_its_public_api_elsewhere():
    """No ``keras_hub.src`` (keras-hub's private modules) in the project's code but the adapter."""
    files = [p for pkg in ("gpt_tf", "pipelines", "serving") for p in (ROOT / pkg).rglob("*.py")]
    users = sorted(str(p.relative_to(ROOT)) for p in files
                   if re.search(r"keras_hub\.src", p.read_text()) and p.name != "keras_hub_adapter.py")
    assert users == []
    assert Path(ROOT / "gpt_tf" / "gpt1" / "keras_hub_adapter.py").is_file()
