"""Fine-tuning checked against the reference implementation (issue 32): ``transformers``' PyTorch
``OpenAIGPTModel`` fine-tuned from the same start, on the same batches, with the same recipe as the
project's cell, scored on dev by the project's metric functions.

    # the cells, smallest tasks first, seed 0 across the tasks before seeds 1-2 (resumable)
    nice -n 19 python -m bench.experiments.reference_finetune --tasks=rte,mrpc,stsb,story_cloze,cola --seeds=0,1,2
    # the table against the project's cells (bench/results/reproduction.jsonl) into docs/results.md
    python -m bench.experiments.reference_finetune --stage=report

What is shared with the project's cell ``python -m gpt_tf.train --flagfile=configs/finetune_<task>_tiny.flags
--init_checkpoint=<books_tiny> --seed=<s>``, and what is not:

* the start: the project's ``GPTTaskModel`` built and initialised exactly as ``Finetuner`` does for that
  seed (``keras.utils.set_random_seed(seed)``, ``initialise_from_pretrained``: the preset's weights, the
  special-token rows re-drawn, W_y's N(0, 0.02) draw), then copied into ``OpenAIGPTModel`` + a linear head;
* the token ids and batches: ``pipelines.transforms.task_dataset`` with the cell's n_ctx, seed and length
  buckets: the §3.3 views and the same global batch at every step;
* the recipe: read from the task's ``configs/finetune_<task>_tiny.flags`` (lr, epochs, warm-up, λ, batch,
  classifier dropout, weight decay, clipping), the learning-rate schedule of ``gpt_tf.optim``;
* the metrics: ``gpt_tf.metrics.compute_metrics`` on dev, after every epoch;
* NOT shared: the forward pass, the loss, dropout's random stream, the optimizer (``torch.optim.AdamW``,
  ``clip_grad_norm_``), which are the reference's own (``reference_model.py``).

Each finished (task, seed, recipe) cell is one JSON line of ``--ledger``; a cell found there is skipped.
Inside a cell the state (weights, optimizer, dropout's random state, step, dev scores so far) is saved after
every epoch and every ``--save_every`` updates under ``--state_dir``; a rerun resumes from it (the batches
follow the step: ``task_dataset(start_batch=step)``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from absl import app, flags

from bench.experiments.finetune_runs import N_CTX, ROOT, append_ledger, load_ledger, main_metric

FLAGS = flags.FLAGS
TASKS = ("rte", "mrpc", "stsb", "story_cloze", "cola")  # smallest first
# The recipe knobs read from a flagfile (gpt_tf.train flags), with their types.
KNOBS = {"n_ctx": int, "batch_size": int, "epochs": int, "learning_rate": float, "warmup_fraction": float,
         "lm_coef": float, "clf_pdrop": float, "weight_decay": float, "clip_norm": float, "lr_decay": str}
SECTION = ("<!-- reference_finetune: written by python -m bench.experiments.reference_finetune --stage=report -->",
           "<!-- /reference_finetune -->")


def define_flags():
    flags.DEFINE_enum("stage", "run", ["run", "report"], "run: the missing cells; report: the table into --report.")
    flags.DEFINE_list("tasks", list(TASKS), "Tasks, in the order they run.")
    flags.DEFINE_enum("arm", "pretrained", ["pretrained", "scratch"], "Start from --pretrained, or from scratch in its shape.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; every task's seed 0 runs before any seed 1.")
    flags.DEFINE_string("pretrained", "gpt_tf/presets/gpt1_tiny_books_en", "The pre-trained model (preset or run folder).")
    flags.DEFINE_string("tasks_dir", "data/tasks_books", "Task records built with the pre-trained model's BPE.")
    flags.DEFINE_string("recipe", "_tiny", "Recipe flagfiles: configs/finetune_<task><recipe>.flags.")
    flags.DEFINE_integer("epochs", 0, "Override the recipe's epochs (0: the recipe's; a dev curve: e.g. 10).")
    flags.DEFINE_string("ledger", "bench/results/reference_finetune.jsonl", "One JSON line per finished cell.")
    flags.DEFINE_string("ours", "bench/results/reproduction.jsonl", "The project's cells (bench/reproduction.py).")
    flags.DEFINE_string("state_dir", "runs/reference_finetune", "Per-cell state saved at each epoch (resume).")
    flags.DEFINE_string("report", "docs/results.md", "--stage=report: the file whose section is (re)written.")
    flags.DEFINE_integer("threads", 2, "torch intra-op threads.")
    flags.DEFINE_integer("max_updates", 0, "Stop after this many updates in this process, the state saved (pieces).")
    flags.DEFINE_integer("save_every", 20, "Also save the cell's state every N updates (0: at each epoch's end only).")


# ------------------------------------------------------------------ recipes
def flagfile_values(path: Path) -> dict:
    """The flags a flagfile sets (``--name=value`` lines), the flagfiles it includes first (paths from ROOT)."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("--"):
            continue
        name, _, value = line[2:].partition("=")
        if name == "flagfile":
            values.update(flagfile_values(ROOT / value))
        else:
            values[name] = value
    return values


