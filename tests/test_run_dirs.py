"""Run folders and tokenizers under mistakes (issue 15, items 6-8): resuming with other
hyper-parameters, a failed command on a run folder, a tokenizer retrained under its data."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from gpt_tf.runs.files import RESUMABLE, resume_problems, write_json_atomic
from gpt_tf.runs.lock import chief_task
from tests.small_runs import ROOT, TRAIN_FLAGS, build_data, run_cli


def snapshot(run_dir):
    """{file name: bytes} of a run folder's top-level files."""
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def trained(shared_data, tmp_path_factory):
    """A 4-step run of the ``test`` model size (checkpoints at 2 and 4), and its flags."""
    root = tmp_path_factory.mktemp("runs")
    data = build_data(shared_data, root)
    flags = [*TRAIN_FLAGS, f"--data_dir={data}", f"--run_dir={root / 'run'}"]
    proc = run_cli("gpt_tf.train", *flags, "--train_steps=4")
    assert proc.returncode == 0, proc.stderr
    return root / "run", flags, data


# ---------------------------------------------------------------------------------------------- item 6
def test_resuming_with_other_hyper_parameters_is_refused_with_the_fields(trained):
    run_dir, flags, _ = trained
    before = snapshot(run_dir)
    proc = run_cli("gpt_tf.train", *flags, "--train_steps=4", "--batch_size=4", "--learning_rate=0.002", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "cannot start, nothing was written" in proc.stderr
    assert f"{run_dir}/train_config.json: batch_size is 8 in the run, 4 in this command" in proc.stderr
    assert f"{run_dir}/train_config.json: learning_rate is 0.001 in the run, 0.002 in this command" in proc.stderr
    assert "may change" in proc.stderr and "--train_steps" in proc.stderr
    assert snapshot(run_dir) == before


def test_flags_that_may_change_on_resume(trained):
    run_dir, flags, _ = trained
    proc = run_cli("gpt_tf.train", *flags, "--train_steps=6", "--log_every=2", "--checkpoint_every=3")
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stderr and "ckpt-4" in proc.stderr
    assert json.loads((run_dir / "train_config.json").read_text())["train_steps"] == 6


def test_the_fields_that_may_change_are_fields_the_cli_writes():
    from absl import flags

    from gpt_tf import train_flags, train_setup

    train_flags.define_flags()
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["gpt_tf.train"])
    try:
        written = set(train_setup.train_kwargs())  # what train_config.json holds from the flags
    finally:
        flags.FLAGS.unparse_flags()
    assert RESUMABLE["train_config.json"] < written and RESUMABLE["model_config.json"] == frozenset()


# ---------------------------------------------------------------------------------------------- item 7
def test_a_failing_command_leaves_the_run_folder_as_it_was(trained):
    run_dir, flags, _ = trained
    before = snapshot(run_dir)
    ckpts = sorted(os.listdir(run_dir / "checkpoints"))
    for mode in ("train", "eval", "generate"):
        prompt = ["--prompt=the"] if mode == "generate" else []
        proc = run_cli("gpt_tf.train", *flags, "--train_steps=6", "--model=tiny", f"--mode={mode}", *prompt, check=False)
        assert proc.returncode == 2, (mode, proc.stderr)
        assert f"{run_dir}/model_config.json: n_embd is 32 in the run" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert snapshot(run_dir) == before and sorted(os.listdir(run_dir / "checkpoints")) == ckpts


def test_data_rebuilt_in_place_is_another_run(trained, tmp_path):
    run_dir, _, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    data = json.loads((copy / "data.json").read_text())
    assert set(data) == {"data"} and len(data["data"]) == 64
    (found, hint) = resume_problems(str(copy), {"data.json": {"data": "0" * 64}})
    assert "data.json: data is" in found and "give a new --run_dir" in hint


def test_config_files_are_written_atomically(tmp_path):
    path = tmp_path / "sub" / "c.json"
    write_json_atomic(str(path), {"b": 1, "a": (1, 2)})
    write_json_atomic(str(path), {"b": 2})
    assert json.loads(path.read_text()) == {"b": 2} and os.listdir(path.parent) == ["c.json"]

    class Unserializable:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(str(path), {"x": Unserializable()})
    assert json.loads(path.read_text()) == {"b": 2} and os.listdir(path.parent) == ["c.json"]


