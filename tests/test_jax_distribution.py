"""Pre-training under ``KERAS_BACKEND=jax`` (``gpt_tf/training/keras_fit.py``): ``python -m gpt_tf.train`` from the
same flags and data, on one device or ``keras.distribution``'s, on the CPU split into 8 devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``). ``DataParallel`` over the 8, ``ModelParallel`` on a 2 x 4
mesh (its weights really split over the model axis) and two processes of 4 devices joined by
``keras.distribution.initialize`` make the one-device run's updates: the same per-update losses (the global batch's
mean cross-entropy, summed in another order: within 1e-5). A run stopped by SIGTERM saves, exits 143, and the same
command ends with the weights and optimizer of the run in one go, to the bit; the run's preset, loaded on
TensorFlow, scores the held-out windows as the JAX run did. The ``test`` model size, dropout off
(exactness), 6 updates of 8 windows of real books."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.small_runs import BOOKS_TINY_BPE, ENV, ROOT, build_data, decoded_text, finish, free_ports

DEVICES = "--xla_force_host_platform_device_count={}"
FLAGS = ["--model=test", "--batch_size=8", "--train_steps=6", "--checkpoint_every=4", "--log_every=1",
         "--warmup_steps=2", "--learning_rate=1e-3", "--dropout=0", "--eval_batches=2", "--seed=3", "--progress=false",
         "--json"]
CLOSE = {"rtol": 1e-5, "atol": 0}


def _start(data, run_dir, *extra, devices=8):
    env = {**ENV, "KERAS_BACKEND": "jax", "XLA_FLAGS": DEVICES.format(devices)}
    return subprocess.Popen([sys.executable, "-m", "gpt_tf.train", f"--data_dir={data}", f"--run_dir={run_dir}",
                             *FLAGS, *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _done(proc_results):
    """The ``--json`` result of each finished run (each must have exited 0)."""
    out = []
    for code, stdout, stderr in proc_results:
        assert code == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _losses(run_dir):
    lines = (run_dir / "keras_fit" / "log.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _weights(run_dir) -> dict:
    """Every array of the run's last save (the model's and the optimizer's variables)."""
    arrays = {}
    with h5py.File(run_dir / "keras_fit" / "latest.weights.h5") as f:
        f.visititems(lambda name, item: arrays.update({name: item[()]}) if isinstance(item, h5py.Dataset) else None)
    return arrays


@pytest.fixture(scope="module")
def runs(shared_data, tmp_path_factory):
    """The data folder, and the run on one device, with DataParallel over 8 and ModelParallel on 2 x 4, run at once."""
    root = tmp_path_factory.mktemp("jax_distribution")
    data = build_data(shared_data, root, tokenizer=BOOKS_TINY_BPE)
    kinds = {"one": [], "data_parallel": ["--distribution=data_parallel"],
             "model_parallel": ["--distribution=model_parallel", "--model_parallel=4"]}
    procs = [_start(data, root / kind, *extra) for kind, extra in kinds.items()]
    results = _done(finish(procs, timeout=600))
    return data, root, dict(zip(kinds, results))


def test_data_parallel_over_8_devices_makes_the_one_device_updates(runs):
    _, root, results = runs
    one, parallel = _losses(root / "one"), _losses(root / "data_parallel")
    assert len(one) == 6 and one[-1] < one[0]
    np.testing.assert_allclose(parallel, one, **CLOSE)
    np.testing.assert_allclose(results["data_parallel"]["held_out_loss"], results["one"]["held_out_loss"], **CLOSE)
    assert results["one"]["sharded"] == results["data_parallel"]["sharded"] == {}  # every weight whole


