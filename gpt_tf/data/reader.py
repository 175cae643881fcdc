"""tf.data reader of the pre-training TFRecords written by `pipelines.pretrain_data`.

`pretraining_dataset(...)` yields `(inputs, targets)`, both int32 [batch_size, n_ctx], where
targets[:, i] = inputs[:, i + 1] of the same (n_ctx + 1)-token record. Pipeline:

    shard files -> (per-worker shard by file) -> seeded file shuffle -> deterministic parallel
    interleave of GZIP TFRecord readers -> (per-worker shard by record) -> seeded record shuffle
    -> repeat -> batch(drop_remainder=True) -> vectorized parse -> prefetch

With an `InputContext` of N pipelines, pipeline k reads every N-th file when there are at least N
files, else every N-th record, so the pipelines see disjoint records. Only tf.data / tf ops are
used (no py_function), so it runs inside tf.distribute / on TPU hosts. Paths go through
tf.io.gfile, so `gs://` folders work too.
"""

from __future__ import annotations

import posixpath
from typing import Optional

import tensorflow as tf

from gpt_tf.data.records import COMPRESSION, MANIFEST, PRETRAIN_FEATURE, pretrain_feature_spec, read_manifest

_BUILDER = "pipelines.pretrain_data"
_DEFAULT_PARALLEL_READS = 4  # fixed (not AUTOTUNE) so the record order is the same on every machine


def resolve_shards(file_pattern_or_dir: str, split: str) -> tuple[list[str], dict]:
    """Shard files of `split` (sorted) and the manifest that describes them.

    A folder: the shards its manifest lists for `split`. A glob pattern: the matching files, which
    must all be `split` shards of the manifest in their folder."""
    source = str(file_pattern_or_dir)
    if tf.io.gfile.isdir(source):
        manifest, folder = read_manifest(source, _BUILDER), source
        if split not in manifest["splits"]:
            raise ValueError(f"{source}/{MANIFEST}: no {split!r} split (has {sorted(manifest['splits'])})")
        files = [posixpath.join(folder, s["file"]) for s in manifest["splits"][split]["shards"]]
        missing = [f for f in files if not tf.io.gfile.exists(f)]
        if missing:
            raise FileNotFoundError(f"{source}/{MANIFEST} lists {len(missing)} missing shard(s), e.g. {missing[0]}")
        return files, manifest
    files = sorted(tf.io.gfile.glob(source))
    if not files:
        raise FileNotFoundError(f"no file matches {source!r}")
    folder = posixpath.dirname(files[0])
    manifest = read_manifest(folder, _BUILDER)
    listed = {s["file"] for s in manifest["splits"].get(split, {}).get("shards", [])}
    strays = [f for f in files if posixpath.dirname(f) != folder or posixpath.basename(f) not in listed]
    if strays:
        raise ValueError(f"{strays[0]} is not a {split!r} shard listed in {folder}/{MANIFEST}")
    return files, manifest


def num_sequences(file_pattern_or_dir: str, split: str) -> int:
    """Number of records of `split` in the given shards (from the manifest)."""
    files, manifest = resolve_shards(file_pattern_or_dir, split)
    names = {posixpath.basename(f) for f in files}
    return sum(s["sequences"] for s in manifest["splits"][split]["shards"] if s["file"] in names)


def batches_per_pipeline(file_pattern_or_dir: str, split: str, batch_size: int, num_pipelines: int = 1) -> int:
    """Full batches of `batch_size` that EVERY one of `num_pipelines` input pipelines yields in one pass.

    Mirrors `pretraining_dataset`'s sharding (by file when there are enough files, else by record),
    from the manifest's counts. Multi-worker evaluation takes this many batches on every worker, so
    that no worker waits in a collective for a batch another one does not have.
    """
    files, manifest = resolve_shards(file_pattern_or_dir, split)
    counts = {posixpath.basename(s["file"]): s["sequences"] for s in manifest["splits"][split]["shards"]}
    sizes = [counts[posixpath.basename(f)] for f in files]
    if len(files) >= num_pipelines:
        per_pipe = [sum(sizes[k::num_pipelines]) for k in range(num_pipelines)]
    else:
        per_pipe = [len(range(k, sum(sizes), num_pipelines)) for k in range(num_pipelines)]
    return min(per_pipe) // batch_size


def parse_batch(serialized: tf.Tensor, n_ctx: int) -> tuple[tf.Tensor, tf.Tensor]:
    """[B] serialized records -> (inputs, targets) int32 [B, n_ctx]."""
    tokens = tf.cast(tf.io.parse_example(serialized, pretrain_feature_spec(n_ctx))[PRETRAIN_FEATURE], tf.int32)
    return tokens[:, :-1], tokens[:, 1:]


def pretraining_dataset(
    file_pattern_or_dir: str,
    split: str,
    batch_size: int,
    n_ctx: int,
    shuffle: bool = True,
    seed: int = 0,
    repeat: bool = True,
    input_context: Optional[tf.distribute.InputContext] = None,
    num_parallel_reads: int = _DEFAULT_PARALLEL_READS,
    shuffle_buffer: int = 10_000,
) -> tf.data.Dataset:
    """Batches of (inputs, targets) int32 [batch_size, n_ctx] from the shards of `split`.

    batch_size is the size of the batches this dataset yields (under tf.distribute pass
    `input_context.get_per_replica_batch_size(global_batch)`). Batches are full
    (drop_remainder=True); a final partial batch is dropped. `n_ctx` must match the manifest's.
    With the same seed and shards the order is identical run to run.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    files, manifest = resolve_shards(file_pattern_or_dir, split)
    if int(manifest["n_ctx"]) != n_ctx:
        raise ValueError(f"{file_pattern_or_dir}: the data was built with n_ctx={manifest['n_ctx']} "
                         f"but n_ctx={n_ctx} was requested; rebuild it or change n_ctx")
    compression = manifest.get("record", {}).get("compression", COMPRESSION)
    n_pipes = input_context.num_input_pipelines if input_context else 1
    pipe_id = input_context.input_pipeline_id if input_context else 0
    by_file = len(files) >= n_pipes

    ds = tf.data.Dataset.from_tensor_slices(files)
    if n_pipes > 1 and by_file:
        ds = ds.shard(n_pipes, pipe_id)
    local_files = len(files[pipe_id::n_pipes]) if by_file else len(files)
    if shuffle:
        ds = ds.shuffle(local_files, seed=seed, reshuffle_each_iteration=True)
    cycle = max(1, min(num_parallel_reads, local_files))
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True} if cycle > 1 else {}
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
                       cycle_length=cycle, block_length=1, **parallel)
    if n_pipes > 1 and not by_file:
        ds = ds.shard(n_pipes, pipe_id)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda s: parse_batch(s, n_ctx), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def as_model_inputs(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``pretraining_dataset``'s batches as the language model takes them: ``({"token_ids", "padding_mask"}, targets)``
    (a mask of ones: every position is text)."""
    return dataset.map(lambda x, y: ({"token_ids": x, "padding_mask": tf.ones_like(x)}, y))
