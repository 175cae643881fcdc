"""A run's checkpoints: their keys, the managers that write them, and reading them back.

A checkpoint holds ``model`` and ``optimizer`` (each a ``variables_by_key`` dict) and ``step``. Only the chief
writes into ``run_dir/checkpoints``; under multi-worker every worker must still call ``save`` (TF's collective
save), so the others save to a private scratch folder (``checkpoint_managers``; one a killed worker left is
removed by the next worker to start on that machine) and every worker restores from the chief's folder, which
must therefore be on storage all workers read (a shared file system or ``gs://``).

Training resumes from the newest intact checkpoint (``restore_latest``); readers of a finished run build its
model without any optimizer or training data (``load_task_model``: a fine-tuning run; ``restore_weights``:
any model from a checkpoint prefix, e.g. a language model from a pre-training run's, ``gpt_tf/convert/
pretrained.py``).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile

from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.config import GPTConfig
from gpt_tf.runs.files import CHECKPOINTS
from gpt_tf.strategy import is_chief
from gpt_tf.data.common import pid_alive


def variables_by_key(variables):
    """A checkpointable dict of the raw tf.Variables behind Keras variables, keyed by index and path.

    Keras numbers dropout seed generators and optimizers process-wide (``seed_generator_7``,
    ``gpt_adam_w_1``); the number is dropped so that the same model and optimizer built in another
    process (or built twice in one) map to the same keys.
    """
    key = lambda i, v: f"{i:04d}." + re.sub(r"(seed_generator|gpt_adam_w)_\d+", r"\1", v.path).replace("/", ".")
    return {key(i, v): v.value for i, v in enumerate(variables)}


def unique_variables(variables) -> list:
    """``variables`` without repeats (task heads share the backbone's), in first-seen order."""
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


# ---------------------------------------------------------------------- managers
def checkpoint_dirs(run_dir: str, strategy) -> tuple[str, str]:
    """(read, write) checkpoint folders: the chief's ``run_dir/checkpoints`` and, off the chief, a scratch folder."""
    shared = os.path.join(run_dir, CHECKPOINTS)
    if is_chief(strategy):
        return shared, shared
    remove_dead_scratch()
    scratch = tempfile.mkdtemp(prefix=f"gpt_tf_worker{strategy.cluster_resolver.task_id}_ckpt_{os.getpid()}_")
    return shared, scratch


def remove_dead_scratch() -> None:
    """Removes the scratch checkpoint folders of workers that are gone without cleaning up (``kill -9``, a lost
    machine): each is a whole checkpoint. Folders of running processes, or of another machine's, are kept."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "gpt_tf_worker*_ckpt_*_*")):
        match = re.fullmatch(r"gpt_tf_worker\d+_ckpt_(\d+)_\w+", os.path.basename(path))
        if match and not pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def checkpoint_managers(checkpoint: tf.train.Checkpoint, run_dir: str, strategy,
                        max_to_keep: int) -> tuple[tf.train.CheckpointManager, tf.train.CheckpointManager]:
    """(write, read) managers of ``checkpoint``: the same one on the chief; off it, scratch and the chief's.

    Call ``remove_scratch(write, read)`` when training ends.
    """
    read_dir, write_dir = checkpoint_dirs(run_dir, strategy)
    write = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=max_to_keep)
    read = write if read_dir == write_dir else tf.train.CheckpointManager(checkpoint, read_dir, max_to_keep=max_to_keep)
    return write, read


def remove_scratch(write: tf.train.CheckpointManager, read: tf.train.CheckpointManager) -> None:
    """Deletes a non-chief worker's scratch checkpoints (``checkpoint_managers``); no-op on the chief."""
    if write is not read:
        shutil.rmtree(write.directory, ignore_errors=True)


class CheckpointError(RuntimeError):
    """No kept checkpoint of a run could be read (each is named with its error)."""


def _first_line(err: Exception) -> str:
    text = getattr(err, "message", str(err)).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200] if text else ''}"