# ---------------------------------------------------------------------------------------------- item 8
def test_a_tokenizer_retrained_under_its_data_stops_every_command(trained, shared_data, tmp_path):
    _, flags, _ = trained
    data = build_data(shared_data, tmp_path, tokenizer_copy=True)
    run_dir = tmp_path / "run"  # a run folder on that data (its JSON files are what the commands read)
    shutil.copytree(trained[0], run_dir, ignore=shutil.ignore_patterns("tb"))
    config = json.loads((run_dir / "train_config.json").read_text())
    write_json_atomic(str(run_dir / "train_config.json"), {**config, "data_dir": str(data), "run_dir": str(run_dir)})
    write_json_atomic(str(run_dir / "data.json"), {"data": json.loads((data / "manifest.json").read_text())["config_hash"]})
    merges = next((tmp_path / "bpe").glob("*.bpe"))
    lines = merges.read_text(encoding="utf-8").splitlines()
    merges.write_text("\n".join(lines[:1] + lines[2:] + lines[1:2]) + "\n", encoding="utf-8")  # "retrained"
    expected = f"{merges} is not the tokenizer {data} was built with"
    own = [f for f in flags if not f.startswith(("--data_dir", "--run_dir"))]
    for mode in ("train", "generate"):
        proc = run_cli("gpt_tf.train", *own, f"--data_dir={data}", f"--run_dir={run_dir}", f"--mode={mode}", check=False)
        assert proc.returncode == 2 and expected in proc.stderr, (mode, proc.stderr)
    proc = run_cli("gpt_tf.analysis.zero_shot", f"--run_dir={run_dir}", "--task=sst2",
                   f"--data_dir={shared_data / 'glue' / 'SST-2'}", f"--output_csv={tmp_path / 'z.csv'}", check=False)
    assert proc.returncode == 2 and f"{merges} is not the tokenizer" in proc.stderr, proc.stderr
    proc = run_cli("serving.export", f"--run_dir={run_dir}", f"--export_base={tmp_path / 'exported'}", check=False)
    assert proc.returncode == 1 and f"{merges} is not the tokenizer" in proc.stderr, proc.stderr
    assert not (tmp_path / "exported").exists() and not (tmp_path / "z.csv").exists()


