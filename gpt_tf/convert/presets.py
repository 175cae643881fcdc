"""keras-hub presets written from what training and GPT-1's release leave: a run folder, the release shards, a
``transformers`` state dict.

A pre-training run becomes a backbone preset (its latest checkpoint, and the tokenizer its data manifest names);
a fine-tuning run a task preset (the keras-hub task of its primary head, label names and tokenizer included);
GPT-1's released shards and a ``transformers`` ``OpenAIGPT`` state dict (``tools/torch_pretrain``'s GPU-trained
``weights-<step>.part<k>.npz`` included) a backbone preset of a model size. ``python -m gpt_tf.convert`` is their
command line. A preset starts training wherever a run would (``--init_checkpoint``, ``pretrained.py``) and is
exported like one (``python -m serving.export --preset``).
"""

from __future__ import annotations

from gpt_tf.config import get_size
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.tokenizer import GPT1Tokenizer


def copy_weights(source, target) -> None:
    """Variable by variable (two layers of one layout); ValueError on any shape mismatch."""
    if len(source.weights) != len(target.weights):
        raise ValueError(f"{len(source.weights)} weights vs {len(target.weights)}: not the same model")
    for a, b in zip(source.weights, target.weights):
        if tuple(a.shape) != tuple(b.shape):
            raise ValueError(f"{a.path} {tuple(a.shape)} vs {b.path} {tuple(b.shape)}")
        b.assign(a)


def save_backbone_preset(backbone, tokenizer_dir: str, preset_dir: str, weights_dtype: str = "float32") -> str:
    """Writes ``backbone`` and the BPE files of ``tokenizer_dir`` as a preset; returns ``preset_dir``.
    ``weights_dtype="float16"`` stores the float32 weights rounded to float16 (half the file; see
    ``store_weights_as``)."""
    tokenizer = GPT1Tokenizer(tokenizer_dir)
    if tokenizer.vocabulary_size() != backbone.config.total_vocab:
        raise ValueError(f"{tokenizer_dir} has {tokenizer.bpe_vocabulary_size} BPE tokens, the model "
                         f"{backbone.config.vocab_size}")
    backbone.save_to_preset(preset_dir)
    tokenizer.save_to_preset(preset_dir)
    if weights_dtype != "float32":
        store_weights_as(preset_dir, weights_dtype)
    return preset_dir


def store_weights_as(preset_dir: str, dtype: str) -> None:
    """Rewrites the preset's ``model.weights.h5`` with its float32 arrays as ``dtype`` (e.g. float16), everything
    else as it was. The model stays float32 (``config.json`` unchanged): Keras casts each stored array to its
    variable's dtype when it loads (``from_preset`` on every backend), so the weights load as their float16
    roundings, for a file half the size (GPU-trained weights that came as float16 lose nothing)."""
    import os  # pylint: disable=import-outside-toplevel

    import h5py  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    path = os.path.join(preset_dir, "model.weights.h5")
    tmp = f"{path}.tmp-{os.getpid()}"
    with h5py.File(path, "r") as source, h5py.File(tmp, "w") as target:
        for key, value in source.attrs.items():
            target.attrs[key] = value

        def copy(name, item):
            if isinstance(item, h5py.Dataset):
                data = item[()]
                target.create_dataset(name, data=data.astype(dtype) if data.dtype == np.float32 else data)
            else:
                target.require_group(name)
            for key, value in item.attrs.items():
                target[name].attrs[key] = value

        source.visititems(copy)
    os.replace(tmp, path)


def _transformer(config, where: str):
    """``config``, where it describes a transformer (a GPT-1 preset holds nothing else)."""
    if config.model_type != GPT1Backbone.model_type:
        raise ValueError(f"{where}: a GPT-1 preset holds a transformer, not model_type={config.model_type!r}")
    return config


