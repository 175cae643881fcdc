"""What a ``python -m gpt_tf.train`` mode starts from, found from the flags before TensorFlow starts (nothing is
written yet): each data folder's manifest, read once and checked with its files and tokenizer (``setup``), and for
pre-training the tokenizer, the model config and ``TrainConfig``'s fields, checked against a run's saved ones
(``pretrain_setup``). A CLI module: it reads the flags ``gpt_tf/train_flags.py`` defines."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from absl import flags

from gpt_tf import train_flags
from gpt_tf.config import GPTConfig
from gpt_tf.runs.files import (DATA_FILE, MODEL_CONFIG, RUN_CONFIGS, data_identity, has_checkpoints, has_fit_saves,
                               resume_problems)

FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a mode starts from, found before TensorFlow starts (nothing is written yet)."""
    manifest: dict                 # --data_dir's manifest.json (each manifest is read once, here)
    aux_manifests: tuple = ()      # --aux_data_dirs' manifests, in flag order
    model_config: Optional[GPTConfig] = None  # pre-training: from --model and the data (fine-tuning finds its own)
    tokenizer: object = None       # pre-training: the offline GPTTokenizer of the data
    train_kwargs: dict = dataclasses.field(default_factory=dict)  # pre-training: TrainConfig's fields
    problems: tuple = ()
    speed: object = None           # TensorFlow's loop: the speed choices TensorFlow starts under (resolve.Resolution)


def setup() -> Setup:
    """Each data folder's manifest (read once) checked with its files and tokenizer, then the mode's set-up."""
    from gpt_tf.data.records import data_file_problems, read_manifest, tokenizer_problems

    manifests, problems = [], []
    for data_dir in [FLAGS.data_dir, *FLAGS.aux_data_dirs]:
        manifest = read_manifest(data_dir)
        manifests.append(manifest)
        tokenizer_dir = (FLAGS.tokenizer_dir if data_dir == FLAGS.data_dir else "") or manifest["tokenizer"]["dir"]
        if not FLAGS.task or os.path.isdir(tokenizer_dir):  # fine-tuning reads ids only; export needs the files
            problems += tokenizer_problems(manifest, tokenizer_dir, data_dir)
        if FLAGS.verify_data and FLAGS.mode in ("train", "eval"):
            problems += data_file_problems(data_dir, manifest)
    setup = Setup(manifests[0], tuple(manifests[1:]), problems=tuple(problems))
    if problems or FLAGS.task:  # the pre-training set-up below reads the tokenizer files
        return setup
    return pretrain_setup(setup)


def train_kwargs() -> dict:
    """``TrainConfig``'s fields from the flags (a dict: compared with a run's before TensorFlow starts)."""
    names = ("init_checkpoint", "batch_size", "grad_accum_steps", "train_steps", "learning_rate", "warmup_steps", "lr_decay",
             "weight_decay", "clip_norm", "precision", "jit_compile", "seed", "log_every", "checkpoint_every",
             "keep_checkpoints", "eval_every", "eval_batches", "sample_every", "sample_prompt", "sample_length")
    return {"data_dir": FLAGS.data_dir, "run_dir": FLAGS.run_dir, **{name: FLAGS[name].value for name in names}}


def pretrain_setup(setup: Setup) -> Setup:
    """``setup`` with pre-training's tokenizer, model config and TrainConfig fields, checked against the run's saved ones."""
    from gpt_tf.config import get_size
    from gpt_tf.convert.pretrained import continued_model_config
    from gpt_tf.text.tokenizer import GPTTokenizer

    manifest = setup.manifest
    tokenizer = GPTTokenizer.from_dir(FLAGS.tokenizer_dir or manifest["tokenizer"]["dir"])
    overrides = {"vocab_size": tokenizer.vocab_size, "n_ctx": FLAGS.n_ctx or int(manifest["n_ctx"]),
                 **train_flags.model_overrides()}
    problems = []
    if FLAGS.init_checkpoint:
        model_config, problems = continued_model_config(FLAGS.init_checkpoint, FLAGS.data_dir, overrides)
    else:
        model_config = get_size(FLAGS.model, **overrides)
    if model_config.n_ctx != int(manifest["n_ctx"]):
        problems.append(f"--n_ctx={model_config.n_ctx} but {FLAGS.data_dir} holds {manifest['n_ctx']}-token sequences")
    kwargs = train_kwargs()
    configs = {MODEL_CONFIG: dataclasses.asdict(model_config)}
    if FLAGS.mode == "train":
        configs.update({RUN_CONFIGS["pretrain"]: kwargs, DATA_FILE: data_identity(data=manifest)})
    problems += resume_problems(FLAGS.run_dir, configs)
    if train_flags.on_keras_fit() and has_checkpoints(FLAGS.run_dir):
        problems.append(f"--run_dir={FLAGS.run_dir} holds checkpoints of TensorFlow's loop: resume it without "
                        "KERAS_BACKEND=jax, or give a new --run_dir")
    elif FLAGS.mode == "train" and not train_flags.on_keras_fit() and has_fit_saves(FLAGS.run_dir):
        problems.append(f"--run_dir={FLAGS.run_dir} holds a run of Keras's fit on JAX: resume it with "
                        "KERAS_BACKEND=jax, or give a new --run_dir")
    return dataclasses.replace(setup, model_config=model_config, tokenizer=tokenizer, train_kwargs=kwargs,
                               problems=tuple(problems))
