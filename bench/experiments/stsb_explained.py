"""STS-B explained (issue 32, item 2): what limits the `tiny` books model on STS-B, in numbers.

    python -m bench.experiments.stsb_explained    # seconds -> bench/results/stsb_explained.json,
                                                  #   docs/stsb_curve.png and its section of docs/results.md

Each input is made by its own command, and the written section quotes each one:

* the dev curve over 10 epochs of the project's fine-tuning, both arms, one seed (dev Pearson after every
  epoch, read from each run's TensorBoard events under ``--curves``; copied into the JSON, so the report
  does not need the runs once they have been read):

      python -m gpt_tf.train --flagfile=configs/finetune_stsb_tiny.flags --data_dir=data/tasks_books/stsb \\
          --init_checkpoint=gpt_tf/presets/gpt1_tiny_books_en --epochs=10 --seed=0 --run_dir=runs/stsb_curve/pretrained_s0
      python -m gpt_tf.train --flagfile=configs/finetune_stsb_tiny.flags --data_dir=data/tasks_books/stsb \\
          --model=tiny --epochs=10 --seed=0 --run_dir=runs/stsb_curve/scratch_s0

* the frozen-feature ridge probe, pre-trained against random weights (``bench.experiments.frozen_probe``);
* the reference implementation's STS-B cells (``bench.experiments.reference_finetune``'s ledger) and the
  project's 3-epoch cells of both arms with the same recipe (``bench/results/reproduction.jsonl``).

The anchors in the section are published figures, not measured here: the paper's STS-B (Table 5, Pearson
of GPT-1 with and without pre-training) and BERT-Mini's (Turc et al. 2019, the same 4 × 256 shape).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from absl import app, flags

from bench.experiments.finetune_runs import load_ledger, replace_section, spread_text
from bench.experiments.reference_finetune import ours_cells, task_recipe

FLAGS = flags.FLAGS
SECTION = ("<!-- stsb_explained: written by python -m bench.experiments.stsb_explained -->",
           "<!-- /stsb_explained -->")
ARMS = ("pretrained", "scratch")
# Published anchors (not measured here), dev/test Pearson × 100 on STS-B.
ANCHORS = (
    ("GPT-1, pre-trained (paper, Table 5)", 82.0,
     "12 × 768, 117M parameters; BooksCorpus (~7,000 books, ~800M words), 100 epochs of 64 × 512-token batches"),
    ("GPT-1, no pre-training (paper, Table 5)", 30.9, "the same network from random weights"),
    ("BERT-Mini (Turc et al. 2019, GLUE test)", 75.4,
     "4 × 256, 11.3M parameters (most in a 30k word-piece table); BooksCorpus + English Wikipedia (~3.3B words)"),
)


def define_flags():
    flags.DEFINE_string("curves", "runs/stsb_curve", "Folder of the two 10-epoch runs (<arm>_s0), read when present.")
    flags.DEFINE_string("probe", "bench/results/frozen_probe_stsb.json", "bench.experiments.frozen_probe's JSON.")
    flags.DEFINE_string("reference", "bench/results/reference_finetune.jsonl", "The reference cells' ledger.")
    flags.DEFINE_string("ours", "bench/results/reproduction.jsonl", "The project's cells (both arms).")
    flags.DEFINE_string("out", "bench/results/stsb_explained.json", "The numbers the section is written from.")
    flags.DEFINE_string("figure", "docs/stsb_curve.png", "The dev-curve figure.")
    flags.DEFINE_string("report", "docs/results.md", "The page whose marked section is (re)written.")


def read_curve(run_dir: Path) -> list[float]:
    """Dev Pearson after each epoch (TensorBoard ``dev/pearson``, in step order), × 100."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    if "dev/pearson" not in events.Tags()["tensors"]:
        raise ValueError(f"{run_dir}/tb: no dev/pearson scalar (is it an STS-B fine-tuning run?)")
    return [round(100 * float(tf.make_ndarray(e.tensor_proto)), 2) for e in events.Tensors("dev/pearson")]


