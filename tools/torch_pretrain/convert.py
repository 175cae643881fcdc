"""The TensorFlow side of `tools.torch_pretrain.train`: token streams out, a gpt_tf run folder back in.

    # 1. here: the pre-training records as two token streams (uint16) for the accelerator
    python -m tools.torch_pretrain.convert --action=export --data_dir=data/books_tiny --tokens=.gpu/books_tiny.npz.xz
    # 2. there: python -m tools.torch_pretrain.train --tokens=.gpu/books_tiny.npz.xz --out_dir=$OUT/run ...
    # 3. here: its weights as a gpt_tf pre-training run, usable by --init_checkpoint, zero-shot, eval, export
    python -m tools.torch_pretrain.convert --action=import --weights_dir=<out_dir> --data_dir=data/books_tiny \\
        --run_dir=runs/books_tiny --model=tiny --plot=docs/books_pretraining.png

Export reads the records of ``pipelines.pretrain_data`` and rebuilds each split's stream (window i holds
stream[i*n_ctx : i*n_ctx + n_ctx + 1], so the stream is the first window plus every next window but its
first token): the accelerator then cuts exactly the same windows.

Import loads every ``weights-<step>.part*.npz`` into a ``Pretrainer`` of the run's config through
``gpt_tf.convert.state_dicts`` (the parts read and their row blocks joined by ``read_state_dict``; the
transformer's by ``load_hf_state_dict``, shapes and tied head checked; for ``--model=lstm_*``, Table 5's LSTM of
``lstm_model.py``, by ``load_torch_lstm``) and saves each as that run's checkpoint
``ckpt-<step>``, so the run folder looks like one ``gpt_tf.train`` wrote. The Adam moments are not
carried over (a resumed run restarts them from zero). ``train_config.json`` states the recipe that ran;
``provenance.json`` says where and how, with the accelerator's log; the held-out perplexity curve goes to
TensorBoard (``<run_dir>/tb/eval``) and, with ``--plot``, to a PNG.
"""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
from absl import app, flags, logging
from tools.torch_pretrain.streams import save_streams

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_enum("action", None, ["export", "import"], "export: records -> streams; import: weights -> run.")
    flags.DEFINE_string("data_dir", None, "A pipelines.pretrain_data output folder.")
    flags.DEFINE_string("tokens", "", "export: the file to write: .npz, or .npz.xz (smaller; tools/torch_pretrain/streams.py).")
    flags.DEFINE_string("weights_dir", "", "import: tools.torch_pretrain.train's --out_dir (log.jsonl, weights-*.npz), "
                        "or a gpt_tf preset with its log.jsonl (gpt_tf/presets/gpt1_tiny_books_en: one checkpoint, the last step).")
    flags.DEFINE_string("run_dir", "", "import: the gpt_tf run folder to create.")
    flags.DEFINE_string("model", "tiny", "import: the preset the accelerator trained.")
    flags.DEFINE_string("plot", "", "import: also draw held-out perplexity against tokens seen into this PNG.")


def split_stream(data_dir: str, split: str) -> np.ndarray:
    """The token stream whose stride-n_ctx windows are the split's records."""
    import tensorflow as tf

    from gpt_tf.data.records import COMPRESSION, PRETRAIN_FEATURE as FEATURE
    from gpt_tf.data.reader import resolve_shards

    files, manifest = resolve_shards(data_dir, split)
    n_ctx = manifest["config"]["n_ctx"]
    spec = {FEATURE: tf.io.FixedLenFeature([n_ctx + 1], tf.int64)}
    records = tf.data.TFRecordDataset(files, compression_type=COMPRESSION).batch(4096)
    pieces = []
    for batch in records:
        windows = tf.io.parse_example(batch, spec)[FEATURE].numpy()
        if not pieces:
            pieces.append(windows[:1, :1].ravel())
        pieces.append(windows[:, 1:].ravel())
    stream = np.concatenate(pieces)
    if stream.max() >= 2**16:
        raise ValueError(f"{data_dir}: token id {stream.max()} does not fit uint16")
    return stream.astype(np.uint16)


def export(data_dir: str, out: str) -> dict:
    from gpt_tf.data.records import read_manifest

    manifest = read_manifest(data_dir)
    streams = {split: split_stream(data_dir, split) for split in ("train", "valid")}
    meta = {"data_dir": data_dir, "n_ctx": manifest["config"]["n_ctx"], "vocab_size": manifest["tokenizer"]["vocab_size"],
            "config_hash": manifest.get("config_hash"), "tokenizer": manifest["tokenizer"],
            "tokens": {k: int(len(v)) for k, v in streams.items()}}
    save_streams(out, meta, streams)
    return meta


