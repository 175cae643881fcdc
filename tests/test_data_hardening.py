"""Bad data as a hostile user makes it (issue 15, items 1-4 and 9): a corrupt shard, invalid UTF-8 in a
task file, a book with a stray byte, a 10 MB line, temporary folders of a killed build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt_tf.data import common
from pipelines.books import decode_book, load_book
from tests.small_runs import ENV, ROOT, TRAIN_FLAGS, build_data, run_cli


@pytest.fixture(scope="module")
def data_dir(shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, live = root / f".data.tmp-{dead.pid}", root / f".data.tmp-{os.getppid()}"  # (the parent runs)
    for folder in (stale, live):
        (folder / "sub").mkdir(parents=True)
    out = build_data(shared_data, root)
    assert not stale.exists() and live.exists()  # item 9: a killed build's folder goes, a running one's stays
    return out


def flip_bytes(path: Path, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, min(len(data) - 8, middle + count)):  # (the last 8 bytes: gzip's CRC and size)
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------- item 1
def test_a_corrupt_shard_is_named_before_anything_is_written(data_dir, tmp_path):
    corrupt = tmp_path / "data"
    subprocess.run(["cp", "-r", str(data_dir), str(corrupt)], check=True)
    shard = sorted(corrupt.glob("train-*.tfrecord.gz"))[0]
    flip_bytes(shard)
    run_dir = tmp_path / "run"
    proc = run_cli("gpt_tf.train", *TRAIN_FLAGS, f"--data_dir={corrupt}", f"--run_dir={run_dir}", "--train_steps=4",
                   check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{shard}: corrupt: its sha256 is" in proc.stderr and "nothing was written" in proc.stderr
    assert not run_dir.exists()


def test_a_corrupt_read_names_the_shard_and_no_checkpoint_follows_it(data_dir, tmp_path):
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(data_dir), str(data)], check=True)
    run_dir = tmp_path / "run"
    first = run_cli("gpt_tf.train", *TRAIN_FLAGS, f"--data_dir={data}", f"--run_dir={run_dir}", "--train_steps=4")
    assert first.returncode == 0, first.stderr
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    shards = sorted(data.glob("train-*.tfrecord.gz"))
    for shard in shards:
        flip_bytes(shard)
    proc = run_cli("gpt_tf.train", *TRAIN_FLAGS, f"--data_dir={data}", f"--run_dir={run_dir}", "--train_steps=40",
                   "--verify_data=false", check=False)
    assert proc.returncode == 1, proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("gpt_tf.train: reading the data failed: ") and "Traceback" not in proc.stderr
    assert f"{shards[0]}: corrupt" in message and "DataLossError" in message, message
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before


# ---------------------------------------------------------------------------------------------- item 2
def test_invalid_utf8_in_task_files_names_file_and_line(tmp_path, shared_data):
    from gpt_tf.tasks import get_task
    from pipelines.finetune_data import build_task_data
    from gpt_tf.data.task_readers import read_examples

    glue = tmp_path / "SST-2"
    glue.mkdir()
    lines = (shared_data / "glue" / "SST-2" / "dev.tsv").read_bytes().split(b"\n")[:40]
    lines[7] = lines[7].replace(b" ", b" caf\xe9 ", 1)  # file line 8: a latin-1 byte in a UTF-8 file
    (glue / "dev.tsv").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError, match=rf"{glue / 'dev.tsv'}:8: invalid UTF-8: byte 0xe9 in field 1"):
        read_examples(get_task("sst2"), glue, "dev")
    examples, skipped = read_examples(get_task("sst2"), glue, "dev", skip_malformed=True)
    assert len(examples) == 38 and [s["line"] for s in skipped] == [8]
    manifest = build_task_data("sst2", glue, shared_data / "gpt1_bpe", tmp_path / "out", skip_malformed=True,
                               show_progress=False)
    assert manifest["skipped_count"] == 1 and manifest["skipped"][0]["line"] == 8
    assert manifest["skipped_by_reason"] == {"malformed": 1}

    snli = tmp_path / "snli_1.0_dev.jsonl"
    rows = [json.dumps({"sentence1": "a", "sentence2": "b", "gold_label": "neutral"}).encode()] * 3
    rows[1] = rows[1].replace(b'"a"', b'"\xff"')
    snli.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(ValueError, match=rf"{snli}:2: invalid UTF-8: byte 0xff"):
        read_examples(get_task("snli"), snli, "dev")

    race = tmp_path / "RACE" / "dev" / "high"
    race.mkdir(parents=True)
    article = json.dumps({"article": "x", "questions": ["q"], "options": [["a", "b", "c", "d"]], "answers": ["A"]},
                         indent=1).encode()
    (race / "1.txt").write_bytes(article.replace(b'"x"', b'"\xe9"'))
    _, skipped = read_examples(get_task("race"), tmp_path, "dev_high", skip_malformed=True)
    assert skipped == [{"file": str(race / "1.txt"), "line": 2, "reason": "malformed: invalid UTF-8: byte 0xe9"}]


# ---------------------------------------------------------------------------------------------- item 3
def test_a_mostly_utf8_book_stays_utf8_with_its_bad_bytes_counted(tmp_path, shared_data):
    text = "Café crème, naïve façade; déjà vu. " * 50
    stray = text.encode("utf-8") + b" a stray \x92 byte and \xff another."
    decoded = decode_book(stray)
    assert (decoded.encoding, decoded.replaced_bytes) == ("utf-8", 2)
    assert decoded.text.startswith("Café crème") and "\ufffd byte" in decoded.text  # no mojibake
    assert "2 invalid byte(s) replaced" in decoded.note
    legacy = decode_book(text.encode("cp1252") + "\u201cquoted\u201d".encode("cp1252"))
    assert legacy.encoding == "cp1252" and legacy.text.startswith("Café crème") and "read as cp1252" in legacy.note
    assert decode_book(text.encode("utf-8")).note is None

    from pipelines.pretrain_data import PretrainConfig, build_pretraining_data

    books = tmp_path / "books"
    books.mkdir()
    real = next((shared_data / "books").glob("*/b0000.txt")).read_bytes()[:40_000]
    (books / "stray.txt").write_bytes(real + text.encode("utf-8") + b"\x92")
    assert load_book(books / "stray.txt", books).encoding == "utf-8"
    manifest = build_pretraining_data(PretrainConfig(input_dir=str(books), output_dir=str(tmp_path / "out"),
                                                     tokenizer_dir=str(shared_data / "gpt1_bpe"), n_ctx=32,
                                                     valid_fraction=0.0, show_progress=False))
    (row,) = manifest["splits"]["train"]["books"]
    assert row["replaced_bytes"] == 1 and "replaced by U+FFFD" in row["encoding_note"]
    assert manifest["splits"]["train"]["replaced_bytes"] == 1


# ---------------------------------------------------------------------------------------------- item 4
def test_a_10mb_line_is_tokenized_in_bounded_memory(shared_data):
    """The book's tokens equal one encode of the text; a 10 MB line adds < 150 MB (it was 1.3 GB)."""
    script = f"""
import resource, sys
sys.path.insert(0, {str(ROOT)!r})
from gpt_tf.text.tokenizer import GPTTokenizer
from pipelines.book_stream import encode_book
tok = GPTTokenizer.from_dir({str(shared_data / 'gpt1_bpe')!r})
words = open({str(next((shared_data / 'books').glob('*/b0000.txt')))!r}, encoding='utf-8').read().split()
line = " ".join(words[i % len(words)] for i in range(100_000))
assert encode_book(tok, line, 40477).tolist() == tok.encode(line)
line = (line + " ") * (10_000_000 // len(line) + 1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = encode_book(tok, line, 40477)
print(len(line), len(ids), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
    proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    chars, tokens, grew_mb = map(int, proc.stdout.split())
    assert chars >= 10_000_000 and tokens > 1_000_000
    assert grew_mb < 150, grew_mb


def test_split_at_spaces_keeps_every_character():
    text = "ab cd " * 10 + "x" * 25 + " end"
    pieces = common.split_at_spaces(text, 8)
    assert all(len(p) <= 8 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    assert common.split_at_spaces("short", 8) == ["short"]
