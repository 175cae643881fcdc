"""GPT-1's BPE tokenizer, offline (Python + HF ``tokenizers``), on GPT-1's two files.

Pipeline, as the release's ``TextEncoder.encode``: :func:`gpt_tf.text.text_clean.clean_text`
(``ftfy.fix_text`` -> ``text_standardize``) -> word split -> lower-case each word -> BPE with
``</w>`` word ends, lowest-rank merge first (HF ``tokenizers.models.BPE``, which reproduces the
reference ``bpe()`` of openai/finetune-transformer-lm). Characters missing from the vocabulary
become ``<unk>`` (id 0 in GPT-1's vocabulary), as the reference's ``encoder.get(token, 0)`` did.

The word split is spaCy's English tokenizer, as GPT-1 used it, reproduced without spaCy by
:class:`gpt_tf.text.word_split.WordSplitter` (``don't`` -> ``do n't``, ``it's`` -> ``it 's``, ``can't``
-> ``ca n't``, ``Mr.`` -> ``mr.``, ``U.S.`` -> ``u.s.``, ``3.14`` stays, ``--`` and ``...`` stay
whole; see that module). The in-graph twin ``gpt_tf/text/tf_tokenizer.py`` applies the same rules in
core TensorFlow ops. Python splits and lower-cases (memoised per space-free chunk) and hands the
words, joined by single spaces, to HF ``tokenizers``, whose pre-tokenizer only splits on ``' '``.
``'\n'`` is a word of its own, so newlines become GPT-1's token ``'\n</w>'`` (id 40477); runs of
blank lines collapse into one newline (``text_standardize`` does that). :meth:`GPTTokenizer.train`
learns new vocabularies on the same words, so they get ``n't</w>`` and ``'s</w>`` as GPT-1's did.
"""

import collections
import json
import os
from pathlib import Path

import tokenizers
from tokenizers import pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from gpt_tf.text import text_clean
from gpt_tf.text.word_split import END_OF_WORD, WordSplitter

UNK = "<unk>"
MERGES_HEADER = "#version: 0.2"
ENCODER_FILE = "encoder.json"
MERGES_FILE = "vocab.bpe"


def read_encoder(path):
    """Reads an encoder json ``{token: id}`` whose ids are exactly 0..n-1 and holds ``<unk>``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"BPE encoder file not found: {path}")
    try:
        encoder = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a valid UTF-8 JSON file: {err}") from err
    if not isinstance(encoder, dict) or not encoder:
        raise ValueError(f"{path}: expected a non-empty JSON object mapping token -> id")
    for token, index in encoder.items():
        if not isinstance(index, int) or isinstance(index, bool):
            raise ValueError(f"{path}: token {token!r} has id {index!r}, expected an integer")
    if sorted(encoder.values()) != list(range(len(encoder))):
        raise ValueError(f"{path}: token ids must be exactly 0..{len(encoder) - 1}, each once")
    if UNK not in encoder:
        raise ValueError(f"{path}: the vocabulary has no {UNK!r} token")
    return encoder


def read_merges(path, encoder):
    """Reads a ``#version: 0.2`` merges file into ``[(left, right), ...]`` in rank order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"BPE merges file not found: {path}")
    merges = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if (number == 1 and line.startswith("#version")) or not line:
                continue
            pair = line.split(" ")
            if len(pair) != 2 or not all(pair):
                raise ValueError(f"{path}:{number}: expected 'left right', got {line!r}")
            for token in (pair[0], pair[1], pair[0] + pair[1]):
                if token not in encoder:
                    raise ValueError(f"{path}:{number}: token {token!r} is not in the encoder")
            merges.append((pair[0], pair[1]))
    return merges


def _find_one(directory, suffix, prefer):
    """The single ``*suffix`` file in ``directory`` (narrowed to names containing ``prefer``)."""
    found = sorted(p for p in directory.glob(f"*{suffix}") if p.is_file())
    if len(found) > 1:
        found = [p for p in found if prefer in p.name] or found
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise FileNotFoundError(
            f"{directory}: expected exactly one {suffix} file"
            f"{f' (or one named *{prefer}*)' if prefer else ''}, found {names}")
    return found[0]


def pre_tokenizer():
    """HF pre-tokenizer of the prepared text: its words are separated by single spaces."""
    return pre_tokenizers.Split(" ", "removed")


def count_words(texts):
    """``Counter`` of the words BPE runs on (cleaned, split, lower-cased) over ``texts``, read one at a time."""
    split, counts = WordSplitter(), collections.Counter()
    for text in texts:
        counts.update(word for word in split(text_clean.clean_text(text)).split(" ") if word)
    return counts


def _repeated_words(counts, per_text=1 << 16):
    """Texts whose words are ``counts``' words, each as often as counted (at most ``per_text`` words a text)."""
    for word, count in counts.items():
        for start in range(0, count, per_text):
            yield " ".join([word] * min(per_text, count - start))


