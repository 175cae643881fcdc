"""The "Fine-tuning against the reference implementation" section of docs/results.md, from the two ledgers:
``bench/results/reference_finetune.jsonl`` (the PyTorch reference, ``reference_finetune.py``) and
``bench/results/reproduction.jsonl`` (the project's pre-trained-arm cells with the same recipe).

Only this section (between its two HTML comments) is rewritten; the rest of the file is kept. When the
file holds no such section it is appended.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from bench.experiments.reference_finetune import SECTION, cell_key, ours_cells, task_recipe
from bench.experiments.finetune_runs import load_ledger, main_metric, median_spread, replace_section, spread_text

FLAGS = flags.FLAGS


def _verdict(ours, theirs) -> str:
    """Whether the two medians differ by more than the seed spread (the wider of the two ranges)."""
    if not ours or not theirs:
        return "–"
    if len(theirs) == 1 or len(ours) == 1:
        (one,), many = (theirs, ours) if len(theirs) == 1 else (ours, theirs)
        low, high = min(many), max(many)
        where = "inside" if low <= one <= high else f"{min(abs(one - low), abs(one - high)):.1f} outside"
        return f"one seed: {one:.1f}, {where} the other's range [{low:.1f}–{high:.1f}]"
    a, b = median_spread(ours), median_spread(theirs)
    gap, spread = abs(a[0] - b[0]), max(a[2] - a[1], b[2] - b[1])
    return f"gap {gap:.1f} {'≤' if gap <= spread else '>'} spread {spread:.1f}"


def _recipe_text(recipe: dict) -> str:
    return (f"n_ctx {recipe['n_ctx']}, lr {recipe['learning_rate']:g}, {recipe['epochs']} ep, "
            f"warm-up {recipe['warmup_fraction']:g}, λ {recipe['lm_coef']:g}")


def section_lines(tasks, seeds, ours_rows: list[dict], ref_rows: list[dict], recipe_suffix: str) -> list[str]:
    by_key = {row["key"]: row for row in ref_rows}
    lines = ["## Fine-tuning against the reference implementation", "",
             "`transformers`' PyTorch `OpenAIGPTModel` fine-tuned from the same start as the project's cell (the",
             "`books_tiny` weights with the special-token rows and W_y drawn as `Finetuner` draws them for the seed), on",
             "the same batches of the same token ids (`pipelines.transforms.task_dataset`: the §3.3 views, n_ctx, length",
             "buckets, the seed's order), with the task's recipe (`configs/finetune_<task>_tiny.flags`: lr, epochs,",
             "warm-up, λ × the LM loss, batch 32, dropout 0.1, weight decay 0.01, clipping 1) and its own forward pass,",
             "loss, dropout stream and optimizer (`torch.optim.AdamW`). Dev scores by the project's metric functions,",
             "in percent: median [min–max] (seeds). *Ours* are `bench/reproduction.py`'s pre-trained-arm cells with the",
             "same recipe (`bench/results/reproduction.jsonl`).", "",
             "| task (metric) | recipe | ours | reference | reference by epoch (median) | ours vs reference |",
             "|---|---|---:|---:|---|---|"]
    missing, cpus, dates, commands = [], set(), [], set()
    for task in tasks:
        recipe, metric = task_recipe(task, recipe_suffix), main_metric(task)
        ours = [100 * row["metrics"]["dev"][metric] for row in ours_cells(ours_rows, task, recipe).values()]
        done = [by_key[cell_key(task, s, recipe)] for s in seeds if cell_key(task, s, recipe) in by_key]
        missing += [f"{task} seed {s}" for s in seeds if cell_key(task, s, recipe) not in by_key]
        theirs = [100 * row["metrics"]["dev"][metric] for row in done]
        curve = ""
        if done:
            n_epochs = min(len(row["epochs"]) for row in done)
            curve = " → ".join(f"{median_spread([100 * r['epochs'][e][metric] for r in done])[0]:.1f}"
                               for e in range(n_epochs))
        for row in done:
            cpus.add(row["cpu"])
            dates.append(row["finished"])
            commands.add(row["cmd"])
        lines.append(f"| {task} ({metric}) | {_recipe_text(recipe)} | {spread_text(ours)} | {spread_text(theirs)} | {curve} | "
                     f"{_verdict(ours, theirs)} |")
    if dates:
        lines += ["", f"Reference cells run by `{'`, `'.join(sorted(commands))}` on "
                  f"{', '.join(sorted(cpus))} (2 cores), finished {min(dates)[:16]} – "
                  f"{max(dates)[:16]} UTC."]
    else:
        lines += ["", "No reference cell has finished yet."]
    partial = _partial_cells(tasks, seeds, by_key, recipe_suffix)
    if partial:
        lines += ["", "Interrupted cells (state saved; the command below resumes them): " + "; ".join(partial) + "."]
    lines += ["", ("Still to run: " + ", ".join(missing) + ". The same command finishes them (a finished cell is "
                   "skipped; an interrupted one resumes from its last saved update):") if missing else
              "Every cell has run. To run them again (a finished cell is skipped, so start from an empty ledger):", "",
              "```bash", "nice -n 19 python -m bench.experiments.reference_finetune --tasks=" + ",".join(tasks) +
              " --seeds=" + ",".join(str(s) for s in seeds),
              "python -m bench.experiments.reference_finetune --stage=report", "```"]
    return lines


def _partial_cells(tasks, seeds, by_key, recipe_suffix) -> list[str]:
    """'<task> seed <s>: update N, dev by epoch ...' for each unfinished cell with a saved state."""
    import torch

    out = []
    for task in tasks:
        recipe, metric = task_recipe(task, recipe_suffix), main_metric(task)
        for seed in seeds:
            key = cell_key(task, seed, recipe)
            path = Path(FLAGS.state_dir) / f"{key}.pt"
            if key in by_key or not path.exists():
                continue
            state = torch.load(path, weights_only=False)
            scores = ", ".join(f"{100 * e[metric]:.1f}" for e in state["epochs"]) or "no epoch finished"
            out.append(f"{task} seed {seed} at update {state['step']} ({state['seconds'] / 60:.0f} min), "
                       f"dev {metric} by epoch: {scores}")
    return out


def write_section() -> None:
    seeds = [int(s) for s in FLAGS.seeds]
    lines = section_lines(FLAGS.tasks, seeds, load_ledger(Path(FLAGS.ours)), load_ledger(Path(FLAGS.ledger)),
                          FLAGS.recipe)
    replace_section(Path(FLAGS.report), SECTION, lines)
    print("\n".join(lines))
