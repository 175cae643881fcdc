"""Supervised fine-tuning (§3.2): the pre-trained backbone, a linear head, L3 = L2 + λ·L1.

The paper's recipe is the default: lr 6.25e-5, batch 32, 3 epochs, linear decay with 0.2%
warm-up, classifier dropout 0.1, λ = 0.5. The ablations of §5 are options: no pre-training
(``init_checkpoint=""``), transfer of only the first ``transfer_layers`` blocks, λ = 0.

Like pre-training, it is a custom ``strategy.run`` loop; each update all-reduces once, and the
losses are scaled by global counts so any number of replicas gives the full-batch update.

Multi-task fine-tuning (§5 suggests it for small sets such as RTE): ``aux_data_dirs`` adds tasks
that share the backbone, each with its own W_y. Every update draws ONE task's batch, the task
chosen by a seeded schedule with probabilities ``mixture`` (default: proportional to the tasks'
training examples, i.e. the datasets concatenated); the update touches the backbone and that
task's head only. The run lasts ``epochs`` passes over the *primary* task (in expectation), and
every task is evaluated at each of those epoch boundaries.
"""

from __future__ import annotations

import dataclasses
import math
import os

import keras
import numpy as np
import tensorflow as tf

from gpt_tf import console
from gpt_tf.config import GPTConfig
from gpt_tf.finetune_io import pretrained_model_config
from gpt_tf.metrics import compute_metrics
from gpt_tf.model import GPTLanguageModel, make_backbone
from gpt_tf.optim import WarmupDecay, make_optimizer
from gpt_tf.strategy import checkpoint_managers, is_chief, remove_scratch
from gpt_tf.task_model import GPTTaskModel, reset_special_embeddings, task_loss, task_predictions, transfer_layers
from gpt_tf.tasks import TaskSpec
from gpt_tf.trainer import (all_reduce_and_apply, named_data_error, restore_latest, restore_pretrained_lm,
                            variables_by_key)
from pipelines.task_batches import bucket_lengths
from pipelines.transforms import load_task_spec, num_examples, special_ids_from_config, task_dataset


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run; defaults are the paper's recipe (§4.1, 'Fine-tuning details')."""

    data_dir: str  # task TFRecords from `python -m pipelines.finetune_data`
    run_dir: str
    init_checkpoint: str = ""  # pre-training run dir, checkpoint prefix or GPT-1 release dir; "" = from scratch
    transfer_layers: int = -1  # blocks transferred from init_checkpoint; -1 = all
    batch_size: int = 32
    epochs: int = 3
    learning_rate: float = 6.25e-5
    warmup_fraction: float = 0.002
    lm_coef: float = 0.5
    clf_pdrop: float = 0.1
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    precision: str = "float32"
    seed: int = 0
    log_every: int = 10
    train_split: str = "train"
    aux_data_dirs: tuple = ()  # multi-task: more tasks' TFRecords, trained together with data_dir's
    mixture: tuple = ()  # sampling weights for (data_dir, *aux_data_dirs); () = proportional to examples
    length_buckets: bool = True  # pad each batch to a length bucket (pipelines/task_batches.py); False: to n_ctx
    buckets_per_octave: int = 4  # bucket lengths per doubling (fewer: less padding cut, fewer XLA/TPU compilations)


@dataclasses.dataclass
class _Head:
    """One task of a (multi-task) run: its spec, records and model (sharing the backbone)."""

    task: TaskSpec
    data_dir: str
    model: GPTTaskModel


def mixture_schedule(weights, total_steps: int, seed: int) -> np.ndarray:
    """Which task (index into ``weights``) each of ``total_steps`` updates trains; deterministic in ``seed``."""
    p = np.asarray(weights, np.float64)
    if len(p) == 1:
        return np.zeros(total_steps, np.int64)
    return np.random.default_rng(seed).choice(len(p), size=total_steps, p=p / p.sum())


