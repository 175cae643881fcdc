"""Tests of the pre-training data pipeline: books reader, TFRecord builder, tf.data reader (the Shakespeare
corpus: tests/test_shakespeare.py)."""

import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipelines import books as books_lib
from pipelines import pretrain_data as pd
from gpt_tf.data import records
from tests.small_runs import ENV

ROOT = Path(__file__).resolve().parents[1]
N_CTX = 64
SHARD_SIZE = 64
MARKER_LINE = re.compile(r"\W*(\*{3}\s*(START|END) OF (THE|THIS) PROJECT GUTENBERG|\*?END\W*THE SMALL PRINT|"
                         r"\*+\s*START\W*THE SMALL PRINT)", re.I)


def has_marker_line(text):
    """Whether a line of `text` is a Gutenberg header/footer marker line."""
    return any(MARKER_LINE.match(line) for line in text.split("\n")
               if "project gutenberg" in line.lower() or "small print" in line.lower())


# ---------------------------------------------------------------- books: real Gutenberg files

@pytest.mark.parametrize("book_id,header,footer", [
    ("b0000", "start-of-project-gutenberg", "end-of-the-ebook"),  # *** START OF THIS ... ***
    ("b0001", "start-of-project-gutenberg", "end-of-project-gutenberg"),  # ***START OF THE ...***
    ("b0117", "start-of-project-gutenberg", "end-of-project-gutenberg"),  # *** START OF THE ... ***
    ("b0075", "end-the-small-print", "end-of-the-ebook"),  # 'The end of Project Gutenberg Etext of'
    ("b0119", "end-the-small-print", "end-of-the-ebook"),  # 'End of The Project Gutenberg Etext of'
    ("b0041", "small-print-version", "end-of-this-etext"),  # World Library Shakespeare
    ("b0183", "end-the-small-print", None),  # no footer at all
])
def test_strip_real_gutenberg_variants(shared_data, book_id, header, footer):
    path = next((shared_data / "books").glob(f"*/{book_id}.txt"))
    book = books_lib.load_book(path, path.parent)
    assert isinstance(book, books_lib.Book)
    assert (book.header, book.footer) == (header, footer)
    raw = books_lib.normalize_newlines(path.read_bytes().decode("utf-8"))
    raw = "\n".join(line.rstrip() for line in raw.split("\n"))
    assert not has_marker_line(book.text)
    assert "<<THIS ELECTRONIC VERSION" not in book.text and "Project Gutenberg-tm" not in book.text
    assert "\r" not in book.text and len(book.text) > 0.3 * len(raw)
    pieces = book.text.split("\n\n\n\n\n") if header == "small-print-version" else [book.text]
    assert all(piece.strip() in raw for piece in pieces)  # the body is the file's own text


def test_every_real_book_loses_its_licence(shared_data):
    seen = collections.Counter()
    for split in ("train", "valid"):
        for book in books_lib.iter_books(shared_data / "books" / split):
            assert isinstance(book, books_lib.Book), book
            assert book.header is not None, book.book_id
            assert not has_marker_line(book.text), book.book_id
            seen[book.encoding] += 1
    assert sum(seen.values()) == 409


# ---------------------------------------------------------------- books: synthetic files

GUTENBERG = ("The Project Gutenberg EBook of Tiny\r\n\r\n*** START OF THIS PROJECT GUTENBERG EBOOK TINY ***\r\n"
             "\r\nProduced by Someone\r\n\r\n\r\n{body}\r\n\r\nEnd of the Project Gutenberg EBook of Tiny\r\n"
             "*** END OF THIS PROJECT GUTENBERG EBOOK TINY ***\r\nlicence text\r\n")


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    (root / "a" / "b").mkdir(parents=True)
    (root / ".hidden").mkdir()
    files = {
        "crlf.txt": GUTENBERG.format(body="Line one.\r\nLine two.").encode("utf-8"),
        "bom.txt": b"\xef\xbb\xbfCaf\xc3\xa9 au lait.\n",
        "cp1252.txt": b"He said \x93hello\x94 \x97 and left.\r\n",
        "latin1.txt": b"Caf\xe9 cr\xe8me, na\xefve.\n",
        "latin1_undefined.txt": b"odd \x81 byte \xe9\n",
        "utf16.txt": "Grüße aus UTF-16.\n".encode("utf-16"),
        "a/b/nested.TXT": b"Deep in the folders.\n",
        "binary_nul.txt": b"PK\x03\x04\x00\x00binary",
        "binary_ctrl.txt": bytes(range(1, 9)) * 200,
        "empty.txt": b"",
        "blank.txt": b" \r\n\t\n",
        "only_licence.txt": GUTENBERG.format(body="").encode("utf-8"),
        "notes.md": b"not a book",
        ".hidden/secret.txt": b"ignored",
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / "dangling.txt").symlink_to(root / "does-not-exist")
    return root