def test_tensorflow_loads_the_runs_preset_and_scores_the_held_out_windows_as_the_jax_run_did(runs):
    import keras

    import gpt_tf
    from gpt_tf.data.reader import pretraining_dataset
    from gpt_tf.gpt1.backbone import token_inputs

    data, root, results = runs
    lm = gpt_tf.GPT1CausalLM.from_preset(results["one"]["preset"])  # this process: TensorFlow
    assert keras.config.backend() == "tensorflow" and lm.backbone.config.n_ctx == 32
    valid = pretraining_dataset(str(data), "valid", 8, 32, shuffle=False, repeat=False).take(2)
    losses = [keras.losses.sparse_categorical_crossentropy(y, lm(token_inputs(x)), from_logits=True).numpy()
              for x, y in valid]
    # the same held-out windows scored by two backends: two computation paths of float32 sums over 512 tokens
    np.testing.assert_allclose(np.mean(losses), results["one"]["held_out_loss"], **CLOSE)
    # its bits per character and per byte: the mean loss times the targets, over their text decoded by hand
    from gpt_tf.text.tokenizer import GPTTokenizer

    one = results["one"]
    targets = np.concatenate([y.numpy().reshape(-1) for _, y in valid])
    text = decoded_text(GPTTokenizer.from_dir(BOOKS_TINY_BPE), targets)
    assert (one["held_out_chars"], one["held_out_bytes"]) == (len(text), len(text.encode("utf-8")))
    bits = one["held_out_loss"] * targets.size / np.log(2)
    assert one["held_out_bits_per_char"] == pytest.approx(bits / len(text), rel=1e-9)
    assert one["held_out_bits_per_byte"] == pytest.approx(bits / len(text.encode("utf-8")), rel=1e-9)
    state = json.loads((root / "one" / "keras_fit" / "state.json").read_text())
    assert state["held_out_bits_per_char"] == one["held_out_bits_per_char"]


def test_model_parallel_splits_the_embedding_and_the_feed_forward_and_makes_the_same_updates(runs):
    _, root, results = runs
    np.testing.assert_allclose(_losses(root / "model_parallel"), _losses(root / "one"), **CLOSE)
    sharded = results["model_parallel"]["sharded"]  # JAX's sharding.spec of each weight, as placed
    assert sharded["embed/tokens_embed/embeddings"] == [None, "model"]
    assert sharded["h0/mlp/c_fc/kernel"] == [None, "model"] and sharded["h1/mlp/c_proj/kernel"] == ["model", None]
    assert sharded["h1/attn/c_attn/kernel"] == [None, "model"] and "h0/ln_1/gamma" not in sharded
    # the saves hold whole arrays: the same weights as the one-device run's, within the sums' order
    one, split = _weights(root / "one"), _weights(root / "model_parallel")
    assert one.keys() == split.keys()
    for name in one:
        np.testing.assert_allclose(split[name], one[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_two_processes_joined_by_keras_distribution_initialize_make_the_one_device_updates(runs):
    data, root, _ = runs
    run_dir, (port,) = root / "two_processes", free_ports(1)
    flags = ["--distribution=data_parallel", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2"]
    procs = [_start(data, run_dir, *flags, f"--process_id={i}", devices=4) for i in (0, 1)]
    first, second = _done(finish(procs, timeout=600))
    np.testing.assert_allclose(_losses(run_dir), _losses(root / "one"), **CLOSE)
    assert first["held_out_loss"] == second["held_out_loss"]
    assert sorted(p.name for p in run_dir.iterdir()) == [  # process 0 wrote the run; process 1 nothing of its own
        ".lock", "data.json", "keras_fit", "model_config.json", "preset", "train_config.json"]


def test_sigterm_saves_and_the_same_command_ends_with_the_weights_of_one_run_in_a_go(runs):
    data, root, _ = runs
    run_dir = root / "stopped"
    proc = _start(data, run_dir)
    for line in proc.stderr:  # SIGTERM as fit begins (it compiles for seconds): it stops after that update
        if line.startswith("fit from update 0"):
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    stop = json.loads((run_dir / "keras_fit" / "state.json").read_text())["updates"]
    assert 1 <= stop < 6 and "preempted (SIGTERM)" in err
    (code, out, err), = finish([_start(data, run_dir)], timeout=600)
    assert code == 0 and f"resumed at update {stop} of 6" in err, err[-3000:]
    assert json.loads(out.splitlines()[-1])["step"] == 6
    np.testing.assert_array_equal(_losses(run_dir), _losses(root / "one"))
    one, resumed = _weights(root / "one"), _weights(run_dir)
    assert one.keys() == resumed.keys() and len(one) > 20
    assert all(np.array_equal(resumed[name], one[name]) for name in one)


def test_a_flag_of_tensorflows_loop_is_refused_under_jax_in_one_line(tmp_path, runs):
    data, _, _ = runs
    (code, out, err), = finish([_start(data, tmp_path / "run", "--strategy=mirrored", "--precision=auto")])
    assert code == 2 and not out and not (tmp_path / "run").exists()
    assert "--strategy=mirrored, --precision=auto: TensorFlow's training loop only" in err, err
