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
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from absl import app, flags

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
    flags.mark_flags_as_required(["data_dir", "run_dir"])


def saving(run_dir: Path, minutes: float, save_every: int):
    """``fit``'s callback: a save at the end of each of ``fit``'s epochs (``save_every`` updates), and the piece's
    stop at the first after ``minutes`` (0: never)."""
    import keras

    start = time.monotonic()

    class Saving(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            updates = (epoch + 1) * save_every
            tmp = run_dir / f".{WEIGHTS}"
            self.model.save_weights(str(tmp))  # the model's and the optimizer's variables
            os.replace(tmp, run_dir / WEIGHTS)
            write_state(run_dir, {"updates": updates, "loss": float(logs["loss"])})
            if minutes and time.monotonic() - start > 60 * minutes:
                self.model.stop_training = True

    return Saving()


def write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / f".{STATE}"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, run_dir / STATE)


def main(argv):
    del argv
    import keras

    from gpt_tf.config import get_size
    from gpt_tf.gpt1 import GPT1CausalLM, GPT1CausalLMPreprocessor, GPT1Tokenizer
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.nn.optim import WarmupDecay, make_optimizer
    from pipelines.reader import batches_per_pipeline, pretraining_dataset
    from pipelines.records import read_manifest

    if keras.config.backend() != "jax":
        print(f"tools.jax_pretrain: runs on JAX (KERAS_BACKEND=jax), Keras runs on {keras.config.backend()} here",
              file=sys.stderr)
        return 2
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
               callbacks=[saving(run_dir, FLAGS.piece_minutes, FLAGS.save_every)])
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
