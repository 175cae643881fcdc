"""Fine-tuning datasets -> tokenized GZIP TFRecords, one file per split, plus manifest.json.

    python -m pipelines.finetune_data --task=sst2 --data_dir=../shared/data/glue/SST-2 \
        --tokenizer_dir=../shared/data/gpt1_bpe --output_dir=DIR [--splits=train,dev] \
        [--max_examples=N] [--train_subsample=N] [--skip_malformed] [--holdout_fraction=F [--holdout_split=val]] \
        [--text_a_column=.. --text_b_column=.. --label_column=.. --label_names=.. --delimiter=..
         --input_type=single --head=classification   (task=csv only)] [--overwrite]

Reading: `gpt_tf.data.task_readers.read_examples` (official formats; malformed rows raise naming
file:line, or with --skip_malformed are skipped and listed in the manifest). Text is tokenized with
`GPTTokenizer.encode_batch`; no special token and no truncation is applied here: the records hold
every token, and `gpt_tf.data.transforms` builds the model inputs (and truncates) for a given n_ctx.

Records (`tf.train.Example`, file `{split}.tfrecord.gz`, GZIP):
    guid           bytes
    tokens_a       int64 list   text_a (premise / sentence / MC context, e.g. the story or article)
    tokens_b       int64 list   text_b (hypothesis / second sentence / RACE question); empty if none
    choice_tokens  int64 list   all candidate answers concatenated (multiple choice), else empty
    choice_lengths int64 list   token count of each candidate
    label          float        class index or score; ABSENT for unlabelled (test) examples, which
                                the reader sees as -1
Splits: the task's standard splits found in --data_dir (or --splits). RACE also gets `dev` / `test`
= middle + high together (RACE-all). --max_examples keeps the first N examples of each split read.

Hold-out (`--holdout_fraction=F`): the split `--holdout_split` (default: `train`, else the first
split read, e.g. Story Cloze's `val`) is divided by example id: an example goes to `dev` when
sha256(guid) / 2**256 < F (at least one does), else to `train`. This makes the paper's "fine-tune on
the Story Cloze val set" measurable without its test set; the manifest records the rule.

Subsample (`--train_subsample=N`): the output `train` split keeps the N examples whose sha256(guid)
is smallest (after any hold-out): a fixed, order-free random sample, unlike --max_examples' first N
(GLUE train files are grouped by source or genre). The manifest records kept / available counts.

Same inputs -> byte-identical files; output is built in a temp folder and renamed into place; an
output with the same config hash makes a re-run a no-op (a different one needs --overwrite).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from gpt_tf.text import word_split
from gpt_tf.console import import_tensorflow, progress, start_command
from gpt_tf.write_errors import refused_build, writing
from gpt_tf.tasks import TaskSpec, csv_task, get_task
from gpt_tf.data.common import command_line, commit_dir, encode_texts, remove_stale_temps, run_cli, tokenizer_files
from gpt_tf.data.records import COMPRESSION, MISSING_LABEL, TASK_FEATURES, find_manifest, record_file, sha256_file, \
    tokenizer_entry, write_manifest
from gpt_tf.data.task_splits import plan_outputs
from gpt_tf.data.task_readers import CsvOptions, available_splits, infer_csv_labels, missing_split_reason, \
    read_examples, split_files
from gpt_tf.data.task_rows import Example

FORMAT_VERSION = 1
REFERENCE_N_CTX = 512  # the paper's context; the manifest counts views longer than this
_ENCODE_CHUNK = 2048
_log = logging.getLogger(__name__)


def _fingerprint(task: TaskSpec, data_dir, splits: Sequence[str]) -> list:
    """[split, file name, size, sha256] of every input file."""
    rows = []
    for split in splits:
        for path in split_files(task, data_dir, split):
            rows.append([split, path.name, path.stat().st_size, sha256_file(path)])
    return rows


def _encode(tokenizer, texts: list[str], desc: str, show_progress: bool) -> list[list[int]]:
    """encode_batch over the distinct texts, in chunks, with a progress bar (RACE repeats articles)."""
    unique = list(dict.fromkeys(texts))
    out = []
    with progress(total=len(unique), desc=desc, unit="text", disable=not show_progress or not unique) as bar:
        for i in range(0, len(unique), _ENCODE_CHUNK):
            out.extend(encode_texts(tokenizer, unique[i: i + _ENCODE_CHUNK]))
            bar.update(min(_ENCODE_CHUNK, len(unique) - i))
    ids = dict(zip(unique, out))
    return [ids[t] for t in texts]


def tokenize_examples(tokenizer, examples: Sequence[Example], desc: str = "tokenize", show_progress: bool = False,
                      skip_malformed: bool = False) -> tuple[list[dict], list[dict]]:
    """Records {guid, tokens_a, tokens_b, choice_tokens, choice_lengths, label} and the examples
    dropped because a text encodes to no token (e.g. only NUL / BOM characters): a ValueError
    naming the guid, or with skip_malformed a skip entry {"file": None, "line": None, "reason"}."""
    texts = [t for e in examples for t in (e.text_a, e.text_b, *(e.choices or ())) if t is not None]
    ids = iter(_encode(tokenizer, texts, desc, show_progress))
    records, skipped = [], []
    for e in examples:
        a, b = next(ids), (next(ids) if e.text_b is not None else [])
        choices = [next(ids) for _ in (e.choices or ())]
        empty = ["text_a"] * (not a) + ["text_b"] * (e.text_b is not None and not b)
        empty += [f"choice {k + 1}" for k, c in enumerate(choices) if not c]
        if empty:
            reason = f"{desc}: example {e.guid!r}: {', '.join(empty)} encodes to no token"
            if not skip_malformed:
                raise ValueError(reason)
            skipped.append({"file": None, "line": None, "reason": f"malformed: {reason}"})
            continue
        records.append({"guid": e.guid, "tokens_a": a, "tokens_b": b, "label": e.label,
                        "choice_tokens": [t for c in choices for t in c],
                        "choice_lengths": [len(c) for c in choices]})
    return records, skipped


def serialize(rec: dict) -> bytes:
    """One tokenized example -> serialized tf.train.Example (label left out when None)."""
    tf = import_tensorflow()

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    feature = {"guid": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rec["guid"].encode("utf-8")])),
               "tokens_a": ints(rec["tokens_a"]), "tokens_b": ints(rec["tokens_b"]),
               "choice_tokens": ints(rec["choice_tokens"]), "choice_lengths": ints(rec["choice_lengths"])}
    if rec["label"] is not None:
        feature["label"] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(rec["label"])]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


def write_records(records: Sequence[dict], path: Path, show_progress: bool = False) -> None:
    """GZIP TFRecord file of the records, in order."""
    tf = import_tensorflow()
    with writing(path), tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type=COMPRESSION)) as writer:
        for rec in progress(records, desc=f"write {path.name}", unit="rec", disable=not show_progress):
            writer.write(serialize(rec))


def split_stats(task: TaskSpec, records: Sequence[dict]) -> dict:
    """Counts, label distribution and length statistics of one split."""
    labels = [r["label"] for r in records if r["label"] is not None]
    lengths = [task.view_lengths(len(r["tokens_a"]), len(r["tokens_b"]), r["choice_lengths"]) for r in records]
    lengths = np.asarray([n for views in lengths for n in views] or [0])
    stats = {"examples": len(records), "labeled": len(labels),
             "max_view_tokens": int(lengths.max()), "mean_view_tokens": round(float(lengths.mean()), 2),
             f"views_over_{REFERENCE_N_CTX}": int((lengths > REFERENCE_N_CTX).sum())}
    if task.head == "regression":
        stats["label_range"] = [min(labels), max(labels)] if labels else None
    else:
        counts = collections.Counter(int(x) for x in labels)
        stats["label_counts"] = {task.label_names[i]: counts[i] for i in range(len(task.label_names))}
    return stats


def _resolve_task(task: Union[str, TaskSpec], data_dir, splits, csv_options) -> TaskSpec:
    """The task spec; for csv, with label names given or inferred over all split files."""
    task = get_task(task) if isinstance(task, str) else task
    if task.name != "csv" or task.head == "regression" or task.label_names:
        return task
    if csv_options is None:
        raise ValueError("the csv task needs csv_options (CsvOptions naming the columns)")
    names = csv_options.label_names or infer_csv_labels(
        [p for s in splits for p in split_files(task, data_dir, s)], csv_options)
    if len(names) < 2:
        raise ValueError(f"{data_dir}: found {len(names)} distinct label(s) {list(names)}; "
                         "a classification task needs at least 2 (or pass label names)")
    return dataclasses.replace(task, label_names=tuple(names))


def read_splits(task, data_dir, splits, skip_malformed, max_examples, csv_options) -> tuple[dict, list]:
    """{split: examples} (first max_examples of each) and all skipped rows (with their split)."""
    examples, skipped = {}, []
    for split in splits:
        items, skips = read_examples(task, data_dir, split, skip_malformed, csv_options)
        examples[split] = items[:max_examples] if max_examples else items
        skipped += [dict(s, split=split) for s in skips]
        if not items:
            raise ValueError(f"{task.name}: split {split!r} of {data_dir} has no usable example "
                             f"({len(skips)} skipped)")
    return examples, skipped


def _config_hash(task: TaskSpec, data_dir, tokenizer_dir, splits, options: dict) -> str:
    key = {"format": FORMAT_VERSION, "task": task.to_dict(), "options": options,
           "input": _fingerprint(task, data_dir, splits),
           "tokenizer": [[p.name, sha256_file(p)] for p in tokenizer_files(tokenizer_dir)],
           "word_split": word_split.fingerprint()}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _existing(out: Path, chash: str, overwrite: bool) -> Optional[dict]:
    """The manifest of an up-to-date output, None when (re)building; raises on a foreign output."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output_dir {out} exists and is not a folder")
    if not out.exists() or not any(out.iterdir()):
        return None
    manifest = find_manifest(out)
    if manifest and manifest.get("config_hash") == chash and all(
            (out / s["file"]).is_file() and (out / s["file"]).stat().st_size == s["bytes"]
            for s in manifest["splits"].values()):
        return manifest
    if not overwrite:
        found = manifest.get("config_hash", "?")[:12] if manifest else "no manifest"
        raise ValueError(f"--output_dir {out} already holds different data ({found} vs {chash[:12]}); "
                         "pass --overwrite to replace it")
    return None


