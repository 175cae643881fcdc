"""Helpers the tests share: the CLI as a user runs it (one-shot or as worker processes), checkpoint weights,
the small-run flags, and a small pre-training set from real books (the model hubs, offline: tests/offline_hubs.py).

Not a test module (no ``test_`` prefix), so pytest collects nothing here; every test file that needs one of
these imports it from here rather than from another test file.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The environment of the processes the tests start: this checkout first on the path, TensorFlow's INFO lines off,
# and child_site/ (its sitecustomize.py: scikit-learn and matplotlib absent, as in a runtime install; keras
# imports both at start-up when the test extras installed them: 1.9 of the 6.8 CPU-s of `import tensorflow` here).
# A process that must not see the project (TF_ONLY below) gets CHILD_SITE alone as its PYTHONPATH.
CHILD_SITE = str(ROOT / "tests" / "child_site")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), CHILD_SITE]), "TF_CPP_MIN_LOG_LEVEL": "2"}
N_CTX = 32
# Two computation paths of the same float32 math (eager calls against a traced graph, a batch against its rows, one
# model class against another built on the same layers) round differently in the last bits where TensorFlow's oneDNN
# rewrites are on (its default on AVX-512 CPUs; off on AVX2-only ones): fused kernels and other blockings change the
# order of the sums. They are compared within this tolerance: ~100x float32's rounding at the logits' magnitudes,
# far below what any real difference in the math gives. The same path run twice is compared bit for bit instead.
TWO_PATHS = {"rtol": 1e-5, "atol": 1e-6}
# The end-to-end pre-training tests' flags (tests/test_train.py, test_scale.py, test_finetune.py).
BASE_FLAGS = [
    "--model=test", "--batch_size=8", "--warmup_steps=2", "--learning_rate=1e-3", "--log_every=1",
    "--eval_batches=2", "--sample_length=8", "--seed=3", "--deterministic", "--progress=false", "--json",
]
# The hardening tests' flags (tests/test_data_hardening.py, test_run_dirs.py): fewer steps, checkpoints every 2.
TRAIN_FLAGS = ["--model=test", "--batch_size=8", "--warmup_steps=1", "--learning_rate=1e-3", "--log_every=1",
               "--eval_batches=1", "--sample_length=4", "--seed=3", "--progress=false", "--checkpoint_every=2"]


def run_cli(module: str, *args, check: bool = True, timeout: int = 300, env=None) -> subprocess.CompletedProcess:
    """``python -m module *args`` from the repo root (``env``: instead of ``ENV``); with ``check``, a non-zero exit
    fails with its output."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env or ENV, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_clis(*calls, timeout: int = 300, env=None) -> list[subprocess.CompletedProcess]:
    """Independent ``run_cli`` calls, each ``(module, *args)``, run at once (most of a small run is the
    single-threaded start-up); their results in order, each checked as ``run_cli`` checks it."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: run_cli(*call, timeout=timeout, env=env), calls))


def start(args, env=None) -> subprocess.Popen:
    """``python -m gpt_tf.train *args`` in the background (one worker of a cluster)."""
    return subprocess.Popen([sys.executable, "-m", "gpt_tf.train", *args], cwd=ROOT, env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs, timeout=240):
    """Waits for every process; returns [(returncode, stdout, stderr)]; kills the rest on a timeout."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def model_weights(run_dir, step):
    """The model variables of checkpoint ``step`` as {name: array}."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(Path(run_dir) / "checkpoints" / f"ckpt-{step}"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "seed_generator" not in n]
    assert len(names) > 10, names
    return {n: reader.get_tensor(n) for n in names}


def max_abs_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def wait_for_checkpoint(run_dir: Path, name: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Waits until the run of ``proc`` lists checkpoint ``name`` (e.g. ``ckpt-3``) in ``run_dir``, still running."""
    state = Path(run_dir) / "checkpoints" / "checkpoint"
    deadline = time.time() + timeout
    while not (state.exists() and f'"{name}"' in state.read_text()) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be stopped at {name}"


