"""``tools/jax_pretrain.py``: the family pre-trained by ``fit`` under ``KERAS_BACKEND=jax``, in pieces, at the ``test``
size on real books; its preset, loaded on TensorFlow, scores the held-out windows as the JAX run did."""

from __future__ import annotations

import json
import subprocess
import sys

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
