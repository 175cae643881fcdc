"""``GPT1Tokenizer``: GPT-1's BPE as a ``keras_hub.tokenizers.Tokenizer``.

Tokenizing runs the project's core-TensorFlow tokenizer (``gpt_tf/text/tf_tokenizer.py``, built from the
offline ``GPTTokenizer`` of ``gpt_tf/text/tokenizer.py``): the same ids as the data pipelines and the
served SavedModels, with no TF-Text op. The paper's special tokens (§3.3) follow the BPE ids in
``gpt_tf.config.SPECIAL_TOKENS`` order: start ``_start_``, delimiter ``_delimiter_``, extract
``_classify_`` (the release's names) and ``_pad_``.
"""

from __future__ import annotations

import os
import shutil

import keras
import keras_hub
from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.config import SPECIAL_TOKENS
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.keras_hub_adapter import preprocessing_function
from gpt_tf.nn.layers import PACKAGE
from gpt_tf.text.tokenizer import ENCODER_FILE, MERGES_FILE, GPTTokenizer
from gpt_tf.text.word_split import END_OF_WORD
from gpt_tf.convert.hf import FROM_PRESET

SPECIAL_TOKEN_NAMES = {"start": "_start_", "delimiter": "_delimiter_", "extract": "_classify_", "pad": "_pad_"}


class _BPE:
    """The tokenizer's BPE files as loaded: the offline ``GPTTokenizer`` and, once built, the core-TF one. A plain
    object, so Keras tracks neither (the layer holds this holder, set once; loading replaces what it holds)."""

    def __init__(self):
        self.offline, self.graph = None, None