def build_task_data(task: Union[str, TaskSpec], data_dir, tokenizer_dir, output_dir, *,
                    splits: Optional[Sequence[str]] = None, max_examples: Optional[int] = None,
                    train_subsample: Optional[int] = None, skip_malformed: bool = False, holdout_fraction: float = 0.0,
                    holdout_split: Optional[str] = None, csv_options: Optional[CsvOptions] = None,
                    overwrite: bool = False, show_progress: bool = True,
                    command: Optional[str] = None) -> dict:
    """Read, tokenize and write the splits of a task (see the module doc); returns the manifest."""
    from gpt_tf.text.tokenizer import GPTTokenizer

    base_task = get_task(task) if isinstance(task, str) else task
    if not Path(data_dir).exists():
        raise FileNotFoundError(f"{data_dir} does not exist: --data_dir is the folder of {base_task.name}'s files in their "
                                "official layout (for a GLUE task, its folder from the GLUE download, e.g. glue_data/RTE)")
    splits = list(splits or available_splits(base_task, data_dir))
    if not splits:
        raise FileNotFoundError(f"no split of task {base_task.name!r} found: {missing_split_reason(base_task, data_dir)}")
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"--max_examples must be positive, got {max_examples}")
    if train_subsample is not None and train_subsample < 1:
        raise ValueError(f"--train_subsample must be positive, got {train_subsample}")
    task = _resolve_task(base_task, data_dir, splits, csv_options)
    options = {"splits": splits, "max_examples": max_examples, "train_subsample": train_subsample,
               "skip_malformed": skip_malformed,
               "holdout_fraction": holdout_fraction, "holdout_split": holdout_split,
               "csv_options": dataclasses.asdict(csv_options) if csv_options else None}
    examples, skipped = read_splits(task, data_dir, splits, skip_malformed, max_examples, csv_options)
    outputs, holdout, subsample = plan_outputs(task, examples, holdout_fraction, holdout_split,
                                                train_subsample)  # input errors first
    chash = _config_hash(task, data_dir, tokenizer_dir, splits, options)
    out = Path(output_dir)
    existing = _existing(out, chash, overwrite)
    if existing is not None:
        _log.warning("%s already holds this build (config hash %s); nothing to do", out, chash[:12])
        return existing
    tokenizer = GPTTokenizer.from_dir(tokenizer_dir)
    records = _tokenize_outputs(tokenizer, examples, outputs, holdout, subsample, skipped, str(data_dir), skip_malformed,
                                show_progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out.parent, out.name)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        split_rows = {name: _write_split(task, name, recs, tmp, show_progress) for name, recs in records.items()}
        manifest = _manifest(task, chash, command, options, tokenizer, tokenizer_dir, data_dir,
                             split_rows, skipped, holdout, subsample)
        write_manifest(tmp, manifest)
        commit_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _tokenize_outputs(tokenizer, examples: dict, outputs: dict, holdout: Optional[dict], subsample: Optional[dict],
                      skipped: list, data_dir: str, skip_malformed: bool, show_progress: bool) -> dict:
    """{output split: records}: each split read is tokenized once, then shared by the hold-out
    halves and the RACE-all union. Examples dropped for empty tokens are appended to `skipped`."""
    tokenized = {}
    for name, items in examples.items():
        tokenized[name], bad = tokenize_examples(tokenizer, items, f"tokenize {name}", show_progress, skip_malformed)
        skipped += [dict(s, file=data_dir, split=name) for s in bad]
    if holdout:
        ids = {r["guid"]: r for r in tokenized[holdout["source_split"]]}
        tokenized.update({s: [ids[e.guid] for e in outputs[s] if e.guid in ids] for s in ("train", "dev")})
        holdout.update(train=len(tokenized["train"]), dev=len(tokenized["dev"]))
    if subsample and not holdout:  # (a hold-out already took the train records from outputs)
        kept = {e.guid for e in outputs["train"]}
        tokenized["train"] = [r for r in tokenized["train"] if r["guid"] in kept]
    return {name: tokenized[name] if name in tokenized else
            [r for part in (f"{name}_middle", f"{name}_high") for r in tokenized[part]] for name in outputs}


