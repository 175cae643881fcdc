"""Fine-tuning on real data: a pre-trained LM against the same model from scratch, plus multi-task RTE.

    python -m bench.finetune_table --pretrained=runs/books_tiny --tasks_dir=data/tasks_books \\
        --out=bench/results/finetune_books_tiny

Every cell is one ``python -m gpt_tf.train --flagfile=configs/finetune_<task>.flags`` run (the
paper's recipe: lr 6.25e-5, batch 32, 3 epochs, linear decay, 0.2% warm-up, λ 0.5, classifier
dropout 0.1) in its own process, timed wall-clock, with the exact command recorded. Arms:

* ``pretrained``: ``--init_checkpoint=<pretrained>`` (all blocks transferred);
* ``scratch``: the same architecture (``--model`` of the pre-trained run) from random init;
* ``multitask``: RTE with the other GLUE tasks as auxiliary heads (``--aux_data_dirs``), RTE drawn
  for half of the updates and the others equally for the rest.

Each finished run is appended to ``<out>.jsonl``; a re-run skips those already there, so an
interrupted table resumes. ``<out>.md`` is rewritten from the JSONL after every run.
"""

from __future__ import annotations

import json
import os
import statistics
import types
from pathlib import Path

from absl import app, flags

from bench.finetune_runs import (N_CTX, append_ledger, dev_metrics, finetune_spec, load_ledger, main_metric, preset_of,
                                 run_one)

FLAGS = flags.FLAGS
MULTITASK_AUX = ("mrpc", "stsb", "sst2", "cola")


def run_spec(task: str, arm: str, seed: int, args) -> dict:
    """The command line of one fine-tuning run."""
    extra = []
    if arm == "multitask":
        aux = [str(Path(args.tasks_dir) / t) for t in MULTITASK_AUX]
        extra = [f"--aux_data_dirs={','.join(aux)}", "--task_mixture=" + ",".join(["0.5"] + ["0.125"] * len(aux))]
    return finetune_spec(task, arm, seed, runs_root=args.runs_root, tasks_dir=args.tasks_dir, precision=args.precision,
                         init_checkpoint=args.pretrained if arm in ("pretrained", "multitask") else "",
                         model=args.model, extra=extra)


def markdown(records: list[dict], header: str) -> str:
    """The results table: per task, pre-trained vs scratch (median over seeds), deltas and times."""
    by = {}
    for r in records:
        by.setdefault((r["task"], r["arm"]), []).append(r)
    lines = [header, "",
             "| task | dev metric | pre-trained | from scratch | Δ | multi-task | time pre-trained / scratch |",
             "|---|---|---:|---:|---:|---:|---|"]
    deltas = []
    for task in N_CTX:
        metric = main_metric(task)
        cell = {arm: by.get((task, arm), []) for arm in ("pretrained", "scratch", "multitask")}
        value = {arm: statistics.median(100 * dev_metrics(r)[metric] for r in rs) if rs else None for arm, rs in cell.items()}
        if value["pretrained"] is None and value["scratch"] is None:
            continue
        fmt = lambda v: "–" if v is None else f"{v:.1f}"
        delta = None if None in (value["pretrained"], value["scratch"]) else value["pretrained"] - value["scratch"]
        if delta is not None:
            deltas.append(delta)
        secs = " / ".join(f"{statistics.median(r['seconds'] for r in cell[a]):.0f} s" if cell[a] else "–"
                          for a in ("pretrained", "scratch"))
        lines.append(f"| {task} | {metric} | {fmt(value['pretrained'])} | {fmt(value['scratch'])} | "
                     f"{'–' if delta is None else f'{delta:+.1f}'} | {fmt(value['multitask'])} | {secs} |")
    if deltas:
        lines.append(f"| **mean** | | | | **{statistics.mean(deltas):+.1f}** | | |")
    lines += ["", "Commands (run from the repository root):", ""]
    lines += [f"- `{r['cmd']}` — {r['seconds']:.0f} s, dev {json.dumps(dev_metrics(r))}" for r in records]
    return "\n".join(lines) + "\n"


def define_flags():
    flags.DEFINE_string("pretrained", None, "pre-training run dir (its latest checkpoint is used)")
    flags.DEFINE_string("tasks_dir", None, "folder of task TFRecords built with its tokenizer")
    flags.DEFINE_string("out", "bench/results/finetune_books_tiny", "output path without extension")
    flags.DEFINE_string("runs_root", "runs/finetune_table", "where the fine-tuning runs go")
    flags.DEFINE_string("tasks", ",".join(N_CTX), "comma-separated tasks (folders under --tasks_dir)")
    flags.DEFINE_string("arms", "pretrained,scratch,multitask", "comma-separated arms")
    flags.DEFINE_string("seeds", "0", "comma-separated seeds")
    flags.DEFINE_string("precision", "mixed_bfloat16", "fine-tuning precision flag")
    flags.mark_flags_as_required(["pretrained", "tasks_dir"])


def main(argv):
    del argv  # everything is a flag
    # the flags' values, plus the preset the pre-trained run was made with
    args = types.SimpleNamespace(**FLAGS.flag_values_dict(), model=preset_of(FLAGS.pretrained))
    jsonl = Path(args.out + ".jsonl")
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    done = load_ledger(jsonl)
    have = {(r["task"], r["arm"], r["seed"]) for r in done}
    specs = [run_spec(task, arm, int(seed), args) for task in args.tasks.split(",") for arm in args.arms.split(",")
             for seed in args.seeds.split(",") if arm != "multitask" or task == "rte"]
    header = (f"Pre-trained: `{args.pretrained}` (preset `{args.model}`); tasks: `{args.tasks_dir}`; "
              f"precision {args.precision}; {os.cpu_count()} CPU cores.")
    for i, spec in enumerate(specs, 1):
        if (spec["task"], spec["arm"], spec["seed"]) in have:
            continue
        print(f"[{i}/{len(specs)}] {spec['task']} {spec['arm']} seed {spec['seed']} ...", flush=True)
        record = run_one(spec)
        print(f"    {record['seconds']:.0f} s, dev {json.dumps(dev_metrics(record))}", flush=True)
        done.append(record)
        append_ledger(jsonl, record)
        Path(args.out + ".md").write_text(markdown(done, header))
    Path(args.out + ".md").write_text(markdown(done, header))
    print(Path(args.out + ".md").read_text())


if __name__ == "__main__":
    define_flags()
    app.run(main)
