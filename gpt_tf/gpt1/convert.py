r"""Command line: a run folder, GPT-1's released shards or a ``transformers`` state dict → a keras-hub preset.

    python -m gpt_tf.gpt1.convert --run_dir=runs/books_tiny --preset_dir=presets/my_books
    python -m gpt_tf.gpt1.convert --run_dir=runs/finetune_sst2 --preset_dir=presets/sst2     # the task too
    python -m gpt_tf.gpt1.convert --gpt1_shards=../shared/data/gpt1 --tokenizer_dir=../shared/data/gpt1_bpe \
        --preset_dir=presets/gpt1
    python -m gpt_tf.gpt1.convert --hf_state_dict=a.npz,b.npz --model=tiny --tokenizer_dir=... --preset_dir=...

The preset loads with ``keras_hub.models.Backbone.from_preset(dir)`` (after ``import gpt_tf``), the
task classes' ``from_preset`` and ``python -m gpt_tf.train --init_checkpoint=dir``.
"""

from __future__ import annotations

import sys

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_string("run_dir", "", "A pre-training or fine-tuning run folder.")
    flags.DEFINE_string("gpt1_shards", "", "A folder of GPT-1's params_{0..9}.npy + params_shapes.json.")
    flags.DEFINE_list("hf_state_dict", [], "transformers OpenAIGPT state dict parts (.npz).")
    flags.DEFINE_string("model", "tiny", "--hf_state_dict: the model size (gpt_tf/config.py) it has the shape of.")
    flags.DEFINE_integer("n_ctx", 0, "--hf_state_dict: the context length (0: the model size's).")
    flags.DEFINE_string("tokenizer_dir", "", "The BPE files (default for a run: the folder its data manifest names).")
    flags.DEFINE_string("preset_dir", None, "Where the preset goes.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    sources = [name for name in ("run_dir", "gpt1_shards", "hf_state_dict") if getattr(FLAGS, name)]
    if len(sources) != 1 or not FLAGS.preset_dir:
        sys.exit("gpt_tf.gpt1.convert: give --preset_dir and exactly one of --run_dir, --gpt1_shards, --hf_state_dict")
    if not FLAGS.run_dir and not FLAGS.tokenizer_dir:
        sys.exit("gpt_tf.gpt1.convert: --tokenizer_dir is required with --gpt1_shards and --hf_state_dict")
    from gpt_tf.console import import_tensorflow  # pylint: disable=import-outside-toplevel

    import_tensorflow()
    from gpt_tf.gpt1 import presets  # pylint: disable=import-outside-toplevel

    try:
        if FLAGS.run_dir:
            path = presets.preset_from_run(FLAGS.run_dir, FLAGS.preset_dir, FLAGS.tokenizer_dir)
        elif FLAGS.gpt1_shards:
            path = presets.preset_from_gpt1_shards(FLAGS.gpt1_shards, FLAGS.tokenizer_dir, FLAGS.preset_dir)
        else:
            path = presets.preset_from_hf_state_dict(FLAGS.hf_state_dict, FLAGS.model, FLAGS.tokenizer_dir,
                                                     FLAGS.preset_dir, FLAGS.n_ctx)
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"gpt_tf.gpt1.convert: {err}")
    print(path, flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