def test_synthetic_books_decoded_and_skipped(synthetic_dir):
    found = {item.book_id: item for item in books_lib.iter_books(synthetic_dir)}
    assert list(found) == sorted(found)  # deterministic order by relative path
    books = {k: v for k, v in found.items() if isinstance(v, books_lib.Book)}
    skipped = {k: v.reason for k, v in found.items() if isinstance(v, books_lib.Skipped)}
    assert books["crlf"].text == "Line one.\nLine two." and books["crlf"].header == "start-of-project-gutenberg"
    assert (books["bom"].text, books["bom"].encoding) == ("Café au lait.", "utf-8-sig")
    assert (books["cp1252"].text, books["cp1252"].encoding) == ("He said “hello” — and left.", "cp1252")
    assert (books["latin1"].text, books["latin1"].encoding) == ("Café crème, naïve.", "latin-1")
    assert books["latin1_undefined"].encoding == "latin-1"
    assert (books["utf16"].text, books["utf16"].encoding) == ("Grüße aus UTF-16.", "utf-16")
    assert books["a/b/nested"].text == "Deep in the folders."
    assert "binary" in skipped["binary_nul"] and "NUL" in skipped["binary_nul"]
    assert "control bytes" in skipped["binary_ctrl"]
    assert skipped["empty"] == "empty file" and "whitespace" in skipped["blank"]
    assert "no text left" in skipped["only_licence"]
    assert skipped["dangling"].startswith("unreadable")
    assert not any(k.startswith(".hidden") or k == "notes" for k in found)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a chmod 000 file")
def test_unreadable_file_is_skipped(tmp_path):
    path = tmp_path / "locked.txt"
    path.write_text("secret")
    path.chmod(0)
    try:
        item = books_lib.load_book(path, tmp_path)
    finally:
        path.chmod(0o644)
    assert isinstance(item, books_lib.Skipped) and item.reason.startswith("unreadable")


# ---------------------------------------------------------------- bad input

def _cfg(tmp_path, **kw):
    base = dict(input_dir=str(tmp_path / "in"), output_dir=str(tmp_path / "out"),
                tokenizer_dir=str(tmp_path / "tok"), n_ctx=N_CTX, show_progress=False)
    return pd.PretrainConfig(**{**base, **kw})


def test_bad_input_errors_name_the_flag(tmp_path):
    with pytest.raises(pd.PretrainDataError, match="--input_dir.*does not exist"):
        pd.build_pretraining_data(_cfg(tmp_path))
    (tmp_path / "in").mkdir()
    with pytest.raises(pd.PretrainDataError, match="--input_dir.*no .txt files"):
        pd.build_pretraining_data(_cfg(tmp_path, train_tokenizer_vocab=100))
    (tmp_path / "in" / "x.txt").write_bytes(b"\x00\x01binary")
    (tmp_path / "in" / "y.txt").write_bytes(b"\x7fELF\x00\x00")
    with pytest.raises(pd.PretrainDataError, match="no usable book.*binary"):
        pd.build_pretraining_data(_cfg(tmp_path, train_tokenizer_vocab=100))
    with pytest.raises(pd.PretrainDataError, match="--n_ctx"):
        pd.build_pretraining_data(_cfg(tmp_path, n_ctx=1))
    with pytest.raises(pd.PretrainDataError, match="--valid_dir.*does not exist"):
        pd.build_pretraining_data(_cfg(tmp_path, valid_dir=str(tmp_path / "nope")))
    with pytest.raises(pd.PretrainDataError, match="--tokenizer_dir"):
        pd.build_pretraining_data(_cfg(tmp_path))
    assert not (tmp_path / "out").exists()


def test_cli_reports_error_and_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipelines.pretrain_data", f"--input_dir={tmp_path}/missing",
                           f"--output_dir={tmp_path}/out", f"--tokenizer_dir={tmp_path}/tok"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--input_dir" in proc.stderr and "missing" in proc.stderr


