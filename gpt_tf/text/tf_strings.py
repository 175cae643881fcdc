"""String-tensor helpers of the in-graph tokenizer (core TensorFlow ops only)."""

import tensorflow as tf


def lookup_table(keys, values, key_dtype, default):
    """A StaticHashTable ``key -> int64`` built from Python lists (exported as constants)."""
    init = tf.lookup.KeyValueTensorInitializer(
        tf.constant(keys, key_dtype), tf.constant(values, tf.int64))
    return tf.lookup.StaticHashTable(init, default_value=tf.constant(default, tf.int64))


def apart(function):
    """``function`` as a graph function of its own that TensorFlow does not inline into the graphs calling it
    (``_noinline``): a branch that rarely runs (ftfy's mojibake repair, HTML entities, NFC) then costs nothing when a
    ``tf.data`` pipeline builds its iterator, which optimizes the inlined graph again each time, and is optimized
    only the first time it runs. The same ops, the same results."""
    return tf.function(function, autograph=False, reduce_retracing=True, experimental_attributes={"_noinline": True})


def replace_where(texts, mask, function):
    """Applies ``function`` to the strings selected by ``mask`` only; returns all strings.

    When ``mask`` selects nothing, ``function``'s ops do not run at all (``tf.cond``).
    """
    def replaced():
        chosen = tf.cast(tf.where(mask)[:, 0], tf.int32)
        others = tf.cast(tf.where(~mask)[:, 0], tf.int32)
        return tf.dynamic_stitch(
            [others, chosen], [tf.gather(texts, others), function(tf.gather(texts, chosen))])

    return tf.cond(tf.reduce_any(mask), replaced, lambda: tf.identity(texts))


def odd_positions(pieces):
    """For a ragged ``[rows, None]`` tensor: whether each flat value sits at an odd index of its row."""
    position = tf.range(tf.size(pieces.flat_values, tf.int64)) - tf.gather(
        pieces.row_splits[:-1], pieces.value_rowids())
    return position % 2 == 1


class StringMap(tf.Module):
    """``{key: value}`` over strings (or int64 keys): a hash table of slots and a tensor of values."""

    def __init__(self, mapping, key_dtype=tf.string, name=None):
        super().__init__(name=name)
        self._slots = lookup_table(list(mapping), list(range(len(mapping))), key_dtype, -1)
        self._values = tf.constant(list(mapping.values()) or [""], tf.string)

    def contains(self, keys):
        """Whether each key is in the map."""
        return self._slots.lookup(keys) >= 0

    def get(self, keys, default):
        """The value of each key, ``default`` (broadcast) where the key is absent."""
        slot = self._slots.lookup(keys)
        return tf.where(slot >= 0, tf.gather(self._values, tf.maximum(slot, 0)), default)

    def map_chars(self, texts):
        """Replaces every character of ``texts`` that is a key by its value."""
        chars = tf.strings.unicode_split(texts, "UTF-8")
        mapped = self.get(chars.flat_values, chars.flat_values)
        return tf.strings.reduce_join(chars.with_flat_values(mapped), axis=1)
