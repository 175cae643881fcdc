"""The command line's training loop: a ``strategy.run`` step loop (Keras's ``fit`` breaks under multi-worker) that
drives the model's own ``train_step``. Pre-training (``lm_objective``) and fine-tuning (``task_objective``) both
run ``TrainLoop``; an objective supplies its compiled model and its data, the loop the rest: what ``fit`` does not
give (``tf.distribute`` strategies, preemption, checkpoints holding the whole state, exact resume).

The forward pass, the loss and the update are the model's: each replica calls Keras's ``train_step`` of the model
(its compiled loss, ``GPTAdamW``'s update: one all-reduce of the gradients, clipping at their global norm), as
``fit`` does. One update = one global batch, split evenly over replicas and, within a replica, into
``grad_accum_steps`` micro-batches, one ``train_step`` each, whose gradients the optimizer accumulates
(``gradient_accumulation_steps``) and applies once; every loss is a mean over examples, so any number of replicas
and micro-batches gives the full-batch update. ``jit_compile`` compiles the ``train_step`` with XLA (one replica only:
its update's collectives cannot run inside XLA).

Checkpoints (``gpt_tf.runs.checkpoints``) hold the model, the optimizer (moments, step counter), the
dropout seed state and the step. The data position is a function of the step: the input
pipelines are deterministic, so on resume each skips the batches it had already produced. This
works under every strategy (distributed iterators cannot be checkpointed), and a killed run resumes
bit-for-bit where its last checkpoint was taken. On SIGTERM (``gpt_tf.training.preemption``) the stop request
is all-reduced after the update, so every worker finishes the same update, saves it and
raises ``Preempted``: a preempted run loses no update and repeats no batch.

A checkpoint the storage refuses (a full disk, a read-only folder: ``gpt_tf.write_errors``) leaves no file of
itself behind and raises ``WriteError``; the checkpoints before it stay as they were, so the same command
resumes from the newest of them once the storage is fixed. The run folder is checked before each save:
removed (or replaced) while training, the run stops with a ``WriteError`` instead of saving into a new,
empty folder.
"""

from __future__ import annotations

import errno
import os

from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.backend import require_tensorflow
from gpt_tf.runs.checkpoints import checkpoint_managers, remove_scratch, restore_latest, variables_by_key
from gpt_tf.training.preemption import Preempted, StopRequest
from gpt_tf.strategy import is_chief
from gpt_tf.write_errors import WriteError, writing


class DataError(RuntimeError):
    """A data file could not be read during training (e.g. a corrupt shard); the message names it."""


def named_data_error(err: tf.errors.OpError, data_dirs) -> DataError:
    """``err`` (tf.data's ``DataLossError``, which names no file) as a ``DataError`` naming the bad file(s).

    The files are found by their sha256 against the manifests. Raised from the failed step, before
    its update is applied or any checkpoint is saved, so the last checkpoint predates the bad read.
    """
    from gpt_tf.data.records import data_file_problems, read_manifest

    bad = [line for d in data_dirs for line in data_file_problems(d, read_manifest(d))]
    where = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
    where = where or f"a file under {', '.join(map(str, data_dirs))} (each one's sha256 still matches)"
    detail = err.message.strip().splitlines()[0][:200]
    return DataError(f"reading the data failed: {where} [{type(err).__name__}: {detail}]; "
                     "no checkpoint was written after the failed read")


def micro_batches(batch, accum: int):
    """``batch`` (a nest of tensors with the batch first) as ``accum`` stacked micro-batches."""
    return tf.nest.map_structure(lambda t: tf.reshape(t, tf.concat([[accum, -1], tf.shape(t)[1:]], 0)), batch)


