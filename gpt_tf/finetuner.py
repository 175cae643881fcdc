"""Supervised fine-tuning (§3.2): the pre-trained backbone, a linear head, L3 = L2 + λ·L1.

The paper's recipe is the default: lr 6.25e-5, batch 32, 3 epochs, linear decay with 0.2%
warm-up, classifier dropout 0.1, λ = 0.5. The ablations of §5 are options: no pre-training
(``init_checkpoint=""``), transfer of only the first ``transfer_layers`` blocks, λ = 0.

Like pre-training, it is a custom ``strategy.run`` loop; each update all-reduces once, and the
losses are scaled by global counts so any number of replicas gives the full-batch update.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import keras
import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from gpt_tf.config import GPTConfig
from gpt_tf.metrics import compute_metrics
from gpt_tf.model import GPTBackbone, GPTLanguageModel
from gpt_tf.optim import WarmupDecay, make_optimizer
from gpt_tf.strategy import is_chief
from gpt_tf.task_model import GPTTaskModel, reset_special_embeddings, task_loss, task_predictions, transfer_layers
from gpt_tf.tasks import TaskSpec
from gpt_tf.trainer import all_reduce_and_apply, restore_latest, restore_pretrained_lm, variables_by_key
from pipelines.transforms import num_examples, special_ids_from_config, task_dataset


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


class Finetuner:
    """Builds the task model under ``strategy``, trains it, evaluates it every epoch and predicts."""

    def __init__(self, task: TaskSpec, model_config: GPTConfig, config: FinetuneConfig, strategy, log=print):
        self.task, self.model_config, self.config, self.strategy, self.log = task, model_config, config, strategy, log
        self.chief = is_chief(strategy)
        if config.batch_size % strategy.num_replicas_in_sync:
            raise ValueError(f"batch_size={config.batch_size} is not divisible by {strategy.num_replicas_in_sync} replicas")
        n_train = num_examples(config.data_dir, config.train_split)
        self.steps_per_epoch = n_train // config.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{config.data_dir}: {n_train} training examples make no full batch of {config.batch_size}")
        self.total_steps = self.steps_per_epoch * config.epochs
        self.special_ids = special_ids_from_config(model_config)
        keras.utils.set_random_seed(config.seed)
        with strategy.scope():
            backbone = GPTBackbone(model_config, dtype=config.precision, name="backbone")
            self.model = GPTTaskModel(backbone, task, clf_pdrop=config.clf_pdrop, dtype=config.precision)
            if config.init_checkpoint:
                self._initialise_from(config.init_checkpoint)
            warmup = math.ceil(config.warmup_fraction * self.total_steps)
            self.schedule = WarmupDecay(config.learning_rate, warmup, self.total_steps, "linear")
            self.optimizer = make_optimizer(self.model.trainable_variables, self.schedule, config.weight_decay,
                                            config.clip_norm)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(model=variables_by_key(self.model.variables),
                                              optimizer=variables_by_key(self.optimizer.variables), step=self.step)
        self.manager = tf.train.CheckpointManager(self.checkpoint, os.path.join(config.run_dir, "checkpoints"),
                                                  max_to_keep=1)

    def _initialise_from(self, path):
        """Pre-trained LM → backbone (first ``transfer_layers`` blocks), special-token rows re-drawn."""
        lm = GPTLanguageModel.from_config_preset(self.model_config)
        restore_pretrained_lm(lm, path)
        n = self.model_config.n_layer if self.config.transfer_layers < 0 else self.config.transfer_layers
        copied = transfer_layers(lm, self.model.backbone, n)
        reset_special_embeddings(self.model.backbone, seed=self.config.seed)
        self.log(f"initialised from {path}: embeddings + {n} of {self.model_config.n_layer} blocks ({len(copied)} arrays)")

    # ------------------------------------------------------------------ data
    def _dataset(self, split, training, start_step=0):
        c = self.config

        def dataset_fn(ctx):
            batch = ctx.get_per_replica_batch_size(c.batch_size)
            dataset = task_dataset(self.task, c.data_dir, split, batch, self.model_config.n_ctx, self.special_ids,
                                   shuffle=training, seed=c.seed, repeat=training, drop_remainder=training,
                                   input_context=ctx)
            # The data position follows the step, as in pre-training (see trainer.py).
            return dataset.skip(start_step * (ctx.num_replicas_in_sync // ctx.num_input_pipelines))

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    # ------------------------------------------------------------------ steps
    def _replica_train_step(self, features, label):
        ctx = tf.distribute.get_replica_context()
        variables = self.model.trainable_variables
        lm_coef = self.config.lm_coef
        with tf.GradientTape() as tape:
            outputs = self.model(features, training=True, with_lm=bool(lm_coef))
            parts = task_loss(self.task, outputs, features, label, lm_coef)
            examples = ctx.all_reduce(tf.distribute.ReduceOp.SUM, parts["examples"])
            lm_tokens = tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, parts["lm_tokens"]), 1.0)
            task_part = parts["task_sum"] / examples
            lm_part = parts["lm_sum"] / lm_tokens
            loss = task_part + lm_coef * lm_part
        grad_norm = all_reduce_and_apply(tape.gradient(loss, variables), variables, self.optimizer)
        reduce = lambda t: ctx.all_reduce(tf.distribute.ReduceOp.SUM, t)
        return reduce(task_part), reduce(lm_part), grad_norm

    @tf.function
    def _run_train_step(self, iterator):
        features, label = next(iterator)
        task_l, lm_l, grad_norm = self.strategy.run(self._replica_train_step, args=(features, label))
        self.step.assign_add(1)
        first = lambda t: self.strategy.experimental_local_results(t)[0]
        return first(task_l), first(lm_l), first(grad_norm)

    @tf.function
    def _run_predict_step(self, batch):
        def replica(features, label):
            return self.model(features, training=False, with_lm=False)["task"], label

        out, label = self.strategy.run(replica, args=batch)
        return self.strategy.gather(out, axis=0), self.strategy.gather(label, axis=0)

    # ------------------------------------------------------------------ public
    def predict(self, split):
        """Task outputs and labels for every example of ``split`` (numpy)."""
        outs, labels = [], []
        for batch in self._dataset(split, training=False):
            out, label = self._run_predict_step(batch)
            outs.append(out.numpy())
            labels.append(label.numpy())
        return np.concatenate(outs), np.concatenate(labels)

    def evaluate(self, split) -> dict:
        """The task's metrics (the paper's first) on ``split``."""
        outs, labels = self.predict(split)
        return {**compute_metrics(self.task, labels, task_predictions(self.task, outs)), "examples": int(len(labels))}

    def evaluate_all(self) -> dict:
        return {split: self.evaluate(split) for split in self.task.eval_splits}

    def restore(self) -> int:
        return restore_latest(self.manager, self.step, self.log)

    def train(self, progress=True) -> dict:
        """Runs ``epochs`` epochs; evaluates and checkpoints at each epoch's end; returns the last metrics."""
        c = self.config
        start = self.restore()
        writer = tf.summary.create_file_writer(os.path.join(c.run_dir, "tb")) if self.chief else None
        iterator = iter(self._dataset(c.train_split, training=True, start_step=start))
        bar = tqdm(total=self.total_steps, initial=start, desc=f"fine-tuning {self.task.name}", unit="step",
                   disable=not (progress and self.chief), dynamic_ncols=True)
        results = {}
        for step in range(start + 1, self.total_steps + 1):
            task_l, lm_l, grad_norm = self._run_train_step(iterator)
            bar.update(1)
            if writer and (step % c.log_every == 0 or step == self.total_steps):
                bar.set_postfix(task_loss=f"{float(task_l):.3f}", lm_loss=f"{float(lm_l):.3f}", refresh=False)
                with writer.as_default(step=step):
                    tf.summary.scalar("train/task_loss", task_l)
                    tf.summary.scalar("train/lm_loss", lm_l)
                    tf.summary.scalar("train/grad_norm", grad_norm)
                    tf.summary.scalar("train/learning_rate", self.schedule(step - 1))
            if step % self.steps_per_epoch == 0:
                results = self.evaluate_all()
                epoch = step // self.steps_per_epoch
                bar.write(f"epoch {epoch}: " + json.dumps(results))
                if writer:
                    with writer.as_default(step=step):
                        for split, metrics in results.items():
                            for name, value in metrics.items():
                                tf.summary.scalar(f"{split}/{name}", value)
                self.manager.save(checkpoint_number=step)
        bar.close()
        return results
