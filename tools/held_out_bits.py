r"""Pre-trained models' held-out loss in bits per character and per byte: figures that compare across vocabularies.

    python -m pipelines.pretrain_data --input_dir=../shared/data/books/train --valid_dir=../shared/data/books/valid \
        --output_dir=data/books_tiny --tokenizer_dir=gpt_tf/presets/gpt1_tiny_books_en/assets/tokenizer --n_ctx=128
    python -m pipelines.pretrain_data --input_dir=../shared/data/books/train --valid_dir=../shared/data/books/valid \
        --output_dir=data/books_small --tokenizer_dir=gpt_tf/presets/gpt1_small_books_en/assets/tokenizer --n_ctx=256
    python -m tools.held_out_bits --models=gpt1_tiny_books_en,gpt1_small_books_en \
        --data_dirs=data/books_tiny,data/books_small          # -> bench/results/held_out_bits.{json,md}

Each model (a shipped preset's name or a preset folder) is scored as pre-training scores its held-out split
(``Pretrainer.evaluate``, float32, on TensorFlow): every full batch of ``--batch_size`` windows of its data folder's
``valid`` split, which must hold the books tokenized by the model's own BPE (``assets/tokenizer/``) at its context.
Reported per model: the loss per token and its perplexity, bits per character and per byte
(``gpt_tf/text/text_units.py``: the definition), the tokens, characters and bytes scored, and how many of the scored
targets are ``<unk>`` (each counted as one character and one byte).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
ROOT = Path(__file__).resolve().parents[1]


def define_flags() -> None:
    flags.DEFINE_list("models", ["gpt1_tiny_books_en", "gpt1_small_books_en"], "Presets (names or folders).")
    flags.DEFINE_list("data_dirs", ["data/books_tiny", "data/books_small"], "Each model's data folder, in order.")
    flags.DEFINE_integer("batch_size", 16, "Windows per batch (the last partial batch is not scored).")
    flags.DEFINE_string("output", str(ROOT / "bench" / "results" / "held_out_bits"),
                        "Writes OUTPUT.json and OUTPUT.md ('' to print only).")


def held_out_bits(model: str, data_dir: str, batch_size: int) -> dict:
    """One model's figures on ``data_dir``'s held-out windows; ValueError where the data is not tokenized for it."""
    import numpy as np
    import tensorflow as tf

    from gpt_tf.convert import preset_io
    from gpt_tf.data.reader import pretraining_dataset
    from gpt_tf.data.records import read_manifest, tokenizer_problems
    from gpt_tf.text.tokenizer import GPTTokenizer
    from gpt_tf.training.lm_objective import Pretrainer, TrainConfig

    folder = preset_io.locate(model)
    config, manifest = preset_io.preset_config(folder), read_manifest(data_dir)
    tokenizer_dir = os.path.join(folder, preset_io.TOKENIZER_ASSETS)
    problems = tokenizer_problems(manifest, tokenizer_dir, data_dir)
    if problems or int(manifest["n_ctx"]) != config.n_ctx:
        raise ValueError(f"{data_dir} is not {model}'s data (its BPE at n_ctx {config.n_ctx}): "
                         + "; ".join(problems or [f"its windows are of {manifest['n_ctx']} tokens"]))
    tokenizer = GPTTokenizer.from_dir(tokenizer_dir)
    with tempfile.TemporaryDirectory(prefix="held_out_bits_") as run_dir:
        trainer = Pretrainer(config, TrainConfig(data_dir=data_dir, run_dir=run_dir, batch_size=batch_size,
                                                 init_checkpoint=folder), tf.distribute.get_strategy(), log=print)
        result = trainer.evaluate(tokenizer=tokenizer)
    batches = pretraining_dataset(data_dir, "valid", batch_size, config.n_ctx, shuffle=False, repeat=False)
    unknown = sum(int(np.sum(y.numpy() == tokenizer.unk_id)) for _, y in batches)  # the scored targets: every batch
    return {"model": model, "data_dir": data_dir, "vocab_size": tokenizer.vocab_size, "n_ctx": config.n_ctx,
            "batch_size": batch_size, **result, "unk_targets": unknown}


def main(argv) -> None:
    del argv
    from bench.harness import header, machine_info, save_report
    from gpt_tf.console import import_tensorflow, start_command

    if len(FLAGS.models) != len(FLAGS.data_dirs):
        raise app.UsageError(f"--models names {len(FLAGS.models)}, --data_dirs {len(FLAGS.data_dirs)}: one data "
                             "folder per model")
    start_command()  # the machine's picked CPU settings, as the command lines run
    import_tensorflow()
    info = machine_info()
    rows = []
    for model, data_dir in zip(FLAGS.models, FLAGS.data_dirs):
        try:
            rows.append(held_out_bits(model, data_dir, FLAGS.batch_size))
        except (ValueError, FileNotFoundError) as err:
            sys.exit(f"tools.held_out_bits: {err}")
        print(rows[-1], file=sys.stderr)
    lines = [header(info), "", "| model | BPE | context | loss per token (perplexity) | bits per character | bits per "
             "byte | tokens | characters | bytes | `<unk>` |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['vocab_size']:,} | {r['n_ctx']} | {r['loss']:.4f} ({r['perplexity']:.1f}) | "
              f"{r['bits_per_char']:.4f} | {r['bits_per_byte']:.4f} | {r['tokens']:,} | {r['chars']:,} | "
              f"{r['bytes']:,} | {r['unk_targets']} |" for r in rows]
    report = {"machine": info, "command": " ".join(["python -m tools.held_out_bits", *sys.argv[1:]]), "models": rows}
    if FLAGS.output:
        save_report(report, "\n".join(lines) + "\n", Path(FLAGS.output).with_suffix(".json"), print)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    define_flags()
    app.run(main)