def read_log(weights_dir: str) -> tuple[dict, list[dict]]:
    """(the run's setting, its evaluation rows) from its log.jsonl."""
    return read_log_file(os.path.join(weights_dir, "log.jsonl"))


def read_log_file(path: str) -> tuple[dict, list[dict]]:
    """(the run's setting, its evaluation rows) from a ``tools.torch_pretrain.train`` log file."""
    setting, rows = {}, []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            setting = row["setting"] if "setting" in row else setting
            if "valid_ppl" in row:
                rows.append(row)
    return setting, rows


def checkpoint_steps(weights_dir: str, final_step: int) -> dict[int, list[str]]:
    """step -> its weight part files, in step order; a gpt_tf preset folder (``gpt_tf/presets/gpt1_tiny_books_en``: the
    kept run's final weights, with its ``log.jsonl`` and ``sweep.jsonl``) is the one checkpoint ``final_step``."""
    from gpt_tf.convert import preset_io

    if preset_io.is_preset(weights_dir):
        return {final_step: [weights_dir]}
    steps: dict[int, list[str]] = {}
    for path in glob.glob(os.path.join(weights_dir, "weights-*.part*.npz")):
        step = int(re.match(r"weights-(\d+)\.part\d+\.npz", os.path.basename(path)).group(1))
        steps.setdefault(step, []).append(path)
    if not steps:
        raise FileNotFoundError(f"{weights_dir}: no weights-<step>.part<k>.npz files and not a gpt_tf preset")
    return {s: sorted(steps[s]) for s in sorted(steps)}


def tokenizer_digests(tokenizer: dict) -> dict:
    """{file name: sha256} of a manifest's tokenizer entry."""
    return {f["name"]: f["sha256"] for f in tokenizer.get("files", [])}


def import_run(weights_dir: str, data_dir: str, run_dir: str, model: str) -> dict:
    import tensorflow as tf

    from gpt_tf.convert import preset_io
    from gpt_tf.config import get_size
    from gpt_tf.convert.state_dicts import load_torch_state_dict, read_state_dict
    from gpt_tf.training.lm_objective import Pretrainer, TrainConfig
    from gpt_tf.data.records import read_manifest

    setting, rows = read_log(weights_dir)
    if setting.get("model", model) != model:
        raise ValueError(f"{weights_dir} trained --model={setting['model']}; import it with --model={setting['model']}, "
                         f"not {model}")
    manifest = read_manifest(data_dir)
    trained_on = tokenizer_digests(setting.get("meta", {}).get("tokenizer", {}))
    if trained_on != tokenizer_digests(manifest["tokenizer"]):
        raise ValueError(f"{weights_dir} was trained on tokenizer files {trained_on}, but {data_dir} was built with "
                         f"{tokenizer_digests(manifest['tokenizer'])}: rebuild it with the run's BPE files")
    config = get_size(model, vocab_size=manifest["tokenizer"]["vocab_size"], n_ctx=manifest["config"]["n_ctx"])
    lstm = config.model_type == "lstm"  # trained in float32 (tools.torch_pretrain.train)
    steps = checkpoint_steps(weights_dir, setting["steps"])
    train_config = TrainConfig(
        data_dir=data_dir, run_dir=run_dir, batch_size=setting["batch_size"], train_steps=setting["steps"],
        learning_rate=setting["learning_rate"], warmup_steps=setting["warmup"], lr_decay="cosine",
        weight_decay=setting["weight_decay"], clip_norm=setting["clip_norm"],
        precision="float32" if lstm else "mixed_bfloat16",
        seed=setting["seed"], keep_checkpoints=len(steps))
    trainer = Pretrainer(config, train_config, tf.distribute.get_strategy(), log=lambda *_: None)
    for step, parts in steps.items():
        if preset_io.is_preset(parts[0]):  # the final weights as shipped in gpt_tf/presets/ (float32 as they were)
            preset_io.load_preset_weights(trainer.model.backbone, parts[0])
        else:
            load_torch_state_dict(trainer.model, read_state_dict(parts))
        trainer.step.assign(step)
        trainer.manager.save(checkpoint_number=step)
    trainer.save_model_config()
    writer = tf.summary.create_file_writer(os.path.join(run_dir, "tb", "eval"))
    with writer.as_default():
        for row in rows:
            tf.summary.scalar("perplexity", row["valid_ppl"], step=row["step"])
            tf.summary.scalar("loss", row["valid_loss"], step=row["step"])
    writer.flush()
    trained_by = ("tools.torch_pretrain.train (tools/torch_pretrain/lstm_model.py, the LSTM baseline that "
                  "tests/test_torch_lstm.py proves equal to gpt_tf's LSTMBackbone)" if lstm else
                  "tools.torch_pretrain.train (transformers OpenAIGPTLMHeadModel, the reference that "
                  "tests/test_weights.py proves equal to gpt_tf's model)")
    provenance = {"trained_by": trained_by,
                  "setting": setting, "curve": rows, "checkpoints": list(steps)}
    with open(os.path.join(run_dir, "provenance.json"), "w") as f:
        json.dump(provenance, f, indent=2)
    return {"run_dir": run_dir, "checkpoints": list(steps), "final_ppl": rows[-1]["valid_ppl"] if rows else None}