def _write_split(task: TaskSpec, name: str, records: list, folder: Path, show_progress: bool) -> dict:
    """Write one split's records into `folder`; returns its manifest entry."""
    path = folder / record_file(name)
    write_records(records, path, show_progress)
    return {"file": path.name, **split_stats(task, records), "bytes": path.stat().st_size,
            "sha256": sha256_file(path)}


def _manifest(task, chash, command, options, tokenizer, tokenizer_dir, data_dir, splits, skipped, holdout, subsample):
    """The manifest.json content."""
    return {
        "format_version": FORMAT_VERSION, "config_hash": chash, "command": command,
        "task": task.name, "task_spec": task.to_dict(), "data_dir": str(data_dir), "options": options,
        "record": {"compression": COMPRESSION, "missing_label": MISSING_LABEL, "features": dict(TASK_FEATURES)},
        "tokenizer": tokenizer_entry(tokenizer, tokenizer_dir),
        "counts": {name: s["examples"] for name, s in splits.items()},
        "holdout": holdout,
        "train_subsample": subsample,
        "splits": splits,
        "skipped_count": len(skipped),
        "skipped_by_reason": dict(collections.Counter(s["reason"].split(":")[0] for s in skipped)),
        "skipped": skipped,
    }


def _define_flags(flags) -> None:
    """The CLI flags (defined only when this module runs as the program)."""
    flags.DEFINE_string("task", None, "Task name (gpt_tf.tasks.TASKS), e.g. sst2, rte, story_cloze, csv.",
                        required=True)
    flags.DEFINE_string("data_dir", None, "The dataset's folder in its official layout (or one file).",
                        required=True)
    flags.DEFINE_string("tokenizer_dir", None, "Folder of the BPE (encoder json + merges).", required=True)
    flags.DEFINE_string("output_dir", None, "Folder to write {split}.tfrecord.gz + manifest.json.",
                        required=True)
    flags.DEFINE_list("splits", None, "Splits to read (default: the task's standard splits found).")
    flags.DEFINE_integer("max_examples", None, "Keep the first N examples of each split read.")
    flags.DEFINE_integer("train_subsample", None, "Keep N train examples, chosen by guid hash (a fixed random sample).")
    flags.DEFINE_boolean("skip_malformed", False, "Skip (and list in the manifest) malformed rows "
                         "instead of failing on the first.")
    flags.DEFINE_float("holdout_fraction", 0.0, "Split --holdout_split into train/dev by guid hash.")
    flags.DEFINE_string("holdout_split", None, "Split to divide (default: train, else the first split read).")
    flags.DEFINE_string("text_a_column", None, "csv: column of the first text.")
    flags.DEFINE_string("text_b_column", None, "csv: column of the second text (pair tasks).")
    flags.DEFINE_string("label_column", "label", "csv: label column.")
    flags.DEFINE_list("label_names", [], "csv: label values in class-index order (default: sorted).")
    flags.DEFINE_string("delimiter", None, "csv: field delimiter (default: tab for .tsv, else comma).")
    flags.DEFINE_enum("input_type", "single", ["single", "pair", "pair_symmetric"], "csv: input type.")
    flags.DEFINE_enum("head", "classification", ["classification", "regression"], "csv: head.")
    flags.DEFINE_boolean("overwrite", False, "Replace a different existing output.")
    flags.DEFINE_boolean("progress", True, "Show progress bars.")


