"""Which records form each fine-tuning batch, and how far it is padded: length buckets.

A record's *length* is its longest view after truncation (`gpt_tf.data.transforms.record_lengths`),
so the K candidates of a multiple-choice example and the two orders of a similarity pair always
share one bucket. Its bucket is the shortest of `bucket_lengths(n_ctx)` that holds it (by default
four per doubling: 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ..., n_ctx, each at most ~25%
longer than the one before), and every batch is padded to one bucket length instead of n_ctx.
SST-2's training phrases (median 12 tokens with the special tokens) then cost 17.8 tokens per view
on average instead of 64; with 2 buckets per doubling 18.9, with powers of two 22.2 (each distinct
length is one more XLA / TPU compilation: fewer buckets trade padding for compile time). Padding is masked
exactly as before (causal attention, `lm_weights`), so no example's loss changes.

Batches are planned *globally*, for all replicas at once (`epoch_plan`), then each input pipeline
takes its replicas' slices of every global batch (`pipeline_rows`). All replicas of a step thus
hold slices of the same batch, of the same shape [B / replicas, K, L]: no replica waits in a
collective for a longer bucket, XLA and TPUs compile once per bucket, and the global batches are
the same for any number of replicas or workers.

Training epoch e (stateless randomness seeded by (seed, e)):
  1. a random permutation of the N records; its last N mod B records sit this epoch out (the
     drop-remainder count of a plain batched epoch; a different random set each epoch);
  2. the rest, stably sorted by bucket, are cut into runs of B consecutive records: every run but
     one per bucket border is one bucket; a run that straddles a border is padded to the longer;
  3. the runs, one global batch each, are put in random order.
So every other record is seen exactly once per epoch, an epoch is exactly N // B batches, and the
step number alone fixes the data position: a run resumed at global batch s starts at epoch
s // (N // B) and skips s mod (N // B) batches of it (without reading them).

Evaluation and prediction: the records sorted by bucket (file order within a bucket), runs of B,
the last run filled up with *ghost* rows (`record_index` -1, a copy of record 0) for the caller to
drop. `record_index` (the record's position in its file) puts predictions back in file order.

With one bucket, `(n_ctx,)`, this is the unbucketed pipeline: every batch padded to n_ctx.
All of it is tf.data and TF ops (no py_function); a split is held in memory as its serialized
records (GLUE-sized sets: megabytes; the shuffle buffer of a streamed reader held as much).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

SMALLEST_BUCKET = 8
BUCKETS_PER_OCTAVE = 4
_MAX_EPOCHS = 2**62  # training repeats "forever"; the loop decides when to stop


def bucket_lengths(n_ctx: int, per_octave: int = BUCKETS_PER_OCTAVE, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
    """Bucket lengths below ``n_ctx``, then ``n_ctx``: ``per_octave`` per doubling from ``smallest``,
    geometric (each 2^(1/per_octave) times the one before), rounded up to a multiple of 4 below 64,
    of 1/8 of the octave's start above (4: 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112,
    128, 160, ...; 2: 8, 12, 16, 24, 32, 48, 64, 96, ...; 1: 8, 16, 32, 64, ...)."""
    if per_octave < 1:
        raise ValueError(f"per_octave must be >= 1, got {per_octave}")
    lengths, start = set(), smallest
    while start < n_ctx:
        step = max(4, start // 8)
        lengths.update(-(-round(start * 2 ** (i / per_octave), 6) // step) * step for i in range(per_octave))
        start *= 2
    return (*sorted(int(n) for n in lengths if n < n_ctx), n_ctx)


def check_buckets(buckets: Sequence[int], n_ctx: int) -> tuple[int, ...]:
    """``buckets`` as a tuple, if strictly increasing, positive and ending at ``n_ctx``."""
    buckets = tuple(int(b) for b in buckets)
    if not buckets or buckets[-1] != n_ctx or buckets[0] < 1 or any(a >= b for a, b in zip(buckets, buckets[1:])):
        raise ValueError(f"bucket lengths {buckets} must be positive, increasing and end at n_ctx={n_ctx}")
    return buckets


def _seed(seed, epoch, stream: int) -> tf.Tensor:
    return tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64) * 2 + stream])


def epoch_plan(lengths, buckets: Sequence[int], batch_size: int, epoch, seed: int,
               training: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Global batches of one epoch: record indices ``[S, batch_size]`` and padded length ``[S]``.

    ``lengths`` [N]: each record's length (<= buckets[-1]). See the module doc for the rules;
    in evaluation the ghost rows of the last batch have index -1.
    """
    lengths = tf.convert_to_tensor(lengths, tf.int32)
    bounds = tf.constant(buckets, tf.int32)
    n = tf.size(lengths)
    if training:
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=_seed(seed, epoch, 0))
        order = order[: n // batch_size * batch_size]
    else:
        order = tf.range(n)
    bucket = tf.searchsorted(bounds, tf.gather(lengths, order), side="left")  # first bound >= length
    by_bucket = tf.argsort(bucket, stable=True)
    order, bucket = tf.gather(order, by_bucket), tf.gather(bucket, by_bucket)
    if not training:  # fill the last batch with ghosts (bucket 0: they never lengthen it)
        ghosts = (batch_size - n % batch_size) % batch_size
        order = tf.concat([order, -tf.ones([ghosts], tf.int32)], 0)
        bucket = tf.concat([bucket, tf.zeros([ghosts], bucket.dtype)], 0)
    index = tf.reshape(order, [-1, batch_size])
    length = tf.gather(bounds, tf.reduce_max(tf.reshape(bucket, [-1, batch_size]), axis=1))
    if training:
        runs = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(index)[0]), seed=_seed(seed, epoch, 1))
        index, length = tf.gather(index, runs), tf.gather(length, runs)
    return index, length


