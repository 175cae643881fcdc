"""``tools/jax_pretrain.py``: the family pre-trained by ``fit`` under ``KERAS_BACKEND=jax``, in pieces, at the ``test``
size on real books; its preset, loaded on TensorFlow, scores the held-out windows as the JAX run did. With
``--tokens``, where TensorFlow cannot be imported (the GPU machine): the run stops by time with its files written,
and its float16 weight parts become a preset (``python -m gpt_tf.convert --state_dict``) that scores alike."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import numpy as np

from tests.small_runs import BOOKS_TINY_BPE, ENV, ROOT, build_data

ARGS = ["--model=test", "--batch_size=8", "--epochs=1", "--save_every=20", "--eval_batches=4"]


def _run(data, run_dir, *extra):
    return subprocess.run([sys.executable, "-m", "tools.jax_pretrain", f"--data_dir={data}", f"--run_dir={run_dir}",
                           *ARGS, *extra], cwd=ROOT, env={**ENV, "KERAS_BACKEND": "jax"}, capture_output=True,
                          text=True, timeout=600, check=False)


def test_a_piece_stops_at_a_save_the_same_command_finishes_and_tensorflow_loads_the_preset(shared_data, tmp_path):
    import keras

    import gpt_tf
    from pipelines.reader import pretraining_dataset

    data, run_dir = build_data(shared_data, tmp_path, tokenizer=BOOKS_TINY_BPE), tmp_path / "run"
    first = _run(data, run_dir, "--piece_minutes=0.001")  # stops at its first save
    assert first.returncode == 75, first.stderr[-3000:]
    assert json.loads((run_dir / "state.json").read_text())["updates"] == 20
    assert "run the same command to go on" in first.stdout
    done = _run(data, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed at update 20 of 100" in done.stdout, done.stdout
    state = json.loads((run_dir / "state.json").read_text())
    assert state["updates"] == 100 and state["loss"] < 8.5  # from ln(8004) = 8.99 at the start
    lm = gpt_tf.GPT1CausalLM.from_preset(str(run_dir / "preset"))  # this process: TensorFlow
    assert keras.config.backend() == "tensorflow" and lm.backbone.config.n_ctx == 32
    valid = pretraining_dataset(str(data), "valid", 8, 32, shuffle=False, repeat=False).take(4)
    losses = [keras.losses.sparse_categorical_crossentropy(y, lm(x), from_logits=True).numpy() for x, y in valid]
    # the same held-out windows scored by two backends: two computation paths, float32 sums of 1,024 tokens
    np.testing.assert_allclose(np.mean(losses), state["held_out_loss"], rtol=1e-5)


def test_from_token_streams_without_tensorflow_the_weight_parts_make_a_preset_that_scores_alike(shared_data, tmp_path):
    import keras

    import gpt_tf
    from gpt_tf.convert.presets import preset_from_state_dict
    from tools.jax_pretrain import token_windows
    from tools.torch_pretrain.convert import export

    tokens = tmp_path / "streams.npz.xz"
    export(str(build_data(shared_data, tmp_path, tokenizer=BOOKS_TINY_BPE)), str(tokens))  # 110 updates of 8

    def run(run_dir, *extra):
        return subprocess.run([sys.executable, "-m", "tools.jax_pretrain", f"--tokens={tokens}", f"--run_dir={run_dir}",
                               "--model=test", "--batch_size=8", "--epochs=1", "--log_every=20",
                               "--steps_per_execution=5", "--eval_batches=4", "--precision=float32", *extra],
                              cwd=ROOT, env={**ENV, "KERAS_BACKEND": "jax", "ABSENT_MODULES": "tensorflow,tensorflow_text"},
                              capture_output=True, text=True, timeout=600, check=False)

    stopped = run(tmp_path / "stopped", "--piece_minutes=0.001")  # stops at its first log line, files written
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert (summary["updates"], summary["updates_total"]) == (20, 110)
    assert (tmp_path / "stopped" / "weights-20.part0.npz").exists()
    done = run(tmp_path / "done")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "done" / "summary.json").read_text())
    lines = [json.loads(line) for line in (tmp_path / "done" / "log.jsonl").read_text().splitlines()[1:]]
    assert [line["step"] for line in lines] == [20, 40, 60, 80, 100, 110]  # the last epoch ends with the batches
    assert summary["updates"] == 110 and summary["final_train_loss"] < 8.5 and summary["tokens_per_s"] > 0
    parts = sorted(str(path) for path in (tmp_path / "done").glob("weights-110.part*.npz"))
    preset = preset_from_state_dict(parts, "test", str(BOOKS_TINY_BPE), str(tmp_path / "preset"), weights_dtype="float16")
    with h5py.File(tmp_path / "preset" / "model.weights.h5") as weights:  # stored as float16, loaded as float32
        stored = []
        weights.visititems(lambda name, item: stored.append(item.dtype) if isinstance(item, h5py.Dataset) else None)
    assert stored and set(stored) == {np.dtype("float16")}
    lm = gpt_tf.GPT1CausalLM.from_preset(preset)  # this process: TensorFlow
    assert keras.config.backend() == "tensorflow" and {w.dtype for w in lm.weights} == {"float32"}
    _, _, valid = token_windows(str(tokens), 32, summary["held_out_windows"])
    losses = [keras.losses.sparse_categorical_crossentropy(valid[i:i + 8, 1:], lm(valid[i:i + 8, :-1]),
                                                           from_logits=True).numpy() for i in range(0, len(valid), 8)]
    # the weights went through float16: the held-out loss of the JAX run within that rounding
    np.testing.assert_allclose(np.mean(losses), summary["held_out_loss"], rtol=1e-3)
