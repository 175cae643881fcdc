"""The GPT-1 presets shipped in ``gpt_tf/presets/``, registered by name with keras-hub, and ``upload_preset``: a
preset folder to the Kaggle or Hugging Face hub with its model card kept.

Their conversions (a run folder, GPT-1's release shards or a ``transformers`` state dict into a preset) are
``gpt_tf/convert/presets.py``, with their command line ``python -m gpt_tf.convert``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.keras_hub_adapter import register_presets
from gpt_tf.convert.preset_io import CONFIG_FILE, PRESET_ALIASES, WEIGHTS_FILE, locate, shipped_presets

CARD_FILE = "README.md"  # a preset folder's model card, as the hubs name it
HF_PREFIX = "hf://"

# keras-hub's preset names: family, size, data, language. Each folder's README.md is its model card; these are the
# one-line descriptions keras-hub lists (`keras_hub.models.Backbone.presets[name]["metadata"]["description"]`).
DESCRIPTIONS = {
    "gpt1_tiny_books_en": "The `tiny` GPT-1 (4 layers, 256 dims, 128 context, 8k BPE) pre-trained on 409 Gutenberg "
                          "books (tools/torch_pretrain/train.py, 7,158 updates, held-out perplexity 55.1 per 8k-BPE "
                          "token, 1.469 bits per character): the model the README's fine-tuning tables start from.",
    "gpt1_small_books_en": "The `small` GPT-1 (6 layers, 384 dims, 256 context, 16k BPE) pre-trained on the same 409 "
                           "Gutenberg books by the family's own fit on JAX (tools/jax_pretrain.py, 6,839 updates, "
                           "held-out perplexity 55.1 per 16k-BPE token, 1.371 bits per character).",
}


def register_shipped_presets() -> None:
    """Registers each shipped preset with keras-hub (``keras_hub_adapter.register_presets``), so
    ``from_preset("gpt1_tiny_books_en")`` finds its folder (no network: keras-hub reads a local folder as the
    preset's handle) and ``keras_hub.models.Backbone.presets`` lists it with its description. An earlier name
    (``PRESET_ALIASES``: ``"books_tiny"``) loads its preset too but is not listed."""
    presets = {}
    for name, folder in shipped_presets().items():
        if name in PRESET_ALIASES:
            continue
        with open(os.path.join(folder, "metadata.json")) as f:
            params = json.load(f).get("parameter_count")
        presets[name] = {"metadata": {"description": DESCRIPTIONS.get(name, name), "params": params, "path": "gpt1"},
                         "kaggle_handle": folder}
    aliases = {alias: name for alias, name in PRESET_ALIASES.items() if name in presets}
    register_presets(presets, GPT1Backbone, aliases)


def _link_or_copy(source: str, target: str) -> None:
    """A file of the upload's copy: a hard link where the file system allows one (no second copy of the weights),
    else a copy; the model card always a copy of its own (keras-hub may write over or delete the copy's card)."""
    if os.path.basename(target) != CARD_FILE:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)


def _put_card_on_hugging_face(uri: str, card: str) -> None:
    """Creates the Hugging Face repository ``uri`` names (where it is missing) and uploads ``card`` as its README.md
    where it has none, so that keras-hub's upload then keeps the folder's card."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import HFValidationError
    except ImportError as err:
        raise ImportError(f"uploading to {uri!r} needs the `huggingface_hub` package "
                          "(`pip install huggingface_hub`)") from err
    try:
        repo_id = huggingface_hub.create_repo(repo_id=uri[len(HF_PREFIX):], exist_ok=True).repo_id
    except HFValidationError as err:
        raise ValueError(f"{uri!r} is not a Hugging Face handle: hf://[<user or org>/]<model>") from err
    if not huggingface_hub.file_exists(repo_id=repo_id, filename=CARD_FILE):
        huggingface_hub.upload_file(path_or_fileobj=card, path_in_repo=CARD_FILE, repo_id=repo_id,
                                    commit_message="Add the model card")


def upload_preset(uri: str, preset) -> None:
    """Uploads a preset folder, or a shipped preset by name, to a model hub with ``keras_hub.upload_preset``,
    keeping its model card (the folder's ``README.md``).

    ``uri`` is keras-hub's: ``kaggle://<user>/<model>/keras/<variation>`` or ``hf://[<user>/]<model>``. Uploading
    to a Hugging Face repository that has no ``README.md`` yet, ``keras_hub.upload_preset`` writes a generated
    stub over the folder's card, uploads that, and then deletes ``README.md`` from the folder; where the repository
    has one it uploads the folder as it is. So this uploads the card first where the repository lacks one, and has
    keras-hub upload a copy of the folder (hard links, the card a copy of its own): the hub gets the folder's files
    with its card, and the folder is left as it was. A folder without a card gets keras-hub's stub, as with
    keras-hub's own call. Kaggle takes the folder's files as they are either way.

    Example:

    ```python
    from gpt_tf.gpt1.presets import upload_preset

    upload_preset("hf://<user>/gpt1_tiny_books_en", "gpt1_tiny_books_en")  # a shipped preset, by name
    upload_preset("kaggle://<user>/gpt1/keras/sst2", "presets/sst2")       # a folder save_to_preset wrote
    ```
    """
    folder = locate(preset)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    if CONFIG_FILE not in names or not any(fnmatch.fnmatch(n, "model*.weights.h5") for n in names):
        # keras-hub's own check, before anything reaches a hub (its weights: one file, or shards model_<k>.weights.h5)
        raise FileNotFoundError(f"{folder} is not a preset folder: it holds no {CONFIG_FILE} and {WEIGHTS_FILE} "
                                "(nothing was uploaded)")
    import keras_hub

    card = os.path.join(folder, CARD_FILE)
    with tempfile.TemporaryDirectory(prefix="gpt_tf_upload_") as staging:
        copy = os.path.join(staging, os.path.basename(os.path.normpath(folder)))
        shutil.copytree(folder, copy, copy_function=_link_or_copy)
        if uri.startswith(HF_PREFIX) and os.path.isfile(card):
            _put_card_on_hugging_face(uri, card)
        keras_hub.upload_preset(uri, copy)