class GPTTokenizer:
    """GPT-1 BPE tokenizer: ids 0..vocab_size-1 from text, and back."""

    def __init__(self, encoder, merges, encoder_path=None, merges_path=None):
        """Builds the tokenizer from ``{token: id}`` and ``[(left, right), ...]``."""
        self.encoder = dict(encoder)
        self.merges = list(merges)
        self.encoder_path = None if encoder_path is None else str(encoder_path)
        self.merges_path = None if merges_path is None else str(merges_path)
        self._decoder = [None] * len(self.encoder)
        for token, index in self.encoder.items():
            self._decoder[index] = token
        model = BPE(self.encoder, self.merges, unk_token=UNK, end_of_word_suffix=END_OF_WORD)
        self._hf = tokenizers.Tokenizer(model)
        self._hf.pre_tokenizer = pre_tokenizer()
        self._split = WordSplitter()

    @classmethod
    def from_files(cls, encoder_json, merges_bpe):
        """Loads GPT-1's format: encoder json (token -> id) + ``#version: 0.2`` merges."""
        encoder = read_encoder(encoder_json)
        return cls(encoder, read_merges(merges_bpe, encoder), encoder_json, merges_bpe)

    @classmethod
    def from_dir(cls, directory):
        """Loads the one ``*.json`` encoder and the one ``*.bpe`` merges file of ``directory``.

        With several ``*.json`` files (GPT-1's folder also holds
        ``params_shapes.json``), the one whose name contains ``encoder`` is used.
        """
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"tokenizer directory not found: {directory}")
        return cls.from_files(_find_one(directory, ".json", "encoder"), _find_one(directory, ".bpe", ""))

    @classmethod
    def train(cls, texts, vocab_size, out_dir, show_progress=True):
        """Learns a BPE of ``vocab_size`` tokens on the cleaned texts; writes and loads it.

        ``<unk>`` is id 0; every character of the corpus is in the vocabulary
        (also as a word end, ``x</w>``), merges follow in rank order. ``texts`` is any iterable, read once: each
        text is prepared and its words counted, so memory holds the distinct words and their counts, never the
        corpus (HF's trainer counts the same words: the merges are those of the texts given to it whole).
        """
        counts = count_words(texts)
        # HF's trainer gives a word-end token (``x</w>``) its id where it first meets it, in a hash map's order
        # (another each run: huggingface/tokenizers#1794), and ids break the ties between pairs of equal
        # counts, so the merges changed from run to run. Registered first, in sorted order, they have fixed ids.
        ends = sorted({word[-1] for word in counts})
        hf = tokenizers.Tokenizer(BPE(unk_token=UNK, end_of_word_suffix=END_OF_WORD))
        hf.pre_tokenizer = pre_tokenizer()
        trainer = BpeTrainer(vocab_size=vocab_size, special_tokens=[UNK] + [end + END_OF_WORD for end in ends],
                             end_of_word_suffix=END_OF_WORD, show_progress=show_progress)
        hf.train_from_iterator(_repeated_words(counts), trainer)
        model = json.loads(hf.to_str())["model"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        cls(model["vocab"], merges).save(out_dir)
        return cls.from_files(os.path.join(out_dir, ENCODER_FILE), os.path.join(out_dir, MERGES_FILE))

    def save(self, out_dir):
        """Writes ``encoder.json`` and ``vocab.bpe`` (GPT-1's format) into ``out_dir``."""
        os.makedirs(out_dir, exist_ok=True)
        ordered = dict(sorted(self.encoder.items(), key=lambda item: item[1]))
        with open(os.path.join(out_dir, ENCODER_FILE), "w", encoding="utf-8") as f:
            json.dump(ordered, f)
        with open(os.path.join(out_dir, MERGES_FILE), "w", encoding="utf-8") as f:
            f.write(MERGES_HEADER + "\n")
            f.writelines(f"{left} {right}\n" for left, right in self.merges)

    @property
    def vocab_size(self):
        """Number of BPE tokens (40478 for GPT-1); special tokens come after."""
        return len(self.encoder)

    @property
    def tokens(self) -> list:
        """The BPE tokens in id order (a copy)."""
        return list(self._decoder)

    @property
    def unk_id(self):
        """Id of ``<unk>``, given to characters outside the vocabulary."""
        return self.encoder[UNK]

    def prepare(self, text):
        """The words BPE runs on, joined by spaces: cleaned, split, lower-cased. A lone surrogate is a ValueError
        (``text_clean.refuse_surrogates``), as for the in-graph twin, which only takes UTF-8."""
        return self._split(text_clean.clean_text(text_clean.refuse_surrogates(text)))

    def words(self, text):
        """The words BPE runs on, as a list."""
        prepared = self.prepare(text)
        return prepared.split(" ") if prepared else []

    def word_ids(self, word):
        """BPE ids of one already split word (no cleanup, no splitting)."""
        return [token.id for token in self._hf.model.tokenize(word)]

    def encode(self, text):
        """Token ids of one text."""
        return self._hf.encode(self.prepare(text), add_special_tokens=False).ids

    def encode_batch(self, texts):
        """Token ids of many texts (cleanup and split in Python, BPE in parallel in Rust)."""
        prepared = [self.prepare(t) for t in texts]
        return [e.ids for e in self._hf.encode_batch(prepared, add_special_tokens=False)]

    def decode(self, ids):
        """Joins the tokens, ``</w>`` -> ``' '``; ids outside 0..vocab_size-1 are skipped."""
        size = len(self._decoder)
        text = "".join(self._decoder[i] for i in ids if 0 <= i < size)
        return text.replace(END_OF_WORD, " ").rstrip(" ")

    def tf_tokenizer(self):
        """The in-graph twin (``TFGPTTokenizer``) of this tokenizer (one loaded from its two files)."""
        from gpt_tf.text.tf_tokenizer import TFGPTTokenizer  # pylint: disable=import-outside-toplevel
        if self.encoder_path is None or self.merges_path is None:
            raise ValueError("this tokenizer was not loaded from files; save() it and load it first")
        return TFGPTTokenizer(self)
