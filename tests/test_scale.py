"""Scaling out: multi-worker training, preemption (SIGTERM) and resume, XLA, per-worker data shards.

The CLI runs are subprocesses of ``python -m gpt_tf.train`` on the ``test`` model size, over TFRecords
built from three real Gutenberg books in several shards (so that each worker reads its own files).
Reference runs are computed in this process with ``Pretrainer``, the loop the CLI drives.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.small_runs import BASE_FLAGS, ENV, ROOT, finish, free_ports, max_abs_diff, model_weights, start

STEPS = 30
FLAGS = [*BASE_FLAGS, "--eval_batches=1", f"--train_steps={STEPS}", "--checkpoint_every=5", "--keep_checkpoints=2"]
PREEMPTED = 143


@pytest.fixture(scope="module")
def data_dir(shared_data, tmp_path_factory):
    """3 train books in shards of 64 sequences of 32+1 tokens, 1 held-out book; a 500-token BPE trained on them."""
    from pipelines.pretrain_data import PretrainConfig, build_pretraining_data

    root = tmp_path_factory.mktemp("scale_data")
    index = [line.split("\t") for line in (shared_data / "books" / "index.tsv").read_text().splitlines()[1:]]
    smallest = sorted((int(row[4]), row[0], row[1]) for row in index)
    for split, count in (("train", 3), ("valid", 1)):
        (root / split).mkdir()
        for _, book_id, book_split in [r for r in smallest if r[2] == split][:count]:
            src = shared_data / "books" / book_split / f"{book_id}.txt"
            (root / split / src.name).write_bytes(src.read_bytes())
    out = root / "tfrecords"
    build_pretraining_data(PretrainConfig(
        input_dir=str(root / "train"), valid_dir=str(root / "valid"), output_dir=str(out),
        tokenizer_dir=str(root / "bpe"), n_ctx=32, shard_size=64, train_tokenizer_vocab=500, show_progress=False))
    assert len(json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]) >= 2
    return out


def reference_run(data_dir, run_dir, flags, pipelines=1, **overrides):
    """The final model weights of an in-process default-strategy run of ``flags``.

    With ``pipelines`` = k > 1, each global batch is the concatenation of the next batch of each of
    k input pipelines reading their own shard of the data: what k workers read between them.
    """
    import tensorflow as tf

    from gpt_tf.config import get_size
    from gpt_tf.text.tokenizer import GPTTokenizer
    from gpt_tf.training.lm_objective import Pretrainer, TrainConfig
    from gpt_tf.data.reader import as_model_inputs, pretraining_dataset

    value = {f.split("=", 1)[0][2:]: f.split("=", 1)[1] for f in flags if "=" in f}
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    dropout = float(value.get("dropout", 0.1))
    model_config = get_size(value["model"], vocab_size=GPTTokenizer.from_dir(manifest["tokenizer"]["dir"]).vocab_size,
                              n_ctx=int(manifest["n_ctx"]), embd_pdrop=dropout, attn_pdrop=dropout, resid_pdrop=dropout)
    config = TrainConfig(
        data_dir=str(data_dir), run_dir=str(run_dir), batch_size=int(value["batch_size"]),
        train_steps=int(value["train_steps"]), learning_rate=float(value["learning_rate"]),
        warmup_steps=int(value["warmup_steps"]), seed=int(value["seed"]), checkpoint_every=int(value["train_steps"]),
        **overrides)
    trainer = Pretrainer(model_config, config, tf.distribute.get_strategy(), log=lambda message: None)
    if pipelines > 1:
        shards = [
            pretraining_dataset(data_dir, "train", config.batch_size // pipelines, model_config.n_ctx, seed=config.seed,
                                input_context=tf.distribute.InputContext(pipelines, k, pipelines))
            for k in range(pipelines)
        ]
        joined = tf.data.Dataset.zip(tuple(shards)).map(lambda *b: tuple(tf.concat(parts, 0) for parts in zip(*b)))
        joined = as_model_inputs(joined)  # the language model's inputs, as the trainer's own datasets give them
        trainer._distributed_dataset = lambda *args, **kwargs: joined
    trainer.train()
    return model_weights(run_dir, config.train_steps)


def sigterm_after(path, proc, others=()):
    """Sends SIGTERM to ``proc`` as soon as ``path`` exists (the run is mid-way)."""
    deadline = time.time() + 240
    while not path.exists() and time.time() < deadline and all(p.poll() is None for p in (proc, *others)):
        time.sleep(0.02)
    assert proc.poll() is None and path.exists(), "the run ended or stalled before it could be preempted"
    proc.send_signal(signal.SIGTERM)


def preempted_step(result):
    code, _, err = result
    assert code == PREEMPTED, (code, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    line = next(x for x in err.splitlines() if x.startswith("preempted (SIGTERM): saved step "))
    return int(line.split("saved step ")[1].split()[0])


def test_sigterm_checkpoints_the_step_reached_and_the_same_command_resumes_it(data_dir, tmp_path):
    """Default strategy, dropout on: SIGTERM mid-run, re-run the command; weights equal an uninterrupted run."""
    run_dir = tmp_path / "run"
    args = [*FLAGS, f"--data_dir={data_dir}", f"--run_dir={run_dir}"]
    proc = start(args)
    sigterm_after(run_dir / "checkpoints" / "ckpt-5.index", proc)
    step = preempted_step(finish([proc])[0])
    assert 5 <= step < STEPS
    assert (run_dir / "checkpoints" / f"ckpt-{step}.index").exists()
    assert not (run_dir / "checkpoints" / f"ckpt-{step + 1}.index").exists()

    code, out, err = finish([start(args)])[0]
    assert code == 0, err[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'ckpt-{step}'} at step {step}" in err
    assert json.loads(out.splitlines()[-1])["step"] == STEPS
    reference = reference_run(data_dir, tmp_path / "reference", args)
    assert max_abs_diff(reference, model_weights(run_dir, STEPS)) < 1e-5


def test_two_workers_preempted_and_resumed_equal_one_worker_on_the_global_batch(data_dir, tmp_path):
    """MWMS on 127.0.0.1, grad accumulation 2: SIGTERM to one worker stops both at the same step;
    the resumed pair ends with identical weights on both workers, equal to one process training on
    the concatenation of the two workers' shards; only the chief writes into the run dir."""
    run_dir, scratch = tmp_path / "run", tmp_path / "scratch"
    scratch.mkdir()
    env = {**ENV, "TMPDIR": str(scratch)}  # where the non-chief worker keeps its checkpoint copy
    workers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    args = [*FLAGS, "--dropout=0", "--grad_accum_steps=2", f"--data_dir={data_dir}", f"--run_dir={run_dir}",
            "--strategy=multi_worker", f"--workers={workers}"]

    chief, other = (start([*args, f"--worker_index={i}"], env) for i in range(2))
    sigterm_after(run_dir / "checkpoints" / "ckpt-5.index", other, [chief])
    steps = [preempted_step(r) for r in finish([chief, other])]
    assert steps[0] == steps[1] and 5 <= steps[0] < STEPS, steps
    assert (run_dir / "checkpoints" / f"ckpt-{steps[0]}.index").exists()

    results = finish([start([*args, f"--worker_index={i}"], env) for i in range(2)])
    for code, _, err in results:
        assert code == 0, err[-3000:]
        assert f"at step {steps[0]}" in err
    finals = [json.loads(out.splitlines()[-1]) for _, out, _ in results]
    assert finals[0]["step"] == finals[1]["step"] == STEPS
    assert finals[0]["weights_sha256"] == finals[1]["weights_sha256"]

    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "checkpoints", "data.json", "model_config.json",
                                                         "speed_choices.json", "tb",
                                                         "train_config.json"]
    assert len(list((run_dir / "tb").iterdir())) == 2  # the chief's event files: first run and resumed run
    assert not list(scratch.glob("gpt_tf_worker*")), "the non-chief worker left its scratch checkpoints"
    reference = reference_run(data_dir, tmp_path / "reference", args, pipelines=2)
    assert max_abs_diff(reference, model_weights(run_dir, STEPS)) < 1e-5


