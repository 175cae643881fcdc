"""Pre-trains the project's GPT-1 family on JAX without TensorFlow: ``fit`` over token streams, in pieces.

    KERAS_BACKEND=jax python -m tools.jax_pretrain --tokens=.gpu/books_small.npz.xz --run_dir=runs/books_small_tokens \\
        --model=small --batch_size=128 --learning_rate=5e-4 --epochs=7 --precision=mixed_bfloat16 --piece_minutes=7

Why it exists: a data folder's TFRecords pre-train on JAX through the command line (``KERAS_BACKEND=jax python -m
gpt_tf.train --flagfile=...``: ``gpt_tf/training/keras_fit.py``, one device or ``keras.distribution``'s), which reads
them with tf.data. A lent GPU machine may have JAX and no TensorFlow: there this trains the same model
(``GPT1CausalLM`` on ``GPT1Backbone`` of ``--model``: ``gpt_tf/config.py``'s sizes) with the paper's pre-training
recipe (``gpt_tf.nn.optim``: AdamW with decay 0.01 on matrices only, clipping at norm 1, a ``--warmup_fraction``
linear warm-up then cosine decay to 0) by Keras's ``fit`` on the JAX backend (``jit``-compiled steps), on the token
streams of ``tools/torch_pretrain/convert.py --action=export`` (nothing imports TensorFlow: the family takes it at
first use, ``gpt_tf/backend.py``), in pieces that fit a device call.

The windows are ``tools/torch_pretrain/train.py``'s (stride n_ctx; every epoch a fresh ``default_rng(seed)``
permutation, taken ``batch_size`` at a time across epoch ends; ``epochs × (windows // batch_size)`` updates), fed to
``fit`` from numpy, ``--steps_per_execution`` steps per call. ``log.jsonl`` gets a line at each piece's start and
the mean training loss since the line before at every multiple of ``--log_every`` updates (``seconds``: since the
piece's ``fit`` began). A piece stops at the first such line past ``--piece_minutes`` (counted from the command's
start, so that start-up and the compilation are inside it), or at SIGTERM after the steps in flight, between two
lines (its next piece first goes up to the next). It saves every ``--save_every`` updates (a multiple of
``--log_every``, itself of ``--steps_per_execution``), at its stop and at the end: the weights and the optimizer's
state beside ``run_dir/latest.weights.h5``, renamed over it, then ``state.json`` (the updates done, dropout's random
state, which the weights file does not hold, and each piece's figures). The same command resumes (``--piece_minutes``
may differ; other settings are refused): the weights, the optimizer (so the schedule), dropout's state, the batches
skipped to the update reached: the updates of a run in one go, to the bit where XLA's are deterministic (on the CPU:
a test holds the weights equal). Every piece ends with the held-out loss of ``eval_batches × batch_size`` valid
windows (the PyTorch route's 4,096 with its defaults, chosen alike), the weights as
``weights-<updates>.part<k>.npz`` (float16, each at most 15 MiB: ``tools/torch_pretrain``'s format, which
``python -m gpt_tf.convert --state_dict=...`` turns into a preset; the previous piece's removed) and ``summary.json``
(updates, tokens; ``fit_seconds`` and ``compile_seconds`` summed over the pieces, listed in ``pieces``; tokens/s,
TFLOP/s and MFU at ``--peak_tflops`` from the seconds between each piece's first and last log lines; the losses),
then exits 75 before the end, 0 at it. ``latest.weights.h5`` (12 bytes a parameter: 203 MB at ``small``) is larger
than a device call returns: keep ``--run_dir`` on the machine between calls and copy the rest out.
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

START = time.monotonic()  # --piece_minutes counts from here
PIECE_EXIT = 75  # as tools/torch_pretrain: a piece stopped at a save; run the same command to go on
WEIGHTS, STATE = "latest.weights.h5", "state.json"
FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("tokens", None, "the token streams (.npz.xz of tools/torch_pretrain/convert.py "
                        "--action=export)")
    flags.DEFINE_string("run_dir", None, "where the weights, state.json, log.jsonl and summary.json go")
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
    flags.DEFINE_integer("log_every", 100, "updates per log.jsonl line (a multiple of steps_per_execution)")
    flags.DEFINE_integer("steps_per_execution", 20, "training steps per call of fit's step function")
    flags.DEFINE_float("peak_tflops", 989.0, "the accelerator's dense bf16 peak, for summary.json's MFU")
    flags.mark_flags_as_required(["tokens", "run_dir"])


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
            yield model_inputs(batch[:, :-1]), batch[:, 1:]


def model_inputs(token_ids):
    """The language model's inputs for windows of token ids (numpy): every position is text."""
    import numpy as np

    return {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}


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
    """The run, in pieces (see the module doc); 0 when every update has run, else PIECE_EXIT."""
    import jax
    import numpy as np

    from gpt_tf.config import get_size
    from gpt_tf.convert.state_dicts import to_hf_state_dict
    from gpt_tf.gpt1 import GPT1CausalLM
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.nn.optim import WarmupDecay, make_optimizer
    from tools.torch_pretrain.pieces import save_arrays

    if FLAGS.log_every % FLAGS.steps_per_execution or FLAGS.save_every % FLAGS.log_every:
        raise app.UsageError("--save_every must be a multiple of --log_every, and that of --steps_per_execution")
    run_dir, batch_size, log_every = Path(FLAGS.run_dir), FLAGS.batch_size, FLAGS.log_every
    compiling = compile_seconds()
    n_ctx = get_size(FLAGS.model).n_ctx
    meta, train, valid = token_windows(FLAGS.tokens, n_ctx, FLAGS.eval_batches * batch_size)
    config = get_size(FLAGS.model, vocab_size=int(meta["vocab_size"]))
    per_epoch = len(train) // batch_size
    total = FLAGS.epochs * per_epoch
    run_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(FLAGS.seed)
    lm = GPT1CausalLM(backbone_for(config, dtype=FLAGS.precision), preprocessor=None, compile=False)
    schedule = WarmupDecay(FLAGS.learning_rate, math.ceil(FLAGS.warmup_fraction * total), total, "cosine")
    lm.compile(optimizer=make_optimizer(schedule, variables=lm.trainable_variables), jit_compile=True,
               steps_per_execution=FLAGS.steps_per_execution)
    terminated = []  # SIGTERM's time

    def on_sigterm(*_):
        terminated.append(time.monotonic() - START)
        lm.stop_training = True

    # SIGTERM (a call's time limit, e.g. `timeout -s TERM`): stop after the steps in flight (fit checks
    # stop_training after each call of its step function), save, then evaluate and write as at --piece_minutes
    signal.signal(signal.SIGTERM, on_sigterm)
    seeds = [v for v in lm.variables if v.path.endswith("seed_generator_state")]  # dropout's: not in the weights
    setting = {name: FLAGS[name].value for name in (
        "tokens", "model", "batch_size", "learning_rate", "warmup_fraction", "epochs", "precision", "seed",
        "steps_per_execution", "log_every", "save_every")}
    state, lines = {"updates": 0, "pieces": []}, []
    if (run_dir / STATE).exists():  # a later piece: the weights, the optimizer (the schedule) and dropout's state
        state, lines = json.loads((run_dir / STATE).read_text()), (run_dir / "log.jsonl").read_text().splitlines()
        if json.loads(lines[0])["setting"] != setting:
            raise app.UsageError(f"{run_dir} holds a run of another setting: {lines[0]}")
        lm.load_weights(str(run_dir / WEIGHTS))
        for variable, value in zip(seeds, state["dropout_seeds"]):
            variable.assign(np.asarray(value, np.uint32))
    start = int(lm.optimizer.iterations.numpy())  # = state.json's, but for a stop between the two files' writes
    kept = [line for line in map(json.loads, lines[1:]) if line.get("step", 0) <= start]  # not a killed piece's
    rows = [line for line in kept if "step" in line]  # past the save
    tokens_per_update, flops_per_token = batch_size * n_ctx, config.flops_per_token()
    device = str(jax.devices()[0].device_kind)
    print(f"{FLAGS.model}: {lm.count_params():,} parameters on {device} ({jax.default_backend()}); {len(train):,} "
          f"windows, {total} updates of {tokens_per_update:,} tokens"
          f"{f'; resumed at update {start}' if lines else ''}; {time.monotonic() - START:.1f} s to here", flush=True)
    piece = {"piece": len(state["pieces"]), "from": start, "device": device, "jax": jax.__version__,
             "keras": keras.__version__, "piece_minutes": FLAGS.piece_minutes}
    head = {"setting": setting, "updates": total, "windows": len(train), "meta": meta}
    (run_dir / ".log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in [head, *kept, piece]))
    os.replace(run_dir / ".log.jsonl", run_dir / "log.jsonl")
    log = (run_dir / "log.jsonl").open("a")
    marks = []  # (updates, seconds since the piece's fit began) of its log lines

    class Logging(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.stop_training = bool(terminated)  # one already come (fit clears the flag)

        def on_epoch_end(self, epoch, logs=None):
            updates = int(self.model.optimizer.iterations.numpy())
            marks.append((updates, time.monotonic() - fit_start))
            row = {"step": updates, "tokens": updates * tokens_per_update, "epoch": updates / per_epoch,
                   "train_loss": float(logs["loss"]), "lr": float(schedule(updates)), "seconds": marks[-1][1]}
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)

    def figures(done):
        """This piece's figures so far: its updates, seconds, and its updates' speed once compiled (from its first
        log line, whose interval holds the compilation, to its last)."""
        now = time.monotonic()
        (first, first_s), (last, last_s) = (marks[0], marks[-1]) if marks else [(done, now - fit_start)] * 2
        return {**piece, "to": done, "fit_seconds": now - fit_start, "first_log_updates": first - start,
                "first_log_seconds": first_s, "steady_updates": last - first, "steady_seconds": last_s - first_s,
                "compile_seconds": sum(seconds for when, seconds in compiling if when >= fit_start),
                "seconds_since_start": now - START, "stopped_by": None if done == total or not lm.stop_training
                else "SIGTERM" if terminated else "--piece_minutes"}

    def extra(done):  # what state.json keeps beside the updates: dropout's state, the pieces' figures
        return {"dropout_seeds": [[int(x) for x in np.asarray(v.numpy())] for v in seeds],
                "pieces": state["pieces"] + [figures(done)]}

    callbacks = [Logging(), saving(run_dir, FLAGS.piece_minutes, FLAGS.save_every, total, START, extra)]
    fit_start, done = time.monotonic(), start

    def fit(steps, epochs):  # Keras's own fit (keras-hub's maps a preprocessor over tf.data or grain: none here)
        print(f"fit from update {done}", flush=True)
        keras.Model.fit(lm, batches(train, batch_size, FLAGS.seed, total, done), steps_per_epoch=steps,
                        epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)
        return int(lm.optimizer.iterations.numpy())

    # an epoch of fit every --log_every updates (a piece SIGTERM stopped between two goes up to the next first);
    # the last ends where the batches do (Keras says so in a warning)
    if done % log_every and done < total:
        done = fit(log_every - done % log_every, 1)
    if done % log_every == 0 and done < total and not lm.stop_training:
        done = fit(log_every, math.ceil((total - done) / log_every))
    if done > start:  # saved at its stop or its end
        pieces = json.loads((run_dir / STATE).read_text())["pieces"]
    else:  # SIGTERM before fit (or a finished run's command again): nothing trained, this piece's figures kept
        pieces = state["pieces"] + ([figures(done)] if done < total else [])
        if done < total and (run_dir / STATE).exists():
            write_state(run_dir, {**state, "pieces": pieces})
    eval_start = time.monotonic()
    held_out = float(keras.Model.evaluate(lm, model_inputs(valid[:, :-1]), valid[:, 1:], batch_size=batch_size,
                                          verbose=0, return_dict=True)["loss"])
    eval_seconds = time.monotonic() - eval_start
    weights = to_hf_state_dict(lm, lm_head=False, include_special=True)
    parts = save_arrays({k: v.astype(np.float16) for k, v in weights.items()}, str(run_dir), done)
    for old in set(run_dir.glob("weights-*.part*.npz")) - {Path(p) for p in parts}:  # an earlier piece's
        old.unlink()
    steady = sum(p["steady_updates"] for p in pieces), sum(p["steady_seconds"] for p in pieces)
    fit_seconds = sum(p["fit_seconds"] for p in pieces)
    per_update = steady[1] / steady[0] if steady[0] else fit_seconds / done if done else math.nan
    summary = {
        "device": device, "backend": jax.default_backend(), "jax": jax.__version__, "keras": keras.__version__,
        "model": FLAGS.model, "parameters": lm.count_params(), "precision": FLAGS.precision,
        "updates": done, "updates_total": total, "fraction_done": done / total, "epochs_done": done / per_epoch,
        "tokens": done * tokens_per_update, "fit_seconds": fit_seconds,
        "compile_seconds": sum(p["compile_seconds"] for p in pieces),
        "seconds_per_update": per_update, "seconds_of_updates": done * per_update,
        "tokens_per_s": tokens_per_update / per_update,
        "fit_tokens_per_s": done * tokens_per_update / (fit_seconds or math.nan),
        "flops_per_token": flops_per_token, "peak_tflops": FLAGS.peak_tflops,
        "final_train_loss": rows[-1]["train_loss"] if rows else None,
        "final_train_loss_updates": done - (rows[-2]["step"] if len(rows) > 1 else 0),
        "held_out_loss": held_out, "held_out_perplexity": math.exp(held_out), "held_out_windows": len(valid),
        "stopped_by": pieces[-1]["stopped_by"] if pieces else None, "eval_seconds": eval_seconds,
        "weights": [Path(p).name for p in parts], "weights_dtype": "float16", "pieces": pieces}
    for name in ("", "fit_"):
        summary[f"{name}tflops"] = summary[f"{name}tokens_per_s"] * flops_per_token / 1e12
        summary[f"{name}mfu"] = summary[f"{name}tflops"] / FLAGS.peak_tflops
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    if done < total:
        print(f"stopped by {summary['stopped_by']} at update {done} of {total} ({done / total:.1%}), saved; run the "
              f"same command to go on", flush=True)
        return PIECE_EXIT
    return 0


def main(argv):
    del argv
    import keras

    if keras.config.backend() != "jax":
        print(f"tools.jax_pretrain: runs on JAX (KERAS_BACKEND=jax), Keras runs on {keras.config.backend()} here",
              file=sys.stderr)
        return 2
    return main_tokens(keras)


if __name__ == "__main__":
    define_flags()
    app.run(lambda argv: sys.exit(main(argv)))
