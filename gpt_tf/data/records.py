"""The on-disk format of the data folders: record features, file names and ``manifest.json``.

The one home of what the builders (``pipelines.pretrain_data``, ``pipelines.finetune_data``) write
and what the readers (``gpt_tf.data.reader``, ``gpt_tf.data.transforms``), training and serving read back.

Pre-training folder: ``{split}-{k:05d}-of-{n:05d}.tfrecord.gz`` shards of ``tf.train.Example``
with one feature ``input_ids`` (int64 [n_ctx + 1]). Fine-tuning folder: ``{split}.tfrecord.gz``
with ``guid`` (bytes), ``tokens_a`` / ``tokens_b`` / ``choice_tokens`` / ``choice_lengths``
(int64 lists) and ``label`` (float, absent when unlabelled). Both are GZIP-compressed and sit next
to a ``manifest.json`` whose ``splits`` list every data file with its sha256.

Paths go through ``tf.io.gfile`` when they name a remote file system (``gs://...``), so TensorFlow
is imported only then (the builders' flag checks stay fast).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from gpt_tf.write_errors import writing

MANIFEST = "manifest.json"
COMPRESSION = "GZIP"
PRETRAIN_FEATURE = "input_ids"
TASK_TOKEN_FEATURES = ("tokens_a", "tokens_b", "choice_tokens", "choice_lengths")
MISSING_LABEL = -1.0  # what a reader sees for an unlabelled record (its label feature is absent)
TASK_FEATURES = {"guid": "bytes", "tokens_a": "int64 list", "tokens_b": "int64 list",
                 "choice_tokens": "int64 list", "choice_lengths": "int64 list",
                 "label": "float (absent when unlabelled)"}  # as the manifest describes them


def shard_file(split: str, index: int, num_shards: int) -> str:
    """File name of pre-training shard ``index`` of ``num_shards`` of a split."""
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord.gz"


def record_file(split: str) -> str:
    """File name of a fine-tuning split's records."""
    return f"{split}.tfrecord.gz"


def pretrain_feature_spec(n_ctx: int) -> dict:
    """``tf.io.parse_example`` spec of a pre-training record."""
    import tensorflow as tf

    return {PRETRAIN_FEATURE: tf.io.FixedLenFeature([n_ctx + 1], tf.int64)}


def task_feature_spec() -> dict:
    """``tf.io.parse_single_example`` spec of a fine-tuning record (label defaults to MISSING_LABEL)."""
    import tensorflow as tf

    spec = {name: tf.io.VarLenFeature(tf.int64) for name in TASK_TOKEN_FEATURES}
    spec["guid"] = tf.io.FixedLenFeature([], tf.string)
    spec["label"] = tf.io.FixedLenFeature([], tf.float32, default_value=MISSING_LABEL)
    return spec


def _join(folder, name: str) -> str:
    return f"{str(folder).rstrip('/')}/{name}"


def _open(path: str, mode: str):
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.GFile(path, mode)
    return open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _exists(path: str) -> bool:
    if "://" in path:
        import tensorflow as tf

        return tf.io.gfile.exists(path)
    return Path(path).is_file()


_MANIFESTS: dict = {}  # local path -> ((mtime_ns, size), parsed): each manifest parsed once per process


def read_manifest(folder, builder: str = "pipelines.pretrain_data or pipelines.finetune_data") -> dict:
    """``folder/manifest.json`` (local or remote), as a fresh dict.

    FileNotFoundError naming the file and the ``builder`` module if there is none; ValueError
    naming it if it is not valid JSON. A local manifest is read and parsed once per process while it
    stays the same file (modification time and size); later calls get copies of that parse.
    """
    path = _join(folder, MANIFEST)
    if not _exists(path):
        raise FileNotFoundError(f"{path}: no manifest; build {folder} with `python -m {builder}`")
    stamp = None
    if "://" not in path:
        stat = os.stat(path)
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = _MANIFESTS.get(os.path.abspath(path))
        if cached and cached[0] == stamp:
            return copy.deepcopy(cached[1])
    with _open(path, "r") as f:
        text = f.read()
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if stamp is not None:
        _MANIFESTS[os.path.abspath(path)] = (stamp, copy.deepcopy(manifest))
    return manifest


