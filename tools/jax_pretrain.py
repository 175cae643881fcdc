"""Pre-trains the project's GPT-1 family on JAX: ``GPT1CausalLM.fit`` over a data folder's TFRecords, in pieces.

    KERAS_BACKEND=jax python -m tools.jax_pretrain --data_dir=data/books_small --run_dir=runs/books_small_jax \\
        --model=small --batch_size=128 --learning_rate=5e-4 --epochs=7 --precision=mixed_bfloat16 --piece_minutes=9

Why it exists: the command line's loop (``python -m gpt_tf.train``) is TensorFlow's; on a GPU machine with JAX this
trains the same model (``GPT1CausalLM`` on ``GPT1Backbone`` of ``--model``: ``gpt_tf/config.py``'s sizes) with the
paper's pre-training recipe (``gpt_tf.nn.optim``: AdamW with decay 0.01 on matrices only, clipping at norm 1, a 2%
linear warm-up then cosine decay to 0), by Keras's ``fit`` on the JAX backend (``jit``-compiled steps), on exactly
the (n_ctx + 1)-token windows ``pipelines.pretrain_data`` wrote, read by ``pipelines.reader.pretraining_dataset`` in
its seeded order. It needs ``jax`` (for a GPU: ``jax[cuda12]``) beside ``tensorflow`` (CPU is enough: tf.data reads
the records and tokenizes).

In pieces: every ``--save_every`` updates the weights and the optimizer's state are written beside
``run_dir/latest.weights.h5`` and renamed over it, then ``state.json`` (the updates done); a piece stops at the
first such save after ``--piece_minutes`` of training and exits with status 75. The same command resumes from
them: the data skipped to the update reached, the schedule where it was. At the end it writes ``run_dir/preset``
(the language model with its tokenizer: ``from_preset`` on any backend, ``--init_checkpoint`` of the command
line) and the held-out loss of ``--eval_batches`` batches into ``state.json``. Dropout's random state starts again
at each piece, so a run in pieces follows another path than one run in a go (the same data, the same recipe).

Where TensorFlow is not installed (the lent GPU machine), ``--tokens`` takes the token streams of
``tools/torch_pretrain/convert.py --action=export`` instead of ``--data_dir`` (nothing imports TensorFlow: the
family takes it at first use, ``gpt_tf/backend.py``), and the run is one go whose files all fit what a device
call returns:

    KERAS_BACKEND=jax python -m tools.jax_pretrain --tokens=.gpu/books_small.npz.xz --run_dir=$OUT \
        --model=small --batch_size=128 --learning_rate=5e-4 --epochs=7 --precision=mixed_bfloat16 --piece_minutes=7

The windows are ``tools/torch_pretrain/train.py``'s (stride n_ctx; every epoch a fresh ``default_rng(seed)``
permutation, taken ``batch_size`` at a time across epoch ends; ``epochs × (windows // batch_size)`` updates), fed to
``fit`` from numpy, ``--steps_per_execution`` steps per call. ``log.jsonl`` gets the mean training loss of every
``--log_every`` updates; with ``--piece_minutes`` (counted from the command's start, so that start-up and the
compilation are inside it) training stops at the first ``--log_every`` boundary past it, and at SIGTERM after the
steps in flight: a partial run. Then the
held-out loss of ``eval_batches × batch_size`` valid windows (the PyTorch route's 4,096 with its defaults, chosen
alike), the weights as ``weights-<updates>.part<k>.npz`` (float16, each at most 15 MiB: ``tools/torch_pretrain``'s
format, which ``python -m gpt_tf.convert --state_dict=...`` turns into a preset) and ``summary.json`` (updates,
tokens, seconds, tokens/s, TFLOP/s and MFU at ``--peak_tflops``, the compilation's seconds, the losses).
The optimizer's state is not written (203 MB at ``small``): such a run does not resume.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

from absl import app, flags

START = time.monotonic()  # --tokens: --piece_minutes counts from here
PIECE_EXIT = 75  # as tools/torch_pretrain: a piece stopped at a save; run the same command to go on
WEIGHTS, STATE = "latest.weights.h5", "state.json"
FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("data_dir", None, "a data folder of pipelines.pretrain_data (manifest.json, TFRecords)")
    flags.DEFINE_string("run_dir", None, "where the weights, state.json and, at the end, the preset go")
    flags.DEFINE_string("model", "small", "a model size of gpt_tf/config.py (its n_ctx must be the data's)")
    flags.DEFINE_integer("batch_size", 128, "sequences per update")
    flags.DEFINE_float("learning_rate", 5e-4, "peak learning rate")
    flags.DEFINE_float("warmup_fraction", 0.02, "linear warm-up over this share of the updates, then cosine to 0")
    flags.DEFINE_integer("epochs", 7, "passes over the training windows")
    flags.DEFINE_integer("save_every", 200, "updates between saves (a piece stops at one)")
    flags.DEFINE_float("piece_minutes", 0.0, "stop at the first save after this many minutes of training (0: never)")
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16"], "Keras's dtype policy (GPU: bf16)")
    flags.DEFINE_integer("eval_batches", 32, "held-out batches evaluated at the end")
    flags.DEFINE_integer("seed", 0, "the data order's and the initialisation's seed")
    flags.DEFINE_string("tokens", None, "instead of --data_dir, where TensorFlow is missing: token streams "
                        "(.npz.xz of tools/torch_pretrain/convert.py --action=export); see the module doc")
    flags.DEFINE_integer("log_every", 100, "--tokens: updates per log.jsonl line (a multiple of steps_per_execution)")
    flags.DEFINE_integer("steps_per_execution", 20, "--tokens: training steps per call of fit's step function")
    flags.DEFINE_float("peak_tflops", 989.0, "--tokens: the accelerator's dense bf16 peak, for summary.json's MFU")
    flags.mark_flags_as_required(["run_dir"])
    flags.register_multi_flags_validator(["data_dir", "tokens"], lambda f: bool(f["data_dir"]) != bool(f["tokens"]),
                                         "give exactly one of --data_dir and --tokens")


def saving(run_dir: Path, minutes: float, save_every: int, total: int, start: float | None = None, extra=None):
    """``fit``'s callback, at the end of each of ``fit``'s epochs: the piece's stop at the first after ``minutes``
    (0: never) from ``start`` (default: now), and a save every ``save_every`` updates, at ``total`` and at a stop
    (the model's and the optimizer's variables beside ``latest.weights.h5``, renamed over it, then ``state.json``:
    the updates done, the epoch's loss and ``extra(updates)``)."""
    import keras

    start = time.monotonic() if start is None else start

    class Saving(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            updates = int(self.model.optimizer.iterations.numpy())
            if minutes and time.monotonic() - start > 60 * minutes:
                self.model.stop_training = True
            if updates % save_every and updates != total and not self.model.stop_training:
                return
            tmp = run_dir / f".{WEIGHTS}"
            self.model.save_weights(str(tmp))
            os.replace(tmp, run_dir / WEIGHTS)
            write_state(run_dir, {"updates": updates, "loss": float(logs["loss"]), **(extra(updates) if extra else {})})

    return Saving()


def write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / f".{STATE}"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, run_dir / STATE)


def token_windows(path: str, n_ctx: int, eval_windows: int):
    """``(meta, train, valid)``: the stream file's stride-n_ctx windows (int32), ``valid`` the PyTorch route's
    ``eval_windows`` held-out ones."""
    import numpy as np

    from tools.torch_pretrain.streams import load_streams
    from tools.torch_pretrain.train import windows

    meta, streams = load_streams(path)
    if meta["n_ctx"] != n_ctx:
        raise app.UsageError(f"{path} holds windows of {meta['n_ctx']} tokens; the model's context is {n_ctx}")
    train, valid = (windows(streams[split].astype(np.int32), n_ctx) for split in ("train", "valid"))
    valid = valid[np.random.default_rng(1234).permutation(len(valid))[:eval_windows]]
    return meta, train, valid


def batches(train, batch_size: int, seed: int, count: int, start: int = 0):
    """Batches ``start`` to ``count`` ``(inputs, next tokens)`` in ``tools.torch_pretrain.train.Run.next_batch``'s
    order (the ones before ``start`` only drawn, not gathered)."""
    import numpy as np

    rng, order = np.random.default_rng(seed), np.zeros([0], np.int64)
    for i in range(count):
        if len(order) < batch_size:  # a new epoch: every window once, in a seeded order
            order = np.concatenate([order, rng.permutation(len(train))])
        take, order = order[:batch_size], order[batch_size:]
        if i >= start:
            batch = train[take]
            yield batch[:, :-1], batch[:, 1:]


def compile_seconds():
    """A list of ``(when, seconds)`` of each of XLA's compilations, as JAX reports them (none where it reports
    none)."""
    seconds = []
    try:
        import jax

        def listen(event, duration, **_):
            if event.endswith("backend_compile_duration"):
                seconds.append((time.monotonic(), duration))

        jax.monitoring.register_event_duration_secs_listener(listen)
    except (AttributeError, ImportError):  # pragma: no cover - an older or newer JAX without the hook
        pass
    return seconds


def main_tokens(keras) -> int:
    """``--tokens``: the run in one go (see the module doc); 0 when every update ran, else PIECE_EXIT."""
    import jax
    import numpy as np

    from gpt_tf.config import get_size
    from gpt_tf.convert.state_dicts import to_hf_state_dict
    from gpt_tf.gpt1 import GPT1CausalLM
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.nn.optim import WarmupDecay, make_optimizer
    from tools.torch_pretrain.pieces import save_arrays

    if FLAGS.log_every % FLAGS.steps_per_execution:
        raise app.UsageError("--log_every must be a multiple of --steps_per_execution")
    run_dir, batch_size, compiling = Path(FLAGS.run_dir), FLAGS.batch_size, compile_seconds()
    n_ctx = get_size(FLAGS.model).n_ctx
    meta, train, valid = token_windows(FLAGS.tokens, n_ctx, FLAGS.eval_batches * batch_size)
    config = get_size(FLAGS.model, vocab_size=int(meta["vocab_size"]))
    per_epoch = len(train) // batch_size
    total = FLAGS.epochs * per_epoch
    run_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(FLAGS.seed)
    lm = GPT1CausalLM(backbone_for(config, dtype=FLAGS.precision), preprocessor=None, compile=False)
    schedule = WarmupDecay(FLAGS.learning_rate, math.ceil(FLAGS.warmup_fraction * total), total, "cosine")
    lm.compile(optimizer=make_optimizer(lm.trainable_variables, schedule), jit_compile=True,
               steps_per_execution=FLAGS.steps_per_execution)
    tokens_per_update, flops_per_token = batch_size * n_ctx, config.flops_per_token()
    device = str(jax.devices()[0].device_kind)
    print(f"{FLAGS.model}: {lm.count_params():,} parameters on {device} ({jax.default_backend()}); {len(train):,} "
          f"windows, {total} updates of {tokens_per_update:,} tokens; {time.monotonic() - START:.1f} s to here",
          flush=True)
    log = (run_dir / "log.jsonl").open("w")
    log.write(json.dumps({"setting": {name: FLAGS[name].value for name in (
        "tokens", "model", "batch_size", "learning_rate", "warmup_fraction", "epochs", "precision", "seed",
        "steps_per_execution", "log_every", "piece_minutes")}, "updates": total, "windows": len(train),
        "meta": meta, "device": device, "jax": jax.__version__, "keras": keras.__version__}) + "\n")
    marks, rows = [], []  # (updates, seconds since fit began) and the line logged, every --log_every updates

    class Logging(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            updates = int(self.model.optimizer.iterations.numpy())
            marks.append((updates, time.monotonic() - fit_start))
            row = {"step": updates, "tokens": updates * tokens_per_update, "epoch": updates / per_epoch,
                   "train_loss": float(logs["loss"]), "lr": float(schedule(updates)), "seconds": marks[-1][1]}
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)
            if FLAGS.piece_minutes and time.monotonic() - START > 60 * FLAGS.piece_minutes:
                self.model.stop_training = True

    # SIGTERM (a call's time limit, e.g. `timeout -s TERM`): stop after the steps in flight, then evaluate and
    # write everything as at --piece_minutes (fit checks stop_training after each call of its step function)
    terminated = []

    def on_sigterm(*_):
        terminated.append(time.monotonic() - START)
        lm.stop_training = True

    signal.signal(signal.SIGTERM, on_sigterm)
    fit_start = time.monotonic()
    # Keras's own fit and evaluate (keras-hub's wrap the data in tf.data or grain, to map a preprocessor over it:
    # there is none here, the batches are token ids), over exactly `total` batches: the last epoch ends where
    # the batches do (Keras says so in a warning).
    keras.Model.fit(lm, batches(train, batch_size, FLAGS.seed, total), steps_per_epoch=FLAGS.log_every,
           epochs=math.ceil(total / FLAGS.log_every), verbose=0, shuffle=False, callbacks=[Logging()])
    fit_seconds = time.monotonic() - fit_start
    done = int(lm.optimizer.iterations.numpy())
    compiled = sum(seconds for when, seconds in compiling if when >= fit_start)  # the training step's
    marks = marks or [(done, fit_seconds)]  # none when stopped before the first line
    (first, first_s), (last, last_s) = marks[0], marks[-1]
    # the updates' speed once compiled: from the first log line (its interval holds the compilation) to the last
    per_update = (last_s - first_s) / (last - first) if last > first else first_s / max(first, 1)
    eval_start = time.monotonic()
    held_out = float(keras.Model.evaluate(lm, valid[:, :-1], valid[:, 1:], batch_size=batch_size, verbose=0, return_dict=True)["loss"])
    eval_seconds = time.monotonic() - eval_start
    state = to_hf_state_dict(lm, lm_head=False, include_special=True)
    parts = save_arrays({k: v.astype(np.float16) for k, v in state.items()}, str(run_dir), done)
    summary = {
        "device": device, "backend": jax.default_backend(), "jax": jax.__version__, "keras": keras.__version__,
        "model": FLAGS.model, "parameters": lm.count_params(), "precision": FLAGS.precision,
        "updates": done, "updates_total": total, "fraction_done": done / total, "epochs_done": done / per_epoch,
        "tokens": done * tokens_per_update, "fit_seconds": fit_seconds, "compile_seconds": compiled,
        "first_log_seconds": first_s, "first_log_updates": first, "seconds_per_update": per_update,
        "seconds_of_updates": done * per_update, "tokens_per_s": tokens_per_update / per_update,
        "fit_tokens_per_s": done * tokens_per_update / fit_seconds,
        "flops_per_token": flops_per_token, "peak_tflops": FLAGS.peak_tflops,
        "final_train_loss": rows[-1]["train_loss"] if rows else None,
        "final_train_loss_updates": done - (rows[-2]["step"] if len(rows) > 1 else 0),
        "held_out_loss": held_out, "held_out_perplexity": math.exp(held_out), "held_out_windows": len(valid),
        "stopped_by": None if done == total else "SIGTERM" if terminated else "--piece_minutes",
        "eval_seconds": eval_seconds, "weights": [Path(p).name for p in parts], "weights_dtype": "float16",
        "seconds_since_start": time.monotonic() - START}
    for name in ("", "fit_"):
        summary[f"{name}tflops"] = summary[f"{name}tokens_per_s"] * flops_per_token / 1e12
        summary[f"{name}mfu"] = summary[f"{name}tflops"] / FLAGS.peak_tflops
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    if done < total:
        print(f"stopped by {summary['stopped_by']} at update {done} of {total} ({done / total:.1%})", flush=True)
        return PIECE_EXIT
    return 0


def main(argv):
    del argv
    import keras

    if keras.config.backend() != "jax":
        print(f"tools.jax_pretrain: runs on JAX (KERAS_BACKEND=jax), Keras runs on {keras.config.backend()} here",
              file=sys.stderr)
        return 2
    if FLAGS.tokens:
        return main_tokens(keras)
    from gpt_tf.config import get_size
    from gpt_tf.gpt1 import GPT1CausalLM, GPT1CausalLMPreprocessor, GPT1Tokenizer
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.nn.optim import WarmupDecay, make_optimizer
    from pipelines.reader import batches_per_pipeline, pretraining_dataset
    from pipelines.records import read_manifest

    run_dir, manifest = Path(FLAGS.run_dir), read_manifest(FLAGS.data_dir)
    config = get_size(FLAGS.model, vocab_size=int(manifest["tokenizer"]["vocab_size"]))
    per_epoch = batches_per_pipeline(FLAGS.data_dir, "train", FLAGS.batch_size)
    total = FLAGS.epochs * per_epoch // FLAGS.save_every * FLAGS.save_every  # whole saves
    if total < FLAGS.save_every:
        raise app.UsageError(f"{FLAGS.epochs} epochs of {per_epoch} updates make no save of {FLAGS.save_every}")
    run_dir.mkdir(parents=True, exist_ok=True)
    state = json.loads((run_dir / STATE).read_text()) if (run_dir / STATE).exists() else {"updates": 0}
    keras.utils.set_random_seed(FLAGS.seed + state["updates"])  # a piece's dropout: its own stream
    lm = GPT1CausalLM(backbone_for(config, dtype=FLAGS.precision), preprocessor=None, compile=False)
    schedule = WarmupDecay(FLAGS.learning_rate, math.ceil(FLAGS.warmup_fraction * total), total, "cosine")
    lm.compile(optimizer=make_optimizer(lm.trainable_variables, schedule), jit_compile=True)
    if state["updates"]:
        lm.load_weights(str(run_dir / WEIGHTS))
        print(f"resumed at update {state['updates']} of {total}", flush=True)
    data = pretraining_dataset(FLAGS.data_dir, "train", FLAGS.batch_size, config.n_ctx, seed=FLAGS.seed)
    if state["updates"] < total:
        lm.fit(data.skip(state["updates"]), steps_per_epoch=FLAGS.save_every, epochs=total // FLAGS.save_every,
               initial_epoch=state["updates"] // FLAGS.save_every, verbose=2, shuffle=False,
               callbacks=[saving(run_dir, FLAGS.piece_minutes, FLAGS.save_every, total)])
        state = json.loads((run_dir / STATE).read_text())
        if state["updates"] < total:
            print(f"piece done at update {state['updates']} of {total}; run the same command to go on", flush=True)
            return PIECE_EXIT
    valid = pretraining_dataset(FLAGS.data_dir, "valid", FLAGS.batch_size, config.n_ctx, shuffle=False, repeat=False)
    held_out = lm.evaluate(valid.take(FLAGS.eval_batches), verbose=0, return_dict=True)["loss"]
    tokenizer = GPT1Tokenizer(manifest["tokenizer"]["dir"])
    GPT1CausalLM(lm.backbone, GPT1CausalLMPreprocessor(tokenizer)).save_to_preset(str(run_dir / "preset"))
    write_state(run_dir, {**state, "held_out_loss": held_out, "held_out_perplexity": math.exp(held_out)})
    print(f"trained {total} updates; held-out loss {held_out:.4f} (perplexity {math.exp(held_out):.1f}); "
          f"the preset: {run_dir / 'preset'}", flush=True)
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
