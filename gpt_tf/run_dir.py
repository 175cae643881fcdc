"""A run folder's config files: written atomically, and compared before a run resumes.

A run folder holds ``model_config.json`` and ``train_config.json`` (pre-training) or
``finetune_config.json`` (fine-tuning), plus ``data.json``: the ``config_hash`` of each data folder
the run reads, so that data rebuilt in place (same path, other content) is noticed too.

Re-running a command on a folder that holds checkpoints resumes it, and the data position is
computed from the step with the *current* batch size and data, so every hyper-parameter must be
the one the run started with. ``resume_problems`` lists each field that differs, except those in
``RESUMABLE``: the length of the run (``train_steps``, ``epochs``; fine-tuning's ``train_steps`` is a cap), how often it logs, checkpoints,
evaluates and samples, how it computes the same update (``grad_accum_steps``, ``jit_compile``),
where its data lives (the data's identity is checked through ``data.json`` instead), and how the run
folder itself is spelled: the folder being resumed is the one whose files are read, whatever its
name (``runs/x``, ``./runs/x/``, its absolute path, or the folder moved or copied elsewhere).

``lock_run_dir`` takes an advisory lock (``flock``) on ``.lock`` in the run folder for the life of the
process: a second trainer on the same folder stops with a clear message instead of both writing
checkpoints (and one resuming from the other's). The kernel drops the lock when the process ends,
however it ends (``kill -9`` included), so a stale lock cannot stop the next run.

Nothing here imports TensorFlow: the checks run before it starts. ``write_json_atomic`` (and
``write_text_atomic``) writes a temporary file beside the target and renames it over, so a killed command,
or one the disk ran out under, leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from typing import Optional

from gpt_tf import preset_io
from gpt_tf.config import GPTConfig, get_size
from gpt_tf.write_errors import writing

DATA_FILE = "data.json"
MODEL_CONFIG = "model_config.json"
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


def _plain(obj) -> dict:
    """A config dict as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(obj))


def has_checkpoints(run_dir: str) -> bool:
    return os.path.isfile(os.path.join(run_dir, "checkpoints", "checkpoint"))


def resume_problems(run_dir: str, configs: dict) -> list[str]:
    """One line per field of ``configs`` ({file name: dict}) that differs from the run's saved file.

    Only for a run that has checkpoints (there is nothing to resume otherwise); a file the run
    does not have is not compared, nor a field the command does not give.
    """
    if not has_checkpoints(run_dir):
        return []
    out, allowed = [], set()
    for name, new in configs.items():
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            old = json.load(f)
        allowed |= RESUMABLE.get(name, frozenset())
        for key, value in sorted(_plain(new).items()):  # the command's fields (a config's defaults are the code's)
            if key not in RESUMABLE.get(name, ()) and old.get(key) != value:
                out.append(f"{path}: {key} is {json.dumps(old.get(key))} in the run, {json.dumps(value)} in this command")
    if out:
        may = f"only --{', --'.join(sorted(allowed))} may change" if allowed else "no flag of the model may change"
        out.append(f"{run_dir} holds checkpoints of another configuration: resume it with its own flags ({may}), "
                   "or give a new --run_dir")
    return out


def data_identity(**data_manifests: Optional[dict]) -> dict:
    """``data.json``'s content: each data folder's manifest ``config_hash`` (None when it has none)."""
    return {role: (manifest or {}).get("config_hash") for role, manifest in data_manifests.items()}


def read_json(path: str) -> dict:
    """A JSON file of a run or data folder; FileNotFoundError naming it when it is missing."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found")
    with open(path) as f:
        return json.load(f)


def pretrained_model_config(path: str) -> GPTConfig:
    """The GPTConfig of a pre-training (or fine-tuning) run dir, a checkpoint prefix, GPT-1 release shards or a
    keras-hub preset folder (``gpt_tf/preset_io.py``)."""
    if os.path.isfile(os.path.join(path, "params_0.npy")):
        return get_size("gpt1")
    if preset_io.is_preset(path):
        return preset_io.preset_config(path)
    run_dir = path if os.path.isdir(path) else os.path.dirname(os.path.dirname(path))  # run/checkpoints/ckpt-N
    config_path = os.path.join(run_dir, MODEL_CONFIG)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} not found: {path} is not a gpt_tf run (nor GPT-1 release shards, "
                                "nor a preset folder)")
    with open(config_path) as f:
        return GPTConfig(**json.load(f))


def continued_model_config(init_checkpoint: str, data_dir: str, overrides: dict) -> tuple[GPTConfig, list[str]]:
    """Continued pre-training's model: ``init_checkpoint``'s (``pretrained_model_config``) with ``overrides``
    (``n_ctx``: the data's, at most the checkpoint's; dropouts), and the problems that forbid it
    (``overrides["vocab_size"]``, the data's tokenizer, must be the checkpoint's)."""
    config = pretrained_model_config(init_checkpoint)
    problems = []
    if config.vocab_size != overrides["vocab_size"]:
        problems.append(f"--init_checkpoint={init_checkpoint} has {config.vocab_size} BPE tokens but {data_dir} was "
                        f"tokenized with {overrides['vocab_size']}: rebuild it with the model's tokenizer")
    if overrides["n_ctx"] > config.n_ctx:
        problems.append(f"{data_dir} holds {overrides['n_ctx']}-token sequences, longer than the {config.n_ctx} "
                        f"positions of --init_checkpoint={init_checkpoint}")
    return config.replace(**{k: v for k, v in overrides.items() if k != "vocab_size"}), problems


LOCK_FILE = ".lock"


class RunDirLocked(RuntimeError):
    """Another process holds the run folder's lock; the message names the folder and the holder."""


def chief_task(workers: list, worker_index: int, environ=os.environ) -> bool:
    """Whether this process is the chief worker (from ``--workers`` / ``--worker_index`` or TF_CONFIG; no
    TensorFlow needed): the one that locks and writes the run folder."""
    if workers:
        return worker_index == 0
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return True  # TensorFlow reports a bad TF_CONFIG itself
    task = cluster.get("task", {})
    kind, index = task.get("type"), int(task.get("index", 0))
    return kind in (None, "chief") or (kind == "worker" and index == 0 and "chief" not in cluster.get("cluster", {}))


def lock_run_dir(run_dir: str):
    """Takes ``run_dir``'s lock (exclusive, non-blocking) and returns its open file: keep it for the run.

    RunDirLocked when another process holds it. The file says who holds it (pid, host, since when).
    """
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that is still running"
        handle.close()
        raise RunDirLocked(f"{run_dir} is in use by another trainer ({holder}; lock file {path}): two trainers "
                           "on one run folder would overwrite each other's checkpoints. Wait for it to end, or give "
                           "another --run_dir") from None
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n")
    handle.flush()
    return handle