def preset_from_run(run_dir: str, preset_dir: str, tokenizer_dir: str = "") -> str:
    """A pre-training run (→ backbone + tokenizer) or a fine-tuning run (→ its task too) as a preset; the run
    is read once by ``gpt_tf.runs.folder.RunFolder`` (``tokenizer_dir``: else the one its data names)."""
    # pylint: disable=import-outside-toplevel
    from gpt_tf.convert.pretrained import restore_pretrained_lm
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.runs.checkpoints import load_task_model
    from gpt_tf.runs.folder import RunFolder

    run = RunFolder.open(run_dir, tokenizer_dir=tokenizer_dir)
    if not run.tokenizer_dir:
        raise FileNotFoundError(f"{run_dir}: no tokenizer folder known (its data folder is gone): give one")
    _transformer(run.model_config, run_dir)
    if run.kind != "finetune":
        lm = causal_lm_for(run.model_config)
        restore_pretrained_lm(lm, run_dir)
        return save_backbone_preset(lm.backbone, run.tokenizer_dir, preset_dir)
    model, spec = load_task_model(run)
    task = task_from(model, spec, run.tokenizer_dir)
    task.save_to_preset(preset_dir)
    return preset_dir


def task_from(model, spec, tokenizer_dir: str):
    """The keras-hub task of a ``GPTTaskModel`` + ``TaskSpec``: on its backbone, its head's weights copied."""
    from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor  # pylint: disable=import-outside-toplevel
    from gpt_tf.gpt1.text_classifier import (  # pylint: disable=import-outside-toplevel
        GPT1MultipleChoice, GPT1TextClassifier, GPT1TextRegressor)

    backbone = model.backbone
    preprocessor = GPT1TaskPreprocessor(GPT1Tokenizer(tokenizer_dir), input_type=spec.input_type,
                                        num_choices=spec.num_choices)
    if spec.head == "regression":
        task = GPT1TextRegressor(backbone, preprocessor, input_type=spec.input_type, dropout=model.clf_pdrop)
    elif spec.head == "choice":
        task = GPT1MultipleChoice(backbone, spec.num_choices, preprocessor, dropout=model.clf_pdrop)
    else:
        task = GPT1TextClassifier(backbone, len(spec.label_names), preprocessor, input_type=spec.input_type,
                                  label_names=spec.label_names, dropout=model.clf_pdrop)
    copy_weights(model.clf, task.task_model.clf)
    return task


def preset_from_gpt1_shards(params_dir: str, tokenizer_dir: str, preset_dir: str, model: str = "gpt1") -> str:
    """GPT-1's released ``params_{0..9}.npy`` (+ ``params_shapes.json``) as a preset (the ``model`` size's
    shape, ``gpt1`` for the release; n_ctx from the position table)."""
    from gpt_tf.convert.release import load_gpt1_release  # pylint: disable=import-outside-toplevel

    vocab_size = GPT1Tokenizer(tokenizer_dir).bpe_vocabulary_size
    backbone = GPT1Backbone.from_gpt_config(_transformer(get_size(model, vocab_size=vocab_size), f"--model={model}"))
    load_gpt1_release(backbone, params_dir)
    return save_backbone_preset(backbone, tokenizer_dir, preset_dir)


def preset_from_state_dict(paths, model: str, tokenizer_dir: str, preset_dir: str, n_ctx: int = 0,
                           weights_dtype: str = "float32") -> str:
    """A ``transformers`` ``OpenAIGPT`` state dict saved as ``.npz`` (one file or its parts) as a preset of the
    model size ``model`` (``n_ctx``: the context, 0 for the size's; ``weights_dtype``: as ``save_backbone_preset``).
    """
    # pylint: disable=import-outside-toplevel
    from gpt_tf.convert.state_dicts import load_hf_state_dict, read_state_dict

    overrides = {"vocab_size": GPT1Tokenizer(tokenizer_dir).bpe_vocabulary_size, **({"n_ctx": n_ctx} if n_ctx else {})}
    backbone = GPT1Backbone.from_gpt_config(_transformer(get_size(model, **overrides), f"--model={model}"))
    load_hf_state_dict(backbone, read_state_dict(paths))
    return save_backbone_preset(backbone, tokenizer_dir, preset_dir, weights_dtype)
