"""GPT-1's released encoder, verbatim, with spaCy's English tokenizer: the reference of the fidelity bench.

``TextEncoder.encode`` of openai/finetune-transformer-lm ``text_utils.py`` is
``ftfy.fix_text`` -> ``text_standardize`` -> spaCy -> per token ``lower()`` -> ``bpe()`` ->
``encoder.get(token, 0)``. The release loaded ``spacy.load('en', disable=[...])`` with every
pipeline component off, i.e. only its tokenizer; here that is ``spacy.lang.en.English().tokenizer``
(the same English rules without a model package). ``text_standardize`` and ``bpe`` are copied from
the release (``bpe``'s cache kept). spaCy is a test/bench-only dependency (requirements-dev.txt).

    ref = ReferenceEncoder("../shared/data/gpt1_bpe")
    ref.words("Don't stop.")  -> ['do', "n't", 'stop', '.']
    ref.encode("Don't stop.") -> ids (list of int)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ftfy


def text_standardize(text):
    """fixes some issues the spacy tokenizer had on books corpus
    also does some whitespace standardization
    (verbatim from the release's text_utils.py)"""
    text = text.replace('—', '-')
    text = text.replace('–', '-')
    text = text.replace('―', '-')
    text = text.replace('…', '...')
    text = text.replace('´', "'")
    text = re.sub(r'''(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)''', r' \1 ', text)
    text = re.sub(r'\s*\n\s*', ' \n ', text)
    text = re.sub(r'[^\S\n]+', ' ', text)
    return text.strip()


def get_pairs(word):
    """The set of adjacent symbol pairs of a word (a tuple of symbols)."""
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


class ReferenceEncoder:
    """The release's ``TextEncoder`` on a folder holding GPT-1's ``encoder_bpe_40000.json`` and ``vocab_40000.bpe``."""

    def __init__(self, bpe_dir):
        from spacy.lang.en import English  # pylint: disable=import-outside-toplevel
        bpe_dir = Path(bpe_dir)
        self.nlp = English().tokenizer
        self.encoder = json.loads((bpe_dir / "encoder_bpe_40000.json").read_text(encoding="utf-8"))
        merges = (bpe_dir / "vocab_40000.bpe").read_text(encoding="utf-8").split("\n")[1:-1]
        merges = [tuple(merge.split()) for merge in merges]
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.cache = {}

    def bpe(self, token):  # pylint: disable=too-many-branches
        """The release's ``bpe()``: lowest-rank merge first, ``</w>`` on the last symbol."""
        word = tuple(token[:-1]) + (token[-1] + '</w>',)
        if token in self.cache:
            return self.cache[token]
        pairs = get_pairs(word)
        if not pairs:
            return token + '</w>'
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float('inf')))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = ' '.join(word)
        if word == '\n  </w>':
            word = '\n</w>'
        self.cache[token] = word
        return word

    def words(self, text):
        """spaCy's tokens of the cleaned text, lower-cased: what ``bpe()`` is applied to."""
        return [token.text.lower() for token in self.nlp(text_standardize(ftfy.fix_text(text)))]

    def encode(self, text):
        """Token ids of one text, as the release computed them."""
        return [self.encoder.get(t, 0) for word in self.words(text) for t in self.bpe(word).split(' ')]
