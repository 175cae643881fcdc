"""``tools/jax_pretrain.py``: the family pre-trained by ``fit`` under ``KERAS_BACKEND=jax`` where TensorFlow cannot be
imported (the GPU machine), over token streams, in pieces: a run stopped by time, then by SIGTERM, and resumed ends
with the weights of a run in one go, to the bit, and its float16 weight parts become a preset
(``python -m gpt_tf.convert --state_dict``) that scores alike. (The data folder's route on JAX is the command line's:
``tests/test_jax_distribution.py``.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import h5py
import numpy as np

from tests.small_runs import BOOKS_TINY_BPE, ENV, ROOT, build_data


def test_from_token_streams_without_tensorflow_in_pieces_as_in_one_go_and_the_weight_parts_make_a_preset(
        shared_data, tmp_path):
    import keras

    import gpt_tf
    from gpt_tf.convert.presets import preset_from_state_dict
    from gpt_tf.gpt1.backbone import token_inputs
    from tools.jax_pretrain import token_windows
    from tools.torch_pretrain.convert import export

    tokens = tmp_path / "streams.npz.xz"
    export(str(build_data(shared_data, tmp_path, tokenizer=BOOKS_TINY_BPE)), str(tokens))  # 110 updates of 8
    command = [sys.executable, "-m", "tools.jax_pretrain", f"--tokens={tokens}", "--model=test", "--batch_size=8",
               "--epochs=1", "--log_every=20", "--steps_per_execution=5", "--save_every=40", "--eval_batches=4",
               "--precision=float32"]
    env = {**ENV, "KERAS_BACKEND": "jax", "ABSENT_MODULES": "tensorflow,tensorflow_text"}

    def run(run_dir, *extra):
        return subprocess.run([*command, f"--run_dir={run_dir}", *extra], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600, check=False)

    def read(run_dir):
        lines = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
        return (json.loads((run_dir / name).read_text()) for name in ("state.json", "summary.json")), lines

    pieces = tmp_path / "pieces"
    first = run(pieces, "--piece_minutes=0.001")  # stops at its first log line: saved, and its files written
    assert first.returncode == 75, first.stderr[-3000:]
    (state, summary), _ = read(pieces)
    assert state["updates"] == summary["updates"] == 20 and summary["updates_total"] == 110
    assert summary["stopped_by"] == "--piece_minutes" and (pieces / "weights-20.part0.npz").exists()
    # the same command again, SIGTERM as fit begins (its step compiles for seconds): it stops after one call of
    # the step function, at update 25, between two log lines (30 or 35 on a machine slow to signal)
    child = subprocess.Popen([*command, f"--run_dir={pieces}", "--piece_minutes=0.001"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in child.stdout:
        if line.startswith("fit from update 20"):
            child.send_signal(signal.SIGTERM)
            break
    _, err = child.communicate(timeout=600)
    assert child.returncode == 75, err[-3000:]
    (state, summary), _ = read(pieces)
    stop = state["updates"]
    assert stop == summary["updates"] in (25, 30, 35) and summary["stopped_by"] == "SIGTERM"
    last = run(pieces)  # no time limit (it is not part of the run's setting): to the end
    assert last.returncode == 0 and f"resumed at update {stop};" in last.stdout, last.stderr[-3000:]
    fits = [line for line in last.stdout.splitlines() if line.startswith("fit from")]
    assert fits == [f"fit from update {stop}", "fit from update 40"]  # up to the next log line first
    one_go = tmp_path / "one_go"
    done = run(one_go)
    assert done.returncode == 0, done.stderr[-3000:]
    (state, summary), lines = read(pieces)
    (_, in_one_go), one_go_lines = read(one_go)
    rows = [line for line in lines if "step" in line]
    assert [line["step"] for line in rows] == [20, stop, 40, 60, 80, 100, 110]  # each: since the line before
    assert [(p["from"], p["to"], p["stopped_by"]) for p in summary["pieces"]] == [
        (0, 20, "--piece_minutes"), (20, stop, "SIGTERM"), (stop, 110, None)]
    assert [line["piece"] for line in lines if "piece" in line] == [0, 1, 2]
    assert (state["updates"], summary["updates"], in_one_go["updates"]) == (110, 110, 110)
    assert summary["final_train_loss"] < 8.5 and summary["tokens_per_s"] > 0 and len(in_one_go["pieces"]) == 1
    # the optimizer's state and dropout's random state are saved with the weights, the batches skipped to the
    # update reached: the same arithmetic as in one go, to the bit
    same = lambda line: (line["step"], line["train_loss"], line["lr"])  # not 40's: from `stop` here, 20 there
    assert [same(line) for line in rows[3:]] == [same(line) for line in one_go_lines if line.get("step", 0) >= 60]
    assert summary["held_out_loss"] == in_one_go["held_out_loss"]
    parts = sorted(str(path) for path in pieces.glob("weights-*.part*.npz"))  # the earlier pieces' removed
    assert [path.rsplit("/", 1)[1] for path in parts] == summary["weights"] == ["weights-110.part0.npz"]
    with np.load(parts[0]) as ours, np.load(one_go / "weights-110.part0.npz") as theirs:
        assert all(np.array_equal(ours[key], theirs[key]) for key in theirs)
    preset = preset_from_state_dict(parts, "test", str(BOOKS_TINY_BPE), str(tmp_path / "preset"), weights_dtype="float16")
    with h5py.File(tmp_path / "preset" / "model.weights.h5") as weights:  # stored as float16, loaded as float32
        stored = []
        weights.visititems(lambda name, item: stored.append(item.dtype) if isinstance(item, h5py.Dataset) else None)
    assert stored and set(stored) == {np.dtype("float16")}
    lm = gpt_tf.GPT1CausalLM.from_preset(preset)  # this process: TensorFlow
    assert keras.config.backend() == "tensorflow" and {w.dtype for w in lm.weights} == {"float32"}
    _, _, valid = token_windows(str(tokens), 32, summary["held_out_windows"])
    losses = [keras.losses.sparse_categorical_crossentropy(valid[i:i + 8, 1:], lm(token_inputs(valid[i:i + 8, :-1])),
                                                           from_logits=True).numpy() for i in range(0, len(valid), 8)]
    # the weights went through float16: the held-out loss of the JAX run within that rounding
    np.testing.assert_allclose(np.mean(losses), summary["held_out_loss"], rtol=1e-3)