def newest_listed(run_dir: Path) -> int:
    """The step of the newest checkpoint a run's state file lists (0: none)."""
    state = run_dir / "checkpoints" / "checkpoint"
    steps = [int(s) for s in re.findall(r'"ckpt-(\d+)"', state.read_text())] if state.exists() else []
    return max(steps, default=0)


def kill_9_once_past(step: int, run_dir: Path, victim, survivor):
    """SIGKILLs ``victim`` once the run lists a checkpoint past ``step``; the survivor's (code, stderr, seconds
    it took to stop after the kill)."""
    deadline = time.monotonic() + 240
    while newest_listed(run_dir) <= step:
        assert victim.poll() is None and survivor.poll() is None and time.monotonic() < deadline, "the run stalled"
        time.sleep(0.02)
    victim.kill()
    victim.wait()
    killed_at = time.monotonic()
    code, _, err = finish([survivor], timeout=120)[0]
    return code, err, time.monotonic() - killed_at


def test_a_worker_killed_mid_run_stops_the_other_and_both_restarted_resume_bit_for_bit(data_dir, tmp_path):
    """MWMS on 127.0.0.1: worker 1 killed with -9 mid-run, then (after both are restarted) the chief. Each time
    the other worker stops within seconds (TensorFlow's coordination service: heartbeats, or the chief's
    address refusing) with one line naming the lost worker and the checkpoint to resume from, never a hang
    or a traceback; restarted once more, the pair ends with the weights of a pair never interrupted."""
    ports = free_ports(2)
    workers = ",".join(f"127.0.0.1:{p}" for p in ports)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**ENV, "TMPDIR": str(scratch)}

    def pair(run_dir):
        args = [*FLAGS, "--dropout=0", f"--data_dir={data_dir}", f"--run_dir={run_dir}", "--strategy=multi_worker",
                f"--workers={workers}"]
        return [start([*args, f"--worker_index={i}"], env) for i in range(2)]

    straight = tmp_path / "straight"
    assert [code for code, _, _ in finish(pair(straight))] == [0, 0]

    run_dir = tmp_path / "run"
    for victim, lost in ((1, "worker 1"), (0, "worker 0")):
        procs = pair(run_dir)
        code, err, seconds = kill_9_once_past(newest_listed(run_dir), run_dir, procs[victim], procs[1 - victim])
        assert code == 1 and "Traceback" not in err, err[-3000:]
        line = err.strip().splitlines()[-1]
        step = newest_listed(run_dir)
        assert line == (f"gpt_tf.train: the cluster lost {lost} (127.0.0.1:{ports[victim]}): it stopped answering, "
                        "and TensorFlow aborted this worker's "
                        f"collectives; training stopped, the run holds its checkpoint at step {step} "
                        f"({run_dir}/checkpoints/ckpt-{step}): restart every worker with the same command to resume "
                        "from it"), line
        assert 0 < step < STEPS and seconds < 60, (step, seconds)
    results = finish(pair(run_dir))
    for code, _, err in results:
        assert code == 0 and f"at step {step}" in err, err[-3000:]
    assert max_abs_diff(model_weights(straight, STEPS), model_weights(run_dir, STEPS)) == 0.0
    assert not list(scratch.glob("gpt_tf_worker*")), "the killed worker's scratch checkpoints were left"


