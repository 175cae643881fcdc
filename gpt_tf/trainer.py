"""The pre-training loop: a custom ``strategy.run`` loop (Keras ``fit`` breaks under multi-worker).

One update = one global batch of ``batch_size`` sequences, split evenly over replicas and,
within a replica, into ``grad_accum_steps`` micro-batches whose gradients are summed before
the single all-reduce, so accumulation gives exactly the large-batch update. The loss is the
mean token cross-entropy over the global batch (Eq. 1).

Checkpoints hold the model, the optimizer (moments, step counter), the dropout seed state and
the step. The data position is a function of the step: the input pipeline is deterministic
(seeded shuffle, deterministic interleave), so on resume each input pipeline skips the batches
it had already produced. This works under every strategy (tf.distribute's distributed
iterators cannot be checkpointed), and a killed run resumes bit-for-bit where its last
checkpoint was taken. On SIGTERM (``gpt_tf.preemption``) every worker finishes the update in
flight, saves it and raises ``Preempted``, so a preempted run loses no update and repeats no batch.

Only the chief writes checkpoints and summaries (``gpt_tf.strategy.checkpoint_managers``); every
worker restores from the chief's. ``jit_compile`` compiles each replica's forward/backward pass
(and the evaluation forward pass) with XLA; the all-reduce and the optimizer update stay outside,
where tf.distribute's cross-device collectives run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import time

import keras
import tensorflow as tf

from gpt_tf.config import GPTConfig
from gpt_tf.model import GPTLanguageModel, lm_loss
from gpt_tf.optim import WarmupDecay, make_optimizer
from gpt_tf.preemption import Preempted, StopRequest
from gpt_tf.run_dir import DATA_FILE, write_json_atomic
from gpt_tf.strategy import checkpoint_managers, is_chief, remove_scratch
from pipelines.reader import batches_per_pipeline, pretraining_dataset


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a pre-training run needs besides the model config."""

    data_dir: str
    run_dir: str
    batch_size: int = 64  # global, in sequences
    grad_accum_steps: int = 1
    train_steps: int = 100_000
    learning_rate: float = 2.5e-4
    warmup_steps: int = 2000
    lr_decay: str = "cosine"
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    adam_beta_1: float = 0.9
    adam_beta_2: float = 0.999
    adam_epsilon: float = 1e-8
    precision: str = "float32"  # or "mixed_bfloat16"
    jit_compile: bool = False  # XLA-compile each replica's forward/backward pass
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 0  # 0: the whole held-out split
    sample_every: int = 0  # 0: only at the end
    sample_prompt: str = ""
    sample_length: int = 64


class DataError(RuntimeError):
    """A data file could not be read during training (e.g. a corrupt shard); the message names it."""


def named_data_error(err: tf.errors.OpError, data_dirs) -> DataError:
    """``err`` (tf.data's ``DataLossError``, which names no file) as a ``DataError`` naming the bad file(s).

    The files are found by their sha256 against the manifests. Raised from the failed step, before
    its update is applied or any checkpoint is saved, so the last checkpoint predates the bad read.
    """
    from pipelines.records import data_file_problems, read_manifest as read_manifest_json

    bad = [line for d in data_dirs for line in data_file_problems(d, read_manifest_json(d))]
    where = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
    where = where or f"a file under {', '.join(map(str, data_dirs))} (each one's sha256 still matches)"
    detail = err.message.strip().splitlines()[0][:200]
    return DataError(f"reading the data failed: {where} [{type(err).__name__}: {detail}]; "
                     "no checkpoint was written after the failed read")


def variables_by_key(variables):
    """A checkpointable dict of the raw tf.Variables behind Keras variables, keyed by index and path.

    Keras numbers dropout seed generators and optimizers process-wide (``seed_generator_7``,
    ``gpt_adam_w_1``); the number is dropped so that the same model and optimizer built in another
    process (or built twice in one) map to the same keys.
    """
    key = lambda i, v: f"{i:04d}." + re.sub(r"(seed_generator|gpt_adam_w)_\d+", r"\1", v.path).replace("/", ".")
    return {key(i, v): v.value for i, v in enumerate(variables)}


def all_reduce_and_apply(grads, variables, optimizer):
    """In a replica: sums gradients over replicas (once), then clips and applies them; returns the norm."""
    grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
    grad_norm = tf.linalg.global_norm(grads)
    optimizer.apply(grads, variables)
    return grad_norm


def restore_latest(manager: tf.train.CheckpointManager, step: tf.Variable, log=print, resuming: bool = True) -> int:
    """Restores ``manager``'s latest checkpoint, if any, every object matched; returns the step.

    ``resuming``: training goes on from it ("resumed from"), else the model is only read ("loaded").
    """
    latest = manager.latest_checkpoint
    if latest:
        manager.checkpoint.restore(latest).assert_existing_objects_matched()
        at = int(step.numpy())
        log(f"resumed from {latest} at step {at}" if resuming else f"loaded {latest} (step {at})")
    return int(step.numpy())


