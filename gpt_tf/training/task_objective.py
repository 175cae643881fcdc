"""Supervised fine-tuning (§3.2): the pre-trained backbone, a linear head, L3 = L2 + λ·L1.

The paper's recipe is the default: lr 6.25e-5, batch 32, 3 epochs, linear decay with 0.2%
warm-up, classifier dropout 0.1, λ = 0.5. The ablations of §5 are options: no pre-training
(``init_checkpoint=""``), transfer of only the first ``transfer_layers`` blocks, λ = 0.

It runs on the one training loop (``gpt_tf.training.loop``), as pre-training does, which drives the task model's own
``train_step`` (what ``fit`` runs: the model's graph, Eq. 5 as Keras's loss, ``GPTAdamW``'s update); every loss is
a mean over examples, so any number of replicas and of ``grad_accum_steps`` micro-batches gives the full-batch
update; SIGTERM saves and stops
(``Preempted``), the same command resumes mid-epoch exactly; ``jit_compile``, ``train_steps`` (a cap
on updates; the learning-rate schedule still spans ``epochs``) and ``checkpoint_every`` (besides the
checkpoint at each epoch's end) are the loop's.

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

from gpt_tf.speed import inference_gelu
from gpt_tf.convert.pretrained import initialise_from_pretrained
from gpt_tf.runs.checkpoints import build_task_models, unique_variables
from gpt_tf.config import GPTConfig
from gpt_tf.metrics import compute_metrics
from gpt_tf.nn.optim import make_optimizer
from gpt_tf.nn.recipes import PAPER_FINETUNE, paper_schedule
from gpt_tf.nn.task_head import task_predictions
from gpt_tf.tasks import TaskSpec
from gpt_tf.training.loop import TrainLoop
from gpt_tf.data.task_batches import bucket_lengths
from gpt_tf.data.transforms import load_task_spec, num_examples, special_ids_from_config, task_dataset


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run; defaults are the paper's recipe (§4.1, 'Fine-tuning details')."""

    data_dir: str  # task TFRecords from `python -m pipelines.finetune_data`
    run_dir: str
    init_checkpoint: str = ""  # pre-training run dir, checkpoint prefix or GPT-1 release dir; "" = from scratch
    transfer_layers: int = -1  # blocks transferred from init_checkpoint; -1 = all
    batch_size: int = PAPER_FINETUNE["batch_size"]
    epochs: int = PAPER_FINETUNE["epochs"]
    learning_rate: float = PAPER_FINETUNE["learning_rate"]
    warmup_fraction: float = PAPER_FINETUNE["warmup_fraction"]
    lm_coef: float = PAPER_FINETUNE["lm_coef"]
    clf_pdrop: float = PAPER_FINETUNE["clf_pdrop"]
    weight_decay: float = PAPER_FINETUNE["weight_decay"]
    clip_norm: float = PAPER_FINETUNE["clip_norm"]
    precision: str = "float32"
    seed: int = 0
    log_every: int = 10
    train_split: str = "train"
    aux_data_dirs: tuple = ()  # multi-task: more tasks' TFRecords, trained together with data_dir's
    mixture: tuple = ()  # sampling weights for (data_dir, *aux_data_dirs); () = proportional to examples
    length_buckets: bool = True  # pad each batch to a length bucket (gpt_tf/data/task_batches.py); False: to n_ctx
    buckets_per_octave: int = 4  # bucket lengths per doubling (fewer: less padding cut, fewer XLA/TPU compilations)
    grad_accum_steps: int = 1  # micro-batches per update (within a replica); the update equals the full batch's
    jit_compile: bool = False  # XLA-compile each micro-batch's forward/backward pass
    train_steps: int = 0  # a cap on updates (0: all of ``epochs``); the schedule still spans ``epochs``
    checkpoint_every: int = 0  # also checkpoint every N updates (0: only at each epoch's end and when stopped)


