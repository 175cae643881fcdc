"""The flags of ``python -m gpt_tf.train``, defined when the CLI starts (``define_flags()`` in ``train.run``).

Importing a module defines no flag, so the CLIs of the project never collide on a name; the checks
of their values are in ``gpt_tf/flag_checks.py``. Here too, what the CLI does with the flags as a whole before
any work starts: the paper's fine-tuning defaults for the flags left unset (``apply_finetune_defaults``), the
contradictions and missing values among them (``combination_problems``), whether pre-training runs Keras's fit on
JAX (``on_keras_fit``) and its ``--distribution`` flags (``placement``), and the ``--zero_shot_*`` flags as a
``ZeroShotConfig`` (``zero_shot_config``).
"""

from __future__ import annotations

import json
import os

from absl import flags, logging

from gpt_tf import backend, flag_checks
from gpt_tf.runs.files import CHECKPOINTS
from gpt_tf.nn.recipes import PAPER_FINETUNE
from gpt_tf.data.records import has_manifest
from gpt_tf.speed import resolve
from gpt_tf.training import placement as placing

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the CLI's flags on absl's ``FLAGS`` (a second call in the same process does nothing)."""
    if "init_checkpoint" in flags.FLAGS:
        return
    flags.DEFINE_enum("mode", "train", ["train", "eval", "generate", "predict"], "What to do.")
    flags.DEFINE_string("task", "", "Fine-tune on this task (gpt_tf.tasks); --data_dir then holds its TFRecords.")
    flags.DEFINE_string("init_checkpoint", "", "The weights to start from: a pre-training run dir, ckpt prefix, GPT-1 "
                        "release dir, keras-hub preset folder or shipped preset's name (gpt1_tiny_books_en) "
                        "(fine-tuning: the pre-trained LM; pre-training: continue from it on --data_dir); empty = from "
                        "scratch.")
    flags.DEFINE_integer("transfer_layers", -1, "Fine-tuning: blocks transferred from --init_checkpoint (-1: all).")
    flags.DEFINE_integer("epochs", PAPER_FINETUNE["epochs"], "Fine-tuning epochs (the paper: 3).")
    flags.DEFINE_float("lm_coef", PAPER_FINETUNE["lm_coef"], "Fine-tuning: λ of the auxiliary LM loss (the paper: 0.5; 0 disables).")
    flags.DEFINE_float("clf_pdrop", PAPER_FINETUNE["clf_pdrop"], "Fine-tuning: classifier dropout (the paper: 0.1).")
    flags.DEFINE_float("warmup_fraction", PAPER_FINETUNE["warmup_fraction"], "Fine-tuning: warm-up as a fraction of all updates (the paper: 0.2%).")
    flags.DEFINE_list("aux_data_dirs", [], "Fine-tuning: more tasks' TFRecords trained together with --data_dir's "
                      "(multi-task: one backbone, one head per task).")
    flags.DEFINE_list("task_mixture", [], "Multi-task: sampling weight per task (--data_dir first, then --aux_data_dirs); "
                      "empty = proportional to training examples.")
    flags.DEFINE_bool("length_buckets", True, "Fine-tuning: pad each batch to the shortest length bucket (8, 12, 16, 20, "
                      "24, 28, 32, 40, ... n_ctx) that holds its examples; --nolength_buckets pads every batch to n_ctx.")
    flags.DEFINE_integer("buckets_per_octave", 4, "Fine-tuning: length buckets per doubling of the length (4: 8, 12, 16, "
                         "20, ...; 1: 8, 16, 32, ...). Each bucket is one XLA/TPU compilation; fewer pad more.")
    flags.DEFINE_string("predict_split", "", "--mode=predict: split to predict (default: the task's first eval split, "
                        "e.g. dev; `test` for a GLUE submission).")
    flags.DEFINE_string("model", "tiny", "Model size (gpt_tf/config.py): gpt1, small, tiny or test; lstm_small, "
                        "lstm_tiny or lstm_test for the LSTM baseline.")
    flags.DEFINE_integer("n_ctx", 0, "Override the model size's context length (0: keep).")
    flags.DEFINE_float("dropout", -1.0, "Override embedding/attention/residual dropout (-1: keep 0.1).")
    flags.DEFINE_float("attn_pdrop", -1.0, "Override the attention dropout alone, after --dropout (-1: keep). 0 lets "
                       "training on JAX or PyTorch run the fused (flash, where the device has it) attention kernel.")
    flags.DEFINE_integer("pad_vocab_to", 0, "In training, the LM head's width rounded up to a multiple of this, the "
                         "extra columns masked (GPU matmuls: 128); 0: keep the model's (1, no padding).")
    flags.DEFINE_string("data_dir", None, "TFRecords from `python -m pipelines.pretrain_data` (has manifest.json).")
    flags.DEFINE_bool("verify_data", True, "Check every data file's sha256 against its manifest before training or "
                      "evaluating (false: skip, for huge sets).")
    flags.DEFINE_string("tokenizer_dir", "", "BPE files (encoder json + .bpe); default: the one manifest.json names.")
    flags.DEFINE_string("run_dir", None, "Where checkpoints, TensorBoard logs and configs go.")
    flags.DEFINE_integer("batch_size", 64, "Global batch size in sequences (the paper: 64).")
    flags.DEFINE_integer("grad_accum_steps", 1, "Micro-batches per update; the update equals the full batch's.")
    flags.DEFINE_integer("train_steps", 100_000, "Number of updates (fine-tuning: a cap; the schedule spans --epochs).")
    flags.DEFINE_float("train_budget_minutes", 0.0, "Pre-training: fewer updates where --train_steps would take "
                       "longer than this on this machine now, from a few timed steps (0: off; the demo's).")
    flags.DEFINE_integer("min_train_steps", 0, "The fewest updates --train_budget_minutes leaves (--train_steps "
                         "still caps it).")
    flags.DEFINE_float("learning_rate", 2.5e-4, "Peak learning rate (the paper: 2.5e-4).")
    flags.DEFINE_integer("warmup_steps", 2000, "Linear warm-up updates (the paper: 2000).")
    flags.DEFINE_enum("lr_decay", "cosine", ["cosine", "linear", "constant"], "Decay after warm-up.")
    flags.DEFINE_float("weight_decay", PAPER_FINETUNE["weight_decay"], "Decoupled weight decay on weight matrices "
                       "(the paper: 0.01).")
    flags.DEFINE_float("clip_norm", PAPER_FINETUNE["clip_norm"], "Clip gradients to this global norm (0: off).")
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16", "auto"], "Compute precision; auto: the faster "
                      "of the two for this model on this machine, timed once and cached (gpt_tf/speed/precision.py).")
    flags.DEFINE_string("speed", "auto", "The speed choices (fused CPU kernels, padded weight gradients, the "
                        "evaluation GELU, oneDNN's rewrites, thread pools; the same results): auto, this machine's "
                        "fastest, timed once per machine and model shape and cached (gpt_tf/speed/resolve.py); "
                        "default, TensorFlow's own with the fused kernels; or a JSON file of them (a run folder's "
                        "speed_choices.json). Recorded in --run_dir/speed_choices.json.")
    flags.DEFINE_enum("strategy", "default", ["default", "one_device", "mirrored", "multi_worker", "tpu"], "tf.distribute.")
    flags.DEFINE_integer("num_cpu_devices", 1, "Split the CPU into this many logical devices (to test mirrored).")
    flags.DEFINE_string("tpu", "", "TPU name or grpc address, with --strategy=tpu.")
    flags.DEFINE_string("tpu_zone", "", "TPU zone, with --strategy=tpu.")
    flags.DEFINE_string("gcp_project", "", "GCP project, with --strategy=tpu.")
    flags.DEFINE_list("workers", [], "With --strategy=multi_worker: every worker's host:port (the first is chief); "
                      "the cluster for this process instead of TF_CONFIG from the environment.")
    flags.DEFINE_integer("worker_index", 0, "With --workers: this process's index in --workers.")
    flags.DEFINE_enum("distribution", "none", list(placing.KINDS), "KERAS_BACKEND=jax "
                      "pre-training: keras.distribution over the devices: none (one device), data_parallel "
                      "(DataParallel over every device), model_parallel (ModelParallel on a (batch, model) mesh).")
    flags.DEFINE_integer("model_parallel", 1, "--distribution=model_parallel: devices on the mesh's model axis "
                         "(the weights split over them: GPT1Backbone.get_layout_map).")
    flags.DEFINE_string("coordinator_address", "", "KERAS_BACKEND=jax, several processes: process 0's host:port "
                        "(keras.distribution.initialize).")
    flags.DEFINE_integer("num_processes", 1, "KERAS_BACKEND=jax: the processes that train together.")
    flags.DEFINE_integer("process_id", 0, "KERAS_BACKEND=jax: this process's index (0 writes the run folder).")
    flags.DEFINE_bool("jit_compile", False, "XLA-compile the model's train_step (one replica; a GPU; TPUs always "
                      "compile).")
    flags.DEFINE_integer("seed", 0, "Seed for init, dropout and data order.")
    flags.DEFINE_bool("deterministic", False, "Enable TF op determinism (bit-exact resume; slower).")
    flags.DEFINE_integer("log_every", 10, "Log/summary period in steps.")
    flags.DEFINE_integer("checkpoint_every", 500, "Checkpoint period in steps (fine-tuning: only when given; "
                         "it always saves at each epoch's end).")
    flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept.")
    flags.DEFINE_integer("eval_every", 0, "Held-out evaluation period in steps (0: at the end only).")
    flags.DEFINE_integer("eval_batches", 0, "Batches per periodic evaluation while training (0: the whole split); --mode=eval reads the "
                         "whole split.")
    flags.DEFINE_integer("sample_every", 0, "Text sample period in steps (0: at the end only).")
    flags.DEFINE_string("sample_prompt", "", "Prompt for samples during training.")
    flags.DEFINE_integer("sample_length", 64, "Tokens per sample.")
    flags.DEFINE_string("prompt", "", "--mode=generate: the prompt.")
    flags.DEFINE_float("temperature", 1.0, "--mode=generate: sampling temperature (0: greedy).")
    flags.DEFINE_integer("top_k", 40, "--mode=generate: sample among the k likeliest tokens (0: all).")
    flags.DEFINE_enum("weights", "float32", ["float32", "bfloat16", "int8", "int8_weight_only"], "--mode=generate: "
                      "the weights' format (gpt_tf/gpt1/weight_formats.py): bfloat16 or int8 read fewer bytes per token.")
    flags.DEFINE_bool("progress", True, "Show a progress bar (a plain line every few steps where stderr is not a terminal).")
    flags.DEFINE_bool("json", False, "End with the result as one JSON line on stdout (for scripts) instead of a summary.")
    flags.DEFINE_list("zero_shot_tasks", [], "Pre-training: §5 zero-shot tasks scored during training (gpt_tf/analysis/heuristics.py): "
                      "cola, sst2, race, story_cloze, dprd.")
    flags.DEFINE_list("zero_shot_data_dirs", [], "Each zero-shot task's folder in its official layout, in --zero_shot_tasks order.")
    flags.DEFINE_integer("zero_shot_every", 0, "Zero-shot period in steps (0: at the end only); writes run_dir/zero_shot.csv.")
    flags.DEFINE_integer("zero_shot_max_examples", 0, "Zero-shot: a fixed hash sample of this many examples per split (0: all).")
    flags.DEFINE_string("zero_shot_reference_json", "", "Zero-shot: JSON {task: reference score} for normalised scores.")


# Flags shared with pre-training whose unset value differs when fine-tuning.
FINETUNE_DEFAULTS = {k: PAPER_FINETUNE[k] for k in ("learning_rate", "batch_size", "lr_decay")}


def apply_finetune_defaults() -> None:
    """The paper's fine-tuning recipe for each flag the user left unset (flagfiles count as set)."""
    for name, value in FINETUNE_DEFAULTS.items():
        if not FLAGS[name].present:
            FLAGS[name].value = value