@keras.saving.register_keras_serializable(package=PACKAGE)
class GPT1Tokenizer(keras_hub.tokenizers.Tokenizer):
    """Strings → GPT-1 BPE ids (ragged ``int32``), and back.

    Args:
        vocabulary: GPT-1's encoder json (``token -> id``), or a folder holding it and the merges.
        merges: the ``vocab.bpe`` merges file (omit when ``vocabulary`` is a folder).

    Example:

    ```python
    import gpt_tf
    tokenizer = gpt_tf.GPT1Tokenizer.from_preset("gpt1_tiny_books_en")
    ids = tokenizer(["The man walked into the room."])     # ragged [1, None]
    tokenizer.detokenize(ids)                               # ["the man walked into the room ."]
    tokenizer.extract_token_id                              # the id after the BPE ids + 2
    ```
    """

    backbone_cls = GPT1Backbone  # keras_hub.tokenizers.Tokenizer.from_preset finds this class for a GPT-1 preset
    from_preset = FROM_PRESET  # keras-hub's, and a transformers GPT-1 checkpoint too (gpt_tf/convert/hf.py)

    def __init__(self, vocabulary=None, merges=None, **kwargs):
        super().__init__(**kwargs)
        self.built = True  # nothing to build (its tables come with the BPE files); Model.quantize asks every layer
        self.file_assets = [ENCODER_FILE, MERGES_FILE]
        self._bpe = _BPE()
        for name, token in SPECIAL_TOKEN_NAMES.items():  # start_token = "_start_", start_token_id (None until loaded)
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", None)
        if vocabulary is not None:
            self.set_vocabulary_and_merges(vocabulary, merges)

    def set_vocabulary_and_merges(self, vocabulary, merges=None):
        """Loads the two BPE files (or the folder holding them)."""
        if merges is None:
            offline = GPTTokenizer.from_dir(vocabulary)
        else:
            offline = GPTTokenizer.from_files(vocabulary, merges)
        self._bpe.offline, self._bpe.graph = offline, None
        for name, token_id in self.special_ids().items():
            setattr(self, f"{name}_token_id", token_id)

    # ------------------------------------------------------------------ vocabulary
    @property
    def loaded(self) -> bool:
        """Whether the BPE files are loaded (a tokenizer built from a config gets them with its assets)."""
        return self._bpe.offline is not None

    @property
    def offline(self) -> GPTTokenizer:
        """The offline ``GPTTokenizer`` (Python; what ``pipelines`` build records with)."""
        if self._bpe.offline is None:
            raise ValueError("GPT1Tokenizer has no vocabulary: pass vocabulary= and merges= or load it with "
                             "GPT1Tokenizer.from_preset(...)")
        return self._bpe.offline

    @property
    def tf_tokenizer(self):
        """The core-TF tokenizer (``TFGPTTokenizer``), built on first use (a few seconds for GPT-1's 40k)."""
        if self._bpe.graph is None:
            with tf.init_scope():  # its tables are built eagerly, also when first used inside tf.data / tf.function
                self._bpe.graph = self.offline.tf_tokenizer()
        return self._bpe.graph

    @property
    def special_tokens(self) -> list:
        """The paper's special tokens (§3.3), in id order: ``_start_``, ``_delimiter_``, ``_classify_``, ``_pad_``."""
        return [SPECIAL_TOKEN_NAMES[name] for name in SPECIAL_TOKENS]

    @property
    def special_token_ids(self) -> list:
        """Their ids, after the BPE ids."""
        return list(self.special_ids().values())

    @property
    def bpe_vocabulary_size(self) -> int:
        return self.offline.vocab_size

    def vocabulary_size(self) -> int:
        """BPE tokens plus the four special tokens (the backbone's ``vocabulary_size``)."""
        return self.offline.vocab_size + len(SPECIAL_TOKENS)

    def get_vocabulary(self):
        return self.offline.tokens + self.special_tokens

    def id_to_token(self, id):  # pylint: disable=redefined-builtin
        vocabulary = self.get_vocabulary()
        if not 0 <= int(id) < len(vocabulary):
            raise ValueError(f"id {id} is outside 0..{len(vocabulary) - 1}")
        return vocabulary[int(id)]

    def token_to_id(self, token):
        specials = dict(zip(self.special_tokens, self.special_token_ids))  # ValueError without a vocabulary
        if token in specials:
            return specials[token]
        if token not in self.offline.encoder:
            raise ValueError(f"token {token!r} is not in the vocabulary")
        return self.offline.encoder[token]

    def special_ids(self) -> dict:
        """``{"start", "delimiter", "extract", "pad"} -> id`` (what ``gpt_tf/data/transforms.py`` takes)."""
        return {name: self.offline.vocab_size + i for i, name in enumerate(SPECIAL_TOKENS)}

    # ------------------------------------------------------------------ text <-> ids
    @preprocessing_function
    def tokenize(self, inputs):
        """``tf.string`` of rank 0, 1 or 2 → ``int32`` ids (ragged last axis)."""
        inputs = tf.convert_to_tensor(inputs, tf.string)
        rank = inputs.shape.rank
        if rank not in (0, 1, 2):
            raise ValueError(f"GPT1Tokenizer takes strings of rank 0, 1 or 2, got shape {inputs.shape}")
        ids = self.encode_eagerly(inputs) if tf.executing_eagerly() else self.tf_tokenizer(tf.reshape(inputs, [-1]))
        if rank == 0:
            return ids[0]
        if rank == 2:
            return tf.RaggedTensor.from_uniform_row_length(ids, tf.shape(inputs, out_type=tf.int64)[1])
        return ids

    def encode_eagerly(self, texts) -> tf.RaggedTensor:
        """Eager path: the offline tokenizer (the same ids; no graph to trace, which for the in-graph
        tokenizer takes a while on first use): any strings → ``int32`` ragged ``[N, None]``, flattened."""
        flat = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else str(t)  # as the graph: U+FFFD
                for t in tf.reshape(tf.convert_to_tensor(texts, tf.string), [-1]).numpy()]
        ids = self.offline.encode_batch(flat)
        return tf.RaggedTensor.from_row_lengths(tf.constant([i for row in ids for i in row], tf.int32),
                                                tf.constant([len(row) for row in ids], tf.int64))

    @preprocessing_function
    def detokenize(self, inputs):
        """Ids (dense or ragged, rank 1 or 2) → text: ``</w>`` becomes a space; special and padding ids dropped."""
        ids = inputs if isinstance(inputs, tf.RaggedTensor) else tf.convert_to_tensor(inputs)
        scalar = ids.shape.rank == 1
        if scalar:
            ids = ids[tf.newaxis]
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        ids = tf.cast(ids, tf.int32)
        ids = tf.ragged.boolean_mask(ids, (ids >= 0) & (ids < self.offline.vocab_size))
        tokens = tf.gather(tf.constant(self.offline.tokens), ids)
        text = tf.strings.regex_replace(tf.strings.reduce_join(tokens, axis=-1), END_OF_WORD, " ")
        text = tf.strings.regex_replace(text, " +$", "")
        return text[0] if scalar else text

    # ------------------------------------------------------------------ assets
    def save_assets(self, dir_path):
        """Copies the two BPE files byte for byte (their sha256, which data manifests record, is kept)."""
        shutil.copyfile(self.offline.encoder_path, os.path.join(dir_path, ENCODER_FILE))
        shutil.copyfile(self.offline.merges_path, os.path.join(dir_path, MERGES_FILE))

    def load_assets(self, dir_path):
        self.set_vocabulary_and_merges(os.path.join(dir_path, ENCODER_FILE), os.path.join(dir_path, MERGES_FILE))

    @property
    def assets_dir(self) -> str:
        """The folder of the BPE files (a ``--tokenizer_dir`` for the CLIs)."""
        return os.path.dirname(self.offline.encoder_path)