def model_inputs(features: dict) -> dict:
    """The task model's inputs among a batch's features (``task_dataset`` adds ``record_index``)."""
    return {k: features[k] for k in ("input_ids", "extract_index", "lm_weights")}


@dataclasses.dataclass
class _Head:
    """One task of a (multi-task) run: its spec, records and model (sharing the backbone)."""

    task: TaskSpec
    data_dir: str
    model: keras.Model  # the family's keras-hub task (gpt_tf/gpt1/text_classifier.py: task_for_spec)


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
        per_replica, rem = divmod(config.batch_size, strategy.num_replicas_in_sync * config.grad_accum_steps)
        if rem or per_replica == 0:
            raise ValueError(f"batch_size={config.batch_size} is not a positive multiple of {strategy.num_replicas_in_sync} "
                             f"replicas × grad_accum_steps ({config.grad_accum_steps})")
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
            models = build_task_models(model_config, tasks, config.clf_pdrop, config.precision, config.lm_coef)
            self.heads = [_Head(t, d, m) for t, d, m in zip(tasks, data_dirs, models)]
            self.model = self.heads[0].model
            if config.init_checkpoint:
                self._initialise_from(config.init_checkpoint)
            variables = unique_variables(v for m in models for v in m.variables)
            self.lr_schedule = paper_schedule(config.learning_rate, config.warmup_fraction, self.total_steps)
            self.optimizer = make_optimizer(self.lr_schedule, config.weight_decay, config.clip_norm,
                                            gradient_accumulation_steps=config.grad_accum_steps)
            self.optimizer.build(unique_variables(v for m in models for v in m.trainable_variables))
            for model in models:  # the loss is Eq. 5: the head's, plus ExtractStates's λ·L1
                model.compile(optimizer=self.optimizer, metrics=[], jit_compile=False)
        # Only the chief writes run_dir/checkpoints; other workers save to scratch and read the chief's.
        self.loop = TrainLoop(strategy, config.run_dir, variables, self.optimizer, grad_accum_steps=config.grad_accum_steps,
                              jit_compile=config.jit_compile, checkpoint_every=config.checkpoint_every, log=log)
        self.chief, self.step = self.loop.chief, self.loop.step
        self.end = min(self.total_steps, config.train_steps or self.total_steps)
        self._train_steps = [self.loop.make_update(h.model) for h in self.heads]
        self._predict_passes = {h.task.name: self._predict_pass(h.model) for h in self.heads}  # built once each
        self._eval_datasets = {}  # (task, split) -> its evaluation batches (`_eval_dataset`)
        if len(self.heads) > 1:
            mix = ", ".join(f"{h.task.name} {w:.3f}" for h, w in zip(self.heads, self.weights))
            log(f"multi-task: {self.total_steps} updates drawn from {mix}")

    def _initialise_from(self, path):
        """Pre-trained LM → backbone (first ``transfer_layers`` blocks), special-token rows re-drawn."""
        n = self.model_config.n_layer if self.config.transfer_layers < 0 else self.config.transfer_layers
        copied = initialise_from_pretrained(self.model, path, n, seed=self.config.seed)
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
            if training:  # the model's inputs and the labels: what its train_step takes
                return dataset.map(lambda features, label: (model_inputs(features), label))
            return dataset.cache()

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def _eval_dataset(self, head: _Head, split):
        key = (head.task.name, split)
        if key not in self._eval_datasets:
            self._eval_datasets[key] = self._dataset(head, split, training=False)
        return self._eval_datasets[key]

    # ------------------------------------------------------------------ steps
    def _predict_pass(self, model):
        """A whole prediction pass in one graph: ``run(dataset)`` loops over the (distributed) batches
        in TF and returns the task outputs, labels and record indices of all of them, concatenated.

        One call per pass instead of one per batch: the per-batch Python (iterator, function call,
        three host copies) was ~11% of an SST-2 evaluation of `tiny` (bench/_profiles.py)."""
        strategy = self.strategy

        def replica(features, label):
            with inference_gelu.passes():  # never an export: the GELU kernel where faster (gpt_tf/speed/inference_gelu.py)
                outputs = model(model_inputs(features), training=False)
            return outputs, label, features["record_index"]

        def step(batch):
            return [strategy.gather(t, axis=0) for t in strategy.run(replica, args=batch)]

        @tf.function
        def run(dataset):
            batches = iter(dataset)
            first = step(next(batches))  # a split has at least one batch (ghost rows fill it)
            arrays = [tf.TensorArray(t.dtype, size=1, dynamic_size=True, infer_shape=False).write(0, t) for t in first]
            for batch in batches:  # autograph: a tf.while_loop over the other batches, any bucket length
                arrays = [a.write(a.size(), t) for a, t in zip(arrays, step(batch))]
            return tuple(a.concat() for a in arrays)

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
        run = self._predict_passes[head.task.name]
        outs, labels, index = (t.numpy() for t in run(self._eval_dataset(head, split)))
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
        return self.loop.restore(resuming)

    def train(self, progress=True) -> dict:
        """Runs ``epochs`` epochs (at most ``train_steps`` updates); evaluates and checkpoints at each
        epoch's end (and at a ``train_steps`` cap); returns the last metrics.

        Raises ``Preempted`` after saving the step reached when SIGTERM arrives on any worker.
        """
        c = self.config
        start = self.restore()
        consumed = np.bincount(self.schedule[:start], minlength=len(self.heads))  # batches each task has used
        self._iterators = [iter(self._dataset(h, c.train_split, training=True, start_batch=int(n)))
                           for h, n in zip(self.heads, consumed)]
        self._writer = tf.summary.create_file_writer(os.path.join(c.run_dir, "tb")) if self.chief else None
        self._bar = console.progress(total=self.end, initial=start, unit="step",
                                     desc=f"fine-tuning {'+'.join(h.task.name for h in self.heads)}",
                                     disable=not (progress and self.chief),
                                     every=console.line_every(self.end - start, multiple_of=c.log_every))
        self._results = {}
        self.loop.run(self.end, self)
        self._bar.close()
        return self._results

    # ------------------------------------------------------------------ the loop's hooks
    def run_update(self, step, stop):
        i = int(self.schedule[step])
        self.heads[i].model.reset_metrics()  # the loss logged is this update's
        return self._train_steps[i](self._iterators[i], stop)

    def data_dirs(self, step):
        return [self.heads[int(self.schedule[step])].data_dir]

    def after_update(self, step) -> bool:
        """Logs every ``log_every`` steps; evaluates every task at each epoch's end (and at the end):
        a checkpoint is due then."""
        c, i = self.config, int(self.schedule[step - 1])
        self._bar.update(1)
        logs = step % c.log_every == 0 or step == self.end
        if logs:  # Eq. 5's L3 of this update (the model's loss), read on every worker: under multi_worker the read
            loss = float(self.heads[i].model.get_metrics_result()["loss"])  # is a collective (the metric's all-reduce)
        if self._writer and logs:
            self._bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            prefix = f"train/{self.heads[i].task.name}/" if len(self.heads) > 1 else "train/"
            with self._writer.as_default(step=step):
                tf.summary.scalar(prefix + "loss", loss)
                tf.summary.scalar("train/grad_norm", self.optimizer.global_norm)
                tf.summary.scalar("train/learning_rate", self.lr_schedule(step - 1))
        if step % self.steps_per_epoch and step != self.end:
            return False
        self._results = self.evaluate_all()
        epoch, rest = divmod(step, self.steps_per_epoch)  # a --train_steps cap may end an epoch early
        where = f"epoch {epoch}" if not rest else f"update {step} ({step / self.steps_per_epoch:.2f} epochs)"
        self._bar.write(f"{where}: {console.format_metrics(self._results)}")
        if self._writer:
            with self._writer.as_default(step=step):
                for split, metrics in self._results.items():
                    for name, value in metrics.items():
                        tf.summary.scalar(f"{split}/{name}", value)
        return True

    def after_save(self, step) -> None:
        del step
