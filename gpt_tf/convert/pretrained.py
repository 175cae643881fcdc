"""The pre-trained weights training and export start from: their model config, and their weights into a model.

A path names them (``--init_checkpoint``, the LM export): a pre-training run folder (its latest checkpoint), one
of its checkpoint prefixes (``runs/x/checkpoints/ckpt-N``), a folder of GPT-1's release shards
(``params_0.npy`` … + ``params_shapes.json``), a keras-hub preset folder (``config.json`` +
``model.weights.h5``) or a ``transformers`` GPT-1 checkpoint (a folder ``save_pretrained`` wrote, or an ``hf://``
handle such as ``hf://openai-community/openai-gpt``: ``gpt_tf/convert/hf.py``), or a shipped preset's name does
where no such path is there (``gpt1_tiny_books_en``, its earlier name ``books_tiny``: ``preset_io.locate``), so a
shipped preset is usable wherever a run is. ``pretrained_model_config`` is the model it implies,
``restore_pretrained_lm`` reads its weights into a ``GPT1CausalLM``; fine-tuning starts from it
(``initialise_from_pretrained``: the embeddings and the first blocks into a task model's backbone) and so does
continued pre-training (``continue_from_pretrained``, with the model ``continued_model_config`` gives).
The configs are found before TensorFlow starts (nothing here imports it until weights are read).
"""

from __future__ import annotations

import os

from gpt_tf.convert import hf, preset_io
from gpt_tf.config import GPTConfig, get_size
from gpt_tf.runs.files import CHECKPOINTS, MODEL_CONFIG, read_model_config

RELEASE_FIRST_SHARD = "params_0.npy"


def is_release(path: str) -> bool:
    """Whether ``path`` is a folder of GPT-1's release shards."""
    return os.path.isfile(os.path.join(path, RELEASE_FIRST_SHARD))


def pretrained_model_config(path: str) -> GPTConfig:
    """The GPTConfig of a pre-training (or fine-tuning) run dir, a checkpoint prefix, GPT-1 release shards, a
    keras-hub preset folder (``gpt_tf/convert/preset_io.py``), a shipped preset's name or a ``transformers``
    checkpoint (``gpt_tf/convert/hf.py``)."""
    path = preset_io.locate(path)
    if is_release(path):
        return get_size("gpt1")
    if hf.is_hf_checkpoint(path):
        return hf.checkpoint_config(path)
    if preset_io.is_preset(path):
        return preset_io.preset_config(path)
    run_dir = path if os.path.isdir(path) else os.path.dirname(os.path.dirname(path))  # run/checkpoints/ckpt-N
    if not os.path.isfile(os.path.join(run_dir, MODEL_CONFIG)):
        raise FileNotFoundError(f"{os.path.join(run_dir, MODEL_CONFIG)} not found: {path} is not a gpt_tf run (nor "
                                "GPT-1 release shards, a preset folder or a transformers checkpoint)")
    return read_model_config(run_dir)


def continued_model_config(init_checkpoint: str, data_dir: str, overrides: dict) -> tuple[GPTConfig, list[str]]:
    """Continued pre-training's model: ``init_checkpoint``'s (``pretrained_model_config``) with ``overrides``
    (``n_ctx``: the data's, at most the checkpoint's; dropouts), and the problems that forbid it
    (``overrides["vocab_size"]``, the data's tokenizer, must be the checkpoint's)."""
    config = pretrained_model_config(init_checkpoint)
    problems = []
    if config.vocab_size != overrides["vocab_size"]:
        problems.append(f"--init_checkpoint={init_checkpoint} has {config.vocab_size} BPE tokens but {data_dir} was "
                        f"tokenized with {overrides['vocab_size']}: rebuild it with the model's tokenizer")
    if overrides["n_ctx"] > config.n_ctx:
        problems.append(f"{data_dir} holds {overrides['n_ctx']}-token sequences, longer than the {config.n_ctx} "
                        f"positions of --init_checkpoint={init_checkpoint}")
    return config.replace(**{k: v for k, v in overrides.items() if k != "vocab_size"}), problems


def restore_pretrained_lm(lm, path: str) -> str:
    """Loads the pre-trained weights at ``path`` (see the module doc) into the ``GPT1CausalLM`` ``lm``; returns
    what was read (the weights file, the shards' folder or the checkpoint prefix)."""
    path = preset_io.locate(path)
    if hf.is_hf_checkpoint(path):
        return hf.load_checkpoint_weights(lm.backbone, path)
    if preset_io.is_preset(path):
        return preset_io.load_preset_weights(lm.backbone, path)
    if is_release(path):
        from gpt_tf.convert.release import load_gpt1_release

        load_gpt1_release(lm, path)
        return path
    import tensorflow as tf

    from gpt_tf.runs.checkpoints import restore_weights

    prefix = tf.train.latest_checkpoint(os.path.join(path, CHECKPOINTS)) if os.path.isdir(path) else path
    if not prefix or not tf.io.gfile.exists(prefix + ".index"):
        raise FileNotFoundError(f"no pre-trained checkpoint at {path} (want a run dir, a ckpt prefix, GPT-1 shards "
                                "or a preset folder)")
    restore_weights(lm.variables, prefix)
    return prefix


def initialise_from_pretrained(model, path: str, n_layers: int, seed: int = 0) -> list[str]:
    """Fine-tuning's start (§3.2): the pre-trained LM at ``path`` (see ``restore_pretrained_lm``) into
    ``model``'s backbone: its embeddings and first ``n_layers`` blocks, then the special-token rows
    re-drawn (deterministic in ``seed``). Returns the paths of the variables overwritten."""
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.transfer import reset_special_embeddings, transfer_layers

    lm = causal_lm_for(pretrained_model_config(path))  # its own n_ctx
    restore_pretrained_lm(lm, path)
    copied = transfer_layers(lm, model.backbone, n_layers)
    reset_special_embeddings(model.backbone, seed=seed)
    return copied


def continue_from_pretrained(lm, path: str) -> list[str]:
    """Continued pre-training's start: the pre-trained LM at ``path`` (see ``restore_pretrained_lm``) into the
    ``GPT1CausalLM`` ``lm``: every block, the embeddings with their special-token rows, and the first
    ``lm``'s n_ctx position rows (its context may be shorter). Returns the paths of the variables overwritten."""
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.nn.transfer import transfer_layers

    source = causal_lm_for(pretrained_model_config(path))  # its own n_ctx
    restore_pretrained_lm(source, path)
    return transfer_layers(source, lm, lm.backbone.config.n_layer)
