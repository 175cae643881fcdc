"""What the GPT-1 family needs from keras-hub beyond its public API, in one place.

Everything else in ``gpt_tf`` uses keras-hub's public names only (``keras_hub.models``, ``keras_hub.tokenizers``).
Each item here says what keras-hub lacks; ``tests/test_keras_hub_adapter.py`` checks every one against the
installed keras-hub and fails with "keras-hub <version> changed: <what>; update
gpt_tf/gpt1/keras_hub_adapter.py" when an upgrade breaks it.

1. ``register_presets``: keras-hub resolves a preset *name* (``from_preset("gpt1_tiny_books_en")``) only
   through its table of built-in presets, filled by ``keras_hub.src.utils.preset_utils.register_presets``
   (documented as meant for presets shipped inside keras-hub itself). The family registers the presets
   shipped inside ``gpt_tf`` there, their folders as handles (a local folder needs no download). An earlier
   name of a preset (an alias) goes into the table ``from_preset`` reads names from (``BUILTIN_PRESETS``) only,
   not into the backbone's listing (``Backbone.presets``), so it loads by name without being listed twice.
2. ``preprocessing_function``: the decorator keras-hub's own tokenizers and preprocessors wear
   (``keras_hub.src.utils.tensor_utils``): eager inputs become tensors, outputs called eagerly become
   Python lists (ragged, strings) or backend tensors, calls nested in one another convert once.
3. ``preset_sequence_length``: a preset with no ``preprocessor.json`` (the shipped ones: a backbone and its
   tokenizer) gives a preprocessor no ``sequence_length``; keras-hub's own presets carry it in that file. keras-hub
   builds such a preprocessor through the classmethod ``_add_missing_kwargs(loader, kwargs)`` (its docstring offers
   it for overriding), whose ``loader.config`` is the preset's ``config.json``: the family's preprocessors take the
   backbone's ``max_sequence_length`` from it there.
4. ``upload_preset`` keeps no model card on a new Hugging Face repository: ``keras_hub.upload_preset`` to a repository
   without ``README.md`` writes its generated stub over the folder's card, uploads it and deletes the folder's
   ``README.md``; to a repository holding one it uploads the folder's card as it is. ``presets.upload_preset`` (public
   calls only, so no code here) puts the card on the repository first and has keras-hub upload a copy of the folder.
"""

from __future__ import annotations

import keras_hub

FIX = "update gpt_tf/gpt1/keras_hub_adapter.py"


def changed(what: str) -> str:
    """The message for a keras-hub that no longer does what this module relies on."""
    return f"keras-hub {keras_hub.__version__} changed: {what}; {FIX}"


try:
    from keras_hub.src.utils.preset_utils import BUILTIN_PRESETS  # noqa: E402
    from keras_hub.src.utils.preset_utils import register_presets as _register_presets  # noqa: E402
    from keras_hub.src.utils.tensor_utils import preprocessing_function  # noqa: E402,F401
except ImportError as err:  # pragma: no cover - only with another keras-hub
    raise ImportError(changed(f"an import failed ({err})")) from err


def register_presets(presets: dict, backbone_cls, aliases: dict | None = None) -> None:
    """Registers ``{name: {"metadata": {...}, "kaggle_handle": folder}}`` as built-in presets of ``backbone_cls``:
    ``from_preset(name)`` of the backbone, its tasks, tokenizer and preprocessors then loads the folder, and
    ``Backbone.presets`` lists it with its metadata. ``aliases`` (``{alias: name}``, each name one of ``presets``)
    load their preset's folder by the alias too, without a listing of their own."""
    _register_presets(presets, backbone_cls)
    if not isinstance(BUILTIN_PRESETS, dict):
        raise TypeError(changed("preset_utils.BUILTIN_PRESETS is no longer a dict"))
    for alias, name in (aliases or {}).items():
        BUILTIN_PRESETS[alias] = presets[name]


def preset_sequence_length(loader):
    """The ``max_sequence_length`` in the backbone config of the preset ``loader`` reads (keras-hub's preset loader,
    as ``Preprocessor._add_missing_kwargs`` gets it), or None where its config has none (not a Keras preset)."""
    config = getattr(loader, "config", None)
    if not isinstance(config, dict):
        raise ValueError(changed("a preset loader has no dict `config` (the preset's config.json)"))
    value = (config.get("config") or {}).get("max_sequence_length")
    return None if value is None else int(value)
