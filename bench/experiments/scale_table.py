"""What did scale buy? One table per task, from the reproduction ledgers of the two model sizes.

    python -m bench.experiments.scale_table       # rewrites the marked section of docs/reproduction.md

Reads ``bench/results/reproduction.jsonl`` (the ``tiny`` books model) and ``bench/results/reproduction_small.jsonl``
(``small``), both written by ``bench.experiments.reproduction``. For each size, arm and task: the dev scores of
every seed that ran with the arm's chosen recipe (the best seed-0 dev score of its sweep, as the reproduction's
report picks it), as median [min–max] and the number of seeds; the gain from pre-training at that size
(pre-trained minus scratch medians); and, pre-trained, what the bigger model adds (small minus tiny). The section
between ``<!-- scale: ... -->`` and ``<!-- /scale -->`` in ``docs/reproduction.md`` is replaced; the rest of the
page is kept. Nothing here runs a model: it only reads the committed ledgers.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from bench.experiments.finetune_runs import N_CTX, ROOT, dev_score, load_ledger, main_metric, median_spread
from bench.experiments.reproduction import ARMS, best_recipes, cell_runs

FLAGS = flags.FLAGS
SIZES = {"tiny": "5.2M parameters, 128 context", "small": "16.9M parameters, 256 context"}
START, END = "<!-- scale: written by `python -m bench.experiments.scale_table`; edits here are replaced -->", \
    "<!-- /scale -->"


def define_flags():
    flags.DEFINE_string("tiny_ledger", "bench/results/reproduction.jsonl", "The tiny model's reproduction ledger.")
    flags.DEFINE_string("small_ledger", "bench/results/reproduction_small.jsonl", "The small model's ledger.")
    flags.DEFINE_string("doc", "docs/reproduction.md", "The page whose marked section is rewritten.")


def cells(records: list[dict]) -> dict:
    """(task, arm) -> the dev scores (× 100) of every seed of the arm's chosen recipe."""
    return {(task, arm): [dev_score(r) for r in cell_runs(records, task, arm, recipe).values()]
            for (task, arm), recipe in best_recipes(records).items()}


def fmt(scores: list[float]) -> str:
    if not scores:
        return "–"
    median, low, high = median_spread(scores)
    return f"{median:.1f} [{low:.1f}–{high:.1f}] ({len(scores)})"


def median(scores: list[float]) -> float | None:
    return median_spread(scores)[0] if scores else None


def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


def section(by_size: dict[str, dict]) -> str:
    """The markdown between the markers: one table per task that any size ran."""
    tasks = [t for t in N_CTX if any((t, arm) in c for c in by_size.values() for arm in ARMS)]
    lines = [START, "",
             "Dev metric × 100: median [min–max] (seeds), each arm with its own recipe chosen on dev; gain: pre-trained "
             "minus scratch at the same size; scale: the small model's pre-trained median minus the tiny one's.", ""]
    for task in tasks:
        lines += [f"**{task}** ({main_metric(task)})", "",
                  "| size | pre-trained | from scratch | gain from pre-training | scale (pre-trained) |",
                  "|---|---|---|---:|---:|"]
        for size, found in by_size.items():
            pre, scratch = found.get((task, "pretrained"), []), found.get((task, "scratch"), [])
            gain = median(pre) - median(scratch) if pre and scratch else None
            tiny = by_size.get("tiny", {}).get((task, "pretrained"), [])
            scale = median(pre) - median(tiny) if size != "tiny" and pre and tiny else None
            lines.append(f"| {size} ({SIZES[size]}) | {fmt(pre)} | {fmt(scratch)} | {signed(gain)} | "
                         f"{signed(scale) if size != 'tiny' else ''} |")
        lines.append("")
    return "\n".join(lines + [END])


def rewrite(doc: Path, text: str) -> None:
    page = doc.read_text(encoding="utf-8")
    if START not in page or END not in page:
        raise SystemExit(f"{doc}: no section marked {START!r} ... {END!r} to rewrite")
    head, rest = page.split(START, 1)
    doc.write_text(head + text + rest.split(END, 1)[1], encoding="utf-8")


def main(argv):
    del argv
    by_size = {"tiny": cells(load_ledger(ROOT / FLAGS.tiny_ledger)),
               "small": cells(load_ledger(ROOT / FLAGS.small_ledger))}
    text = section(by_size)
    rewrite(ROOT / FLAGS.doc, text)
    print(text)


if __name__ == "__main__":
    define_flags()
    app.run(main)
