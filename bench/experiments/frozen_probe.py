"""How much of a regression task the frozen model's states already hold: a ridge probe on dev.

    python -m bench.experiments.frozen_probe --task_dir=data/tasks_books/stsb --pretrained=gpt_tf/presets/gpt1_tiny_books_en   # ~2 min

The probe reads the final block's states at the extract tokens, as the fine-tuned head does (for a
symmetric pair task the two orders' states added, §3.3), from the pre-trained model and from the same
shape with random weights (``--seed``), fits a ridge regression on the training split's states
(standardised, closed form, one fit per ``--ridge``), and prints dev Pearson (and writes it to ``--out``,
which ``bench.experiments.stsb_explained`` reads). Nothing is trained but the
probe: if it is low for the pre-trained states, fine-tuning starts with little of the signal.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
from pathlib import Path

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("task_dir", "data/tasks_books/stsb", "task records built with the pre-trained run's BPE")
    flags.DEFINE_string("pretrained", "gpt_tf/presets/gpt1_tiny_books_en", "the pre-trained model (preset or run folder) probed")
    flags.DEFINE_integer("n_ctx", 96, "context of the views (the task's recipe's n_ctx)")
    flags.DEFINE_list("ridge", ["1", "10", "100", "1000"], "ridge penalties, each fitted and scored on dev")
    flags.DEFINE_integer("seed", 0, "seed of the random-weights model")
    flags.DEFINE_string("out", "bench/results/frozen_probe_stsb.json", "the scores as JSON ('' : print only)")


def states(model, task, task_dir: str, split: str, n_ctx: int, special_ids) -> tuple[np.ndarray, np.ndarray]:
    """[examples, d] extract-token states (orders added for a symmetric pair) and the labels, file order kept."""
    from pipelines.transforms import task_dataset

    xs, ys = [], []
    for features, label in task_dataset(task, task_dir, split, 64, n_ctx, special_ids):
        _, h = model.extract_states(features, training=False, all_states=False)
        h = h.numpy().sum(axis=1) if task.input_type == "pair_symmetric" else h.numpy()[:, 0]
        keep = features["record_index"].numpy() >= 0
        xs.append(h[keep])
        ys.append(label.numpy()[keep])
    return np.concatenate(xs), np.concatenate(ys)


def probe(model, task, args, special_ids) -> dict:
    x, y = states(model, task, args.task_dir, "train", args.n_ctx, special_ids)
    x_dev, y_dev = states(model, task, args.task_dir, "dev", args.n_ctx, special_ids)
    mean, std = x.mean(0), x.std(0) + 1e-6
    x, x_dev = (x - mean) / std, (x_dev - mean) / std
    scores = {}
    for penalty in args.ridge:
        w = np.linalg.solve(x.T @ x + float(penalty) * np.eye(x.shape[1]), x.T @ (y - y.mean()))
        scores[penalty] = round(float(np.corrcoef(x_dev @ w, y_dev)[0, 1]), 4)
    return scores


def main(argv):
    del argv  # everything is a flag
    import keras

    from gpt_tf.checkpoints import build_task_models, initialise_from_pretrained
    from gpt_tf.run_dir import pretrained_model_config
    from pipelines.transforms import load_task_spec, special_ids_from_config

    task = load_task_spec(FLAGS.task_dir)
    if task.head != "regression":
        raise app.UsageError(f"{FLAGS.task_dir}: task {task.name!r} has a {task.head} head; the probe is a regression")
    config = dataclasses.replace(pretrained_model_config(FLAGS.pretrained), n_ctx=FLAGS.n_ctx)
    special_ids = special_ids_from_config(config)
    report = {"command": " ".join(["python -m bench.experiments.frozen_probe", *sys.argv[1:]]),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"), "task": task.name,
              "pretrained": FLAGS.pretrained, "n_ctx": FLAGS.n_ctx, "seed": FLAGS.seed, "dev_pearson": {}}
    for arm in ("pretrained", "random"):
        keras.utils.set_random_seed(FLAGS.seed)
        model = build_task_models(config, [task], 0.1, "float32")[0]
        if arm == "pretrained":  # as fine-tuning starts: every block transferred
            initialise_from_pretrained(model, FLAGS.pretrained, config.n_layer, seed=FLAGS.seed)
        report["dev_pearson"][arm] = probe(model, task, FLAGS, special_ids)
        print(f"{task.name} {arm}: dev pearson by ridge penalty {report['dev_pearson'][arm]}", flush=True)
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