def collect(args, previous: dict) -> dict:
    """The numbers: curves from the runs where they exist (else the previous JSON's), probe, cells."""
    curves = dict(previous.get("curves", {}))
    for arm in ARMS:
        run = Path(args.curves) / f"{arm}_s0"
        if (run / "tb").exists():
            curves[arm] = {"dev_pearson_by_epoch": read_curve(run), "run_dir": str(run)}
    recipe = task_recipe("stsb")
    ours = load_ledger(Path(args.ours))
    cells = {arm: sorted(round(100 * r["metrics"]["dev"]["pearson"], 2)
                         for r in ours_cells(ours, "stsb", recipe, arm).values()) for arm in ARMS}
    cells["reference"] = sorted(round(100 * r["metrics"]["dev"]["pearson"], 2) for r in load_ledger(Path(args.reference))
                                if r["task"] == "stsb" and r["arm"] == "pretrained" and r["recipe"] == recipe)
    probe_path = Path(args.probe)
    probe = json.loads(probe_path.read_text()) if probe_path.exists() else None
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
            "command": " ".join(["python -m bench.experiments.stsb_explained", *sys.argv[1:]]),
            "recipe": recipe, "curves": curves, "cells_3_epochs": cells, "probe": probe,
            "anchors": [{"what": w, "pearson": v, "setup": s} for w, v, s in ANCHORS]}


def section_lines(data: dict, figure: str) -> list[str]:
    cells, curves, probe = data["cells_3_epochs"], data["curves"], data["probe"]
    lines = ["## STS-B explained", "",
             f"Dev Pearson × 100, `tiny` (4 × 256) models, the recipe of `configs/finetune_stsb_tiny.flags` "
             f"(n_ctx {data['recipe']['n_ctx']}, lr {data['recipe']['learning_rate']}, λ {data['recipe']['lm_coef']}, "
             f"batch 32); median [min–max] (seeds). Written {data['date']} by `{data['command']}`.", "",
             "| | 3 epochs (the recipe) | best of 10 epochs (epoch) | after 10 epochs | frozen states, ridge probe |",
             "|---|---:|---:|---:|---:|"]
    for arm, label in (("pretrained", "ours, pre-trained (`books_tiny`)"), ("scratch", "ours, from scratch")):
        curve = curves.get(arm, {}).get("dev_pearson_by_epoch", [])
        best = f"{max(curve):.1f} ({curve.index(max(curve)) + 1})" if curve else "–"
        if 0 < len(curve) < 10:
            best += f", {len(curve)} of 10 run"
        last = f"{curve[-1]:.1f}" if len(curve) >= 10 else "–"
        probe_arm = "pretrained" if arm == "pretrained" else "random"
        probed = "–"
        if probe:
            by_penalty = probe["dev_pearson"][probe_arm]
            penalty = max(by_penalty, key=by_penalty.get)
            probed = f"{100 * by_penalty[penalty]:.1f} (ridge {penalty})"
        lines.append(f"| {label} | {spread_text(cells[arm])} | {best} | {last} | {probed} |")
    lines.append(f"| reference (`transformers`' OpenAIGPT, pre-trained) | {spread_text(cells['reference'])} | | | |")
    lines += ["", f"![STS-B dev Pearson by epoch]({Path(figure).name})", "",
              "Anchors (published, not measured here):", ""]
    lines += [f"- {a['what']}: **{a['pearson']}**; {a['setup']}." for a in data["anchors"]]
    lines += ["", "Made by:", "", "```bash"]
    lines += [f"python -m gpt_tf.train --flagfile=configs/finetune_stsb_tiny.flags --data_dir=data/tasks_books/stsb "
              f"{'--init_checkpoint=gpt_tf/presets/gpt1_tiny_books_en' if arm == 'pretrained' else '--model=tiny'} "
              f"--epochs=10 --seed=0 --run_dir=runs/stsb_curve/{arm}_s0" for arm in ARMS]
    if probe:
        lines.append(probe["command"])
    lines += ["python -m bench.experiments.reference_finetune --tasks=stsb --seeds=0,1,2",
              data["command"], "```"]
    return lines


def write(args) -> list[str]:
    """Refreshes ``args.out`` from the inputs, draws ``args.figure``, rewrites the section of ``args.report``."""
    from bench.experiments.study_figures import stsb_figure

    out = Path(args.out)
    data = collect(args, json.loads(out.read_text()) if out.exists() else {})
    out.write_text(json.dumps(data, indent=1) + "\n")
    stsb_figure({arm: c["dev_pearson_by_epoch"] for arm, c in data["curves"].items()}, data["cells_3_epochs"],
                data["anchors"], args.figure)
    lines = section_lines(data, args.figure)
    replace_section(Path(args.report), SECTION, lines)
    return lines


def main(argv):
    del argv  # everything is a flag
    print("\n".join(write(FLAGS)))
    print(f"wrote {FLAGS.out}, {FLAGS.figure} and {FLAGS.report}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
