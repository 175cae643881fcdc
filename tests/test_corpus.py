"""Several folders of books as one pre-training corpus (pipelines/corpus.py, pipelines/pretrain_data.py): the same
records as one folder holding their books, every folder in the manifest, overlapping folders refused, and the text
of the windows' targets counted at build time (gpt_tf/text/text_units.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines import pretrain_data as pd
from tests.small_runs import decoded_text, run_cli

N_CTX = 32


@pytest.fixture(scope="module")
def folders(shared_data, tmp_path_factory):
    """Two folders of two real books each (the first 30,000 bytes), one folder holding all four, a held-out one."""
    root = tmp_path_factory.mktemp("corpus")
    names = {"a": ("b0000", "b0001"), "b": ("b0002", "b0003"), "valid": ("b0019",)}
    for folder, books in names.items():
        (root / folder).mkdir()
        for name in books:
            data = next((shared_data / "books").glob(f"*/{name}.txt")).read_bytes()[:30_000]
            (root / folder / f"{name}.txt").write_bytes(data)
            if folder != "valid":
                (root / "all").mkdir(exist_ok=True)
                (root / "all" / f"{name}.txt").write_bytes(data)
    return root


def _build(root: Path, inputs, out: str) -> dict:
    return pd.build_pretraining_data(pd.PretrainConfig(
        input_dir=inputs, valid_dir=str(root / "valid"), output_dir=str(root / out), tokenizer_dir=str(root / f"{out}_bpe"),
        train_tokenizer_vocab=600, n_ctx=N_CTX, shard_size=40, show_progress=False))


@pytest.fixture(scope="module")
def built(folders):
    """The corpus of folders a and b, and of the one folder holding their books (each with a BPE trained on it)."""
    return (_build(folders, (str(folders / "a"), str(folders / "b")), "two"),
            _build(folders, str(folders / "all"), "one"))


def test_two_folders_make_the_records_of_one_folder_holding_their_books(folders, built):
    two, one = built
    for name in ("encoder.json", "vocab.bpe"):  # the BPE trained on the books streamed from both folders
        assert (folders / "two_bpe" / name).read_bytes() == (folders / "one_bpe" / name).read_bytes()
    for split in ("train", "valid"):
        assert [s["sha256"] for s in two["splits"][split]["shards"]] == [s["sha256"] for s in one["splits"][split]["shards"]]
        for key in ("stream_tokens", "sequences", "dropped_tail_tokens", "targets"):
            assert two["splits"][split][key] == one["splits"][split][key], (split, key)
    train = two["splits"]["train"]
    assert train["source_dirs"] == [str(folders / "a"), str(folders / "b")] and "source_dir" not in train
    assert [(b["id"], b["dir"]) for b in train["books"]] == [("b0000", 0), ("b0001", 0), ("b0002", 1), ("b0003", 1)]
    assert two["config"]["input_dir"] == train["source_dirs"]
    assert one["splits"]["train"]["source_dir"] == str(folders / "all")  # one folder: as before
    assert two["splits"]["valid"]["source_dirs"] == [str(folders / "valid")]
    assert json.loads((folders / "two" / "manifest.json").read_text()) == two


def test_the_command_line_takes_the_folders_as_a_list_or_the_flag_repeated(folders, built):
    """Both spellings name the build already made: the command finds it up to date."""
    common = [f"--valid_dir={folders / 'valid'}", f"--output_dir={folders / 'two'}", "--train_tokenizer_vocab=600",
              f"--tokenizer_dir={folders / 'two_bpe'}", f"--n_ctx={N_CTX}", "--shard_size=40", "--progress=false"]
    for spelling in ([f"--input_dir={folders / 'a'},{folders / 'b'}"],
                     [f"--input_dir={folders / 'a'}", f"--input_dir={folders / 'b'}"]):
        proc = run_cli("pipelines.pretrain_data", *spelling, *common)
        assert "already holds this build" in proc.stderr, proc.stderr
    proc = run_cli("pipelines.pretrain_data", f"--input_dir={folders / 'b'},{folders / 'a'}", *common, check=False)
    assert proc.returncode == 2 and "--overwrite" in proc.stderr  # another order: another corpus


def test_overlapping_folders_are_refused_naming_them(folders, tmp_path):
    (tmp_path / "a" / "more").mkdir(parents=True)
    shutil.copy(folders / "a" / "b0000.txt", tmp_path / "a" / "more" / "x.txt")
    shutil.copy(folders / "a" / "b0001.txt", tmp_path / "a" / "y.txt")
    cases = [((str(folders / "a"), str(folders / "a")), None, "also given to --input_dir"),
             ((str(tmp_path / "a"), str(tmp_path / "a" / "more")), None, "one folder is inside the other"),
             (str(tmp_path / "a"), str(tmp_path / "a" / "more"), "--input_dir .* and --valid_dir .*: one folder is inside"),
             ((str(folders / "a"), str(tmp_path / "missing")), None, "--input_dir: folder .*missing.* does not exist")]
    for inputs, valid, message in cases:
        with pytest.raises(pd.PretrainDataError, match=message):
            pd.build_pretraining_data(pd.PretrainConfig(input_dir=inputs, valid_dir=valid, output_dir=str(tmp_path / "o"),
                                                        tokenizer_dir=str(tmp_path / "t"), train_tokenizer_vocab=600,
                                                        n_ctx=N_CTX, show_progress=False))
    assert not (tmp_path / "o").exists()


def test_the_manifest_counts_the_text_of_the_windows_targets(folders, built):
    """Decoded by hand, the targets of every held-out window make the characters and bytes the manifest holds."""
    import tensorflow as tf

    from gpt_tf.text.tokenizer import GPTTokenizer

    two, _ = built
    tokenizer = GPTTokenizer.from_dir(folders / "two_bpe")
    split = two["splits"]["valid"]
    files = [str(folders / "two" / s["file"]) for s in split["shards"]]
    spec = {"input_ids": tf.io.FixedLenFeature([N_CTX + 1], tf.int64)}
    windows = np.stack([tf.io.parse_single_example(r, spec)["input_ids"].numpy()
                        for r in tf.data.TFRecordDataset(files, compression_type="GZIP")])
    text = decoded_text(tokenizer, windows[:, 1:])
    assert split["targets"] == {"tokens": windows[:, 1:].size, "chars": len(text), "bytes": len(text.encode("utf-8"))}
    assert split["targets"]["tokens"] == split["sequences"] * N_CTX
