"""A run folder's files: their names, written atomically, the data's identity, and what a resume must match.

A run folder holds ``model_config.json`` and ``train_config.json`` (pre-training) or ``finetune_config.json``
(fine-tuning), plus ``data.json``: the ``config_hash`` of each data folder the run reads, so that data rebuilt
in place (same path, other content) is noticed too; its checkpoints are in ``checkpoints/``
(``gpt_tf/runs/checkpoints.py``), or, pre-trained by Keras's ``fit`` on JAX, its saves in ``keras_fit/``
(``gpt_tf/training/keras_fit.py``; ``has_fit_saves``). ``speed_choices.json`` records the speed choices its last
training command ran under (``gpt_tf/speed/choices.py``); they belong to the machine, not to the run, so it is
rewritten at each start and never compared: a run resumes under another machine's choices.

Re-running a command on a folder that holds checkpoints resumes it, and the data position is computed from the
step with the *current* batch size and data, so every hyper-parameter must be the one the run started with.
``resume_problems`` lists each field that differs, except those in ``RESUMABLE``: the length of the run
(``train_steps``, ``epochs``; fine-tuning's ``train_steps`` is a cap), how often it logs, checkpoints, evaluates
and samples, how it computes the same update (``grad_accum_steps``, ``jit_compile``), where its data lives (the
data's identity is checked through ``data.json`` instead), and how the run folder itself is spelled: the folder
being resumed is the one whose files are read, whatever its name (``runs/x``, ``./runs/x/``, its absolute path,
or the folder moved or copied elsewhere).

Nothing here imports TensorFlow: the checks run before it starts. ``write_json_atomic`` (and
``write_text_atomic``) writes a temporary file beside the target and renames it over, so a killed command, or
one the disk ran out under, leaves the old file or the new one, never half of one; a write the storage refuses
is a ``WriteError`` naming the file (``gpt_tf.write_errors``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from gpt_tf.config import GPTConfig
from gpt_tf.write_errors import writing

CHECKPOINTS = "checkpoints"  # a run folder's sub-folder
KERAS_FIT = "keras_fit"  # the sub-folder of a run pre-trained by Keras's fit on JAX (gpt_tf/training/keras_fit.py)
DATA_FILE = "data.json"
MODEL_CONFIG = "model_config.json"
SPEED_CHOICES = "speed_choices.json"  # the machine's choices, rewritten at each start, never compared on resume
RUN_CONFIGS = {"pretrain": "train_config.json", "finetune": "finetune_config.json"}  # the run config, by kind
RESUMABLE = {
    "train_config.json": frozenset({"train_steps", "log_every", "checkpoint_every", "keep_checkpoints", "eval_every",
                                    "eval_batches", "sample_every", "sample_prompt", "sample_length", "jit_compile",
                                    "grad_accum_steps", "data_dir", "precision", "run_dir", "init_checkpoint"}),
    "finetune_config.json": frozenset({"epochs", "log_every", "data_dir", "aux_data_dirs", "init_checkpoint",
                                       "precision", "train_steps", "checkpoint_every", "grad_accum_steps",
                                       "jit_compile", "run_dir"}),
    "model_config.json": frozenset(),
    DATA_FILE: frozenset(),
}


def write_json_atomic(path: str, obj) -> None:
    """``obj`` as indented, key-sorted JSON at ``path``, replacing any old file in one rename."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """``text`` (UTF-8) at ``path``, written beside it and renamed over any old file: a failed or killed write
    leaves the old file (or none) and no temporary one. A write the storage refuses is a ``WriteError``
    naming ``path`` (``gpt_tf.write_errors``)."""
    folder = os.path.dirname(path) or "."
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with writing(path):
        os.makedirs(folder, exist_ok=True)
        try:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def save_run_configs(run_dir: str, kind: str, model_config: GPTConfig, config, data: Optional[dict] = None) -> None:
    """``model_config.json``, the run config of ``kind`` (``RUN_CONFIGS``: a ``TrainConfig`` or ``FinetuneConfig``,
    so that eval, predict, a resume and the readers rebuild the same run) and ``data.json`` (``data_identity``),
    each written atomically."""
    for name, obj in ((MODEL_CONFIG, model_config), (RUN_CONFIGS[kind], config)):
        write_json_atomic(os.path.join(run_dir, name), dataclasses.asdict(obj))
    if data is not None:
        write_json_atomic(os.path.join(run_dir, DATA_FILE), data)


def read_json(path: str) -> dict:
    """A JSON file of a run or data folder; FileNotFoundError naming it when it is missing."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found")
    with open(path) as f:
        return json.load(f)


def read_model_config(run_dir: str) -> GPTConfig:
    """The ``GPTConfig`` a run folder's ``model_config.json`` holds."""
    return GPTConfig(**read_json(os.path.join(run_dir, MODEL_CONFIG)))


def has_checkpoints(run_dir: str) -> bool:
    return os.path.isfile(os.path.join(run_dir, CHECKPOINTS, "checkpoint"))


def has_fit_saves(run_dir: str) -> bool:
    """Whether the run was pre-trained by Keras's fit on JAX and saved (``keras_fit/state.json``)."""
    return os.path.isfile(os.path.join(run_dir, KERAS_FIT, "state.json"))


def data_identity(**data_manifests: Optional[dict]) -> dict:
    """``data.json``'s content: each data folder's manifest ``config_hash`` (None when it has none)."""
    return {role: (manifest or {}).get("config_hash") for role, manifest in data_manifests.items()}


def _plain(obj) -> dict:
    """A config dict as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(obj))


def resume_problems(run_dir: str, configs: dict) -> list[str]:
    """One line per field of ``configs`` ({file name: dict}) that differs from the run's saved file.

    Only for a run that has checkpoints or fit's saves (there is nothing to resume otherwise); a file the run
    does not have is not compared, nor a field the command does not give.
    """
    if not has_checkpoints(run_dir) and not has_fit_saves(run_dir):
        return []
    out, allowed = [], set()
    for name, new in configs.items():
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            old = json.load(f)
        allowed |= RESUMABLE.get(name, frozenset())
        # a model field newer than the run's file is at its default there (as GPTConfig reads the file)
        saved = {**(dataclasses.asdict(GPTConfig()) if name == MODEL_CONFIG else {}), **old}
        for key, value in sorted(_plain(new).items()):  # the command's fields (a config's defaults are the code's)
            if key not in RESUMABLE.get(name, ()) and saved.get(key) != value:
                out.append(f"{path}: {key} is {json.dumps(saved.get(key))} in the run, {json.dumps(value)} in this command")
    if out:
        may = f"only --{', --'.join(sorted(allowed))} may change" if allowed else "no flag of the model may change"
        out.append(f"{run_dir} holds checkpoints of another configuration: resume it with its own flags ({may}), "
                   "or give a new --run_dir")
    return out
