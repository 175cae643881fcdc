"""The pre-training CLI end to end, on real books: resume after kill -9, strategies, accumulation, eval, bad flags.

Each run is a subprocess of ``python -m gpt_tf.train`` (as a user runs it), on the ``test`` model size
over TFRecords built from three real Gutenberg books with a small BPE trained on them (in this process, by
the function behind ``python -m pipelines.pretrain_data``, whose command line test_torch_pretrain.py and
the walk-through run).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gpt_tf.speed import choices
from gpt_tf.speed.choices import SpeedChoices
from pipelines.pretrain_data import PretrainConfig, build_pretraining_data
from tests.small_runs import BASE_FLAGS, ENV, ROOT, decoded_text, max_abs_diff, model_weights, run_cli, \
    wait_for_checkpoint

THIS_MACHINES = choices.environment(ENV).apply(SpeedChoices())  # the suite's runs: GPT_TF_AUTOTUNE=0


@pytest.fixture(scope="module")
def data_dir(shared_data, tmp_path_factory):
    books = tmp_path_factory.mktemp("books")
    index = [line.split("\t") for line in (shared_data / "books" / "index.tsv").read_text().splitlines()[1:]]
    smallest = sorted((int(row[4]), row[0], row[1]) for row in index)
    for split, count in (("train", 3), ("valid", 1)):
        (books / split).mkdir()
        for _, book_id, book_split in [r for r in smallest if r[2] == split][:count]:
            src = shared_data / "books" / book_split / f"{book_id}.txt"
            (books / split / src.name).write_bytes(src.read_bytes())
    out = tmp_path_factory.mktemp("data") / "tfrecords"
    build_pretraining_data(PretrainConfig(input_dir=str(books / "train"), valid_dir=str(books / "valid"),
                                          output_dir=str(out), tokenizer_dir=str(out.parent / "bpe"),
                                          train_tokenizer_vocab=500, n_ctx=32, show_progress=False))
    return out


@pytest.fixture(scope="module")
def straight_run(data_dir, tmp_path_factory):
    """An uninterrupted 60-step run with dropout on; checkpoints every 20 steps."""
    run_dir = tmp_path_factory.mktemp("straight")
    flags = [*BASE_FLAGS, f"--data_dir={data_dir}", "--train_steps=60", "--checkpoint_every=20"]
    proc = run_cli("gpt_tf.train", *flags, f"--run_dir={run_dir}")
    return run_dir, flags, proc


def test_training_lowers_loss_and_writes_everything(straight_run):
    run_dir, _, proc = straight_run
    losses = [float(x) for x in _scalars(run_dir / "tb", "train/loss")]
    assert len(losses) == 60
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 0.3, losses
    tags = _tags(run_dir / "tb")
    for tag in ("train/perplexity", "train/learning_rate", "train/tokens_per_sec", "train/grad_norm",
                "valid/perplexity", "valid/bits_per_char", "valid/bits_per_byte", "samples/text"):
        assert tag in tags, (tag, tags)
    assert json.loads((run_dir / "model_config.json").read_text())["n_layer"] == 2
    assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 60
    # The choices it trained under (the suite's: nothing measured, the defaults and what ENV sets by hand), in one line
    assert SpeedChoices.load(str(run_dir / "speed_choices.json")) == THIS_MACHINES
    assert sum(line.startswith("speed choices (auto, nothing measured: GPT_TF_AUTOTUNE=0): ")
               for line in proc.stderr.splitlines()) == 1, proc.stderr


def test_kill_9_then_same_command_resumes_to_identical_weights(straight_run):
    run_dir, flags, _ = straight_run
    killed_dir = run_dir.parent / "killed"
    cmd = [sys.executable, "-m", "gpt_tf.train", *flags, f"--run_dir={killed_dir}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Wait for the manager's state file to list ckpt-20, not for ckpt-20.index: the index is written
    # before the state file, and a kill between the two leaves nothing to resume from.
    wait_for_checkpoint(killed_dir, "ckpt-20", proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed_dir / "checkpoints" / "ckpt-60.index").exists()
    # Another machine's choices in the folder: the machine's own, never compared, rewritten by the resumed command
    other = THIS_MACHINES.replace(fused_kernels=not THIS_MACHINES.fused_kernels, padded_grads=("*",), onednn=True)
    (killed_dir / "speed_choices.json").write_text(json.dumps(other.to_dict()))
    resumed = run_cli("gpt_tf.train", *flags, f"--run_dir={killed_dir}")
    assert "resumed from" in resumed.stderr
    assert SpeedChoices.load(str(killed_dir / "speed_choices.json")) == THIS_MACHINES
    # Bit for bit on every CPU kind: resuming is the point. --deterministic fixes TensorFlow's op order, and both runs
    # execute the same graphs with the same settings on the same machine, so they round alike in either oneDNN mode.
    assert max_abs_diff(model_weights(run_dir, 60), model_weights(killed_dir, 60)) == 0.0


@pytest.fixture(scope="module")
def full_batch(data_dir, tmp_path_factory):
    """The default strategy's 6 full-batch updates (dropout off: replicas draw their own masks, so only the
    deterministic computation can match): its flags and final weights, one run for both comparisons below."""
    flags = [*BASE_FLAGS, f"--data_dir={data_dir}", "--train_steps=6", "--checkpoint_every=6", "--dropout=0"]
    run_dir = tmp_path_factory.mktemp("full_batch")
    run_cli("gpt_tf.train", *flags, f"--run_dir={run_dir}")
    return flags, model_weights(run_dir, 6)


@pytest.mark.parametrize("extra", [["--strategy=mirrored", "--num_cpu_devices=2"], ["--grad_accum_steps=4"]],
                         ids=["mirrored_2_cpus", "grad_accum_4"])
def test_same_update_as_default_strategy_full_batch(full_batch, tmp_path, extra):
    flags, ref = full_batch
    run_cli("gpt_tf.train", *flags, *extra, f"--run_dir={tmp_path / 'other'}")
    assert max_abs_diff(ref, model_weights(tmp_path / "other", 6)) < 1e-5


def test_eval_and_generate_modes(straight_run, data_dir):
    run_dir, flags, _ = straight_run
    result = json.loads(run_cli("gpt_tf.train", *flags, f"--run_dir={run_dir}", "--mode=eval").stdout.splitlines()[-1])
    assert result["step"] == 60 and result["tokens"] > 0
    assert 1.0 < result["perplexity"] < result["unigram_perplexity"]
    assert json.loads((run_dir / "eval_step60.json").read_text()) == result
    # bits per character and per byte: the loss summed over the evaluated targets, over their text decoded by hand
    from gpt_tf.data.reader import pretraining_dataset
    from gpt_tf.text.tokenizer import GPTTokenizer

    tokenizer = GPTTokenizer.from_dir(data_dir.parent / "bpe")
    batches = pretraining_dataset(str(data_dir), "valid", 8, 32, shuffle=False, repeat=False)
    targets = np.concatenate([y.numpy().reshape(-1) for _, y in batches.take(result["tokens"] // (8 * 32))])
    assert len(targets) == result["tokens"]
    text = decoded_text(tokenizer, targets)
    assert (result["chars"], result["bytes"]) == (len(text), len(text.encode("utf-8")))
    bits = result["loss"] * result["tokens"] / np.log(2)
    assert result["bits_per_char"] == pytest.approx(bits / len(text), rel=1e-9)
    assert result["bits_per_byte"] == pytest.approx(bits / len(text.encode("utf-8")), rel=1e-9)
    out = run_cli("gpt_tf.train", *flags, f"--run_dir={run_dir}", "--mode=generate", "--prompt=the",
                  "--temperature=1", "--sample_length=16").stdout
    text = out.split("run dir", 1)[1].split("\n", 1)[1]  # after the model line
    assert text.startswith("the ") and len(re.findall(r"\w+", text)) >= 4, text
    # greedy, past the context (32): the cache starts again from the last half-context; KERAS_BACKEND=jax in the
    # environment: the command takes TensorFlow all the same, and says so in one line (the same graph: bit for bit)
    greedy = [*flags, f"--run_dir={run_dir}", "--mode=generate", "--prompt=the", "--temperature=0", "--sample_length=40"]
    plain = run_cli("gpt_tf.train", *greedy)
    asked = subprocess.run([sys.executable, "-m", "gpt_tf.train", *greedy], cwd=ROOT, capture_output=True, text=True,
                           env={**ENV, "KERAS_BACKEND": "jax"}, timeout=300, check=True)
    sampled = plain.stdout.split("run dir", 1)[1].split("\n", 1)[1]
    assert sampled.startswith("the") and asked.stdout.split("run dir", 1)[1].split("\n", 1)[1] == sampled
    assert "gpt_tf.train: runs on TensorFlow" in asked.stderr and "KERAS_BACKEND=jax" in asked.stderr, asked.stderr
    int8 = run_cli("gpt_tf.train", *greedy, "--weights=int8").stdout  # the weights in 1 byte: a sample all the same
    assert int8.split("run dir", 1)[1].split("\n", 1)[1].startswith("the"), int8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--flagfile=configs/does_not_exist.flags"], "does_not_exist.flags"),
        (["--run_dir=/tmp/x"], "--data_dir is required"),
        (["--data_dir=/nonexistent", "--run_dir=/tmp/x"], "has no manifest.json"),
        (["--data_dir=/tmp", "--run_dir=/tmp/x", "--batch_size=6", "--grad_accum_steps=4"], "not divisible"),
        (["--data_dir=/tmp", "--run_dir=/tmp/x", "--warmup_steps=10", "--train_steps=5"], "--warmup_steps=10"),
        (["--data_dir=/tmp", "--run_dir=/tmp/x", "--num_cpu_devices=2"], "--strategy=mirrored"),
        (["--data_dir=/tmp", "--run_dir=/tmp/x", "--strategy=tpu"], "needs --tpu"),
        (["--data_dir=/tmp", "--run_dir=/tmp/x", "--strategy=mirrored", "--jit_compile"], "--jit_compile compiles"),
        (["--data_dir=/tmp", "--run_dir=/tmp/nope", "--mode=eval"], "no checkpoints"),
        (["--data_dir=/tmp", "--run_dir=/tmp/x", "--speed=fastest"], "--speed=fastest: neither auto, default nor"),
    ],
)
def test_bad_flags_fail_fast_with_a_clear_message(args, message):
    start = time.time()
    proc = run_cli("gpt_tf.train", *args, check=False, timeout=60)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert time.time() - start < 20  # before TensorFlow is even imported


def _events(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def _tags(tb_dir):
    return set(_events(tb_dir).Tags()["tensors"])


def _scalars(tb_dir, tag):
    import tensorflow as tf

    return [float(tf.make_ndarray(e.tensor_proto)) for e in _events(tb_dir).Tensors(tag)]


def test_a_train_budget_cuts_the_updates_to_what_fits_but_keeps_the_floor(data_dir, tmp_path):
    """--train_budget_minutes (the demo's): a budget no step fits in leaves --min_train_steps updates, said in a
    line; --train_steps still caps the floor (the walk-through test runs the demo with --train_steps=4)."""
    flags = [*BASE_FLAGS, f"--data_dir={data_dir}", "--train_steps=40", "--warmup_steps=2",
             "--train_budget_minutes=0.00001", "--min_train_steps=5"]
    done = run_cli("gpt_tf.train", *flags, f"--run_dir={tmp_path / 'run'}")
    assert re.search(r"train budget 1e-05 min: \d+ ms per \d+x32 update measured now, 0 fit -> 5 updates", done.stderr)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("ckpt-5*"))
    assert not list((tmp_path / "run" / "checkpoints").glob("ckpt-40*"))
