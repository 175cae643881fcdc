"""The shipped presets' model cards (``gpt_tf/presets/*/README.md``): the metadata header the hubs read, the
sections and the family's tasks; ``gpt_tf.gpt1.presets.upload_preset`` keeps the card on both hubs (their calls
on local folders, ``FakeHubs``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.offline_hubs import FakeHubs
from tests.small_runs import BOOKS_TINY as BOOKS


# The metadata header of every shipped model card (the fields the Hugging Face and Kaggle hubs read).
CARD_METADATA = {"license": "apache-2.0", "library_name": "keras-hub", "language": ["en"],
                 "pipeline_tag": "text-generation"}


def front_matter(card: str) -> tuple[dict, str]:
    """A model card's YAML front matter (between its first line, ``---``, and the next ``---`` line: ``key: value``
    lines, and ``key:`` followed by ``- item`` lines) as a dict, and the card's text after it."""
    assert card.startswith("---\n"), "a model card starts with its metadata header"
    header, closed, body = card[4:].partition("\n---\n")
    assert closed, "the metadata header has no closing `---` line"
    fields, key = {}, None
    for line in header.splitlines():
        if line.startswith("- ") and isinstance(fields.get(key), list):
            fields[key].append(line[2:].strip())
            continue
        key, colon, value = line.partition(":")
        assert colon and key == key.strip() and key not in fields, f"not a header line: {line!r}"
        fields[key] = value.strip() or []
    try:
        import yaml
    except ImportError:
        pass
    else:  # the hubs parse it as YAML: the same fields
        assert yaml.safe_load(header) == fields
    return fields, body


def test_each_shipped_preset_has_a_model_card_and_names_the_family_tasks():
    from gpt_tf.convert.preset_io import PRESET_ALIASES, shipped_presets

    folders = {name: folder for name, folder in shipped_presets().items() if name not in PRESET_ALIASES}
    assert "gpt1_tiny_books_en" in folders and shipped_presets()["books_tiny"] == folders["gpt1_tiny_books_en"]
    for name, folder in folders.items():
        metadata, card = front_matter((Path(folder) / "README.md").read_text())
        assert {field: metadata.get(field) for field in CARD_METADATA} == CARD_METADATA, name
        assert {"gpt1", "keras", "tensorflow"} <= set(metadata.get("tags", [])), name
        card = card.lstrip("\n")
        for heading in ("## Model", "## Training data", "## Training", "## Quality", "## Intended use", "## Limits",
                        "## License"):
            assert f"\n{heading}\n" in card, (name, heading)
        assert card.startswith(f"# {name}\n") and "Apache-2.0" in card, name
        assert all(backend in card for backend in ("JAX", "PyTorch", "TensorFlow")), (name, "the backends it runs on")
        quality = card.split("\n## Quality\n", 1)[1].split("\n## ", 1)[0]
        assert "bits per character" in quality, (name, "the held-out loss every vocabulary compares on")
        tasks = json.loads((Path(folder) / "metadata.json").read_text())["tasks"]
        assert tasks == ["GPT1CausalLM", "GPT1MultipleChoice", "GPT1TextClassifier", "GPT1TextRegressor"], name


def test_upload_preset_keeps_the_model_card(tmp_path, monkeypatch):
    """``gpt_tf.gpt1.presets.upload_preset`` (the hubs' calls mocked): the hub gets the preset's files with its model
    card, on Hugging Face (a new repository, one holding an older card, a bare name) and on Kaggle, where
    ``keras_hub.upload_preset`` alone would put its generated stub on a new Hugging Face repository and delete the
    folder's card; the folder is left as it was, and nothing reaches a hub from a folder that is not a preset."""
    from gpt_tf.gpt1.presets import upload_preset

    hubs = FakeHubs(tmp_path / "hub").install(monkeypatch)
    before = {p.relative_to(BOOKS): p.read_bytes() for p in BOOKS.rglob("*") if p.is_file()}
    card, config = before[Path("README.md")], before[Path("config.json")]
    hubs.create_repo("me/older")
    (hubs.repo("me/older") / "README.md").write_text("an older card\n")
    for uri, preset, repo in (("hf://me/gpt1_tiny_books_en", "gpt1_tiny_books_en", "me/gpt1_tiny_books_en"),
                              ("hf://me/older", str(BOOKS), "me/older"),
                              ("hf://bare", "books_tiny", "me/bare"),
                              ("kaggle://me/gpt1/keras/gpt1_tiny_books_en", str(BOOKS),
                               "me/gpt1/keras/gpt1_tiny_books_en")):
        hubs.calls.clear()
        upload_preset(uri, preset)
        uploaded = hubs.repo(repo)
        assert (uploaded / "README.md").read_bytes() == card, (uri, (uploaded / "README.md").read_text()[:300])
        assert (uploaded / "config.json").read_bytes() == config and (uploaded / "model.weights.h5").is_file(), uri
        assert hubs.calls[-1] == ("model_upload" if uri.startswith("kaggle") else "upload_folder"), (uri, hubs.calls)
    assert {p.relative_to(BOOKS): p.read_bytes() for p in BOOKS.rglob("*") if p.is_file()} == before
    hubs.calls.clear()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="is not a preset folder: it holds no config.json"):
        upload_preset("hf://me/empty", str(tmp_path / "empty"))
    assert hubs.calls == []
