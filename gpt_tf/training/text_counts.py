"""The text a held-out evaluation scored: the characters and bytes of its target tokens, counted as it runs.

Both pre-training routes report their held-out loss also in bits per character and per byte
(``gpt_tf.text.text_units``: the definition and the arithmetic). ``TextCounter`` sums each evaluated batch's
targets in the token table of the data's tokenizer: exactly the tokens the loss was summed over, whatever
``eval_batches`` or the strategy (``add_replicas``: a ``tf.distribute`` batch, summed in each replica and
all-reduced, as the loss is), or batches as arrays (``add``: Keras's ``evaluate`` on its own dataset).
"""

from __future__ import annotations

import numpy as np

from gpt_tf.text.text_units import bits_per_text, count_text, token_text_lengths


class TextCounter:
    """Characters and bytes of the evaluated targets' text; ``bits(total loss in nats)`` gives the figures."""

    def __init__(self, tokenizer, strategy=None):
        self.lengths = token_text_lengths(tokenizer)
        self.chars = self.bytes = 0
        self.strategy, self._count = strategy, None

    def add(self, targets) -> None:
        """Targets as an array (any shape)."""
        chars, nbytes = count_text(self.lengths, targets)
        self.chars, self.bytes = self.chars + chars, self.bytes + nbytes

    def add_replicas(self, targets) -> None:
        """Targets as the strategy's per-replica batch: summed in each replica, then across them."""
        if self._count is None:
            import tensorflow as tf

            table = tf.constant(self.lengths, tf.int64)
            strategy = self.strategy

            def count(batch):
                per_replica = strategy.run(lambda t: tf.reduce_sum(tf.gather(table, t), axis=[0, 1]), args=(batch,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self._count = tf.function(count)
        chars, nbytes = np.asarray(self._count(targets)).tolist()
        self.chars, self.bytes = self.chars + chars, self.bytes + nbytes

    def bits(self, loss_nats: float) -> dict:
        """``bits_per_char``, ``bits_per_byte``, ``chars``, ``bytes`` of a total loss over the counted targets."""
        return bits_per_text(loss_nats, self.chars, self.bytes)