class TrainLoop:
    """The step loop, its checkpoints and its update functions, for the variables of one objective.

    ``model_variables`` and ``optimizer`` are what a checkpoint holds besides the step; the step
    variable is made here, under ``strategy``.
    """

    def __init__(self, strategy, run_dir: str, model_variables, optimizer, *, grad_accum_steps: int = 1,
                 jit_compile: bool = False, checkpoint_every: int = 0, keep_checkpoints: int = 1, log=print):
        require_tensorflow("gpt_tf's training loop (pre-training and fine-tuning runs, tf.distribute)")
        self.strategy, self.optimizer, self.log = strategy, optimizer, log
        self.grad_accum_steps, self.jit_compile, self.checkpoint_every = grad_accum_steps, jit_compile, checkpoint_every
        self.chief = is_chief(strategy)
        with strategy.scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(model=variables_by_key(model_variables),
                                              optimizer=variables_by_key(optimizer.variables), step=self.step)
        self.manager, self.read_manager = checkpoint_managers(self.checkpoint, run_dir, strategy, keep_checkpoints)
        self.run_dir = run_dir
        self._run_dir_id = folder_identity(run_dir)  # None until it exists (the first save makes it)

    def restore(self, resuming: bool = True) -> int:
        """Restores the chief's latest checkpoint if any; returns the step reached (``restore_latest``)."""
        return restore_latest(self.read_manager, self.step, self.log, resuming)

    def save(self, step: int) -> None:
        """Checkpoint ``step`` (collective: every worker calls it). ``WriteError`` when the storage refuses it
        (no file of it is left) or when the chief's run folder was removed or replaced since the last save."""
        prefix = os.path.join(self.manager.directory, f"ckpt-{step}")
        if self.chief and self._run_dir_id is not None and folder_identity(self.run_dir) != self._run_dir_id:
            raise WriteError(errno.ENOENT, prefix, f"the run folder {self.run_dir} was removed or replaced while "
                                                   f"training: step {step} was not saved, and nothing more is written")
        try:
            with writing(prefix):
                self.manager.save(checkpoint_number=step)
        except WriteError:
            remove_unlisted(self.manager.directory, prefix)
            raise
        if self._run_dir_id is None:
            self._run_dir_id = folder_identity(self.run_dir)

    # ------------------------------------------------------------------ one update
    def make_update(self, model):
        """A ``tf.function(iterator, stop) -> stop``: one update of ``model`` (compiled with a ``GPTAdamW`` of
        ``gradient_accumulation_steps`` = ``grad_accum_steps``) by its ``train_step`` on each micro-batch of the next
        global batch. ``stop`` (float32, > 0 to request a stop) comes back summed over all replicas. The loss is
        then ``model.get_metrics_result()["loss"]`` (reset with ``model.reset_metrics()``), the gradient norm
        ``model.optimizer.global_norm``."""
        accum = self.grad_accum_steps
        # One function per micro-batch: each is traced with its own choice of accumulating or updating (micro_batch)
        steps = [tf.function(model.train_step, jit_compile=True) if self.jit_compile else model.train_step
                 for _ in range(accum)]

        def replica(batch, stop):
            if accum == 1:
                steps[0](batch)
            else:
                micro = micro_batches(batch, accum)
                for i in range(accum):  # unrolled: the optimizer's update (its collectives) in the last, no tf.cond
                    with model.optimizer.micro_batch(last=i == accum - 1):
                        steps[i](tf.nest.map_structure(lambda t, i=i: t[i], micro))
            # Any worker's stop request reaches every worker: they all stop after this update.
            stop = tf.identity(stop)  # placed on this replica's device (collectives need one)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, stop)

        @tf.function
        def update(iterator, stop):
            stop = self.strategy.run(replica, args=(next(iterator), stop))
            self.step.assign_add(1)
            return self.strategy.experimental_local_results(stop)[0]  # identical on all replicas

        return update

    # ------------------------------------------------------------------ the loop
    def run(self, end: int, objective) -> None:
        """Runs updates until the step reaches ``end``; raises ``Preempted`` after saving on SIGTERM.

        ``objective`` provides ``run_update(step, stop)`` (update number ``step + 1``; returns the
        ``make_update`` function's ``stop``), ``data_dirs(step)`` (named when a read fails), ``after_update(step,
        outputs) -> bool`` (logging, evaluation; True: save a checkpoint now) and ``after_save(step)``.
        A checkpoint is saved every ``checkpoint_every`` steps (0: never for that reason), at ``end``,
        when ``after_update`` asks and when stopping.
        """
        try:
            with StopRequest() as stop_request:
                self._run(end, objective, stop_request)
        finally:
            remove_scratch(self.manager, self.read_manager)

    def _run(self, end, objective, stop_request) -> None:
        while (step := int(self.step.numpy())) < end:
            try:
                stop = objective.run_update(step, tf.constant(float(stop_request.requested)))
            except tf.errors.DataLossError as err:
                raise named_data_error(err, objective.data_dirs(step)) from None
            step = int(self.step.numpy())
            due = objective.after_update(step)
            stopping = float(stop) > 0 and step < end
            every = self.checkpoint_every and step % self.checkpoint_every == 0
            if due or every or step == end or stopping:
                self.save(step)
            if stopping:
                raise Preempted(step, os.path.join(self.read_manager.directory, f"ckpt-{step}"))
            objective.after_save(step)


def folder_identity(path: str):
    """(device, inode) of a local folder, None when it does not exist or is remote: a folder removed, or removed and
    made again, has another."""
    if "://" in str(path):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def remove_unlisted(directory: str, prefix: str) -> None:
    """Removes the files of checkpoint ``prefix`` (``.index``, ``.data-*``, the ``_temp`` folder of a save in
    progress) unless ``directory``'s checkpoint state lists it: what a save that failed part-way leaves."""
    try:
        state = tf.train.get_checkpoint_state(directory)
        listed = {os.path.basename(p) for p in state.all_model_checkpoint_paths} if state else set()
        if os.path.basename(prefix) in listed:
            return
        for path in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp"):
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
    except (tf.errors.OpError, OSError):  # a read-only or vanished folder: nothing could have been written there
        pass
