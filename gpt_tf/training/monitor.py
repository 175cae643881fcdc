"""What a pre-training run shows while it trains: a progress bar, TensorBoard, held-out evals, samples.

TensorBoard (``run_dir/tb``): ``train/{loss,perplexity,learning_rate,grad_norm,tokens_per_sec}``,
``valid/{loss,perplexity}``, ``samples/text`` and the run's hyper-parameters (HParams tab); with a
zero-shot suite (``gpt_tf/analysis/heuristics.py``, given by the CLI), ``zero_shot[_normalized]/<task>`` every ``every`` steps
and at the end, also appended to ``run_dir/zero_shot.csv`` (a resumed run may repeat the rows of
steps after its last checkpoint). Only the chief worker writes.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf
from tensorboard.plugins.hparams import api as hp

from gpt_tf import console
from gpt_tf.gpt1.generate import Sampler


class TrainCallbacks:
    """Hooks called by ``Pretrainer.train``; holds the summary writer and the progress bar."""

    def __init__(self, trainer, tokenizer=None, log=print, progress=True, zero_shot=None):
        self.trainer, self.tokenizer, self.log, self.zero_shot = trainer, tokenizer, log, zero_shot
        c = trainer.config
        self.writer = tf.summary.create_file_writer(os.path.join(c.run_dir, "tb")) if trainer.chief else None
        start = int(trainer.step.numpy())
        self.bar = console.progress(total=c.train_steps, initial=start, desc="pre-training", unit="step",
                                    disable=not (progress and trainer.chief),
                                    every=console.line_every(c.train_steps - start, multiple_of=c.log_every))
        self.sampler = Sampler(trainer.model)
        if self.writer:
            with self.writer.as_default():
                hparams = {**_flat(trainer.model_config, "model."), **_flat(c, "train.")}
                hp.hparams(hparams, trial_id=os.path.basename(os.path.abspath(c.run_dir)))

    def on_log(self, step, stats):
        self.bar.set_postfix(loss=f"{stats['loss']:.3f}", ppl=f"{stats['perplexity']:.1f}",
                             tok_s=f"{stats['tokens_per_sec']:.0f}", refresh=False)
        if self.writer:
            with self.writer.as_default(step=step):
                for key, value in stats.items():
                    tf.summary.scalar(f"train/{key}", value)

    def on_step_end(self, step, trainer):
        self.bar.update(step - self.bar.n)
        c = trainer.config
        final = step >= c.train_steps
        if (c.eval_every and step % c.eval_every == 0) or final:
            self.evaluate(step)
        if (c.sample_every and step % c.sample_every == 0) or final:
            self.sample(step)
        if self.zero_shot and ((self.zero_shot.config.every and step % self.zero_shot.config.every == 0) or final):
            self.evaluate_zero_shot(step)
        if final:
            self.close()

    def close(self):
        """Ends the progress bar and flushes TensorBoard (at the end, or when training stops early)."""
        self.bar.close()
        if self.writer:
            self.writer.flush()

    def evaluate(self, step):
        result = self.trainer.evaluate(self.trainer.config.eval_batches, tokenizer=self.tokenizer)
        bits = (f", {result['bits_per_char']:.4f} bits per character, {result['bits_per_byte']:.4f} per byte"
                if "bits_per_char" in result else "")
        self.bar.write(f"step {step}: held-out loss {result['loss']:.4f}, perplexity {result['perplexity']:.2f}{bits} "
                       f"over {result['tokens']} tokens")
        if self.writer:
            with self.writer.as_default(step=step):
                for key in ("loss", "perplexity", "bits_per_char", "bits_per_byte"):
                    if key in result:
                        tf.summary.scalar(f"valid/{key}", result[key])
        return result

    def evaluate_zero_shot(self, step):
        """The zero-shot heuristics on the current weights → TensorBoard and ``run_dir/zero_shot.csv``."""
        rows = self.zero_shot.evaluate(self.trainer.model, step=step)
        self.bar.write(f"step {step} zero-shot: " + ", ".join(f"{r['task']} {r['metric']} {r['score']:.4f}" for r in rows))
        if self.writer:
            self.zero_shot.record(rows, self.writer, step, os.path.join(self.trainer.config.run_dir, "zero_shot.csv"))
        return rows

    def sample(self, step):
        if self.tokenizer is None:
            return None
        c = self.trainer.config
        prompt = self.tokenizer.encode(c.sample_prompt) if c.sample_prompt else []
        text = self.tokenizer.decode(self.sampler.sample(prompt, c.sample_length, seed=step))
        shown = f"{c.sample_prompt} ▸ {text}" if c.sample_prompt else text
        self.bar.write(f"step {step} sample: {shown}")
        if self.writer:
            with self.writer.as_default(step=step):
                tf.summary.text("samples/text", shown)
        return shown


def _flat(obj, prefix):
    """A dataclass as HParams-compatible {name: scalar}."""
    out = {}
    for key, value in dataclasses.asdict(obj).items():
        out[prefix + key] = value if isinstance(value, (bool, int, float, str)) else json.dumps(value)
    return out
