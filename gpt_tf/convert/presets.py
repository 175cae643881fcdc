"""keras-hub presets written from what training and GPT-1's release leave: a run folder, the release shards, a
``transformers`` state dict; and a preset folder of the earlier subclassed layout re-saved in today's.

A pre-training run becomes a backbone preset (its latest checkpoint, and the tokenizer its data manifest names);
a fine-tuning run a task preset (the keras-hub task of its primary head, label names and tokenizer included);
GPT-1's released shards and a ``transformers`` ``OpenAIGPT`` state dict (``tools/torch_pretrain``'s GPU-trained
``weights-<step>.part<k>.npz`` included) a backbone preset of a model size; a ``transformers`` checkpoint folder
or ``hf://`` handle (``openai-community/openai-gpt``: the paper's model; ``gpt_tf/convert/hf.py``) a backbone preset
with its tokenizer and a model card. ``python -m gpt_tf.convert`` is their
command line. A preset starts training wherever a run would (``--init_checkpoint``, ``pretrained.py``) and is
exported like one (``python -m serving.export --preset``).
"""

from __future__ import annotations

from gpt_tf.config import get_size
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.tokenizer import GPT1Tokenizer


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
    """A run's keras-hub task (``load_task_model``) with its ``TaskSpec``'s preprocessor, ready to save as a preset."""
    from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor  # pylint: disable=import-outside-toplevel

    model.preprocessor = GPT1TaskPreprocessor(GPT1Tokenizer(tokenizer_dir), model.backbone.max_sequence_length,
                                              input_type=spec.input_type, num_choices=spec.num_choices)
    model.compile()  # the paper's defaults, as from_preset compiles it: the saved optimizer state is what it loads into
    return model


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


def preset_from_preset(source_dir: str, preset_dir: str) -> str:
    """A backbone preset folder (``source_dir``) re-saved at ``preset_dir`` in today's weights layout: an earlier,
    subclassed layout's ``model.weights.h5`` (``gpt_tf/convert/old_layout.py``) is read and written as Keras lays out
    the functional backbone; float16 stored weights stay float16. The files of ``source_dir`` the preset does not
    write (its model card, logs) are copied beside it. ``source_dir`` may be ``preset_dir``."""
    import os  # pylint: disable=import-outside-toplevel
    import shutil  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel

    import h5py  # pylint: disable=import-outside-toplevel

    from gpt_tf.convert.preset_io import TOKENIZER_ASSETS, WEIGHTS_FILE, preset_config  # pylint: disable=import-outside-toplevel

    config = _transformer(preset_config(source_dir), source_dir)
    weights = os.path.join(source_dir, WEIGHTS_FILE)
    with h5py.File(weights, "r") as f:
        stored = set()
        f.visititems(lambda _, item: stored.add(str(item.dtype)) if isinstance(item, h5py.Dataset) else None)
    backbone = GPT1Backbone.from_gpt_config(config)
    backbone.load_weights(weights)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(preset_dir)) or ".") as tmp:
        save_backbone_preset(backbone, os.path.join(source_dir, TOKENIZER_ASSETS), tmp,
                             "float16" if stored == {"float16"} else "float32")
        os.makedirs(preset_dir, exist_ok=True)
        written = set(os.listdir(tmp))
        if os.path.abspath(source_dir) != os.path.abspath(preset_dir):
            for name in sorted(set(os.listdir(source_dir)) - written):
                source = os.path.join(source_dir, name)
                if os.path.isfile(source):
                    shutil.copy2(source, os.path.join(preset_dir, name))
        for name in sorted(written):
            target = os.path.join(preset_dir, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            shutil.move(os.path.join(tmp, name), target)
    return preset_dir


def preset_from_hf(source: str, preset_dir: str, weights_dtype: str = "float32") -> str:
    """A ``transformers`` GPT-1 checkpoint (a folder or an ``hf://`` handle, ``gpt_tf/convert/hf.py``) as a backbone
    preset: its weights with the special-token rows added, its ``vocab.json`` + ``merges.txt`` written in GPT-1's
    two-file format as the tokenizer's assets, and a model card (``README.md``: source, licence, sizes)."""
    import os  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel

    from gpt_tf.convert import hf  # pylint: disable=import-outside-toplevel
    from gpt_tf.text.tokenizer import GPTTokenizer  # pylint: disable=import-outside-toplevel

    checkpoint = hf.open_checkpoint(source)
    hf.from_hf(GPT1Tokenizer, checkpoint)  # the tokenizer's errors before the weights are read
    backbone = hf.from_hf(GPT1Backbone, checkpoint)
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        GPTTokenizer.from_files(*checkpoint.tokenizer_files()).save(tokenizer_dir)
        save_backbone_preset(backbone, tokenizer_dir, preset_dir, weights_dtype)
    weights_mb = os.path.getsize(os.path.join(preset_dir, "model.weights.h5")) / 2**20
    name = os.path.basename(os.path.abspath(preset_dir))
    with open(os.path.join(preset_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(hf_model_card(checkpoint.source, checkpoint.config, weights_mb, name))
    return preset_dir


def hf_model_card(source: str, config, weights_mb: float, name: str) -> str:
    """The model card of a preset converted from a ``transformers`` GPT-1 checkpoint (YAML header as the Hugging Face
    and Kaggle hubs read it)."""
    cells = [f"{config.n_params / 1e6:.1f}M", config.n_layer, config.n_embd, config.n_head, config.d_ff, config.n_ctx,
             f"{config.vocab_size:,}", config.n_special, f"{weights_mb:.0f} MB (`model.weights.h5`)"]
    row = "| " + " | ".join(map(str, cells)) + " |"
    return f"""---
license: mit
library_name: keras-hub
language:
- en
pipeline_tag: text-generation
tags:
- gpt1
- keras
- keras-hub
- tensorflow
- jax
- pytorch
---

# {name}

GPT-1 (Radford et al. 2018, *Improving Language Understanding by Generative Pre-Training*) as a gpt-tf keras-hub
preset, converted from the `transformers` checkpoint `{source}` by `python -m gpt_tf.convert --hf={source}`.

```python
import gpt_tf
preset = "path/to/{name}"  # this folder
lm = gpt_tf.GPT1CausalLM.from_preset(preset)
classifier = gpt_tf.GPT1TextClassifier.from_preset(preset, num_classes=2)
```

`python -m gpt_tf.train --task=... --init_checkpoint=<this folder>` fine-tunes it; the task data is tokenized with
`assets/tokenizer/` (GPT-1's BPE: `--tokenizer_dir` of `python -m pipelines.finetune_data`).

## Model

| parameters | blocks | width | heads | feed-forward | context | BPE tokens | special tokens | weights file |
|---|---|---|---|---|---|---|---|---|
{row}

The token table holds the checkpoint's {config.vocab_size:,} BPE rows, then {config.n_special} rows for the special
tokens of the paper's §3.3 (start `_start_`, delimiter `_delimiter_`, extract `_classify_`, pad `_pad_`), which
the pre-trained language model never had: they are drawn from N(0, {config.init_std}) as the release's code draws
them, and fine-tuning draws them again from its own seed.

## Source and licence

Weights and tokenizer from `{source}`. GPT-1's weights and BPE files were released by OpenAI under the MIT licence
(github.com/openai/finetune-transformer-lm), as is the Hugging Face repository `openai-community/openai-gpt`; a
checkpoint from elsewhere carries its own terms. The conversion copies the weights and adds the special rows; it
trains nothing.
"""