def read_sweep(weights_dir: str) -> dict[str, list[dict]]:
    """run name -> its evaluation rows, from the sweep's ``sweep.jsonl`` (empty when there is none)."""
    path = os.path.join(weights_dir, "sweep.jsonl")
    runs: dict[str, list[dict]] = {}
    if os.path.isfile(path):
        with open(path) as f:
            for row in map(json.loads, f):
                if "valid_ppl" in row:
                    runs.setdefault(row["run"], []).append(row)
    return runs


def plot_curve(rows: list[dict], setting: dict, path: str, sweep: dict[str, list[dict]] | None = None) -> None:
    """Held-out perplexity against tokens seen: the kept run bold, the sweep's other runs thin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=120)
    kept = f"lr{setting.get('learning_rate')}"
    for name, other in sorted((sweep or {}).items()):
        if abs(float(name[2:]) - float(setting.get("learning_rate", 0))) > 1e-12:
            ax.plot([r["tokens"] / 1e6 for r in other], [r["valid_ppl"] for r in other], lw=1, alpha=0.7,
                    label=f"lr {name[2:]}: {other[-1]['valid_ppl']:.1f}")
    tokens = [r["tokens"] / 1e6 for r in rows]
    ax.plot(tokens, [r["valid_ppl"] for r in rows], marker="o", ms=3, lw=2, color="C0",
            label=f"{kept.replace('lr', 'lr ')} (kept): {rows[-1]['valid_ppl']:.1f}")
    ax.plot(tokens, [float(np.exp(r["train_loss"])) for r in rows], ls="--", lw=1, color="C0",
            label="kept run, training batches (dropout on)")
    epoch_tokens = rows[-1]["tokens"] / rows[-1]["epoch"] / 1e6 if rows and rows[-1]["epoch"] else 0
    for k in range(1, int(rows[-1]["epoch"]) + 1 if rows else 0):
        ax.axvline(k * epoch_tokens, color="0.85", lw=0.8, zorder=0)
    ax.set_yscale("log")
    ax.set_xlabel("tokens seen (millions; grey lines: epochs)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title(f"{setting.get('model', '')} pre-trained on the shared books (batch {setting.get('batch_size')} "
                 f"x {setting.get('meta', {}).get('n_ctx')})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv):
    del argv
    from gpt_tf.console import import_tensorflow, start_command

    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TF's checkpoint INFO lines off the console, as gpt_tf.train

    start_command()
    import_tensorflow()  # its start-up lines off the console (GPT_TF_VERBOSE=1 keeps them)
    if FLAGS.action == "export":
        if not FLAGS.tokens:
            raise app.UsageError("--action=export needs --tokens")
        print(json.dumps(export(FLAGS.data_dir, FLAGS.tokens)))
        return
    if not (FLAGS.weights_dir and FLAGS.run_dir):
        raise app.UsageError("--action=import needs --weights_dir and --run_dir")
    if os.path.exists(os.path.join(FLAGS.run_dir, "checkpoints")):
        raise app.UsageError(f"{FLAGS.run_dir} already has checkpoints; import into a new run folder")
    print(json.dumps(import_run(FLAGS.weights_dir, FLAGS.data_dir, FLAGS.run_dir, FLAGS.model)))
    if FLAGS.plot:
        setting, rows = read_log(FLAGS.weights_dir)
        plot_curve(rows, setting, FLAGS.plot, read_sweep(FLAGS.weights_dir))


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["action", "data_dir"])
    app.run(main)