def restore_pretrained_lm(lm: GPTLanguageModel, path: str) -> str:
    """Loads pre-trained weights into ``lm``; returns what was read.

    ``path``: a pre-training run dir (its latest checkpoint), a checkpoint prefix, or a directory of
    the GPT-1 release shards (``params_0.npy`` … with ``params_shapes.json``).
    """
    if os.path.isfile(os.path.join(path, "params_0.npy")):
        from gpt_tf.weights import load_gpt1_release

        load_gpt1_release(lm, path)
        return path
    prefix = tf.train.latest_checkpoint(os.path.join(path, "checkpoints")) if os.path.isdir(path) else path
    if not prefix or not tf.io.gfile.exists(prefix + ".index"):
        raise FileNotFoundError(f"no pre-trained checkpoint at {path} (want a run dir, a ckpt prefix or GPT-1 shards)")
    tf.train.Checkpoint(model=variables_by_key(lm.variables)).restore(prefix).expect_partial().assert_existing_objects_matched()
    return prefix


class Pretrainer:
    """Builds model, optimizer, data and checkpoint under ``strategy`` and runs the LM objective."""

    def __init__(self, model_config: GPTConfig, config: TrainConfig, strategy, log=print):
        self.model_config, self.config, self.strategy, self.log = model_config, config, strategy, log
        self.chief = is_chief(strategy)
        self.replicas = strategy.num_replicas_in_sync
        per_replica, rem = divmod(config.batch_size, self.replicas * config.grad_accum_steps)
        if rem or per_replica == 0:
            raise ValueError(
                f"batch_size={config.batch_size} must be a positive multiple of replicas ({self.replicas}) × "
                f"grad_accum_steps ({config.grad_accum_steps})"
            )
        keras.utils.set_random_seed(config.seed)
        with strategy.scope():
            self.model = GPTLanguageModel.from_config_preset(model_config, dtype=config.precision)
            self.schedule = WarmupDecay(config.learning_rate, config.warmup_steps, config.train_steps, config.lr_decay)
            self.optimizer = make_optimizer(
                self.model.trainable_variables,
                self.schedule,
                weight_decay=config.weight_decay,
                clip_norm=config.clip_norm,
                beta_1=config.adam_beta_1,
                beta_2=config.adam_beta_2,
                epsilon=config.adam_epsilon,
            )
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(
            model=variables_by_key(self.model.variables),
            optimizer=variables_by_key(self.optimizer.variables),
            step=self.step,
        )
        self.manager, self.read_manager = checkpoint_managers(self.checkpoint, config.run_dir, strategy, config.keep_checkpoints)
        if config.jit_compile:
            self._micro_grads = tf.function(self._micro_grads, jit_compile=True)
            self._replica_eval_step = tf.function(self._replica_eval_step, jit_compile=True)

    # ------------------------------------------------------------------ data
    def _distributed_dataset(self, split, repeat, start_step=0, max_steps=0):
        """The split as per-replica batches; training skips the batches of ``start_step`` updates.

        Without ``repeat``, every input pipeline yields the same number of updates' batches (at most
        ``max_steps`` if set), so multi-worker evaluation ends on the same step on every worker.
        """
        c = self.config

        def dataset_fn(ctx):
            per_update = ctx.num_replicas_in_sync // ctx.num_input_pipelines  # batches a pipeline feeds per update
            dataset = pretraining_dataset(
                c.data_dir,
                split,
                batch_size=ctx.get_per_replica_batch_size(c.batch_size),
                n_ctx=self.model_config.n_ctx,
                shuffle=split == "train",
                seed=c.seed,
                repeat=repeat,
                input_context=ctx,
            )
            if not repeat:
                batch = ctx.get_per_replica_batch_size(c.batch_size)
                steps = batches_per_pipeline(c.data_dir, split, batch, ctx.num_input_pipelines) // per_update
                dataset = dataset.take(per_update * (min(steps, max_steps) if max_steps else steps))
            return dataset.skip(start_step * per_update)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    # ------------------------------------------------------------------ steps
    def _micro_grads(self, x, y):
        """Gradients of one micro-batch's share of the global mean loss, and its loss sum."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss_sum, _ = lm_loss(self.model(x, training=True), y)
            scaled = loss_sum / tf.cast(self.config.batch_size * self.model_config.n_ctx, tf.float32)
        return tape.gradient(scaled, variables), loss_sum

    def _replica_train_step(self, inputs, targets, stop):
        accum, variables = self.config.grad_accum_steps, self.model.trainable_variables
        global_tokens = tf.cast(self.config.batch_size * self.model_config.n_ctx, tf.float32)
        if accum == 1:
            grads, loss_sum = self._micro_grads(inputs, targets)
        else:
            xs = tf.reshape(inputs, (accum, -1, tf.shape(inputs)[-1]))
            ys = tf.reshape(targets, (accum, -1, tf.shape(targets)[-1]))
            grads = [tf.zeros_like(v.value) for v in variables]
            loss_sum = tf.constant(0.0)
            for i in tf.range(accum):
                g, l = self._micro_grads(xs[i], ys[i])
                grads = [a + b for a, b in zip(grads, g)]
                loss_sum += l
        # Any worker's stop request reaches every worker with the loss: they all stop after this update.
        stop = tf.identity(stop)  # placed on this replica's device (collectives need one)
        loss_sum, stop = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, [loss_sum, stop])
        grad_norm = all_reduce_and_apply(grads, variables, self.optimizer)
        return loss_sum / global_tokens, grad_norm, stop

    @tf.function
    def _run_train_step(self, iterator, stop):
        """One update; ``stop`` (float32, > 0 to request a stop) comes back summed over all replicas."""
        inputs, targets = next(iterator)
        loss, grad_norm, stop = self.strategy.run(self._replica_train_step, args=(inputs, targets, stop))
        self.step.assign_add(1)
        first = lambda t: self.strategy.experimental_local_results(t)[0]  # identical on all replicas
        return first(loss), first(grad_norm), first(stop)

    def _replica_eval_step(self, inputs, targets):
        return lm_loss(self.model(inputs, training=False), targets)

    @tf.function
    def _run_eval_step(self, batch):
        loss_sum, count = self.strategy.run(self._replica_eval_step, args=batch)
        reduce = lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None)
        return reduce(loss_sum), reduce(count)

    # ------------------------------------------------------------------ public
    def restore(self, resuming: bool = True) -> int:
        """Restores the chief's latest checkpoint if any; returns the step reached (see ``restore_latest``)."""
        return restore_latest(self.read_manager, self.step, self.log, resuming)

    def weights_digest(self) -> str:
        """SHA-256 of the model's weights: equal on every worker of a job whose replicas are in sync."""
        digest = hashlib.sha256()
        for variable in self.model.variables:
            digest.update(variable.numpy().tobytes())
        return digest.hexdigest()

    def evaluate(self, max_batches: int = 0) -> dict:
        """Token-level perplexity on the held-out split (whole split unless ``max_batches``)."""
        loss_sum, tokens = 0.0, 0.0
        try:
            for batch in self._distributed_dataset("valid", repeat=False, max_steps=max_batches):
                s, n = self._run_eval_step(batch)
                loss_sum, tokens = loss_sum + float(s), tokens + float(n)
        except tf.errors.DataLossError as err:
            raise named_data_error(err, [self.config.data_dir]) from None
        if not tokens:
            raise ValueError(f"held-out split of {self.config.data_dir} gave no full batch of {self.config.batch_size}")
        loss = loss_sum / tokens
        return {"loss": loss, "perplexity": math.exp(loss), "tokens": int(tokens)}

    def train(self, callbacks=None) -> dict:
        """Runs until ``train_steps``; ``callbacks`` is a ``TrainCallbacks`` (summaries, samples, eval).

        Raises ``Preempted`` after saving the step reached when SIGTERM arrives on any worker.
        """
        try:
            with StopRequest() as stop_request:
                return self._train(stop_request, callbacks)
        finally:
            remove_scratch(self.manager, self.read_manager)

    def _train(self, stop_request, callbacks) -> dict:
        c = self.config
        start = self.restore()
        iterator = iter(self._distributed_dataset("train", repeat=True, start_step=start))
        if start >= c.train_steps:
            self.log(f"already at step {start} >= train_steps={c.train_steps}; nothing to train")
        tokens_per_step = c.batch_size * self.model_config.n_ctx
        t0, last = time.perf_counter(), start
        loss = grad_norm = None
        while int(self.step.numpy()) < c.train_steps:
            try:
                loss, grad_norm, stop = self._run_train_step(iterator, tf.constant(float(stop_request.requested)))
            except tf.errors.DataLossError as err:
                raise named_data_error(err, [c.data_dir]) from None
            step = int(self.step.numpy())
            if step % c.log_every == 0 or step == c.train_steps:
                elapsed = time.perf_counter() - t0
                stats = {
                    "loss": float(loss),
                    "perplexity": math.exp(min(float(loss), 50.0)),
                    "learning_rate": float(self.schedule(step - 1)),
                    "grad_norm": float(grad_norm),
                    "tokens_per_sec": (step - last) * tokens_per_step / max(elapsed, 1e-9),
                }
                if callbacks:
                    callbacks.on_log(step, stats)
                t0, last = time.perf_counter(), step
            stopping = float(stop) > 0 and step < c.train_steps
            if step % c.checkpoint_every == 0 or step == c.train_steps or stopping:
                self.manager.save(checkpoint_number=step)
            if stopping:
                raise Preempted(step, os.path.join(self.read_manager.directory, f"ckpt-{step}"))
            if callbacks:
                callbacks.on_step_end(step, self)
        return {"step": int(self.step.numpy()), "loss": None if loss is None else float(loss),
                "weights_sha256": self.weights_digest()}

    def save_model_config(self, data: dict | None = None) -> None:
        """Writes ``run_dir/model_config.json``, ``train_config.json`` and ``data.json`` atomically (chief only)."""
        if not self.chief:
            return
        for name, obj in (("model_config.json", self.model_config), ("train_config.json", self.config)):
            write_json_atomic(os.path.join(self.config.run_dir, name), dataclasses.asdict(obj))
        if data is not None:
            write_json_atomic(os.path.join(self.config.run_dir, DATA_FILE), data)