def combination_problems() -> list[str]:
    """Contradictions and missing values, found before any work starts."""
    problems = [f"--{name} is required" for name in ("data_dir", "run_dir") if not getattr(FLAGS, name)]
    builder = "finetune_data" if FLAGS.task else "pretrain_data"
    if FLAGS.data_dir and not has_manifest(FLAGS.data_dir):
        problems.append(f"--data_dir={FLAGS.data_dir} has no manifest.json; build it with `python -m pipelines.{builder}`")
    if FLAGS.batch_size > 0 and FLAGS.grad_accum_steps > 0 and FLAGS.batch_size % FLAGS.grad_accum_steps:
        problems.append(f"--batch_size={FLAGS.batch_size} is not divisible by --grad_accum_steps={FLAGS.grad_accum_steps}")
    problems += flag_checks.mode_problems(FLAGS) + flag_checks.strategy_problems(FLAGS)
    problems += flag_checks.route_problems(FLAGS, on_keras_fit())
    if on_keras_fit():
        problems += placement().problems()
    elif resolve.spec_problem(FLAGS.speed):
        problems.append(resolve.spec_problem(FLAGS.speed))
    if FLAGS.strategy == "tpu" and FLAGS.precision == "float32":
        logging.warning("TPUs are fastest with --precision=mixed_bfloat16")
    if FLAGS.task:
        return problems + flag_checks.finetune_problems(FLAGS)
    if FLAGS.warmup_steps < 0 or FLAGS.warmup_steps > FLAGS.train_steps:
        problems.append(f"--warmup_steps={FLAGS.warmup_steps} must be within [0, --train_steps={FLAGS.train_steps}]")
    untrained = FLAGS.run_dir and not os.path.isdir(os.path.join(FLAGS.run_dir, CHECKPOINTS))
    if FLAGS.mode in ("eval", "generate") and untrained:
        problems.append(f"--mode={FLAGS.mode} needs a trained run: no checkpoints in --run_dir={FLAGS.run_dir}")
    if FLAGS.zero_shot_reference_json and not os.path.isfile(FLAGS.zero_shot_reference_json):
        problems.append(f"--zero_shot_reference_json={FLAGS.zero_shot_reference_json} does not exist")
    elif FLAGS.zero_shot_tasks:
        problems += zero_shot_config().problems()
    return problems