class Finetuner:
    """Builds the task model(s) under ``strategy``, trains, evaluates every epoch and predicts.

    ``self.task`` / ``self.model`` are the primary task (``config.data_dir``); with
    ``config.aux_data_dirs`` more heads share ``self.model.backbone`` (see the module doc).
    """

    def __init__(self, task: TaskSpec, model_config: GPTConfig, config: FinetuneConfig, strategy, log=print):
        self.task, self.model_config, self.config, self.strategy, self.log = task, model_config, config, strategy, log
        self.chief = is_chief(strategy)
        if config.batch_size % strategy.num_replicas_in_sync:
            raise ValueError(f"batch_size={config.batch_size} is not divisible by {strategy.num_replicas_in_sync} replicas")
        data_dirs = (config.data_dir, *config.aux_data_dirs)
        tasks = (task, *(load_task_spec(d) for d in config.aux_data_dirs))
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"each task may appear once in a multi-task run, got {names}")
        if config.mixture and len(config.mixture) != len(tasks):
            raise ValueError(f"mixture has {len(config.mixture)} weights for {len(tasks)} tasks {names}")
        if config.mixture and (min(config.mixture) < 0 or not sum(config.mixture) > 0):
            raise ValueError(f"mixture weights must be >= 0 with a positive sum, got {config.mixture}")
        sizes = [num_examples(d, config.train_split) for d in data_dirs]
        for d, n in zip(data_dirs, sizes):
            if n < config.batch_size:
                raise ValueError(f"{d}: {n} training examples make no full batch of {config.batch_size}")
        self.weights = np.asarray(config.mixture or sizes, np.float64) / float(sum(config.mixture or sizes))
        # An "epoch" is one pass over the primary task's training set, in expectation.
        self.steps_per_epoch = math.ceil(sizes[0] // config.batch_size / self.weights[0])
        self.total_steps = self.steps_per_epoch * config.epochs
        self.schedule = mixture_schedule(self.weights, self.total_steps, config.seed)
        self.special_ids = special_ids_from_config(model_config)
        n_ctx = model_config.n_ctx
        self.buckets = bucket_lengths(n_ctx, config.buckets_per_octave) if config.length_buckets else (n_ctx,)
        keras.utils.set_random_seed(config.seed)
        with strategy.scope():
            backbone = make_backbone(model_config, dtype=config.precision)
            self.heads = [
                _Head(t, d, GPTTaskModel(backbone, t, clf_pdrop=config.clf_pdrop, dtype=config.precision))
                for t, d in zip(tasks, data_dirs)
            ]
            self.model = self.heads[0].model
            if config.init_checkpoint:
                self._initialise_from(config.init_checkpoint)
            variables = _unique(v for h in self.heads for v in h.model.variables)
            trainable = _unique(v for h in self.heads for v in h.model.trainable_variables)
            warmup = math.ceil(config.warmup_fraction * self.total_steps)
            self.lr_schedule = WarmupDecay(config.learning_rate, warmup, self.total_steps, "linear")
            self.optimizer = make_optimizer(trainable, self.lr_schedule, config.weight_decay, config.clip_norm)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(model=variables_by_key(variables),
                                              optimizer=variables_by_key(self.optimizer.variables), step=self.step)
        # Only the chief writes run_dir/checkpoints; other workers save to scratch and read the chief's.
        self.manager, self.read_manager = checkpoint_managers(self.checkpoint, config.run_dir, strategy, 1)
        self._train_steps = [self._make_train_step(h) for h in self.heads]
        self._predict_steps = {h.task.name: self._predict_step(h.model) for h in self.heads}  # built once each
        self._eval_datasets = {}  # (task, split) -> its evaluation batches (`_eval_dataset`)
        if len(self.heads) > 1:
            mix = ", ".join(f"{h.task.name} {w:.3f}" for h, w in zip(self.heads, self.weights))
            log(f"multi-task: {self.total_steps} updates drawn from {mix}")

    def _initialise_from(self, path):
        """Pre-trained LM → backbone (first ``transfer_layers`` blocks), special-token rows re-drawn."""
        lm = GPTLanguageModel.from_config_preset(pretrained_model_config(path))  # its own n_ctx
        restore_pretrained_lm(lm, path)
        n = self.model_config.n_layer if self.config.transfer_layers < 0 else self.config.transfer_layers
        copied = transfer_layers(lm, self.model.backbone, n)
        reset_special_embeddings(self.model.backbone, seed=self.config.seed)
        self.log(f"initialised from {path}: embeddings + {n} of {self.model_config.n_layer} blocks ({len(copied)} arrays)")

    # ------------------------------------------------------------------ data
    def _dataset(self, head: _Head, split, training, start_batch=0):
        """Per-replica slices of global batches; training starts at global batch ``start_batch``
        (the data position follows the step, as in pre-training), evaluation is one pass, kept in
        memory once read (every epoch evaluates the same batches: they are built once)."""
        c = self.config

        def dataset_fn(ctx):
            dataset = task_dataset(head.task, head.data_dir, split, c.batch_size, self.model_config.n_ctx,
                                   self.special_ids, training=training, seed=c.seed, buckets=self.buckets,
                                   start_batch=start_batch, input_context=ctx)
            return dataset if training else dataset.cache()

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _eval_dataset(self, head: _Head, split):
        key = (head.task.name, split)
        if key not in self._eval_datasets:
            self._eval_datasets[key] = self._dataset(head, split, training=False)
        return self._eval_datasets[key]

    # ------------------------------------------------------------------ steps
    def _make_train_step(self, head: _Head):
        """One update on a batch of ``head``'s task: backbone + that head (a tf.function per task)."""
        lm_coef, model, task = self.config.lm_coef, head.model, head.task

        def replica_step(features, label):
            ctx = tf.distribute.get_replica_context()
            variables = model.trainable_variables
            with tf.GradientTape() as tape:
                outputs = model(features, training=True, with_lm="targets" if lm_coef else False)
                parts = task_loss(task, outputs, features, label, lm_coef)
                examples = ctx.all_reduce(tf.distribute.ReduceOp.SUM, parts["examples"])
                lm_tokens = tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, parts["lm_tokens"]), 1.0)
                task_part = parts["task_sum"] / examples
                lm_part = parts["lm_sum"] / lm_tokens
                loss = task_part + lm_coef * lm_part
            grad_norm = all_reduce_and_apply(tape.gradient(loss, variables), variables, self.optimizer)
            reduce = lambda t: ctx.all_reduce(tf.distribute.ReduceOp.SUM, t)
            return reduce(task_part), reduce(lm_part), grad_norm

        @tf.function
        def run(iterator):
            features, label = next(iterator)
            task_l, lm_l, grad_norm = self.strategy.run(replica_step, args=(features, label))
            self.step.assign_add(1)
            first = lambda t: self.strategy.experimental_local_results(t)[0]
            return first(task_l), first(lm_l), first(grad_norm)

        return run

    def _predict_step(self, model):
        @tf.function(reduce_retracing=True)  # one trace for every bucket length
        def run(batch):
            def replica(features, label):
                return model(features, training=False, with_lm=False)["task"], label, features["record_index"]

            return tuple(self.strategy.gather(t, axis=0) for t in self.strategy.run(replica, args=batch))

        return run

    # ------------------------------------------------------------------ public
    def _head(self, task_name):
        for head in self.heads:
            if task_name in (None, head.task.name):
                return head
        raise KeyError(f"no task {task_name!r} in this run; have {[h.task.name for h in self.heads]}")

    def predict(self, split, task_name=None):
        """Task outputs and labels for every example of ``split`` in file order (numpy); the primary task by default."""
        head = self._head(task_name)
        step = self._predict_steps[head.task.name]
        outs, labels, index = [], [], []
        for batch in self._eval_dataset(head, split):
            for values, tensor in zip((outs, labels, index), step(batch)):
                values.append(tensor.numpy())
        outs, labels, index = (np.concatenate(v) for v in (outs, labels, index))
        real = index >= 0  # ghost rows fill the last batch
        order = np.argsort(index[real], kind="stable")
        if not np.array_equal(index[real][order], np.arange(num_examples(head.data_dir, split))):
            raise RuntimeError(f"{head.data_dir}/{split}: prediction did not cover each record exactly once")
        return outs[real][order], labels[real][order]

    def evaluate(self, split, task_name=None) -> dict:
        """The task's metrics (the paper's first) on ``split``."""
        task = self._head(task_name).task
        outs, labels = self.predict(split, task_name)
        return {**compute_metrics(task, labels, task_predictions(task, outs)), "examples": int(len(labels))}

    def evaluate_all(self) -> dict:
        """``{split: metrics}`` for the primary task, plus ``{"<task>/<split>": metrics}`` for the others."""
        results = {split: self.evaluate(split) for split in self.task.eval_splits}
        for head in self.heads[1:]:
            for split in head.task.eval_splits:
                results[f"{head.task.name}/{split}"] = self.evaluate(split, head.task.name)
        return results

    def restore(self, resuming: bool = True) -> int:
        return restore_latest(self.read_manager, self.step, self.log, resuming)

    def train(self, progress=True) -> dict:
        """Runs ``epochs`` epochs; evaluates and checkpoints at each epoch's end; returns the last metrics."""
        try:
            return self._train(progress)
        finally:
            remove_scratch(self.manager, self.read_manager)

    def _train(self, progress) -> dict:
        c = self.config
        start = self.restore()
        writer = tf.summary.create_file_writer(os.path.join(c.run_dir, "tb")) if self.chief else None
        consumed = np.bincount(self.schedule[:start], minlength=len(self.heads))  # batches each task has used
        iterators = [iter(self._dataset(h, c.train_split, training=True, start_batch=int(n)))
                     for h, n in zip(self.heads, consumed)]
        multi = len(self.heads) > 1
        bar = console.progress(total=self.total_steps, initial=start, unit="step",
                               desc=f"fine-tuning {'+'.join(h.task.name for h in self.heads)}",
                               disable=not (progress and self.chief),
                               every=console.line_every(self.total_steps - start, multiple_of=c.log_every))
        results = {}
        for step in range(start + 1, self.total_steps + 1):
            i = int(self.schedule[step - 1])
            try:
                task_l, lm_l, grad_norm = self._train_steps[i](iterators[i])
            except tf.errors.DataLossError as err:
                raise named_data_error(err, [self.heads[i].data_dir]) from None
            bar.update(1)
            if writer and (step % c.log_every == 0 or step == self.total_steps):
                bar.set_postfix(task_loss=f"{float(task_l):.3f}", lm_loss=f"{float(lm_l):.3f}", refresh=False)
                prefix = f"train/{self.heads[i].task.name}/" if multi else "train/"
                with writer.as_default(step=step):
                    tf.summary.scalar(prefix + "task_loss", task_l)
                    tf.summary.scalar(prefix + "lm_loss", lm_l)
                    tf.summary.scalar("train/grad_norm", grad_norm)
                    tf.summary.scalar("train/learning_rate", self.lr_schedule(step - 1))
            if step % self.steps_per_epoch == 0:
                results = self.evaluate_all()
                epoch = step // self.steps_per_epoch
                bar.write(f"epoch {epoch}: {console.format_metrics(results)}")
                if writer:
                    with writer.as_default(step=step):
                        for split, metrics in results.items():
                            for name, value in metrics.items():
                                tf.summary.scalar(f"{split}/{name}", value)
                self.manager.save(checkpoint_number=step)
        bar.close()
        return results


def _unique(variables) -> list:
    """``variables`` without repeats (the heads share the backbone's), in first-seen order."""
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out