def wait_for(condition, seconds: float, what: str) -> None:
    """Polls ``condition()`` until it is true; fails naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)


def save_length_model(folder: Path, plus: int = 0) -> None:
    """A SavedModel of a tiny string model (``sentence`` -> its ``length`` + ``plus``) in ``folder``: the stand-in
    for a GPT export where a test is about the server, not the model (``plus`` tells versions apart)."""
    import tensorflow as tf

    class Length(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentence")])
        def serve(self, sentence):
            return {"length": tf.strings.length(sentence) + plus}

    module = Length()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


def spawn_server(log: Path, *flags: str) -> subprocess.Popen:
    """``python -m serving.server *flags`` on two free ports (``proc.ports``: gRPC, REST), its stderr to ``log``
    (``proc.log``); it returns at once (``server_ready`` waits for it), so several servers start side by side."""
    ports = tuple(free_ports(2))
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "serving.server", f"--port={ports[0]}",
                                 f"--rest_api_port={ports[1]}", *flags],
                                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=stderr, text=True)
    proc.ports, proc.log = ports, Path(log)
    return proc


def server_ready(proc: subprocess.Popen, timeout: float = 180.0) -> str:
    """A ``spawn_server`` process's ready line (its first stdout line), waiting at most ``timeout`` seconds;
    fails with its log's tail when it does not come."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    assert "gRPC on" in line, proc.log.read_text()[-3000:]
    return line


def start_server(log: Path, *flags: str) -> subprocess.Popen:
    """``spawn_server``, once it is serving (killed if it does not come up)."""
    proc = spawn_server(log, *flags)
    try:
        server_ready(proc)
    except BaseException:
        proc.kill()
        raise
    return proc


def stop_servers(*procs: subprocess.Popen) -> None:
    """SIGTERM to each at once (each takes a few seconds to stop); each must exit 0 within 30 s; none outlives
    this."""
    for proc in procs:
        proc.terminate()
    try:
        for proc in procs:
            assert proc.wait(timeout=30) == 0, proc.log.read_text()[-3000:]
    finally:
        for proc in procs:
            proc.kill()


def books_folder(shared_data: Path, root: Path, chars: int = 60_000) -> tuple[Path, Path]:
    """(train, valid) folders: the first ``chars`` characters of two real books and of one held-out book."""
    train, valid = root / "train", root / "valid"
    for folder, names in ((train, ("b0000", "b0001")), (valid, ("b0019",))):
        folder.mkdir(parents=True)
        for name in names:
            src = next((shared_data / "books").glob(f"*/{name}.txt"))
            (folder / src.name).write_bytes(src.read_bytes()[:chars])
    return train, valid


def build_data(shared_data: Path, root: Path, tokenizer_copy: bool = False, tokenizer: Path | None = None) -> Path:
    """TFRecords (n_ctx 32, shards of 16 records) with GPT-1's BPE (a copy of it with ``tokenizer_copy``), or
    with the BPE folder ``tokenizer``."""
    from pipelines.pretrain_data import PretrainConfig, build_pretraining_data

    tokenizer = tokenizer or shared_data / "gpt1_bpe"
    if tokenizer_copy:
        shutil.copytree(tokenizer, root / "bpe")
        tokenizer = root / "bpe"
    train, valid = books_folder(shared_data, root / "books")
    out = root / "data"
    build_pretraining_data(PretrainConfig(input_dir=str(train), valid_dir=str(valid), output_dir=str(out),
                                          tokenizer_dir=str(tokenizer), n_ctx=N_CTX, shard_size=16,
                                          show_progress=False))
    return out


# The keras-hub family's tests (tests/test_gpt1_family.py, test_gpt1_batching.py): the `test` shape on books_tiny's
# 8k BPE (fast), a few SST-2-like texts.
BOOKS_TINY = ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en"
BOOKS_TINY_BPE = BOOKS_TINY / "assets" / "tokenizer"
GPT1_TEXTS = ["a gripping , beautifully acted film .", "a dull mess", "it is what it is , no more and no less ."]


