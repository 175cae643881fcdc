"""One home for checkpoints and run folders: keys, managers, restoring, and the model a run implies.

A checkpoint holds ``model`` and ``optimizer`` (each a ``variables_by_key`` dict) and ``step``.
Only the chief writes into ``run_dir/checkpoints``; under multi-worker every worker must still call
``save`` (TF's collective save), so the others save to a private scratch folder
(``checkpoint_managers``; one a killed worker left is removed by the next worker to start on that
machine) and every worker restores from the chief's folder, which must therefore be on storage all
workers read (a shared file system or ``gs://``).

Readers of finished runs (``serving/export.py``, ``gpt_tf/analysis/zero_shot.py``) build models here
without any optimizer or training data: ``load_task_model`` (a fine-tuning run, as
``pipelines.run_folder.RunFolder`` read it) and ``restore_pretrained_lm`` (a pre-training run, a
checkpoint prefix or GPT-1 release shards).
Nothing here imports training code or ``pipelines``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile

import tensorflow as tf

from gpt_tf import preset_io
from gpt_tf.config import GPTConfig
from gpt_tf.run_dir import pretrained_model_config
from gpt_tf.strategy import is_chief

CHECKPOINTS = "checkpoints"  # a run folder's sub-folder


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
        if match and not _pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


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


# ---------------------------------------------------------------------- the model a run implies
def restore_pretrained_lm(lm, path: str) -> str:
    """Loads pre-trained weights into the ``GPT1CausalLM`` ``lm``; returns what was read.

    ``path``: a pre-training run dir (its latest checkpoint), a checkpoint prefix, a directory of
    the GPT-1 release shards (``params_0.npy`` … with ``params_shapes.json``) or a preset folder
    (``config.json`` + ``model.weights.h5``, e.g. ``gpt_tf/presets/gpt1_tiny_books_en``).
    """
    if preset_io.is_preset(path):
        return preset_io.load_preset_weights(lm.backbone, path)
    if os.path.isfile(os.path.join(path, "params_0.npy")):
        from gpt_tf.convert.release import load_gpt1_release

        load_gpt1_release(lm, path)
        return path
    prefix = tf.train.latest_checkpoint(os.path.join(path, CHECKPOINTS)) if os.path.isdir(path) else path
    if not prefix or not tf.io.gfile.exists(prefix + ".index"):
        raise FileNotFoundError(f"no pre-trained checkpoint at {path} (want a run dir, a ckpt prefix, GPT-1 shards "
                                "or a preset folder)")
    tf.train.Checkpoint(model=variables_by_key(lm.variables)).restore(prefix).expect_partial().assert_existing_objects_matched()
    return prefix


def initialise_from_pretrained(model, path: str, n_layers: int, seed: int = 0) -> list[str]:
    """Fine-tuning's start (§3.2): the pre-trained LM at ``path`` (see ``restore_pretrained_lm``) into
    ``model``'s backbone: its embeddings and first ``n_layers`` blocks, then the special-token rows
    re-drawn (deterministic in ``seed``). Returns the paths of the variables overwritten."""
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.task_model import reset_special_embeddings, transfer_layers

    lm = causal_lm_for(pretrained_model_config(path))  # its own n_ctx
    restore_pretrained_lm(lm, path)
    copied = transfer_layers(lm, model.backbone, n_layers)
    reset_special_embeddings(model.backbone, seed=seed)
    return copied


def continue_from_pretrained(lm, path: str) -> list[str]:
    """Continued pre-training's start: the pre-trained LM at ``path`` (see ``restore_pretrained_lm``) into the
    ``GPT1CausalLM`` ``lm``: every block, the embeddings with their special-token rows, and the first
    ``lm``'s n_ctx position rows (its context may be shorter). Returns the paths of the variables overwritten."""
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.task_model import transfer_layers

    source = causal_lm_for(pretrained_model_config(path))  # its own n_ctx
    restore_pretrained_lm(source, path)
    return transfer_layers(source, lm, lm.backbone.config.n_layer)


def build_task_models(model_config: GPTConfig, tasks, clf_pdrop: float, precision: str) -> list:
    """One ``GPTTaskModel`` per task, all on one backbone (the primary task first): a run's model.

    Fine-tuning and ``load_task_model`` build it here alike, so the checkpoint keys (variable order) match.
    """
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.task_model import GPTTaskModel

    backbone = backbone_for(model_config, dtype=precision)
    return [GPTTaskModel(backbone, task, clf_pdrop=clf_pdrop, dtype=precision) for task in tasks]


def load_task_model(run, precision: str = "float32"):
    """(``GPTTaskModel``, ``TaskSpec``) of a fine-tuning run's latest checkpoint: its primary task.

    ``run``: the run folder as ``pipelines.run_folder.RunFolder`` read it once (its ``model_config``,
    ``run_config`` and the ``tasks`` its data manifests name; the core does not import ``pipelines``).
    A multi-task run gets its shared backbone and every head; only the model's weights are
    restored: no optimizer, no data.
    """
    run_dir = run.path
    models = build_task_models(run.model_config, run.tasks, run.run_config.get("clf_pdrop", 0.1), precision)
    latest = tf.train.latest_checkpoint(os.path.join(run_dir, CHECKPOINTS))
    if not latest:
        raise FileNotFoundError(f"{run_dir}/{CHECKPOINTS} holds no checkpoint")
    model = variables_by_key(unique_variables(v for m in models for v in m.variables))
    tf.train.Checkpoint(model=model).restore(latest).expect_partial().assert_existing_objects_matched()
    return models[0], run.tasks[0]