def restore_latest(manager: tf.train.CheckpointManager, step: tf.Variable, log=print, resuming: bool = True) -> int:
    """Restores ``manager``'s latest intact checkpoint, if any, every object matched; returns the step.

    A checkpoint that cannot be read (a corrupt or truncated file: ``DataLossError``, "Checksum does
    not match") is passed over for the newest older one that can, and one line says so; when none can,
    ``CheckpointError`` lists them. ``resuming``: training goes on from it ("resumed from"), else the
    model is only read ("loaded").
    """
    latest = manager.latest_checkpoint
    if not latest:
        return int(step.numpy())
    candidates = [latest] + [p for p in reversed(manager.checkpoints) if p != latest]
    failed = []
    for prefix in candidates:
        try:
            manager.checkpoint.restore(prefix).assert_existing_objects_matched()
        except (tf.errors.OpError, IndexError, ValueError) as err:  # unreadable (corrupt, truncated) files
            failed.append(f"{prefix} ({_first_line(err)})")
            continue
        at = int(step.numpy())
        done = f"resumed from {prefix} at step {at}" if resuming else f"loaded {prefix} (step {at})"
        log(f"cannot read {'; '.join(failed)}: {done} instead, the newest intact checkpoint" if failed else done)
        return at
    raise CheckpointError(f"no checkpoint of {manager.directory} can be read: {'; '.join(failed)}")


def kept_checkpoints(run_dir: str, step: int = 0) -> list[tuple[int, str]]:
    """``[(step, prefix)]`` of the run's kept checkpoints in step order (only ``step`` if non-zero)."""
    ckpt_dir = os.path.join(run_dir, CHECKPOINTS)
    state = tf.train.get_checkpoint_state(ckpt_dir)
    found = []
    for prefix in list(state.all_model_checkpoint_paths) if state else []:
        match = re.search(r"ckpt-(\d+)$", prefix)
        if match:
            found.append((int(match.group(1)), prefix if os.path.isabs(prefix) else os.path.join(ckpt_dir, os.path.basename(prefix))))
    found.sort()
    if step:
        found = [(s, p) for s, p in found if s == step]
        if not found:
            raise FileNotFoundError(f"{ckpt_dir}: no kept checkpoint at step {step}")
    if not found:
        raise FileNotFoundError(f"{ckpt_dir}: no checkpoints")
    return found


def latest_checkpoint(run_dir: str) -> str:
    """The prefix of the run's newest listed checkpoint; FileNotFoundError naming the folder when it holds none."""
    prefix = tf.train.latest_checkpoint(os.path.join(run_dir, CHECKPOINTS))
    if not prefix:
        raise FileNotFoundError(f"{run_dir}/{CHECKPOINTS} holds no checkpoint")
    return prefix


def restore_weights(variables, prefix: str) -> None:
    """The model weights of the checkpoint ``prefix`` into ``variables`` (in the order the run's model lists them,
    ``variables_by_key``), every one of them found there; the optimizer and step it also holds are left alone."""
    checkpoint = tf.train.Checkpoint(model=variables_by_key(variables))
    checkpoint.restore(prefix).expect_partial().assert_existing_objects_matched()


def build_task_models(model_config: GPTConfig, tasks, clf_pdrop: float, precision: str, lm_coef: float = 0.5) -> list:
    """One keras-hub task of the family per task (``task_for_spec``), all on one backbone (the primary task first):
    a run's model, uncompiled.

    Fine-tuning and ``load_task_model`` build it here alike, so the checkpoint keys (variable order) match.
    """
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.gpt1.text_classifier import task_for_spec

    backbone = backbone_for(model_config, dtype=precision)
    return [task_for_spec(backbone, task, dropout=clf_pdrop, lm_coef=lm_coef) for task in tasks]


def load_task_model(run, precision: str = "float32"):
    """(the keras-hub task, ``TaskSpec``) of a fine-tuning run's latest checkpoint: its primary task.

    ``run``: the run folder as ``gpt_tf.runs.folder.RunFolder`` read it once (its ``model_config``,
    ``run_config`` and the ``tasks`` its data manifests name). A multi-task run gets its shared backbone and
    every head; only the model's weights are restored: no optimizer, no data.
    """
    models = build_task_models(run.model_config, run.tasks, run.run_config.get("clf_pdrop", 0.1), precision)
    restore_weights(unique_variables(v for m in models for v in m.variables), latest_checkpoint(run.path))
    return models[0], run.tasks[0]
