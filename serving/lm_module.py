"""A pre-trained GPT language model as a ``tf.Module`` for TF Serving (core TF ops only).

Signatures (B = any batch size >= 1):

* ``serving_default``: ``text`` string ``[B]`` -> ``token_ids`` int32 ``[B, T]`` (the tokens
  scored, padded with -1), ``lengths`` int32 ``[B]``, ``token_log_probs`` float32 ``[B, T]``
  (log p(token_t | tokens before it); 0 for the first token, which has no context, and for
  padding), ``log_prob`` float32 ``[B]`` (their sum), and the model's guesses for the token
  after the text: ``next_token_ids`` int32 ``[B, k]``, ``next_tokens`` string ``[B, k]``
  (``</w>`` shown as a trailing space) and ``next_token_log_probs`` float32 ``[B, k]``.
* ``tokens``: ``input_ids`` int32 ``[B, T]`` (T <= n_ctx) and ``lengths`` int32 ``[B]`` (the
  real tokens of each row; the rest is padding) -> the same outputs but ``token_ids``.
* ``generate``: ``text`` string ``[B]`` and ``max_new_tokens`` int32 ``[B]`` (1 to n_ctx - 1) -> the greedy
  continuation of each text, ``continuation`` string ``[B]`` (``</w>`` as a space, as the tokenizer decodes) and
  ``continuation_ids`` int32 ``[B, N]`` (N the largest ``max_new_tokens``; -1 past a row's own). It runs
  ``GPT1CausalLM.generate_step``, the Python API's generation with its key/value cache, traced in core TF ops; a
  text keeps its last ``n_ctx - N`` tokens.

Probabilities are over the BPE vocabulary only (the special tokens are never predicted, as in
``gpt_tf.gpt1.generate``). A text longer than the context keeps its last n_ctx tokens (the model's
sliding window). A text that encodes to no token, or that is not valid UTF-8, is rejected
(INVALID_ARGUMENT).
"""

from __future__ import annotations

import tensorflow as tf

from gpt_tf.backend import require_tensorflow
from gpt_tf.gpt1.backbone import token_inputs
from gpt_tf.text.tokenizer import GPTTokenizer
from gpt_tf.text.word_split import END_OF_WORD
from serving.task_module import check_batch, check_texts, check_tokens