def task_recipe(task: str, recipe: str = "_tiny", epochs: int = 0) -> dict:
    """The knobs of ``configs/finetune_<task><recipe>.flags`` (n_ctx from ``N_CTX`` where it sets none)."""
    values = flagfile_values(ROOT / "configs" / f"finetune_{task}{recipe}.flags")
    values.setdefault("n_ctx", str(N_CTX[task]))
    out = {name: kind(values[name]) for name, kind in KNOBS.items() if name in values}
    if epochs:
        out["epochs"] = epochs
    return out


def cell_key(task: str, seed: int, recipe: dict, arm: str = "pretrained") -> str:
    return f"{task}_{'' if arm == 'pretrained' else arm + '_'}s{seed}_" + "_".join(f"{k}{recipe[k]}" for k in sorted(recipe) if k != "lr_decay")


def ours_cells(ledger_rows: list[dict], task: str, recipe: dict, arm: str = "pretrained") -> dict:
    """{seed: the project's ``arm`` record with this recipe} from bench/reproduction.py's ledger.

    A ledger row names only the knobs it overrides; the rest are those of ``configs/finetune_<task>.flags``."""
    base = task_recipe(task, recipe="")
    found = {}
    for row in ledger_rows:
        if row["task"] != task or row["arm"] != arm:
            continue
        have = {**base, **{k: KNOBS[k](v) for k, v in row["recipe"].items()}}
        have["n_ctx"] = int(shlex.split(row["cmd"].split("--n_ctx=")[1])[0]) if "--n_ctx=" in row["cmd"] else N_CTX[task]
        if all(have.get(k) == v for k, v in recipe.items()):
            found.setdefault(row["seed"], row)
    return found


# ------------------------------------------------------------------ one cell
def project_start(pretrained, task, n_ctx: int, seed: int, clf_pdrop: float):
    """(GPTConfig, GPTTaskModel) initialised as ``Finetuner`` does for ``seed``: from the pre-trained model at
    the path ``pretrained``, or from scratch when ``pretrained`` is a ``GPTConfig`` (the scratch arm's shape)."""
    import keras

    from gpt_tf.checkpoints import build_task_models, initialise_from_pretrained
    from gpt_tf.run_dir import pretrained_model_config

    scratch = not isinstance(pretrained, str)
    config = dataclasses.replace(pretrained if scratch else pretrained_model_config(pretrained), n_ctx=n_ctx)
    keras.utils.set_random_seed(seed)
    model = build_task_models(config, [task], clf_pdrop, "float32")[0]
    if not scratch:
        initialise_from_pretrained(model, pretrained, config.n_layer, seed=seed)
    return config, model


def evaluate(ref, task, data_dir: str, split: str, batch_size: int, n_ctx: int, special_ids) -> dict:
    """The project's metrics of the reference model on ``split`` (file order, ghost rows dropped)."""
    import numpy as np
    import torch

    from bench.experiments.reference_model import to_torch
    from gpt_tf.metrics import compute_metrics
    from gpt_tf.task_model import task_predictions
    from pipelines.transforms import task_dataset

    ref.eval()
    outs, labels, index = [], [], []
    with torch.no_grad():
        for features, label in task_dataset(task, data_dir, split, batch_size, n_ctx, special_ids):
            batch, _ = to_torch(features, label)
            outs.append(ref(batch["input_ids"], batch["extract_index"])[0].numpy())
            labels.append(label.numpy())
            index.append(features["record_index"].numpy())
    outs, labels, index = np.concatenate(outs), np.concatenate(labels), np.concatenate(index)
    real = index >= 0
    order = np.argsort(index[real], kind="stable")
    outs, labels = outs[real][order], labels[real][order]
    return {**compute_metrics(task, labels, task_predictions(task, outs)), "examples": int(len(labels))}


