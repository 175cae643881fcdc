"""keras-hub's preset layout as the core reads it, without importing keras-hub.

A preset folder (``GPT1Backbone.save_to_preset``, ``python -m gpt_tf.convert``) holds
``config.json`` (the backbone's Keras config: keras-hub's field names), ``model.weights.h5`` (the
backbone's weights), ``tokenizer.json`` + ``assets/tokenizer/`` (GPT-1's two BPE files) and
``metadata.json``; a task adds ``task.json`` / ``task.weights.h5``. The presets shipped in the package are
``gpt_tf/presets/<name>``.
The core reads a preset's ``config.json`` and weights file itself (``--init_checkpoint=<preset>``: a run
folder's model config, weights restored into the run's backbone; ``locate``: a shipped preset by its name where a
path would be).
"""

from __future__ import annotations

import json
import os

from gpt_tf.config import GPTConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TASK_FILE = "task.json"  # a task preset's: the task's class and config (its weights: task.weights.h5)
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")
SHIPPED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets")  # package data: named presets
PRESET_ALIASES = {"books_tiny": "gpt1_tiny_books_en"}  # earlier names of shipped presets -> their names
HF_SCHEME = "hf://"  # a Hugging Face Hub handle: a keras-hub preset there, or a transformers checkpoint (convert/hf.py)


def is_preset(path: str) -> bool:
    """Whether ``path`` is a folder holding a preset's ``config.json`` and ``model.weights.h5``."""
    return os.path.isfile(os.path.join(path, CONFIG_FILE)) and os.path.isfile(os.path.join(path, WEIGHTS_FILE))


def is_task_preset(path: str) -> bool:
    """Whether the preset folder ``path`` holds a task (a classifier, regressor or multiple choice), not a backbone
    alone."""
    return is_preset(path) and os.path.isfile(os.path.join(path, TASK_FILE))


def preset_config(path: str) -> GPTConfig:
    """The ``GPTConfig`` of the preset folder ``path`` (its ``config.json``)."""
    config_path = os.path.join(path, CONFIG_FILE)
    with open(config_path) as f:
        saved = json.load(f)
    name = saved.get("registered_name", "")
    if not name.endswith("GPT1Backbone"):
        raise ValueError(f"{config_path}: a {name or 'non-Keras'} config, not a GPT1Backbone preset")
    return GPTConfig.from_backbone_kwargs(saved["config"])


def load_preset_weights(backbone, path: str) -> str:
    """The preset's backbone weights into ``backbone`` (a ``GPT1Backbone`` of the same shape); returns the file."""
    weights = os.path.join(path, WEIGHTS_FILE)
    backbone.load_weights(weights)
    return weights


def shipped_presets() -> dict:
    """``{name: folder}`` of the presets shipped inside the package (``gpt_tf/presets/<name>``), their aliases
    (``PRESET_ALIASES``) included."""
    if not os.path.isdir(SHIPPED_DIR):
        return {}
    folders = {name: os.path.join(SHIPPED_DIR, name) for name in sorted(os.listdir(SHIPPED_DIR))
               if os.path.isfile(os.path.join(SHIPPED_DIR, name, CONFIG_FILE))}
    return {**folders, **{alias: folders[name] for alias, name in PRESET_ALIASES.items() if name in folders}}


def locate(path) -> str:
    """Where the weights ``path`` names are: ``path`` itself where something is there (a folder or a file, or a
    checkpoint prefix: ``<path>.index``) or where it is an ``hf://`` handle (a transformers checkpoint on the Hugging
    Face Hub, ``gpt_tf/convert/hf.py``), else the folder of the shipped preset it names (``shipped_presets``: a
    name or an earlier name). ValueError when it is neither, naming the shipped presets."""
    path = os.fspath(path)
    if os.path.exists(path) or os.path.exists(path + ".index") or path.startswith(HF_SCHEME):
        return path
    shipped = shipped_presets()
    if path in shipped:
        return shipped[path]
    raise ValueError(f"{path} does not exist and is not a shipped preset (shipped presets: "
                     f"{', '.join(shipped) or 'none'})")


def preset_problem(preset) -> str:
    """Why ``preset`` (a ``from_preset`` argument) names no preset here, or "" (a shipped name, a folder holding
    ``config.json``, or a remote handle such as ``kaggle://`` / ``hf://``, which keras-hub resolves)."""
    if not isinstance(preset, (str, os.PathLike)):
        return f"a preset is a shipped name or a folder, got {type(preset).__name__} {preset!r}"
    preset = os.fspath(preset)
    if "://" in preset or preset in shipped_presets():
        return ""
    shipped = ", ".join(shipped_presets()) or "none"
    where = os.path.abspath(os.path.expanduser(preset))
    if not os.path.isdir(where):
        return (f"GPT-1 preset {preset!r} not found: it is neither a shipped preset ({shipped}) nor a folder "
                f"({where} does not exist); save_to_preset or `python -m gpt_tf.convert` writes one")
    if not os.path.isfile(os.path.join(where, CONFIG_FILE)):
        return (f"{where} is not a preset folder: it holds no {CONFIG_FILE} (shipped presets: {shipped}; "
                "save_to_preset or `python -m gpt_tf.convert` writes one)")
    return ""