class LMServingModule(tf.Module):
    """``lm`` (a ``GPT1CausalLM``, its sampler set to greedy for ``generate``) behind text and token-id signatures."""

    def __init__(self, lm, tokenizer, offline: GPTTokenizer, top_k: int = 10, name=None):
        super().__init__(name=name)
        config = lm.backbone.config
        if not 1 <= top_k <= config.vocab_size:
            raise ValueError(f"top_k must be in [1, {config.vocab_size}], got {top_k}")
        if tokenizer.vocab_size != config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model {config.vocab_size}")
        require_tensorflow("The language model's SavedModel (TF Serving)")
        lm.use_sampler("greedy")
        self.lm, self.tokenizer, self.top_k = lm, tokenizer, top_k
        self.n_ctx, self.vocab_size = config.n_ctx, config.vocab_size
        words = sorted(offline.encoder, key=offline.encoder.get)
        self._vocab = tf.constant([w.replace(END_OF_WORD, " ") for w in words], tf.string)

    def score(self, input_ids, lengths) -> dict:
        """Outputs for right-padded token ids ``[B, T]`` with ``lengths`` real tokens per row."""
        logits = tf.cast(self.lm(token_inputs(input_ids), training=False), tf.float32)[..., : self.vocab_size]
        log_probs = tf.nn.log_softmax(logits, axis=-1)
        targets = tf.clip_by_value(input_ids[:, 1:], 0, self.vocab_size - 1)
        scored = tf.gather(log_probs[:, :-1], targets, axis=2, batch_dims=2)
        length = tf.shape(input_ids)[1]
        mask = tf.sequence_mask(lengths, length)[:, 1:]
        token_log_probs = tf.pad(tf.where(mask, scored, 0.0), [[0, 0], [1, 0]])
        last = tf.gather(log_probs, lengths - 1, axis=1, batch_dims=1)
        best, best_ids = tf.math.top_k(last, k=self.top_k)
        best_ids = tf.cast(best_ids, tf.int32)
        return {"lengths": lengths, "token_log_probs": token_log_probs,
                "log_prob": tf.reduce_sum(token_log_probs, axis=1), "next_token_ids": best_ids,
                "next_tokens": tf.gather(self._vocab, best_ids), "next_token_log_probs": best}

    def generate(self, text, max_new_tokens) -> dict:
        """The ``generate`` signature's outputs (see the module doc): texts continued greedily."""
        checks = check_batch({"text": text, "max_new_tokens": max_new_tokens}) + check_texts("text", text) + [
            tf.debugging.assert_positive(max_new_tokens, message="max_new_tokens must be >= 1"),
            tf.debugging.assert_less(max_new_tokens, self.n_ctx, message=f"max_new_tokens must be < {self.n_ctx}")]
        with tf.control_dependencies(checks):
            ids = self.tokenizer(text)
        with tf.control_dependencies(check_tokens("text", ids)):
            longest = tf.reduce_max(max_new_tokens)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        keep = tf.minimum(lengths, self.n_ctx - longest)  # each text's last tokens that leave room for the longest
        total = tf.reduce_max(keep) + longest
        positions = tf.range(total)[None, :]
        prompt = ids.to_tensor(default_value=0)
        source = tf.minimum(lengths[:, None] - keep[:, None] + positions, tf.shape(prompt)[1] - 1)
        in_prompt = positions < keep[:, None]
        token_ids = tf.where(in_prompt, tf.gather(prompt, source, batch_dims=1), 0)
        done = self.lm.generate_step({"token_ids": token_ids, "padding_mask": in_prompt})["token_ids"]
        steps = tf.range(longest)[None, :]
        wanted = steps < max_new_tokens[:, None]
        continuation = tf.where(wanted, tf.gather(done, tf.minimum(keep[:, None] + steps, total - 1), batch_dims=1), -1)
        words = tf.gather(self._vocab, tf.ragged.boolean_mask(continuation, wanted))
        text = tf.strings.regex_replace(tf.strings.reduce_join(words, axis=-1), " +$", "")
        return {"continuation": text, "continuation_ids": continuation}

    def signatures(self) -> dict:
        """``{name: ConcreteFunction}`` to pass to ``tf.saved_model.save`` (the scoring graph traced once)."""
        score = tf.function(self.score)

        def serve_text(text):
            checks = check_batch({"text": text}) + check_texts("text", text)
            with tf.control_dependencies(checks):
                ids = self.tokenizer(text)
            with tf.control_dependencies(check_tokens("text", ids)):
                ids = ids[:, -self.n_ctx:]  # the last n_ctx tokens: the model's sliding window
            out = dict(score(ids.to_tensor(default_value=0), tf.cast(ids.row_lengths(), tf.int32)))
            out["token_ids"] = ids.to_tensor(default_value=-1)
            return out

        def serve_tokens(input_ids, lengths):
            shape = tf.shape(input_ids)
            checks = [
                tf.debugging.assert_positive(shape[0], message="empty batch: send at least one example"),
                tf.debugging.assert_less_equal(shape[1], self.n_ctx, message=f"input_ids longer than n_ctx={self.n_ctx}"),
                tf.debugging.assert_equal(tf.shape(lengths), shape[:1], message="lengths must be [batch]"),
                tf.debugging.assert_positive(lengths, message="lengths must be >= 1"),
                tf.debugging.assert_less_equal(lengths, shape[1], message="lengths must be <= the length of input_ids"),
                tf.debugging.assert_non_negative(input_ids, message="input_ids must be >= 0"),
                tf.debugging.assert_less(input_ids, self.vocab_size, message=f"input_ids must be < {self.vocab_size}"),
            ]
            with tf.control_dependencies(checks):
                return score(tf.identity(input_ids), tf.identity(lengths))

        return {
            "serving_default": tf.function(serve_text).get_concrete_function(
                tf.TensorSpec([None], tf.string, name="text")),
            "tokens": tf.function(serve_tokens).get_concrete_function(
                tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                tf.TensorSpec([None], tf.int32, name="lengths")),
            "generate": tf.function(self.generate).get_concrete_function(
                tf.TensorSpec([None], tf.string, name="text"), tf.TensorSpec([None], tf.int32, name="max_new_tokens")),
        }
