"""Fine-tuning on the one training loop: SIGTERM and kill -9 mid-epoch, and kill -9 at an epoch's end (the
length-bucketed batches resumed at the next epoch), resume exactly; accumulation and two mirrored replicas
equal the full batch on one device; a flag of the other kind of run is rejected by name.

Each run is a subprocess of ``python -m gpt_tf.train --task=...`` on the ``test`` model size over small
slices of the real SST-2 and STS-B files (GPT-1's BPE).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.small_runs import ENV, ROOT, max_abs_diff, model_weights, run_cli, wait_for_checkpoint

PREEMPTED = 143
# SST-2, 64 records in batches of 8: 8 updates an epoch, 24 in all; a checkpoint every 3 lands mid-epoch.
FLAGS = ["--model=test", "--n_ctx=64", "--batch_size=8", "--epochs=3", "--seed=2", "--log_every=1",
         "--progress=false", "--json", "--deterministic", "--learning_rate=1e-3", "--checkpoint_every=3"]


@pytest.fixture(scope="module")
def built(shared_data, tmp_path_factory):
    from pipelines import finetune_data as fd

    out = tmp_path_factory.mktemp("loop_tasks")
    for task, folder in (("sst2", "glue/SST-2"), ("stsb", "glue/STS-B")):
        fd.build_task_data(task, shared_data / folder, shared_data / "gpt1_bpe", out / task, show_progress=False,
                           max_examples=64 if task == "sst2" else 40)
    return out


@pytest.fixture(scope="module")
def straight(built, tmp_path_factory):
    """An uninterrupted run (dropout on); its flags."""
    run_dir = tmp_path_factory.mktemp("straight")
    flags = [*FLAGS, "--task=sst2", f"--data_dir={built / 'sst2'}"]
    run_cli("gpt_tf.train", *flags, f"--run_dir={run_dir}")
    return run_dir, flags


def test_sigterm_saves_exits_143_and_the_same_command_resumes_to_the_same_weights(straight, tmp_path):
    run_dir, flags = straight
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "gpt_tf.train", *flags, f"--run_dir={stopped}"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(stopped, "ckpt-3", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == PREEMPTED, err[-3000:]
    line = next(x for x in err.splitlines() if x.startswith("preempted (SIGTERM): saved step "))
    step = int(line.split("saved step ")[1].split()[0])
    assert 3 <= step < 24 and (stopped / "checkpoints" / f"ckpt-{step}.index").exists()
    resumed = run_cli("gpt_tf.train", *flags, f"--run_dir={stopped}")
    assert f"at step {step}" in resumed.stderr
    # Bit for bit on every CPU kind: resuming is the point. --deterministic fixes TensorFlow's op order, and both runs
    # execute the same graphs with the same settings on the same machine, so they round alike in either oneDNN mode.
    assert max_abs_diff(model_weights(run_dir, 24), model_weights(stopped, 24)) == 0.0


def _kill_9_at_then_resume(run_dir, flags, killed, checkpoint):
    """Trains into ``killed``, kills it (SIGKILL) once ``checkpoint`` is listed, resumes it: its final weights
    must equal the straight run's in ``run_dir`` bit for bit."""
    proc = subprocess.Popen([sys.executable, "-m", "gpt_tf.train", *flags, f"--run_dir={killed}"], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_checkpoint(killed, checkpoint, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "checkpoints" / "ckpt-24.index").exists()
    assert "resumed from" in run_cli("gpt_tf.train", *flags, f"--run_dir={killed}").stderr
    assert max_abs_diff(model_weights(run_dir, 24), model_weights(killed, 24)) == 0.0  # bit for bit, as above


def test_kill_9_mid_epoch_then_resume_gives_bit_identical_weights(straight, tmp_path):
    run_dir, flags = straight
    _kill_9_at_then_resume(run_dir, flags, tmp_path / "killed", "ckpt-3")


def test_kill_9_then_resume_gives_bit_identical_weights(straight, tmp_path):
    """At an epoch's end: the run checkpoints at epochs' ends only (no --checkpoint_every), is killed once epoch
    1's checkpoint (64 records / 8 = ckpt-8) is listed, and resumes at epoch 2's first bucketed batch. The straight
    run it must equal also checkpointed every 3 updates, which changes no weight (a field that may change on a
    resume, gpt_tf/runs/files.py)."""
    run_dir, flags = straight
    flags = [f for f in flags if not f.startswith("--checkpoint_every=")]
    _kill_9_at_then_resume(run_dir, flags, tmp_path / "killed", "ckpt-8")


@pytest.fixture(scope="module")
def one_device(built, tmp_path_factory):
    """STS-B (40 records), 2 epochs of 5 full batches on the default strategy, dropout off (micro-batches and
    replicas draw other masks, so only the deterministic computation can match): its flags, final weights and
    final JSON line, the reference of both tests below."""
    flags = [*FLAGS, "--task=stsb", f"--data_dir={built / 'stsb'}", "--dropout=0", "--clf_pdrop=0", "--epochs=2"]
    run_dir = tmp_path_factory.mktemp("one_device")
    proc = run_cli("gpt_tf.train", *flags, f"--run_dir={run_dir}", timeout=240)
    return flags, model_weights(run_dir, 10), json.loads(proc.stdout.strip().splitlines()[-1])


def test_grad_accum_2_gives_the_full_batch_update(one_device, tmp_path):
    # λ = 0.5: the task loss and L1 are both means over the global batch's examples (L1 per view first).
    flags, full, _ = one_device
    run_cli("gpt_tf.train", *flags, "--grad_accum_steps=2", f"--run_dir={tmp_path / 'accum'}")
    assert max_abs_diff(full, model_weights(tmp_path / "accum", 10)) < 1e-5


def test_two_mirrored_replicas_equal_one_device(one_device, tmp_path):
    """The length-bucketed global batches split between 2 replicas (gpt_tf/data/task_batches.py)."""
    flags, one, one_result = one_device
    two = run_cli("gpt_tf.train", *flags, f"--run_dir={tmp_path / 'two'}", "--strategy=mirrored", "--num_cpu_devices=2",
                  timeout=240)
    assert max_abs_diff(one, model_weights(tmp_path / "two", 10)) < 1e-5
    metrics = [result["dev"] for result in (one_result, json.loads(two.stdout.strip().splitlines()[-1]))]
    assert metrics[0]["examples"] == metrics[1]["examples"] == 40
    assert metrics[0]["pearson"] == pytest.approx(metrics[1]["pearson"], abs=1e-4)


def test_train_steps_caps_fine_tuning_and_evaluates_there(built, tmp_path):
    flags = [*FLAGS, "--task=stsb", f"--data_dir={built / 'stsb'}", "--epochs=2", "--train_steps=7"]
    proc = run_cli("gpt_tf.train", *flags, f"--run_dir={tmp_path / 'run'}")
    assert (tmp_path / "run" / "checkpoints" / "ckpt-7.index").exists()
    assert not (tmp_path / "run" / "checkpoints" / "ckpt-10.index").exists()
    assert '"dev"' in proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("args, message", [
    (["--task=rte", "--warmup_steps=5"], "--warmup_steps applies to pre-training only"),
    (["--task=rte", "--eval_every=5"], "--eval_every applies to pre-training only"),
    (["--task=rte", "--lr_decay=cosine"], "--lr_decay=cosine: fine-tuning decays linearly"),
    (["--epochs=2"], "--epochs applies to fine-tuning only"),
    (["--lm_coef=0"], "--lm_coef applies to fine-tuning only"),
    (["--warmup_fraction=0.1"], "--warmup_fraction applies to fine-tuning only"),
    (["--task=rte", "--init_checkpoint=runs/x", "--model=small"], "--model: with --init_checkpoint the model is"),
    (["--mode=eval", "--prompt=the", "--top_k=5", "--weights=int8"],
     "--prompt, --top_k, --weights only apply to --mode=generate"),
])
def test_a_flag_for_the_other_kind_of_run_is_rejected(args, message):
    proc = run_cli("gpt_tf.train", "--data_dir=/tmp", "--run_dir=/tmp/x", *args, check=False, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
