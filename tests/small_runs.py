"""Helpers the hardening tests share: a small pre-training set from real books, the CLI as a user runs it.

Not a test module (no ``test_`` prefix): ``tests/test_data_hardening.py`` and
``tests/test_run_dirs.py`` import it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
N_CTX = 32
TRAIN_FLAGS = ["--model=test", "--batch_size=8", "--warmup_steps=1", "--learning_rate=1e-3", "--log_every=1",
               "--eval_batches=1", "--sample_length=4", "--seed=3", "--progress=false", "--checkpoint_every=2"]


def run_cli(module: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def books_folder(shared_data: Path, root: Path, chars: int = 60_000) -> tuple[Path, Path]:
    """(train, valid) folders: the first ``chars`` characters of two real books and of one held-out book."""
    train, valid = root / "train", root / "valid"
    for folder, names in ((train, ("b0000", "b0001")), (valid, ("b0019",))):
        folder.mkdir(parents=True)
        for name in names:
            src = next((shared_data / "books").glob(f"*/{name}.txt"))
            (folder / src.name).write_bytes(src.read_bytes()[:chars])
    return train, valid


def build_data(shared_data: Path, root: Path, tokenizer_copy: bool = False) -> Path:
    """TFRecords (n_ctx 32, shards of 16 records) with GPT-1's BPE (a copy of it with ``tokenizer_copy``)."""
    from pipelines.pretrain_data import PretrainConfig, build_pretraining_data

    tokenizer = shared_data / "gpt1_bpe"
    if tokenizer_copy:
        shutil.copytree(tokenizer, root / "bpe")
        tokenizer = root / "bpe"
    train, valid = books_folder(shared_data, root / "books")
    out = root / "data"
    build_pretraining_data(PretrainConfig(input_dir=str(train), valid_dir=str(valid), output_dir=str(out),
                                          tokenizer_dir=str(tokenizer), n_ctx=N_CTX, shard_size=16,
                                          show_progress=False))
    return out