def model_overrides() -> dict:
    """The model config's fields the dropout and vocabulary-padding flags override (``GPTConfig.replace``'s
    keywords)."""
    out = {}
    if FLAGS.dropout >= 0:
        out.update(embd_pdrop=FLAGS.dropout, attn_pdrop=FLAGS.dropout, resid_pdrop=FLAGS.dropout)
    if FLAGS.attn_pdrop >= 0:
        out["attn_pdrop"] = FLAGS.attn_pdrop
    if FLAGS.pad_vocab_to:
        out["pad_vocab_to"] = FLAGS.pad_vocab_to
    return out


def on_keras_fit() -> bool:
    """Whether this command pre-trains by Keras's fit on JAX (``gpt_tf/training/keras_fit.py``): pre-training's
    ``--mode=train`` under ``KERAS_BACKEND=jax``; every other command runs on TensorFlow."""
    return backend.asked() == "jax" and not FLAGS.task and FLAGS.mode == "train"


def placement():
    """The --distribution flags as a ``gpt_tf.training.placement.Placement``."""
    return placing.Placement(FLAGS.distribution, FLAGS.model_parallel, FLAGS.coordinator_address, FLAGS.num_processes,
                     FLAGS.process_id)


def zero_shot_config():
    """The --zero_shot_* flags as a ``ZeroShotConfig`` (no TensorFlow import)."""
    from gpt_tf.analysis.heuristics import ZeroShotConfig

    reference = {}
    if FLAGS.zero_shot_reference_json:
        with open(FLAGS.zero_shot_reference_json) as f:
            reference = {task: float(score) for task, score in json.load(f).items() if task in FLAGS.zero_shot_tasks}
    return ZeroShotConfig(tasks=tuple(FLAGS.zero_shot_tasks), data_dirs=tuple(FLAGS.zero_shot_data_dirs),
                          every=FLAGS.zero_shot_every, max_examples=FLAGS.zero_shot_max_examples, reference=reference)
