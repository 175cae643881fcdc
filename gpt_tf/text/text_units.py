"""What a held-out loss is in bits per character and per byte: a measure every vocabulary shares.

A loss per token depends on the vocabulary: a BPE of 16k tokens cuts the same books into fewer tokens than one of
8k, so each token carries more of the text and its loss is larger. Bits per character divide the same total by
the text instead:

    bits per character = total loss in nats / ln 2 / characters
    bits per byte      = total loss in nats / ln 2 / bytes

where the total is the sum of the cross-entropies of the evaluated target tokens and the characters and bytes are
those of the text these tokens encode: each token's text as ``GPTTokenizer.decode`` writes it, the end-of-word mark
``</w>`` counting as the one space after its word (``'\\n</w>'``, the newline token, is 2 characters), bytes in
UTF-8. That text is the cleaned, word-split, lower-cased text the BPE runs on (``GPTTokenizer.prepare``: each word
and one space after it), the same whatever the BPE, so the figures compare across every vocabulary of this
tokenizer (GPT-1's 40k BPE and any BPE ``pipelines.pretrain_data`` trains); not with a tokenizer that cleans or
splits text differently. An ``<unk>`` token (a character the vocabulary lacks) counts as one character and one
byte. Special tokens beyond the BPE (start, delimiter, extract, pad) count as none: they never are pre-training
targets.

``token_text_lengths`` gives each id's characters and bytes (a table the evaluations sum over their targets),
``count_text`` sums it over ids, ``bits_per_text`` is the arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from gpt_tf.text.word_split import END_OF_WORD

CHARS, BYTES = 0, 1  # the columns of ``token_text_lengths``


def token_text_lengths(tokenizer) -> np.ndarray:
    """int64 [vocab_size, 2]: the characters and UTF-8 bytes of each BPE token's text (``</w>`` as one space)."""
    table = np.zeros([tokenizer.vocab_size, 2], np.int64)
    for index, token in enumerate(tokenizer.tokens):
        text = token.replace(END_OF_WORD, " ")
        table[index] = len(text), len(text.encode("utf-8"))
    table[tokenizer.unk_id] = 1, 1
    return table


def count_text(lengths: np.ndarray, ids) -> tuple[int, int]:
    """(characters, bytes) of the text that token ``ids`` (any shape of BPE ids) encode."""
    chars, nbytes = np.take(lengths, np.asarray(ids).reshape(-1), axis=0).sum(axis=0)
    return int(chars), int(nbytes)


def bits_per_text(loss_nats: float, chars: int, nbytes: int) -> dict:
    """``{"bits_per_char", "bits_per_byte", "chars", "bytes"}`` of a total loss of ``loss_nats`` (the sum over the
    evaluated tokens, in nats) on a text of ``chars`` characters and ``nbytes`` bytes."""
    if chars <= 0 or nbytes <= 0:
        raise ValueError(f"bits per character need a text: got {chars} characters, {nbytes} bytes")
    bits = loss_nats / math.log(2)
    return {"bits_per_char": bits / chars, "bits_per_byte": bits / nbytes, "chars": int(chars), "bytes": int(nbytes)}