def run_cell(task_name: str, seed: int, recipe: dict, *, pretrained, tasks_dir: str, state_dir: str,
             save_every: int = 20, max_updates: int = 0, log=print) -> dict | None:
    """Fine-tunes the reference on one (task, seed); returns the ledger record (dev metrics per epoch), or None
    when ``max_updates`` (> 0) updates ran first in this call (the state saved: the next call resumes).
    ``pretrained``: a path (the pre-trained arm) or a ``GPTConfig`` (the scratch arm, ``project_start``)."""
    import torch

    from bench.experiments.reference_model import ReferenceTaskModel, learning_rate, to_torch, warmup_steps
    from bench.torch_pretrain.train import param_groups
    from pipelines.task_batches import bucket_lengths
    from pipelines.transforms import load_task_spec, num_examples, special_ids_from_config, task_dataset

    data_dir = str(Path(tasks_dir) / task_name)
    task, n_ctx, batch_size = load_task_spec(data_dir), recipe["n_ctx"], recipe["batch_size"]
    config, model = project_start(pretrained, task, n_ctx, seed, recipe["clf_pdrop"])
    special_ids = special_ids_from_config(config)
    ref = ReferenceTaskModel.from_project(model, recipe["clf_pdrop"])
    del model
    steps_per_epoch = num_examples(data_dir, "train") // batch_size
    total = steps_per_epoch * recipe["epochs"]
    warmup = warmup_steps(recipe["warmup_fraction"], total)
    optimizer = torch.optim.AdamW(param_groups(ref, recipe["weight_decay"]), lr=0.0, betas=(0.9, 0.999), eps=1e-8)
    torch.manual_seed(seed)
    arm = "pretrained" if isinstance(pretrained, str) else "scratch"
    state_path = Path(state_dir) / f"{cell_key(task_name, seed, recipe, arm)}.pt"
    step, epochs, seconds = 0, [], 0.0
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        ref.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step, epochs, seconds = state["step"], state["epochs"], state["seconds"]
        log(f"{task_name} seed {seed}: resumed at update {step} of {total}")
    start, first = time.time() - seconds, step
    batches = iter(task_dataset(task, data_dir, "train", batch_size, n_ctx, special_ids, training=True, seed=seed,
                                buckets=bucket_lengths(n_ctx), start_batch=step))
    ref.train()
    while step < total:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, recipe["learning_rate"], warmup, total)
        batch, label = to_torch(*next(batches))
        losses = ref.losses(batch, label, recipe["lm_coef"])
        optimizer.zero_grad(set_to_none=True)
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), recipe["clip_norm"])
        optimizer.step()
        step += 1
        if step % 20 == 0:
            log(f"{task_name} seed {seed}: update {step}/{total} task {float(losses['task'].detach()):.4f} "
                f"lm {float(losses['lm'].detach()):.4f} ({time.time() - start:.0f} s)")
        end_of_epoch = step % steps_per_epoch == 0
        if end_of_epoch:
            epochs.append(evaluate(ref, task, data_dir, "dev", batch_size, n_ctx, special_ids))
            log(f"{task_name} seed {seed}: epoch {len(epochs)} dev {epochs[-1]}")
            ref.train()
        stop = bool(max_updates) and step - first >= max_updates and step < total
        if end_of_epoch or stop or (save_every and step % save_every == 0 and step < total):
            state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = state_path.with_suffix(".tmp")
            torch.save({"model": ref.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                        "step": step, "epochs": epochs, "seconds": time.time() - start}, tmp)
            os.replace(tmp, state_path)
        if stop:
            log(f"{task_name} seed {seed}: stopped after {max_updates} updates at update {step} of {total} (state saved)")
            return None
    from gpt_tf.precision import cpu_name

    return {"task": task_name, "arm": arm, "seed": seed, "recipe": recipe, "key": cell_key(task_name, seed, recipe, arm),
            "metrics": {"dev": epochs[-1]}, "epochs": epochs, "updates": total, "seconds": round(time.time() - start, 1),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": _git_revision(), "cpu": cpu_name()}


def _git_revision() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def run_all() -> None:
    import torch

    torch.set_num_threads(FLAGS.threads)
    ledger = Path(FLAGS.ledger)
    start = FLAGS.pretrained
    if FLAGS.arm == "scratch":  # the pre-trained model's shape, fresh weights (the reproduction's scratch arm)
        from gpt_tf.run_dir import pretrained_model_config

        start = pretrained_model_config(FLAGS.pretrained)
    done = {row["key"] for row in load_ledger(ledger)}
    for seed in (int(s) for s in FLAGS.seeds):
        for task in FLAGS.tasks:
            recipe = task_recipe(task, FLAGS.recipe, FLAGS.epochs)
            if cell_key(task, seed, recipe, FLAGS.arm) in done:
                print(f"{task} seed {seed}: in {ledger}, skipped", flush=True)
                continue
            record = run_cell(task, seed, recipe, pretrained=start, tasks_dir=FLAGS.tasks_dir,
                              state_dir=FLAGS.state_dir, save_every=FLAGS.save_every, max_updates=FLAGS.max_updates,
                              log=lambda m: print(m, flush=True))
            if record is None:
                return
            record.update(torch_threads=FLAGS.threads,
                          cmd="python -m bench.experiments.reference_finetune " + " ".join(sys.argv[1:]))
            append_ledger(ledger, record)
            print(f"{task} seed {seed}: dev {record['metrics']['dev']} ({record['seconds']} s)", flush=True)


def main(argv):
    del argv  # everything is a flag
    os.chdir(ROOT)
    if FLAGS.stage == "run":
        run_all()
    else:
        from bench.experiments.reference_report import write_section

        write_section()


if __name__ == "__main__":
    define_flags()
    app.run(main)