def has_manifest(folder) -> bool:
    """Whether ``folder`` (local or remote) holds a ``manifest.json``."""
    return _exists(_join(folder, MANIFEST))


def find_manifest(folder) -> Optional[dict]:
    """The manifest of a local output folder, or None if it has none (the builders' up-to-date check);
    ValueError naming the file if it is not valid JSON (``read_manifest``)."""
    return read_manifest(folder) if has_manifest(folder) else None


def split_entry(manifest: dict, folder, split: str) -> dict:
    """The manifest's entry of ``split``; ValueError naming the splits it has."""
    if split not in manifest.get("splits", {}):
        raise ValueError(f"{folder}: no split {split!r}; it has {sorted(manifest.get('splits', {}))}")
    return manifest["splits"][split]


def sha256_file(path) -> str:
    """Hex sha256 of a file's bytes (``gs://`` and other remote paths through ``tf.io.gfile``)."""
    digest = hashlib.sha256()
    with _open(str(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _data_files(manifest: dict) -> list[dict]:
    """Every ``{"file", "sha256", ...}`` entry of a pre-training (shards) or fine-tuning (splits) manifest."""
    entries = []
    for split in manifest.get("splits", {}).values():
        entries += split.get("shards", [split] if "file" in split else [])
    return [e for e in entries if "sha256" in e]


def data_file_problems(data_dir, manifest: dict, names: Optional[set] = None) -> list[str]:
    """One line per data file (shard) of ``manifest`` that is missing or whose sha256 differs from it."""
    out = []
    for entry in _data_files(manifest):
        if names is not None and entry["file"] not in names:
            continue
        path = _join(data_dir, entry["file"])
        try:
            digest = sha256_file(path)
        except OSError as err:
            out.append(f"{path}: unreadable ({err.strerror or err})")
            continue
        if digest != entry["sha256"]:
            out.append(f"{path}: corrupt: its sha256 is {digest[:12]}…, the manifest says {entry['sha256'][:12]}… "
                       "(rebuild the data, or copy the file again)")
    return out


def tokenizer_problems(manifest: dict, tokenizer_dir, data_dir) -> list[str]:
    """One line per tokenizer file that differs from the one ``data_dir``'s manifest was built with."""
    out = []
    for entry in manifest.get("tokenizer", {}).get("files", []):
        path = Path(tokenizer_dir) / entry["name"]
        if not path.is_file():
            out.append(f"{path}: missing; {data_dir}/{MANIFEST} was tokenized with it")
        elif sha256_file(path) != entry["sha256"]:
            out.append(f"{path} is not the tokenizer {data_dir} was built with (sha256 {sha256_file(path)[:12]}… vs "
                       f"{entry['sha256'][:12]}… in its {MANIFEST}): was it retrained with --overwrite? Rebuild the "
                       "data with this tokenizer, or point --tokenizer_dir at the original")
    return out


def tokenizer_entry(tokenizer, tokenizer_dir, **extra) -> dict:
    """The manifest's ``tokenizer`` section: folder, vocabulary size, ``extra`` fields and each file's sha256."""
    files = [Path(tokenizer.encoder_path), Path(tokenizer.merges_path)]
    return {"dir": str(tokenizer_dir), "vocab_size": tokenizer.vocab_size, **extra,
            "files": [{"name": p.name, "path": str(p), "sha256": sha256_file(p)} for p in files]}


def write_manifest(folder: Path, manifest: dict) -> None:
    """``folder/manifest.json`` as both builders write it (indent 1, UTF-8 kept, final newline)."""
    path = Path(folder) / MANIFEST
    with writing(path), open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
