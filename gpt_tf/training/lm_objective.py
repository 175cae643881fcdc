"""Pre-training: the LM objective (Eq. 1) on the one training loop (``gpt_tf.training.loop``).

One update = one global batch of ``batch_size`` sequences (split over replicas and
``grad_accum_steps`` micro-batches by the loop), one run of the language model's own ``train_step`` per
micro-batch: its compiled loss (``TokenCrossEntropy``: the mean token cross-entropy) and ``GPTAdamW``'s update, what
``fit`` runs. Checkpoints, resume, preemption and accumulation are the loop's (see its doc).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time

import keras
import tensorflow as tf

from gpt_tf.speed import inference_gelu
from gpt_tf.config import GPTConfig
from gpt_tf.convert.pretrained import continue_from_pretrained
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.nn.objectives import lm_loss
from gpt_tf.nn.optim import WarmupDecay, make_optimizer
from gpt_tf.nn.recipes import PAPER_FINETUNE
from gpt_tf.runs.files import save_run_configs
from gpt_tf.training.loop import TrainLoop, named_data_error
from gpt_tf.training.text_counts import TextCounter
from gpt_tf.data.reader import as_model_inputs, batches_per_pipeline, pretraining_dataset


def compile_lm(model, optimizer, jit_compile: bool) -> None:
    """The language model compiled for pre-training, by the command line's loop and Keras's ``fit`` on JAX alike: the
    loss alone (``TokenCrossEntropy``, ``GPT1CausalLM.compile``'s default; keras-hub's default metric, token accuracy,
    is an argmax over the logits every step, and nothing reads it)."""
    model.compile(optimizer=optimizer, weighted_metrics=[], jit_compile=jit_compile)


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
    weight_decay: float = PAPER_FINETUNE["weight_decay"]  # the paper's, shared with fine-tuning
    clip_norm: float = PAPER_FINETUNE["clip_norm"]
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
    init_checkpoint: str = ""  # continue from these weights (a run, ckpt prefix, GPT-1 shards or preset); "": scratch


class Pretrainer:
    """Builds model, optimizer, data and loop under ``strategy`` and trains the LM objective."""

    def __init__(self, model_config: GPTConfig, config: TrainConfig, strategy, log=print):
        self.model_config, self.config, self.strategy, self.log = model_config, config, strategy, log
        self.replicas = strategy.num_replicas_in_sync
        per_replica, rem = divmod(config.batch_size, self.replicas * config.grad_accum_steps)
        if rem or per_replica == 0:
            raise ValueError(
                f"batch_size={config.batch_size} must be a positive multiple of replicas ({self.replicas}) × "
                f"grad_accum_steps ({config.grad_accum_steps})"
            )
        keras.utils.set_random_seed(config.seed)
        with strategy.scope():
            self.model = causal_lm_for(model_config, dtype=config.precision)
            if config.init_checkpoint:  # a resumed run's own checkpoint overrides it in `restore`
                copied = continue_from_pretrained(self.model, config.init_checkpoint)
                log(f"initialised from {config.init_checkpoint}: embeddings + {model_config.n_layer} blocks "
                    f"({len(copied)} arrays)")
            self.schedule = WarmupDecay(config.learning_rate, config.warmup_steps, config.train_steps, config.lr_decay)
            self.optimizer = make_optimizer(self.schedule, weight_decay=config.weight_decay, clip_norm=config.clip_norm,
                                            beta_1=config.adam_beta_1, beta_2=config.adam_beta_2,
                                            epsilon=config.adam_epsilon,
                                            gradient_accumulation_steps=config.grad_accum_steps,
                                            variables=self.model.trainable_variables)
            compile_lm(self.model, self.optimizer, jit_compile=False)
        self.loop = TrainLoop(strategy, config.run_dir, self.model.variables, self.optimizer,
                              grad_accum_steps=config.grad_accum_steps, jit_compile=config.jit_compile,
                              checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints, log=log)
        self.chief, self.step, self.manager = self.loop.chief, self.loop.step, self.loop.manager
        self._update = self.loop.make_update(self.model)
        if config.jit_compile:
            self._replica_eval_step = tf.function(self._replica_eval_step, jit_compile=True)
        self._callbacks = None

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
            dataset = as_model_inputs(dataset)
            if not repeat:
                batch = ctx.get_per_replica_batch_size(c.batch_size)
                steps = batches_per_pipeline(c.data_dir, split, batch, ctx.num_input_pipelines) // per_update
                dataset = dataset.take(per_update * (min(steps, max_steps) if max_steps else steps))
            return dataset.skip(start_step * per_update)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    # ------------------------------------------------------------------ steps
    def _replica_eval_step(self, inputs, targets):
        with inference_gelu.passes():  # never an export: the GELU kernel where faster (gpt_tf/speed/inference_gelu.py)
            return lm_loss(self.model(inputs, training=False), targets)

    @tf.function
    def _run_eval_step(self, batch):
        loss_sum, count = self.strategy.run(self._replica_eval_step, args=batch)
        reduce = lambda t: self.strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None)
        return reduce(loss_sum), reduce(count)

    # ------------------------------------------------------------------ public
    def restore(self, resuming: bool = True) -> int:
        """Restores the chief's latest checkpoint if any; returns the step reached (see ``restore_latest``)."""
        return self.loop.restore(resuming)

    def weights_digest(self) -> str:
        """SHA-256 of the model's weights: equal on every worker of a job whose replicas are in sync."""
        digest = hashlib.sha256()
        for variable in self.model.variables:
            digest.update(variable.numpy().tobytes())
        return digest.hexdigest()

    def evaluate(self, max_batches: int = 0, tokenizer=None) -> dict:
        """Token-level perplexity on the held-out split (whole split unless ``max_batches``); given the data's
        ``tokenizer``, bits per character and per byte too (``gpt_tf.training.text_counts``)."""
        loss_sum, tokens = 0.0, 0.0
        text = None if tokenizer is None else TextCounter(tokenizer, self.strategy)
        try:
            for batch in self._distributed_dataset("valid", repeat=False, max_steps=max_batches):
                s, n = self._run_eval_step(batch)
                loss_sum, tokens = loss_sum + float(s), tokens + float(n)
                if text:
                    text.add_replicas(batch[1])
        except tf.errors.DataLossError as err:
            raise named_data_error(err, [self.config.data_dir]) from None
        if not tokens:
            raise ValueError(f"held-out split of {self.config.data_dir} gave no full batch of {self.config.batch_size}")
        loss = loss_sum / tokens
        bits = text.bits(loss_sum) if text else {}
        return {"loss": loss, "perplexity": math.exp(loss), "tokens": int(tokens), **bits}

    def train(self, callbacks=None) -> dict:
        """Runs until ``train_steps``; ``callbacks`` is a ``TrainCallbacks`` (summaries, samples, eval).

        Raises ``Preempted`` after saving the step reached when SIGTERM arrives on any worker.
        """
        c = self.config
        start = self.restore()
        self._iterator = iter(self._distributed_dataset("train", repeat=True, start_step=start))
        if start >= c.train_steps:
            self.log(f"already at step {start} >= train_steps={c.train_steps}; nothing to train")
        self._callbacks, self._last, self._loss = callbacks, (time.perf_counter(), start), None
        self.loop.run(c.train_steps, self)
        loss = self._loss
        return {"step": int(self.step.numpy()), "loss": None if loss is None else float(loss),
                "weights_sha256": self.weights_digest()}

    # ------------------------------------------------------------------ the loop's hooks
    def run_update(self, step, stop):
        del step
        self.model.reset_metrics()  # the loss logged is this update's
        return self._update(self._iterator, stop)

    def data_dirs(self, step):
        del step
        return [self.config.data_dir]

    def after_update(self, step) -> bool:
        """Logs every ``log_every`` steps (and the last); never asks for an extra checkpoint."""
        c = self.config
        if step % c.log_every == 0 or step == c.train_steps:  # every worker reads it (a collective), at the same steps
            self._loss = self.model.get_metrics_result()["loss"]
            t0, last = self._last
            elapsed = time.perf_counter() - t0
            stats = {
                "loss": float(self._loss),
                "perplexity": math.exp(min(float(self._loss), 50.0)),
                "learning_rate": float(self.schedule(step - 1)),
                "grad_norm": float(self.optimizer.global_norm.numpy()),  # float() refuses a distributed variable
                "tokens_per_sec": (step - last) * c.batch_size * self.model_config.n_ctx / max(elapsed, 1e-9),
            }
            if self._callbacks:
                self._callbacks.on_log(step, stats)
            self._last = (time.perf_counter(), step)
        return False

    def after_save(self, step) -> None:
        if self._callbacks:
            self._callbacks.on_step_end(step, self)

    def save_model_config(self, data: dict | None = None) -> None:
        """Writes ``run_dir/model_config.json``, ``train_config.json`` and ``data.json`` atomically (chief only)."""
        if self.chief:
            save_run_configs(self.config.run_dir, "pretrain", self.model_config, self.config, data)
