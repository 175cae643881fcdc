r"""Command line: pre-train, evaluate or sample a GPT language model.

    python -m gpt_tf.train --flagfile=configs/gpt1_pretrain.flags
    python -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=eval
    python -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=generate --prompt="to be"

Flags are read here only; everything below takes dataclasses. Re-running the same command
resumes from the run directory's latest checkpoint.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS

flags.DEFINE_enum("mode", "train", ["train", "eval", "generate"], "What to do.")
flags.DEFINE_string("model", "tiny", "Model preset: gpt1, small, tiny or test.")
flags.DEFINE_integer("n_ctx", 0, "Override the preset's context length (0: keep).")
flags.DEFINE_float("dropout", -1.0, "Override embedding/attention/residual dropout (-1: keep 0.1).")
flags.DEFINE_string("data_dir", None, "TFRecords from `python -m pipelines.pretrain_data` (has manifest.json).")
flags.DEFINE_string("tokenizer_dir", "", "BPE files (encoder json + .bpe); default: the one manifest.json names.")
flags.DEFINE_string("run_dir", None, "Where checkpoints, TensorBoard logs and configs go.")
flags.DEFINE_integer("batch_size", 64, "Global batch size in sequences (the paper: 64).")
flags.DEFINE_integer("grad_accum_steps", 1, "Micro-batches per update; the update equals the full batch's.")
flags.DEFINE_integer("train_steps", 100_000, "Number of updates.")
flags.DEFINE_float("learning_rate", 2.5e-4, "Peak learning rate (the paper: 2.5e-4).")
flags.DEFINE_integer("warmup_steps", 2000, "Linear warm-up updates (the paper: 2000).")
flags.DEFINE_enum("lr_decay", "cosine", ["cosine", "linear", "constant"], "Decay after warm-up.")
flags.DEFINE_float("weight_decay", 0.01, "Decoupled weight decay on weight matrices (the paper: 0.01).")
flags.DEFINE_float("clip_norm", 1.0, "Clip gradients to this global norm (0: off).")
flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16"], "Compute precision.")
flags.DEFINE_enum("strategy", "default", ["default", "one_device", "mirrored", "multi_worker", "tpu"], "tf.distribute.")
flags.DEFINE_integer("num_cpu_devices", 1, "Split the CPU into this many logical devices (to test mirrored).")
flags.DEFINE_string("tpu", "", "TPU name or grpc address, with --strategy=tpu.")
flags.DEFINE_string("tpu_zone", "", "TPU zone, with --strategy=tpu.")
flags.DEFINE_string("gcp_project", "", "GCP project, with --strategy=tpu.")
flags.DEFINE_integer("seed", 0, "Seed for init, dropout and data order.")
flags.DEFINE_bool("deterministic", False, "Enable TF op determinism (bit-exact resume; slower).")
flags.DEFINE_integer("log_every", 10, "Log/summary period in steps.")
flags.DEFINE_integer("checkpoint_every", 500, "Checkpoint period in steps.")
flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept.")
flags.DEFINE_integer("eval_every", 0, "Held-out evaluation period in steps (0: at the end only).")
flags.DEFINE_integer("eval_batches", 0, "Batches per periodic evaluation (0: the whole split).")
flags.DEFINE_integer("sample_every", 0, "Text sample period in steps (0: at the end only).")
flags.DEFINE_string("sample_prompt", "", "Prompt for samples during training.")
flags.DEFINE_integer("sample_length", 64, "Tokens per sample.")
flags.DEFINE_string("prompt", "", "--mode=generate: the prompt.")
flags.DEFINE_float("temperature", 1.0, "--mode=generate: sampling temperature (0: greedy).")
flags.DEFINE_integer("top_k", 40, "--mode=generate: sample among the k likeliest tokens (0: all).")
flags.DEFINE_bool("progress", True, "Show a progress bar.")


def _check_flags() -> list[str]:
    """Contradictions and missing values, found before any work starts."""
    problems = []
    for name in ("data_dir", "run_dir"):
        if not getattr(FLAGS, name):
            problems.append(f"--{name} is required")
    if FLAGS.data_dir and not os.path.isfile(os.path.join(FLAGS.data_dir, "manifest.json")):
        problems.append(f"--data_dir={FLAGS.data_dir} has no manifest.json; build it with `python -m pipelines.pretrain_data`")
    if FLAGS.batch_size <= 0 or FLAGS.grad_accum_steps <= 0 or FLAGS.train_steps <= 0:
        problems.append("--batch_size, --grad_accum_steps and --train_steps must be positive")
    elif FLAGS.batch_size % FLAGS.grad_accum_steps:
        problems.append(f"--batch_size={FLAGS.batch_size} is not divisible by --grad_accum_steps={FLAGS.grad_accum_steps}")
    if FLAGS.warmup_steps < 0 or FLAGS.warmup_steps > FLAGS.train_steps:
        problems.append(f"--warmup_steps={FLAGS.warmup_steps} must be within [0, --train_steps={FLAGS.train_steps}]")
    if FLAGS.num_cpu_devices > 1 and FLAGS.strategy != "mirrored":
        problems.append("--num_cpu_devices > 1 only makes sense with --strategy=mirrored")
    if FLAGS.strategy == "tpu" and not FLAGS.tpu:
        problems.append("--strategy=tpu needs --tpu")
    if FLAGS.strategy == "tpu" and FLAGS.precision == "float32":
        logging.warning("TPUs are fastest with --precision=mixed_bfloat16")
    if FLAGS.mode in ("eval", "generate") and FLAGS.run_dir and not os.path.isdir(os.path.join(FLAGS.run_dir, "checkpoints")):
        problems.append(f"--mode={FLAGS.mode} needs a trained run: no checkpoints in --run_dir={FLAGS.run_dir}")
    if not 0.0 <= FLAGS.temperature:
        problems.append("--temperature must be >= 0")
    return problems


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    problems = _check_flags()
    if problems:
        sys.exit("gpt_tf.train: invalid flags:\n  " + "\n  ".join(problems))

    # Imported late: flag errors must show in a second, not after TensorFlow's start-up.
    import keras
    import tensorflow as tf

    from gpt_tf.baselines import unigram_perplexity
    from gpt_tf.config import get_preset
    from gpt_tf.generate import Sampler
    from gpt_tf.monitor import TrainCallbacks
    from gpt_tf.strategy import make_strategy, split_cpu
    from gpt_tf.tokenizer import GPTTokenizer
    from gpt_tf.trainer import Pretrainer, TrainConfig

    with open(os.path.join(FLAGS.data_dir, "manifest.json")) as f:
        manifest = json.load(f)
    tokenizer_dir = FLAGS.tokenizer_dir or manifest["tokenizer"]["dir"]
    tokenizer = GPTTokenizer.from_dir(tokenizer_dir)
    overrides = {"vocab_size": tokenizer.vocab_size, "n_ctx": FLAGS.n_ctx or int(manifest["n_ctx"])}
    if FLAGS.dropout >= 0:
        overrides.update(embd_pdrop=FLAGS.dropout, attn_pdrop=FLAGS.dropout, resid_pdrop=FLAGS.dropout)
    model_config = get_preset(FLAGS.model, **overrides)
    if model_config.n_ctx != int(manifest["n_ctx"]):
        sys.exit(f"gpt_tf.train: --n_ctx={model_config.n_ctx} but {FLAGS.data_dir} holds {manifest['n_ctx']}-token sequences")

    if FLAGS.deterministic:
        tf.config.experimental.enable_op_determinism()
    split_cpu(FLAGS.num_cpu_devices)
    strategy = make_strategy(FLAGS.strategy, FLAGS.num_cpu_devices, FLAGS.tpu, FLAGS.tpu_zone, FLAGS.gcp_project)
    if FLAGS.precision != "float32":
        keras.mixed_precision.set_dtype_policy(FLAGS.precision)
    config = TrainConfig(
        data_dir=FLAGS.data_dir, run_dir=FLAGS.run_dir, batch_size=FLAGS.batch_size,
        grad_accum_steps=FLAGS.grad_accum_steps, train_steps=FLAGS.train_steps, learning_rate=FLAGS.learning_rate,
        warmup_steps=FLAGS.warmup_steps, lr_decay=FLAGS.lr_decay, weight_decay=FLAGS.weight_decay,
        clip_norm=FLAGS.clip_norm, precision=FLAGS.precision, seed=FLAGS.seed, log_every=FLAGS.log_every,
        checkpoint_every=FLAGS.checkpoint_every, keep_checkpoints=FLAGS.keep_checkpoints, eval_every=FLAGS.eval_every,
        eval_batches=FLAGS.eval_batches, sample_every=FLAGS.sample_every, sample_prompt=FLAGS.sample_prompt,
        sample_length=FLAGS.sample_length,
    )
    trainer = Pretrainer(model_config, config, strategy, log=logging.info)
    print(f"model {FLAGS.model}: {model_config.n_params / 1e6:.2f}M parameters, {strategy.num_replicas_in_sync} replica(s), "
          f"{FLAGS.precision}, run dir {FLAGS.run_dir}", flush=True)

    if FLAGS.mode == "train":
        trainer.save_model_config()
        result = trainer.train(TrainCallbacks(trainer, tokenizer, progress=FLAGS.progress))
        print(json.dumps(result), flush=True)
        return
    step = trainer.restore()
    if FLAGS.mode == "eval":
        result = {"step": step, **trainer.evaluate(), **unigram_perplexity(FLAGS.data_dir, model_config.n_ctx, tokenizer.vocab_size)}
        if trainer.chief:
            with open(os.path.join(FLAGS.run_dir, f"eval_step{step}.json"), "w") as f:
                json.dump(result, f, indent=2)
        print(json.dumps(result), flush=True)
    else:
        sampler = Sampler(trainer.model, model_config.vocab_size, model_config.n_ctx)
        ids = sampler.sample(tokenizer.encode(FLAGS.prompt), FLAGS.sample_length, FLAGS.temperature, FLAGS.top_k, FLAGS.seed)
        print(FLAGS.prompt + " " + tokenizer.decode(ids), flush=True)


def run():
    app.run(main)


if __name__ == "__main__":
    run()