def pipeline_rows(index: tf.Tensor, length: tf.Tensor, batch_size: int,
                  input_context: Optional[tf.distribute.InputContext]) -> tuple[tf.Tensor, tf.Tensor]:
    """This input pipeline's share of the global batches ``index`` [S, B] / ``length`` [S]:
    its replicas' slices, one per row: ``[S * replicas_here, B / replicas]`` and their lengths.

    Global batch rows go to replicas in order (replica r gets rows r·B/R ... (r+1)·B/R - 1), which
    is the order ``strategy.gather`` puts them back in; pipeline p feeds replicas p·R/P ... .
    """
    ctx = input_context or tf.distribute.InputContext()
    replicas, pipelines = ctx.num_replicas_in_sync, ctx.num_input_pipelines
    if batch_size % replicas or replicas % pipelines:
        raise ValueError(f"batch_size={batch_size} must split evenly over {replicas} replicas "
                         f"and those over {pipelines} input pipelines")
    local, per_replica = replicas // pipelines, batch_size // replicas
    start = ctx.input_pipeline_id * local * per_replica
    mine = index[:, start:start + local * per_replica]
    return tf.reshape(mine, [-1, per_replica]), tf.repeat(length, local)


def planned_batches(records: tf.data.Dataset, num_records: int, lengths_fn: Callable, example_fn: Callable,
                    buckets: Sequence[int], batch_size: int, *, training: bool, seed: int = 0,
                    start_batch: int = 0, input_context: Optional[tf.distribute.InputContext] = None,
                    source: str = "records") -> tf.data.Dataset:
    """Per-replica batches of one split, planned by `epoch_plan` (see the module doc).

    ``records``: a dataset whose one element is the split's ``num_records`` serialized records.
    ``lengths_fn(serialized [N]) -> [N]`` gives the records' lengths; ``example_fn(serialized, i,
    length) -> (features, label)`` builds record i padded to ``length`` (i = -1: a ghost row).
    Training repeats epochs without end, starting at global batch ``start_batch``; evaluation is
    one pass. Batches hold ``batch_size / replicas`` examples. ``source`` names the file in errors.
    """
    per_epoch = num_records // batch_size
    if training and per_epoch < 1:
        raise ValueError(f"{num_records} training records make no full batch of {batch_size}")
    first_epoch, skip = divmod(start_batch, per_epoch) if training else (0, 0)
    ctx = input_context or tf.distribute.InputContext()
    per_replica = batch_size // ctx.num_replicas_in_sync
    skip_rows = skip * (ctx.num_replicas_in_sync // ctx.num_input_pipelines) * per_replica

    def one_epoch(epoch, serialized):
        check = tf.debugging.assert_equal(tf.size(serialized), num_records, message=f"{source}: the file does not "
                                          f"hold the {num_records} records its manifest lists")
        with tf.control_dependencies([check]):
            lengths = lengths_fn(serialized)
        index, length = epoch_plan(lengths, buckets, batch_size, epoch, seed, training)
        rows, row_length = pipeline_rows(index, length, batch_size, input_context)
        examples = tf.data.Dataset.from_tensor_slices((tf.reshape(rows, [-1]), tf.repeat(row_length, per_replica)))
        examples = examples.skip(tf.where(epoch == first_epoch, tf.constant(skip_rows, tf.int64), 0))
        return examples.map(lambda i, n: example_fn(serialized, i, n), num_parallel_calls=tf.data.AUTOTUNE,
                            deterministic=True)

    epochs = tf.data.Dataset.range(first_epoch, _MAX_EPOCHS if training else 1)
    ds = tf.data.Dataset.zip((epochs, records.repeat())).flat_map(one_epoch)
    ds = ds.batch(per_replica, drop_remainder=True)  # rows never straddle epochs: each is a whole slice
    options = tf.data.Options()
    options.deterministic = True
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)