def gpt1_tokenizer():
    """``GPT1Tokenizer`` on books_tiny's BPE."""
    import gpt_tf

    return gpt_tf.GPT1Tokenizer(str(BOOKS_TINY_BPE))


def gpt1_backbone(seed=0, **overrides):
    """A ``GPT1Backbone`` of the ``test`` model size for the 8k BPE, its weights from ``seed``."""
    import keras

    import gpt_tf
    from gpt_tf.config import get_size

    keras.utils.set_random_seed(seed)
    return gpt_tf.GPT1Backbone.from_gpt_config(get_size("test", vocab_size=8000, **overrides))


def decoded_text(tokenizer, ids) -> str:
    """The text token ``ids`` encode, by hand (bits per character's definition, ``gpt_tf/text/text_units.py``): each
    token's string, ``</w>`` as the space after its word, ``<unk>`` as one character."""
    tokens = tokenizer.tokens
    text = "".join("?" if i == tokenizer.unk_id else tokens[i] for i in np.asarray(ids).reshape(-1))
    return text.replace("</w>", " ")


def gpt1_classifier(tokenizer, input_type="single", num_classes=2):
    """A ``GPT1TextClassifier`` on ``gpt1_backbone()`` with a preprocessor of ``input_type``."""
    import gpt_tf

    preprocessor = gpt_tf.GPT1TaskPreprocessor(tokenizer, input_type=input_type)
    return gpt_tf.GPT1TextClassifier(gpt1_backbone(), num_classes=num_classes, preprocessor=preprocessor)


# The preamble of a script that must run with TensorFlow alone (stock TF Serving's situation): `import
# tensorflow` imports keras when it is installed, so it is unloaded, and any import of it, of the project,
# TF Text or keras-hub is blocked before the SavedModels are loaded and run. `BLOCKED` names them.
TF_ONLY = """
import importlib.abc, json, sys
import tensorflow as tf
BLOCKED = ("keras", "tf_keras", "keras_hub", "tensorflow_text", "gpt_tf", "pipelines", "serving")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked: " + name)
for name in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
    del sys.modules[name]
sys.meta_path.insert(0, Block())
"""


# The machine's own faults (tests/test_disk_faults.py): a file system of a chosen size, a folder made read-only.
# Both are mounts (a tmpfs, a read-only bind mount), so they need root or CAP_SYS_ADMIN; where mounting is refused
# the tests that need them skip, saying so. Permissions cannot stand in: root writes through them.
@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """``folder`` as a tmpfs of ``size`` (``mount -o size=``: 40m, 200k) for the block; a real ENOSPC past it."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"a size-limited tmpfs cannot be mounted here (root or CAP_SYS_ADMIN needed): "
                    f"{(proc.stderr or proc.stdout).strip()[:200]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` read-only for the block (a read-only bind mount over itself: EROFS for root too). Files already
    open for writing stay writable, as on a real remount."""
    import pytest

    proc = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"a read-only bind mount cannot be made here (root or CAP_SYS_ADMIN needed): "
                    f"{proc.stderr.strip()[:200]}")
    try:
        for _ in range(200):  # EBUSY while a file is being opened for writing through the new mount: try again
            if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode == 0:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"{folder} could not be made read-only")
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


# The property-based tests (tests/test_fuzz_*.py): each runs a bounded number of generated examples, about a
# minute for them all; GPT_TF_FUZZ_EXAMPLES=N runs N per test instead (a longer search, by hand).
def fuzz_settings(examples: int, **more):
    """``hypothesis.settings`` of a property test: ``examples`` cases (or ``GPT_TF_FUZZ_EXAMPLES``), no deadline
    (the machine is shared), no example database written into the checkout."""
    from hypothesis import HealthCheck, settings

    count = int(os.environ.get("GPT_TF_FUZZ_EXAMPLES") or examples)
    return settings(max_examples=count, deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture], **more)