def test_jit_compile_and_accumulation_give_the_full_batch_update(data_dir, tmp_path):
    flags = [*FLAGS, "--dropout=0", "--train_steps=3"]
    plain = reference_run(data_dir, tmp_path / "plain", flags)
    compiled = reference_run(data_dir, tmp_path / "xla", flags, jit_compile=True, grad_accum_steps=2)
    assert max_abs_diff(plain, compiled) < 1e-5  # XLA sums in its own order: equal up to rounding


@pytest.mark.parametrize("pipelines", [1, 2, 3, 7])  # 7 > files: sharded by record
def test_every_input_pipeline_yields_the_counted_batches(data_dir, pipelines):
    """Multi-worker evaluation takes ``batches_per_pipeline`` batches on every worker: each must have them."""
    import tensorflow as tf

    from gpt_tf.data.reader import batches_per_pipeline, pretraining_dataset

    counted = batches_per_pipeline(data_dir, "valid", 4, pipelines)
    actual = [
        sum(1 for _ in pretraining_dataset(data_dir, "valid", 4, 32, shuffle=False, repeat=False,
                                           input_context=tf.distribute.InputContext(pipelines, k, pipelines)))
        for k in range(pipelines)
    ]
    assert counted == min(actual) > 0, (counted, actual)


def test_the_cluster_resolver_names_the_cluster_and_this_worker():
    """--workers is the cluster (no TF_CONFIG written): a resolver TensorFlow's MultiWorkerMirroredStrategy takes."""
    from gpt_tf.strategy import cluster_resolver

    resolver = cluster_resolver(["a:1", "b:2"], 1)
    assert resolver.cluster_spec().as_dict() == {"worker": ["a:1", "b:2"]}
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    with pytest.raises(ValueError, match="not in"):
        cluster_resolver(["a:1"], 1)
    with pytest.raises(ValueError, match="host:port"):
        cluster_resolver(["a"], 0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--strategy=multi_worker"], "needs the cluster"),
        (["--workers=127.0.0.1:1,127.0.0.1:2"], "only makes sense with --strategy=multi_worker"),
        (["--strategy=multi_worker", "--workers=127.0.0.1:1", "--worker_index=1"], "--worker_index=1"),
    ],
)
def test_bad_cluster_flags_fail_fast(args, message):
    proc = subprocess.run([sys.executable, "-m", "gpt_tf.train", "--data_dir=/tmp", "--run_dir=/tmp/x", *args],
                          cwd=ROOT, env={k: v for k, v in ENV.items() if k != "TF_CONFIG"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_stop_request_turns_sigterm_into_a_flag():
    from gpt_tf.training.preemption import StopRequest

    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested
    assert signal.getsignal(signal.SIGTERM) is before