def main(argv) -> None:
    """CLI entry point: flags -> build_task_data."""
    from absl import flags

    if len(argv) > 1:
        raise SystemExit(f"error: unexpected arguments {argv[1:]}")
    start_command()  # before any work: the process started again where TensorFlow must start otherwise
    f = flags.FLAGS
    task, csv_options = f.task, None
    if f.task == "csv":
        if not f.text_a_column:
            raise SystemExit("error: --task=csv needs --text_a_column")
        task = csv_task(f.input_type, f.head)
        delimiter = {"tab": "\t", "\\t": "\t"}.get(f.delimiter, f.delimiter)
        csv_options = CsvOptions(f.text_a_column, f.text_b_column, f.label_column or None, delimiter,
                                 tuple(f.label_names))
    try:
        manifest = build_task_data(
            task, f.data_dir, f.tokenizer_dir, f.output_dir, splits=f.splits, max_examples=f.max_examples,
            train_subsample=f.train_subsample,
            skip_malformed=f.skip_malformed, holdout_fraction=f.holdout_fraction,
            holdout_split=f.holdout_split, csv_options=csv_options, overwrite=f.overwrite,
            show_progress=f.progress,
            command=command_line("pipelines.finetune_data"))
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:
        sys.exit(refused_build(err, f.output_dir))
    counts = ", ".join(f"{s}={n}" for s, n in manifest["counts"].items())
    print(f"{f.output_dir}: {manifest['task']} {counts} ({manifest['skipped_count']} rows skipped)")


if __name__ == "__main__":
    run_cli(_define_flags, main)