# ---------------------------------------------------------------------------------------------- issue 28
def test_a_run_folder_resumes_under_any_name(trained, tmp_path):
    """The same run folder spelled otherwise (absolute, ./relative, trailing slash), or moved or copied
    elsewhere, is the same run (before: "holds checkpoints of another configuration", exit 2)."""
    run_dir, flags, _ = trained
    saved = {name: json.loads((run_dir / name).read_text()) for name in ("model_config.json", "train_config.json")}
    for spelling in (f"{run_dir}/", os.path.relpath(run_dir) + "/", f"{tmp_path}/elsewhere"):
        configs = {**saved, "train_config.json": {**saved["train_config.json"], "run_dir": spelling}}
        assert resume_problems(str(run_dir), configs) == [], spelling
    older = tmp_path / "older"  # a run saved before a model field existed (pad_vocab_to) resumes at its default
    shutil.copytree(run_dir, older)
    model = {k: v for k, v in saved["model_config.json"].items() if k != "pad_vocab_to"}
    (older / "model_config.json").write_text(json.dumps(model))
    assert resume_problems(str(older), saved) == []
    assert resume_problems(str(older), {"model_config.json": {**model, "pad_vocab_to": 128}})[0].endswith(
        "pad_vocab_to is 1 in the run, 128 in this command")
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    relative = os.path.relpath(moved, ROOT) + "/"  # the CLI runs from the repository root
    own = [f for f in flags if not f.startswith("--run_dir")]
    proc = run_cli("gpt_tf.train", *own, f"--run_dir={relative}", "--train_steps=8", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {relative}checkpoints/ckpt-" in proc.stderr, proc.stderr[-3000:]  # (step 4 or 6: tests before)
    assert (moved / "checkpoints" / "ckpt-8.index").exists() and not (run_dir / "checkpoints" / "ckpt-8.index").exists()


def test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path):
    """A latest checkpoint whose data fails its checksum: the one before it is restored, and one line says
    which was passed over and why (before: a 67-line DataLossError traceback). None intact: one clear error."""
    import tensorflow as tf

    from gpt_tf.runs.checkpoints import CheckpointError, restore_latest

    weights, step = tf.Variable(tf.zeros([1000])), tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=weights, step=step), str(tmp_path), max_to_keep=3)
    for at in (2, 4, 6):
        weights.assign(tf.fill([1000], float(at)))
        step.assign(at)
        manager.save(checkpoint_number=at)
    data = next(tmp_path.glob("ckpt-6.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the weights
    data.write_bytes(bytes(raw))
    logs = []
    fresh = tf.train.CheckpointManager(tf.train.Checkpoint(w=weights, step=step), str(tmp_path), max_to_keep=3)
    assert restore_latest(fresh, step, logs.append) == 4 and float(weights[0]) == 4.0
    assert len(logs) == 1 and "\n" not in logs[0], logs
    assert f"cannot read {tmp_path}/ckpt-6 (DataLossError" in logs[0] and f"resumed from {tmp_path}/ckpt-4" in logs[0]
    for at in (2, 4):
        next(tmp_path.glob(f"ckpt-{at}.data-*")).write_bytes(b"")
    with pytest.raises(CheckpointError, match="no checkpoint of .* can be read: .*ckpt-6 .*ckpt-4 .*ckpt-2"):
        restore_latest(fresh, step, logs.append)


HOLD_LOCK = "import sys, time; from gpt_tf.runs.lock import lock_run_dir; h = lock_run_dir(sys.argv[1]); print('locked', flush=True); time.sleep(300)"


def test_a_second_trainer_on_a_locked_run_folder_stops_with_status_2(trained):
    """A process holds the run folder's lock (as a running trainer does): a trainer on the folder exits 2
    naming the holder and writes nothing (before: both trained, one resuming from the other's checkpoints);
    after the holder is killed with -9 the lock is free again."""
    import signal
    import subprocess
    import sys

    from gpt_tf.runs.lock import RunDirLocked, lock_run_dir
    from tests.small_runs import ENV

    run_dir, flags, _ = trained
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before, ckpts = snapshot(run_dir), sorted(os.listdir(run_dir / "checkpoints"))
        proc = run_cli("gpt_tf.train", *flags, "--train_steps=6", check=False)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert f"{run_dir} is in use by another trainer (pid {holder.pid} on" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert snapshot(run_dir) == before and sorted(os.listdir(run_dir / "checkpoints")) == ckpts
        with pytest.raises(RunDirLocked):
            lock_run_dir(str(run_dir))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock_run_dir(str(run_dir)).close()  # released by the kernel with the killed process


def test_the_chief_is_found_from_the_flags_or_tf_config():
    """The process that locks and writes the run folder: worker 0 of --workers, else TF_CONFIG's chief (or
    worker 0 of a cluster without one); a single process without TF_CONFIG, or with one TensorFlow will reject."""
    assert chief_task(["a:1", "b:2"], 0, {}) and not chief_task(["a:1", "b:2"], 1, {})
    assert chief_task([], 0, {})
    assert chief_task([], 0, {"TF_CONFIG": "not json"})
    cluster = {"worker": ["a:1", "b:2"]}

    def tf_config(kind, index, **more):
        return {"TF_CONFIG": json.dumps({"cluster": {**cluster, **more}, "task": {"type": kind, "index": index}})}

    assert chief_task([], 0, tf_config("worker", 0)) and not chief_task([], 0, tf_config("worker", 1))
    assert chief_task([], 0, tf_config("chief", 0, chief=["c:3"]))
    assert not chief_task([], 0, tf_config("worker", 0, chief=["c:3"]))  # a cluster with a chief: worker 0 is not it
    assert not chief_task([], 0, tf_config("evaluator", 0))
