"""GPT-1 as ``transformers`` publishes it (``model_type`` "openai-gpt", ``openai-community/openai-gpt``), read into
the family's classes.

A checkpoint is an ``hf://owner/name`` handle, downloaded by ``huggingface_hub.snapshot_download`` (its cache, so
``HF_HUB_OFFLINE=1`` reads what an earlier download left), or a folder as ``save_pretrained`` writes it:
``config.json``, ``model.safetensors`` (read with ``safetensors.numpy``, no PyTorch) or ``pytorch_model.bin`` (read
with PyTorch; their sharded ``*.index.json`` forms too), and the tokenizer's ``vocab.json`` + ``merges.txt``.

Converted as the paper uses the model: the checkpoint's 40,478 BPE rows and 512 positions, then the four special
rows of §3.3 (start, delimiter, extract, pad), which the language model never had, drawn from N(0, 0.02) as the
release's code draws them (``gpt_tf/nn/transfer.py``; a fixed seed, so every load gives the same rows; fine-tuning
draws them again from its own seed). ``vocab.json`` + ``merges.txt`` are GPT-1's two BPE files
(``encoder_bpe_40000.json``, ``vocab_40000.bpe``) in Hugging Face's layout: the project's tokenizer reads them, and
their vocabulary must have as many tokens as the token table has rows. A wrong ``model_type``, a missing file or
tensor, a shape other than ``config.json`` implies: one ``CheckpointError`` naming the file and the tensor, raised
before any weight is assigned.

``is_hf_checkpoint`` tells such a checkpoint from a keras-hub preset; ``from_hf(cls, preset, **kwargs)`` builds any
class of the family from it (``from_preset``'s arguments); ``checkpoint_config`` and ``load_checkpoint_weights``
are what ``--init_checkpoint`` needs (``gpt_tf/convert/pretrained.py``). keras-hub's own ``from_preset`` cannot
reach it: its transformers loader knows a fixed list of model types, and "openai-gpt" is not one.
"""

from __future__ import annotations

import dataclasses
import json
import os

from gpt_tf.config import SPECIAL_TOKENS, GPTConfig
from gpt_tf.convert import preset_io
from gpt_tf.convert.preset_io import HF_SCHEME

MODEL_TYPE = "openai-gpt"
CONFIG_FILE = "config.json"
VOCAB_FILE, MERGES_FILE = "vocab.json", "merges.txt"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH_BIN, TORCH_BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
# What a download fetches: the config, the tokenizer and the safetensors weights; the .bin only where those are none.
DOWNLOAD = [CONFIG_FILE, VOCAB_FILE, MERGES_FILE, SAFETENSORS, SAFETENSORS_INDEX, "model-*.safetensors"]
DOWNLOAD_BIN = [TORCH_BIN, TORCH_BIN_INDEX, "pytorch_model-*.bin"]
SPECIAL_ROWS_SEED = 0  # the special rows' N(0, init_std) draws (gpt_tf.nn.transfer.reset_special_embeddings)
ACTIVATIONS = ("gelu", "gelu_new")  # transformers' OpenAIGPT "gelu" is gelu_new: the tanh GELU of the release and ours


class CheckpointError(ValueError):
    """A transformers checkpoint this family cannot load; the message names the file (and the tensor)."""


