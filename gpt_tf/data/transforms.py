"""Input transformations of the paper (§3.3, Figure 1) as tf.data ops, and `task_dataset`.

Each tokenized record (`pipelines.finetune_data`) becomes K views of n_ctx tokens, with
<s> = start, $ = delimiter, <e> = extract, right-padded with the pad id:

    single            K = 1            <s> a <e>
    pair              K = 1            <s> a $ b <e>
    pair_symmetric    K = 2            <s> a $ b <e>   and   <s> b $ a <e>
    multiple_choice   K = num_choices  <s> context $ choice_k <e>, context = tokens_a ++ tokens_b
                                       (Story Cloze: the story; RACE: article ++ question)

Features: `input_ids` int32 [K, n_ctx]; `extract_index` int32 [K] (position of <e>);
`lm_weights` float32 [K, n_ctx], aligned with the LM *targets*: lm_weights[t] = 1 iff
input_ids[t + 1] is a real token (text, $ or <e>; not padding), so it is 0 at the last real token
and at every position after it (always 0 at t = n_ctx - 1). Label: int32 class / choice index, or
float32 score for regression; -1 for unlabelled (test) records.

Truncation rule (a view longer than n_ctx): the second part -- hypothesis / second sentence for
pairs, the candidate answer for multiple choice -- is never cut while the first part can give way.
The first part is cut until the view fits: from the RIGHT for single and pair inputs (keep the
beginning of the premise), from the LEFT for multiple choice (keep the end of the context, the
part closest to the question / ending). Only if the second part alone does not fit (longer than
n_ctx - 3) is it cut from the right, and the first part is then empty. pair_symmetric truncates
(a, b) once by the pair rule and builds both views from the same tokens; multiple choice truncates
each candidate's view on its own. Single inputs keep the first n_ctx - 2 tokens.

All of this is pure TensorFlow (no py_function), so it runs inside tf.distribute input pipelines.
"""

from __future__ import annotations

import posixpath
from typing import Mapping, Optional, Sequence

from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

from gpt_tf.config import SPECIAL_TOKENS
from gpt_tf.tasks import TaskSpec
from gpt_tf.data.records import COMPRESSION, MANIFEST, TASK_TOKEN_FEATURES, read_manifest, split_entry, task_feature_spec
from gpt_tf.data.task_batches import bucket_lengths, check_buckets, planned_batches


def special_ids_from_config(config) -> dict:
    """{"start", "delimiter", "extract", "pad"} -> id, from a GPTConfig."""
    return {name: config.special_id(name) for name in SPECIAL_TOKENS}


def parse_record(serialized: tf.Tensor) -> dict:
    """One serialized record -> {guid, tokens_a, tokens_b, choice_tokens, choice_lengths: int32, label}."""
    parsed = tf.io.parse_single_example(serialized, task_feature_spec())
    for name in TASK_TOKEN_FEATURES:
        parsed[name] = tf.cast(tf.sparse.to_dense(parsed[name]), tf.int32)
    return parsed


