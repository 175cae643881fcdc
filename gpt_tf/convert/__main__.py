r"""Command line: a run folder, GPT-1's released shards, a ``transformers`` checkpoint or state dict → a keras-hub
preset.

    python -m gpt_tf.convert --run_dir=runs/shakespeare_tiny --preset_dir=presets/shakespeare  # a backbone preset
    python -m gpt_tf.convert --run_dir=runs/finetune_sst2_tiny --preset_dir=presets/sst2        # a task preset
    python -m gpt_tf.convert --gpt1_shards=../shared/data/gpt1 --tokenizer_dir=../shared/data/gpt1_bpe \
        --preset_dir=presets/gpt1
    python -m gpt_tf.convert --state_dict=weights-7158.part0.npz,weights-7158.part1.npz --model=tiny \
        --tokenizer_dir=data/books_bpe8k --preset_dir=presets/books      # e.g. tools/torch_pretrain's GPU weights
    python -m gpt_tf.convert --state_dict=weights-6839.part0.npz,weights-6839.part1.npz,weights-6839.part2.npz \
        --model=small --tokenizer_dir=data/books_bpe16k --weights_dtype=float16 \
        --preset_dir=gpt_tf/presets/gpt1_small_books_en                  # tools/jax_pretrain --tokens's float16 parts
    python -m gpt_tf.convert --preset=presets/old --preset_dir=presets/new  # a preset of the earlier weights layout
    python -m gpt_tf.convert --hf=hf://openai-community/openai-gpt --preset_dir=presets/openai_gpt  # the paper's GPT-1
    python -m gpt_tf.convert --hf=path/to/save_pretrained_folder --preset_dir=presets/openai_gpt  # the same, offline

The preset loads with ``keras_hub.models.Backbone.from_preset(dir)`` (after ``import gpt_tf.gpt1``) and the task
classes' ``from_preset``, fine-tunes and continues pre-training with ``python -m gpt_tf.train
--init_checkpoint=dir``, and exports with ``python -m serving.export --preset=dir``.
"""

from __future__ import annotations

import sys

from absl import app, flags

FLAGS = flags.FLAGS
SOURCES = ("run_dir", "gpt1_shards", "state_dict", "preset", "hf")


def define_flags() -> None:
    flags.DEFINE_string("run_dir", "", "A pre-training run folder (→ a backbone preset) or a fine-tuning one "
                        "(→ a task preset).")
    flags.DEFINE_string("gpt1_shards", "", "A folder of GPT-1's params_{0..9}.npy + params_shapes.json.")
    flags.DEFINE_list("state_dict", [], "A transformers OpenAIGPT state dict saved as .npz: one file or its parts "
                      "(tools/torch_pretrain's weights-<step>.part<k>.npz).")
    flags.DEFINE_string("preset", "", "A backbone preset folder, re-saved in today's weights layout (one saved by "
                        "an earlier version loads too; this writes it anew). May be --preset_dir itself.")
    flags.DEFINE_string("hf", "", "A transformers GPT-1 checkpoint (model_type openai-gpt): an hf://owner/name handle "
                        "(through the Hugging Face cache; HF_HUB_OFFLINE=1 reads it alone) or a folder save_pretrained "
                        "wrote, with vocab.json + merges.txt (no --tokenizer_dir).")
    flags.DEFINE_string("model", "tiny", "--state_dict: the model size (gpt_tf/config.py) it has the shape of.")
    flags.DEFINE_integer("n_ctx", 0, "--state_dict: the context length (0: the model size's).")
    flags.DEFINE_enum("weights_dtype", "float32", ["float32", "float16"], "--state_dict, --hf: how model.weights.h5 "
                      "stores the weights (float16: half the file; the model loads float32 all the same).")
    flags.DEFINE_string("tokenizer_dir", "", "The BPE files (default for a run: the folder its data manifest names).")
    flags.DEFINE_string("preset_dir", None, "Where the preset goes.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if len([name for name in SOURCES if getattr(FLAGS, name)]) != 1 or not FLAGS.preset_dir:
        sys.exit("gpt_tf.convert: give --preset_dir and exactly one of --run_dir, --gpt1_shards, --state_dict, "
                 "--preset, --hf")
    if FLAGS.hf and FLAGS.tokenizer_dir:
        sys.exit("gpt_tf.convert: --hf takes its tokenizer from the checkpoint (vocab.json + merges.txt): drop "
                 "--tokenizer_dir")
    if not (FLAGS.run_dir or FLAGS.preset or FLAGS.hf) and not FLAGS.tokenizer_dir:
        sys.exit("gpt_tf.convert: --tokenizer_dir is required with --gpt1_shards and --state_dict")
    from gpt_tf.console import import_tensorflow, start_command  # pylint: disable=import-outside-toplevel

    start_command()
    import_tensorflow()
    from gpt_tf.convert import presets  # pylint: disable=import-outside-toplevel

    try:
        if FLAGS.run_dir:
            path = presets.preset_from_run(FLAGS.run_dir, FLAGS.preset_dir, FLAGS.tokenizer_dir)
        elif FLAGS.preset:
            path = presets.preset_from_preset(FLAGS.preset, FLAGS.preset_dir)
        elif FLAGS.hf:
            path = presets.preset_from_hf(FLAGS.hf, FLAGS.preset_dir, FLAGS.weights_dtype)
        elif FLAGS.gpt1_shards:
            path = presets.preset_from_gpt1_shards(FLAGS.gpt1_shards, FLAGS.tokenizer_dir, FLAGS.preset_dir)
        else:
            path = presets.preset_from_state_dict(FLAGS.state_dict, FLAGS.model, FLAGS.tokenizer_dir,
                                                  FLAGS.preset_dir, FLAGS.n_ctx, FLAGS.weights_dtype)
    except (FileNotFoundError, KeyError, ValueError) as err:
        sys.exit(f"gpt_tf.convert: {err}")
    print(path, flush=True)


def run():
    """The console script's entry point (pyproject's [project.scripts])."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