def _cause(err: Exception) -> str:
    """A library's error as a part of one line: its type and its message's first line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


# ----------------------------------------------------------------------------- where the checkpoint is
def is_hf_checkpoint(preset) -> bool:
    """Whether ``preset`` names a transformers checkpoint: a local folder whose ``config.json`` has a transformers
    ``model_type`` (a keras-hub preset's has ``registered_name`` instead), or an ``hf://`` handle whose
    ``config.json`` does (fetched through the Hugging Face cache; a handle whose config cannot be fetched counts as
    one, so that ``from_hf`` says why)."""
    if not isinstance(preset, (str, os.PathLike)):
        return False
    preset = os.fspath(preset)
    if preset.startswith(HF_SCHEME):
        try:
            from huggingface_hub import hf_hub_download  # pylint: disable=import-outside-toplevel

            path = hf_hub_download(_repo_id(preset), CONFIG_FILE)
        except Exception:  # pylint: disable=broad-except  # not reachable, not there: from_hf names the reason
            return True
        return _is_transformers_config(path)
    return os.path.isdir(preset) and _is_transformers_config(os.path.join(preset, CONFIG_FILE))


def _is_transformers_config(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config and "registered_name" not in config


def _repo_id(handle: str) -> str:
    repo = handle[len(HF_SCHEME):].strip("/")
    if not repo:
        raise CheckpointError(f"{handle}: give the repository, as in hf://openai-community/openai-gpt")
    return repo


def resolve(preset) -> str:
    """The local folder of ``preset``: the folder itself, or an ``hf://`` handle's snapshot in the Hugging Face cache
    (downloaded there unless ``HF_HUB_OFFLINE=1``): the config, tokenizer and safetensors weights, the
    ``pytorch_model.bin`` only where the repository has no safetensors."""
    preset = os.fspath(preset)
    if not preset.startswith(HF_SCHEME):
        if not os.path.isdir(preset):
            raise CheckpointError(f"{preset}: no such folder (a transformers checkpoint is a folder as "
                                  f"save_pretrained writes it, or an {HF_SCHEME}owner/name handle)")
        return preset
    from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel
    from huggingface_hub.errors import HFValidationError  # pylint: disable=import-outside-toplevel

    repo = _repo_id(preset)
    try:
        folder = snapshot_download(repo, allow_patterns=DOWNLOAD)
        if not _weights_files(folder):
            folder = snapshot_download(repo, allow_patterns=DOWNLOAD_BIN)
    except HFValidationError as err:
        raise CheckpointError(f"{preset}: not a Hugging Face repository name ({_cause(err)})") from None
    except Exception as err:  # pylint: disable=broad-except  # offline, not cached, not found, no access
        raise CheckpointError(f"{preset}: cannot get it from the Hugging Face Hub or its cache "
                              f"({_cause(err)})") from None
    return folder


def _weights_files(folder: str) -> list:
    """The weights files ``folder`` holds, safetensors first: ``[(path, "safetensors" | "torch")]``, one file or the
    shards an ``*.index.json`` lists."""
    for single, index, kind in ((SAFETENSORS, SAFETENSORS_INDEX, "safetensors"), (TORCH_BIN, TORCH_BIN_INDEX, "torch")):
        if os.path.isfile(os.path.join(folder, single)):
            return [(os.path.join(folder, single), kind)]
        index_path = os.path.join(folder, index)
        if os.path.isfile(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise CheckpointError(f"{index_path}: not a weight index ({_cause(err)})") from None
            return [(os.path.join(folder, name), kind) for name in shards]
    return []


# ----------------------------------------------------------------------------- what it holds
@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A transformers GPT-1 checkpoint, its ``config.json`` read and checked (``open_checkpoint``)."""

    source: str  # as given: a folder or an hf:// handle
    folder: str  # where its files are
    backbone_kwargs: dict  # GPT1Backbone's arguments (keras-hub's names), the four special rows counted

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    @property
    def config(self) -> GPTConfig:
        """The model as a ``GPTConfig`` (what a run's ``model_config.json`` holds)."""
        return GPTConfig.from_backbone_kwargs(self.backbone_kwargs)

    @property
    def bpe_tokens(self) -> int:
        return self.backbone_kwargs["vocabulary_size"] - len(SPECIAL_TOKENS)

    def weights_files(self) -> list:
        files = _weights_files(self.folder)
        if not files:
            raise CheckpointError(f"{self.folder}: no weights ({SAFETENSORS}, {TORCH_BIN} or their sharded "
                                  f"*.index.json forms)")
        missing = [path for path, _ in files if not os.path.isfile(path)]
        if missing:
            raise CheckpointError(f"{missing[0]}: listed in the weight index but not there")
        return files

    def state_dict(self) -> tuple[dict, str]:
        """The weights as numpy arrays (safetensors) or torch tensors (``.bin``), and the file(s) they came from."""
        files, state = self.weights_files(), {}
        for path, kind in files:
            part = _read_safetensors(path) if kind == "safetensors" else _read_torch(path)
            for key, value in part.items():
                if key in state:
                    raise CheckpointError(f"{path}: tensor {key} is also in another shard")
                state[key] = value
        return state, ", ".join(path for path, _ in files)

    def tokenizer_files(self) -> tuple[str, str]:
        """``vocab.json`` and ``merges.txt`` (GPT-1's ``encoder_bpe_40000.json`` and ``vocab_40000.bpe`` in Hugging
        Face's layout)."""
        paths = self.path(VOCAB_FILE), self.path(MERGES_FILE)
        missing = [os.path.basename(p) for p in paths if not os.path.isfile(p)]
        if missing:
            raise CheckpointError(f"{self.folder}: no {' or '.join(missing)} (the tokenizer's two files; "
                                  "tokenizer.json alone is not read)")
        return paths


def _config_problem(config: dict) -> str:
    """What in a transformers ``config.json`` this family cannot build ("" when nothing)."""
    if config.get("model_type") != MODEL_TYPE:
        return (f"model_type is {config.get('model_type')!r}, not {MODEL_TYPE!r} (GPT-1); "
                "keras-hub's own classes load the model types it knows")
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"{key} is {value!r}, not a positive integer"
    if config.get("afn", "gelu") not in ACTIVATIONS:
        return f"afn is {config.get('afn')!r}; GPT-1 uses the tanh GELU ('gelu')"
    if config.get("n_special", 0):
        return f"n_special is {config['n_special']}: a checkpoint with special-token rows of its own is not GPT-1's"
    return ""


def open_checkpoint(preset) -> Checkpoint:
    """``preset`` (a folder or an ``hf://`` handle) found, its ``config.json`` read and checked."""
    if isinstance(preset, Checkpoint):
        return preset
    folder = resolve(preset)
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{folder}: no {CONFIG_FILE}")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not readable JSON ({_cause(err)})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    problem = _config_problem(config)
    if problem:
        raise CheckpointError(f"{path}: {problem}")
    d = config["n_embd"]
    kwargs = {"vocabulary_size": config["vocab_size"] + len(SPECIAL_TOKENS), "num_layers": config["n_layer"],
              "num_heads": config["n_head"], "hidden_dim": d, "intermediate_dim": 4 * d,  # transformers' MLP: 4·n_embd
              "max_sequence_length": config["n_positions"], "dropout": config.get("resid_pdrop", 0.1),
              "attention_dropout": config.get("attn_pdrop", 0.1), "embedding_dropout": config.get("embd_pdrop", 0.1),
              "layer_norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
              "init_std": config.get("initializer_range", 0.02)}
    try:
        GPTConfig.from_backbone_kwargs(kwargs)  # GPTConfig's own checks (heads dividing the width)
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    return Checkpoint(os.fspath(preset), folder, kwargs)


def checkpoint_config(preset) -> GPTConfig:
    """The ``GPTConfig`` of the checkpoint ``preset`` (its ``config.json``; no weights read, no TensorFlow)."""
    return open_checkpoint(preset).config


def _read_safetensors(path: str) -> dict:
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel

    try:
        return load_file(path)
    except Exception as err:  # pylint: disable=broad-except  # SafetensorError, a dtype numpy lacks (bfloat16)
        raise CheckpointError(f"{path}: not readable as safetensors with numpy ({_cause(err)})") from None


def _read_torch(path: str) -> dict:
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise CheckpointError(f"{path}: reading {os.path.basename(path)} needs PyTorch (pip install torch), or give "
                              f"the checkpoint as {SAFETENSORS}") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pylint: disable=broad-except  # a truncated or foreign file
        raise CheckpointError(f"{path}: not a readable PyTorch state dict ({_cause(err)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state dict")
    return state


# ----------------------------------------------------------------------------- into the family's models
def load_checkpoint_weights(backbone, preset) -> str:
    """The checkpoint's weights into ``backbone`` (a ``GPT1Backbone`` of its shape, or a model holding one; a shorter
    context takes the first position rows), the special-token rows drawn anew; returns the file(s) read. Every
    tensor is checked before any is assigned: on an error the backbone is as it was."""
    from gpt_tf.convert.layout import backbone_of  # pylint: disable=import-outside-toplevel
    from gpt_tf.convert.state_dicts import load_hf_state_dict  # pylint: disable=import-outside-toplevel
    from gpt_tf.nn.transfer import reset_special_embeddings  # pylint: disable=import-outside-toplevel

    checkpoint = open_checkpoint(preset)
    backbone = backbone_of(backbone)
    state, where = checkpoint.state_dict()
    try:
        load_hf_state_dict(backbone, state)
    except KeyError as err:
        raise CheckpointError(f"{where}: {err.args[0]}") from None
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    reset_special_embeddings(backbone, seed=SPECIAL_ROWS_SEED)
    return where


def from_hf(cls, preset, **kwargs):
    """A ``cls`` of the family (``GPT1Backbone``, ``GPT1CausalLM``, ``GPT1TextClassifier``, ``GPT1TextRegressor``,
    ``GPT1MultipleChoice``, ``GPT1Tokenizer``, ``GPT1TaskPreprocessor``, ``GPT1CausalLMPreprocessor``; a keras-hub
    base class such as ``keras_hub.models.TextClassifier`` stands for the family's one) built from the transformers
    checkpoint ``preset`` through its public constructor; ``kwargs`` as its ``from_preset`` takes them
    (``num_classes``, ``sequence_length``, ``dtype``, ``load_weights``, ...; a task passes ``sequence_length`` to its
    preprocessor)."""
    import keras_hub  # pylint: disable=import-outside-toplevel

    checkpoint = open_checkpoint(preset)
    cls = _family_class(cls)
    if issubclass(cls, keras_hub.models.Backbone):
        return _backbone(cls, checkpoint, **kwargs)
    if issubclass(cls, keras_hub.tokenizers.Tokenizer):
        return _tokenizer(cls, checkpoint, **kwargs)
    if issubclass(cls, keras_hub.models.Preprocessor):
        tokenizer = kwargs.pop("tokenizer", None) or from_hf(cls.tokenizer_cls, checkpoint)
        if kwargs.get("sequence_length") is None:  # as from_preset: the backbone's context
            kwargs["sequence_length"] = checkpoint.backbone_kwargs["max_sequence_length"]
        return cls(tokenizer=tokenizer, **kwargs)
    if issubclass(cls, keras_hub.models.Task):
        backbone_kwargs = {"load_weights": kwargs.pop("load_weights", True), "dtype": kwargs.pop("dtype", None)}
        sequence_length = kwargs.pop("sequence_length", None)
        if "preprocessor" not in kwargs and cls.preprocessor_cls is not None:  # tokenizer errors before the weights'
            kwargs["preprocessor"] = from_hf(cls.preprocessor_cls, checkpoint, sequence_length=sequence_length)
        if "backbone" not in kwargs:
            kwargs["backbone"] = from_hf(cls.backbone_cls, checkpoint, **backbone_kwargs)
        return cls(**kwargs)
    raise TypeError(f"from_hf builds the family's backbone, tokenizer, preprocessors and tasks, not {cls.__name__}")


def _backbone(cls, checkpoint: Checkpoint, load_weights=True, **kwargs):
    """``cls(**checkpoint's arguments, **kwargs)``, its weights the checkpoint's (all checked, then assigned)."""
    args = {**checkpoint.backbone_kwargs, **kwargs}
    positions = checkpoint.backbone_kwargs["max_sequence_length"]
    if args["max_sequence_length"] > positions:
        raise CheckpointError(f"{checkpoint.path(CONFIG_FILE)}: max_sequence_length={args['max_sequence_length']} is "
                              f"longer than the checkpoint's {positions} positions")
    backbone = cls(**args)
    if load_weights:
        load_checkpoint_weights(backbone, checkpoint)
    return backbone


def _tokenizer(cls, checkpoint: Checkpoint, **kwargs):
    """``cls`` on the checkpoint's ``vocab.json`` + ``merges.txt``, read by the project's GPT-1 BPE reader, whose
    vocabulary must be the token table's rows (``vocab_size``)."""
    vocab, merges = checkpoint.tokenizer_files()
    try:
        tokenizer = cls(vocabulary=vocab, merges=merges, **kwargs)
    except (FileNotFoundError, ValueError) as err:
        raise CheckpointError(str(err)) from None
    if tokenizer.bpe_vocabulary_size != checkpoint.bpe_tokens:
        raise CheckpointError(f"{vocab}: {tokenizer.bpe_vocabulary_size} tokens, but {checkpoint.path(CONFIG_FILE)} "
                              f"has vocab_size {checkpoint.bpe_tokens} (the token table's rows)")
    return tokenizer


def _family_class(cls):
    """``cls`` where it is the family's; for a keras-hub base class (``keras_hub.models.CausalLM``, ...), its one
    subclass in the family (the classes imported so far: ``import gpt_tf.gpt1`` imports them all)."""
    if not isinstance(cls, type):
        raise TypeError(f"from_hf takes a class, got {cls!r}")
    if _ours(cls):
        if getattr(cls, "model_type", "gpt") != "gpt":
            raise TypeError(f"{cls.__name__} builds model_type={cls.model_type!r}; a transformers GPT-1 is a "
                            "transformer")
        return cls
    found, todo = [], list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        todo.extend(sub.__subclasses__())
        if _ours(sub) and getattr(sub, "model_type", "gpt") == "gpt" and not any(issubclass(sub, c) for c in found):
            found = [c for c in found if not issubclass(c, sub)] + [sub]
    if len(found) != 1:
        names = ", ".join(sorted(c.__name__ for c in found)) or "none (import gpt_tf.gpt1 first)"
        raise TypeError(f"{cls.__name__} is not a class of the GPT-1 family, and its family subclasses are {names}: "
                        "name the family's class")
    return found[0]


def _ours(cls) -> bool:
    """Whether ``cls`` is a class of the family (or a subclass of one): its ``from_preset`` is ``FROM_PRESET``."""
    return any(vars(c).get("from_preset") is FROM_PRESET for c in cls.__mro__)


def _from_preset(cls, preset, **kwargs):
    """keras-hub's ``from_preset``, which also takes a transformers GPT-1 checkpoint: an ``hf://`` handle or a folder
    ``save_pretrained`` wrote (``from_hf``). Every other preset (a name, a keras-hub preset folder, a Kaggle or
    Hugging Face keras-hub handle) goes to keras-hub's own ``from_preset`` as it is."""
    if is_hf_checkpoint(preset):
        return from_hf(cls, preset, **kwargs)
    keras_hubs = next(vars(c)["from_preset"] for c in cls.__mro__
                      if "from_preset" in vars(c) and vars(c)["from_preset"] is not FROM_PRESET)
    return keras_hubs.__func__(cls, preset, **kwargs)


# The family's classes take it as ``from_preset = FROM_PRESET``: the one thing each adds to keras-hub's loading.
FROM_PRESET = classmethod(_from_preset)