def fit_lengths(len_first: tf.Tensor, len_second: tf.Tensor, budget: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(kept first, kept second) token counts within `budget`: the second part is kept whole if it
    fits, the first part gets what is left."""
    keep_second = tf.minimum(len_second, budget)
    keep_first = tf.minimum(len_first, budget - keep_second)
    return keep_first, keep_second


def pack_view(parts: list, n_ctx: int, pad_id: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Concatenate token parts (total <= n_ctx) -> (input_ids [n_ctx], extract_index, lm_weights)."""
    tokens = tf.concat([tf.cast(p, tf.int32) for p in parts], axis=0)
    length = tf.shape(tokens)[0]
    tf.debugging.assert_less_equal(length, n_ctx, message="view longer than n_ctx after truncation")
    ids = tf.pad(tokens, [[0, n_ctx - length]], constant_values=pad_id)
    ids = tf.ensure_shape(ids, [n_ctx])
    weights = tf.sequence_mask(length - 1, n_ctx, dtype=tf.float32)
    return ids, length - 1, weights


def _specials(special_ids: Mapping[str, int]) -> dict:
    return {name: tf.constant([special_ids[name]], tf.int32) for name in ("start", "delimiter", "extract")}


def single_views(a, n_ctx: int, special_ids: Mapping[str, int]) -> list:
    """[<s> a <e>] with a cut from the right to n_ctx - 2 tokens."""
    s = _specials(special_ids)
    return [pack_view([s["start"], a[: n_ctx - 2], s["extract"]], n_ctx, special_ids["pad"])]


def _truncate_pair(a, b, n_ctx: int):
    """(a, b) cut by the pair rule: a from the right first, then b from the right."""
    keep_a, keep_b = fit_lengths(tf.size(a), tf.size(b), n_ctx - 3)
    return a[:keep_a], b[:keep_b]


def pair_views(a, b, n_ctx: int, special_ids: Mapping[str, int]) -> list:
    """[<s> a $ b <e>] after the pair truncation."""
    s, (a, b) = _specials(special_ids), _truncate_pair(a, b, n_ctx)
    return [pack_view([s["start"], a, s["delimiter"], b, s["extract"]], n_ctx, special_ids["pad"])]


def pair_symmetric_views(a, b, n_ctx: int, special_ids: Mapping[str, int]) -> list:
    """[<s> a $ b <e>, <s> b $ a <e>] from one pair truncation of (a, b)."""
    s, (a, b) = _specials(special_ids), _truncate_pair(a, b, n_ctx)
    pad = special_ids["pad"]
    return [pack_view([s["start"], a, s["delimiter"], b, s["extract"]], n_ctx, pad),
            pack_view([s["start"], b, s["delimiter"], a, s["extract"]], n_ctx, pad)]


def multiple_choice_views(context, choice_tokens, choice_lengths, num_choices: int, n_ctx: int,
                          special_ids: Mapping[str, int]) -> list:
    """[<s> context $ choice_k <e> for k]; context cut from the LEFT, then the choice from the right."""
    check = tf.debugging.assert_equal(tf.size(choice_lengths), num_choices,
                                      message=f"record does not have num_choices={num_choices} choices")
    with tf.control_dependencies([check]):
        choices = tf.RaggedTensor.from_row_lengths(choice_tokens, tf.identity(choice_lengths))
    s, views, n_context = _specials(special_ids), [], tf.size(context)
    for k in range(num_choices):
        choice = choices[k]
        keep_ctx, keep_choice = fit_lengths(n_context, tf.size(choice), n_ctx - 3)
        views.append(pack_view([s["start"], context[n_context - keep_ctx:], s["delimiter"],
                                choice[:keep_choice], s["extract"]], n_ctx, special_ids["pad"]))
    return views


def transform_record(task: TaskSpec, record: dict, n_ctx: int, special_ids: Mapping[str, int]):
    """A parsed record -> ({input_ids [K, n_ctx], extract_index [K], lm_weights [K, n_ctx]}, label)."""
    a, b = record["tokens_a"], record["tokens_b"]
    if task.input_type == "single":
        views = single_views(a, n_ctx, special_ids)
    elif task.input_type == "pair":
        views = pair_views(a, b, n_ctx, special_ids)
    elif task.input_type == "pair_symmetric":
        views = pair_symmetric_views(a, b, n_ctx, special_ids)
    elif task.input_type == "multiple_choice":
        views = multiple_choice_views(tf.concat([a, b], 0), record["choice_tokens"], record["choice_lengths"],
                                      task.num_choices, n_ctx, special_ids)
    else:
        raise ValueError(f"unknown input_type {task.input_type!r}")
    ids, extract, weights = (tf.stack(list(x)) for x in zip(*views))
    label = record["label"] if task.head == "regression" else tf.cast(record["label"], tf.int32)
    return {"input_ids": ids, "extract_index": tf.cast(extract, tf.int32), "lm_weights": weights}, label


def record_lengths(task: TaskSpec, serialized: tf.Tensor, n_ctx: int) -> tf.Tensor:
    """Tokens in the longest view of each of the serialized records [N], after truncation: int32 [N].

    Equals max(extract_index) + 1 of `transform_record`: the truncation rule cuts a view to n_ctx
    exactly when it is longer, so a view's length is min(its untruncated length, n_ctx).
    """
    spec = {name: tf.io.RaggedFeature(tf.int64) for name in TASK_TOKEN_FEATURES}
    parsed = tf.io.parse_example(serialized, spec)
    a = tf.cast(parsed["tokens_a"].row_lengths(), tf.int32)
    b = tf.cast(parsed["tokens_b"].row_lengths(), tf.int32)
    if task.input_type != "multiple_choice":
        return view_lengths(task.input_type, a, b, n_ctx)
    choices = parsed["choice_lengths"]
    check = tf.debugging.assert_equal(tf.cast(choices.row_lengths(), tf.int32), task.num_choices,
                                      message=f"a record does not have num_choices={task.num_choices} choices")
    with tf.control_dependencies([check]):
        c = tf.reshape(tf.cast(choices.flat_values, tf.int32), [-1, task.num_choices])
    return view_lengths(task.input_type, a, b, n_ctx, c)


def view_lengths(input_type: str, a: tf.Tensor, b: tf.Tensor, n_ctx: int, choices: tf.Tensor | None = None):
    """Tokens in each example's longest view after truncation, from its fields' token counts: int32 [N].

    ``a``, ``b`` [N]: the first and second text's tokens (``b`` zeros for single texts); ``choices`` [N, K]:
    each candidate's tokens (multiple choice). The special tokens are counted: ``<s> a <e>``,
    ``<s> a $ b <e>``, ``<s> a b $ choice <e>``; truncation cuts a view to ``n_ctx``.
    """
    if input_type == "single":
        return tf.minimum(a + 2, n_ctx)
    if input_type != "multiple_choice":
        return tf.minimum(a + b + 3, n_ctx)
    return tf.reduce_max(tf.minimum((a + b)[:, None] + choices + 3, n_ctx), axis=1)


def _check_special_ids(special_ids: Mapping[str, int], vocab_size: int) -> None:
    """All four special ids present, distinct and outside the BPE ids 0..vocab_size-1."""
    missing = [n for n in SPECIAL_TOKENS if n not in special_ids]
    if missing:
        raise ValueError(f"special_ids lacks {missing}; expected keys {SPECIAL_TOKENS}")
    values = [int(special_ids[n]) for n in SPECIAL_TOKENS]
    if len(set(values)) != len(values) or min(values) < vocab_size:
        raise ValueError(f"special ids {dict(special_ids)} must be distinct and >= the data's BPE "
                         f"vocab_size {vocab_size}")


def load_task_spec(data_dir: str) -> TaskSpec:
    """The TaskSpec a data folder was built for (e.g. a csv task with its inferred labels)."""
    return TaskSpec.from_dict(_manifest(data_dir)["task_spec"])


def num_examples(data_dir: str, split: str) -> int:
    """Records in a split, from the manifest."""
    return int(split_entry(_manifest(data_dir), data_dir, split)["examples"])


def split_guids(data_dir: str, split: str) -> list[str]:
    """The guids of a split's records, in file order (what a submission file is keyed by)."""
    entry = split_entry(_manifest(data_dir), data_dir, split)
    records = tf.data.TFRecordDataset(posixpath.join(data_dir, entry["file"]), compression_type=COMPRESSION)
    spec = {"guid": task_feature_spec()["guid"]}
    return [g.decode("utf-8") for batch in records.batch(4096)
            for g in tf.io.parse_example(batch, spec)["guid"].numpy()]


def _manifest(data_dir: str) -> dict:
    return read_manifest(data_dir, "pipelines.finetune_data")


def _check_task(task: TaskSpec, manifest: dict, data_dir: str) -> None:
    """The requested task must be the one the records were built for."""
    built = manifest.get("task_spec", {})
    for field in ("name", "input_type", "head", "label_names", "num_choices"):
        have, want = built.get(field), getattr(task, field)
        if (list(want) if isinstance(want, tuple) else want) != have:
            raise ValueError(f"{data_dir} was built for task {built.get('name')!r} with {field}={have!r}, "
                             f"but task {task.name!r} has {field}={want!r}")


def task_dataset(task: TaskSpec, data_dir: str, split: str, batch_size: int, n_ctx: int,
                 special_ids: Mapping[str, int], *, training: bool = False, seed: int = 0,
                 buckets: Optional[Sequence[int]] = None, start_batch: int = 0,
                 input_context: Optional[tf.distribute.InputContext] = None) -> tf.data.Dataset:
    """Per-replica batches of (features, label) of one split, length-bucketed (`gpt_tf.data.task_batches`).

    ``batch_size`` is the GLOBAL batch; each batch holds ``batch_size / replicas`` examples (the
    replicas of ``input_context``). Features are those of `transform_record`, padded to the batch's
    bucket length L (``input_ids`` [b, K, L]), plus ``record_index`` int32 [b] (position in the
    file; -1 for the ghost rows that fill an evaluation's last batch). ``buckets``: the bucket
    lengths, default `bucket_lengths(n_ctx)`; ``(n_ctx,)`` pads every batch to n_ctx.
    ``training``: seeded shuffled epochs without end, from global batch ``start_batch``; else one
    pass in bucket order. The order is a function of (seed, epoch) only: identical run to run.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if n_ctx < 4:
        raise ValueError(f"n_ctx must be at least 4 (3 special tokens + 1), got {n_ctx}")
    buckets = check_buckets(bucket_lengths(n_ctx) if buckets is None else buckets, n_ctx)
    manifest = _manifest(data_dir)
    _check_task(task, manifest, data_dir)
    entry = split_entry(manifest, data_dir, split)
    _check_special_ids(special_ids, int(manifest["tokenizer"]["vocab_size"]))
    path = posixpath.join(str(data_dir), entry["file"])
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path}: listed in {data_dir}/{MANIFEST} but missing")
    ids, num_records = {k: int(v) for k, v in special_ids.items()}, int(entry["examples"])
    records = tf.data.TFRecordDataset(path, compression_type=manifest["record"].get("compression", COMPRESSION))
    records = records.batch(num_records + 1)  # the whole split, one element

    def example(serialized, i, length):
        features, label = transform_record(task, parse_record(serialized[tf.maximum(i, 0)]), n_ctx, ids)
        if len(buckets) > 1:  # cut the padding beyond the bucket (every view of the record fits)
            features["input_ids"] = features["input_ids"][:, :length]
            features["lm_weights"] = features["lm_weights"][:, :length]
        features["record_index"] = i
        return features, label

    return planned_batches(records, num_records, lambda s: record_lengths(task, s, n_ctx), example, buckets,
                           batch_size, training=training, seed=seed, start_batch=start_batch,
                           input_context=input_context, source=path)