# ---------------------------------------------------------------- end to end on real books

@pytest.fixture(scope="module")
def built(shared_data, tmp_path_factory):
    """Six smallest real books -> BPE of 1000 tokens trained on them -> TFRecords (n_ctx 64)."""
    tmp = tmp_path_factory.mktemp("e2e")
    paths = sorted((shared_data / "books" / "train").glob("*.txt"), key=lambda p: (p.stat().st_size, p.name))[:6]
    (tmp / "in").mkdir()
    for p in paths:
        shutil.copy(p, tmp / "in" / p.name)
    cfg = pd.PretrainConfig(input_dir=str(tmp / "in"), output_dir=str(tmp / "out"), tokenizer_dir=str(tmp / "tok"),
                            n_ctx=N_CTX, valid_fraction=0.2, shard_size=SHARD_SIZE, train_tokenizer_vocab=1000,
                            show_progress=False)
    manifest = pd.build_pretraining_data(cfg)
    from gpt_tf.text.tokenizer import GPTTokenizer
    return cfg, manifest, GPTTokenizer.from_dir(cfg.tokenizer_dir)


def _records(out_dir, manifest, split):
    import tensorflow as tf
    files = [str(Path(out_dir) / s["file"]) for s in manifest["splits"][split]["shards"]]
    spec = {records.PRETRAIN_FEATURE: tf.io.FixedLenFeature([N_CTX + 1], tf.int64)}
    rows = [tf.io.parse_single_example(r, spec)[records.PRETRAIN_FEATURE].numpy()
            for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    return np.stack(rows)


def test_manifest_numbers_are_consistent(built):
    cfg, manifest, tok = built
    assert manifest["n_ctx"] == N_CTX and manifest["record"]["compression"] == "GZIP"
    assert manifest["tokenizer"]["vocab_size"] == tok.vocab_size == 1000
    for f in manifest["tokenizer"]["files"]:
        assert records.sha256_file(Path(cfg.tokenizer_dir) / f["name"]) == f["sha256"]
    assert manifest["separator"]["id"] in tok.encode("one\ntwo")
    assert set(manifest["splits"]) == {"train", "valid"}
    for split in manifest["splits"].values():
        assert split["book_tokens"] == sum(b["tokens"] for b in split["books"])
        assert split["stream_tokens"] == split["book_tokens"] + split["num_books"] - 1
        assert split["sequences"] == (split["stream_tokens"] - 1) // N_CTX
        assert split["dropped_tail_tokens"] == split["stream_tokens"] - split["sequences"] * N_CTX - 1
        assert sum(s["sequences"] for s in split["shards"]) == split["sequences"]
        assert split["num_shards"] == -(-split["sequences"] // SHARD_SIZE) == len(split["shards"])
        assert sum(split["encodings"].values()) == split["num_books"]
    assert manifest["totals"]["books"] == 6 and manifest["totals"]["skipped"] == 0
    assert manifest["totals"]["sequences"] == sum(s["sequences"] for s in manifest["splits"].values())


def test_records_are_the_books_tokens_contiguously(built):
    cfg, manifest, tok = built
    train_ids = [b["id"] for b in manifest["splits"]["train"]["books"]]
    sep = manifest["separator"]["id"]
    expected = []
    for i, book_id in enumerate(train_ids):
        book = books_lib.load_book(Path(cfg.input_dir) / f"{book_id}.txt", cfg.input_dir)
        expected += ([sep] if i else []) + tok.encode(book.text)  # whole-book encode, no blocks
    records = _records(cfg.output_dir, manifest, "train")
    assert records.shape == (manifest["splits"]["train"]["sequences"], N_CTX + 1)
    assert (records[1:, 0] == records[:-1, -1]).all()  # stride n_ctx: boundary token shared
    stream = np.concatenate([records[0], records[1:, 1:].reshape(-1)])
    np.testing.assert_array_equal(stream, np.asarray(expected[:len(stream)]))
    assert len(expected) - len(stream) == manifest["splits"]["train"]["dropped_tail_tokens"]
    assert tok.decode(records[0].tolist()).split()[:3] == tok.decode(expected[:N_CTX]).split()[:3]


def test_rebuild_is_byte_identical_and_rerun_is_a_noop(built, tmp_path):
    cfg, manifest, _ = built
    out = Path(cfg.output_dir)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = pd.build_pretraining_data(cfg)  # same config: nothing rebuilt
    assert again == manifest and mtimes == {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    cfg2 = dataclasses.replace(cfg, output_dir=str(tmp_path / "out2"), train_tokenizer_vocab=None)
    m2 = pd.build_pretraining_data(cfg2)  # tokenizer loaded from disk this time
    for name, split in manifest["splits"].items():
        for s1, s2 in zip(split["shards"], m2["splits"][name]["shards"], strict=True):
            assert (out / s1["file"]).read_bytes() == (tmp_path / "out2" / s2["file"]).read_bytes()
    with pytest.raises(pd.PretrainDataError, match="--overwrite"):
        pd.build_pretraining_data(dataclasses.replace(cfg2, shard_size=1000))
    m3 = pd.build_pretraining_data(dataclasses.replace(cfg2, shard_size=1000, overwrite=True))
    assert m3["totals"]["shards"] == 2 and m3["totals"]["sequences"] == manifest["totals"]["sequences"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


# ---------------------------------------------------------------- tf.data reader

def _rows(ds):
    return [tuple(np.concatenate([x, y[-1:]]).tolist()) for xb, yb in ds for x, y in zip(xb.numpy(), yb.numpy())]


def test_reader_shapes_and_shift(built):
    from gpt_tf.data.reader import pretraining_dataset
    cfg, manifest, _ = built
    ds = pretraining_dataset(cfg.output_dir, "train", batch_size=8, n_ctx=N_CTX, seed=3)
    inputs, targets = next(iter(ds))
    assert inputs.shape == targets.shape == (8, N_CTX) and inputs.dtype.name == "int32"
    np.testing.assert_array_equal(inputs.numpy()[:, 1:], targets.numpy()[:, :-1])
    again = next(iter(pretraining_dataset(cfg.output_dir, "train", batch_size=8, n_ctx=N_CTX, seed=3)))
    np.testing.assert_array_equal(inputs.numpy(), again[0].numpy())  # seeded: reproducible
    ordered = pretraining_dataset(cfg.output_dir, "train", 4, N_CTX, shuffle=False, repeat=False,
                                  num_parallel_reads=1)
    records = _records(cfg.output_dir, manifest, "train")
    assert _rows(ordered) == [tuple(r) for r in records[:len(records) // 4 * 4].tolist()]
    with pytest.raises(ValueError, match="n_ctx=64"):
        pretraining_dataset(cfg.output_dir, "train", batch_size=8, n_ctx=32)


@pytest.mark.parametrize("split,pipelines", [("train", 2), ("valid", 0)])
def test_reader_workers_get_disjoint_covering_shards(built, split, pipelines):
    import tensorflow as tf
    from gpt_tf.data.reader import pretraining_dataset
    cfg, manifest, _ = built
    n_files = manifest["splits"][split]["num_shards"]
    pipelines = pipelines or n_files + 1  # more pipelines than files: sharded by record
    seen = collections.Counter()
    per_worker = []
    for k in range(pipelines):
        ctx = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=k)
        rows = _rows(pretraining_dataset(cfg.output_dir, split, 1, N_CTX, seed=1, repeat=False, input_context=ctx))
        per_worker.append(set(rows))
        seen.update(rows)
    assert all(per_worker) and sum(len(w) for w in per_worker) == len(set().union(*per_worker))
    assert seen == collections.Counter(tuple(r) for r in _records(cfg.output_dir, manifest, split).tolist())


# ---------------------------------------------------------------- splits

def test_split_by_hash_is_deterministic_and_never_empty():
    books = [books_lib.Book(f"{i}.txt", f"dir/book{i}", "text", "utf-8") for i in range(10)]
    train, valid = pd.split_by_hash(books, 0.05)
    assert len(valid) >= 1 and len(train) + len(valid) == 10 and not set(train) & set(valid)
    assert {b.book_id for b in pd.split_by_hash(books[::-1], 0.05)[1]} == {b.book_id for b in valid}  # order-free
    half = pd.split_by_hash(books, 0.5)[1]
    assert {b.book_id for b in valid} <= {b.book_id for b in half}  # a threshold on one hash per book
    assert pd.split_by_hash(books, 0.0) == (books, [])
    with pytest.raises(pd.PretrainDataError, match="at least 2 books"):
        pd.split_by_hash(books[:1], 0.05)
