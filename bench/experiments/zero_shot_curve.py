r"""Fig. 2 (right) for one pre-training run: zero-shot scores over its kept checkpoints, as a table and a figure.

    python -m gpt_tf.analysis.zero_shot --run_dir=runs/books_tiny --task=cola,sst2,story_cloze --include_init \
        --data_dir=../shared/data/glue/CoLA,../shared/data/glue/SST-2,../shared/data/story_cloze \
        --output_csv=runs/zero_shot_books/zero_shot.csv
    python -m bench.experiments.zero_shot_curve --csv=runs/zero_shot_books/zero_shot.csv --out=docs/zero_shot_books

Writes ``<out>.md`` and ``<out>.png``. The normalisation is the paper's: (score - chance) / (reference -
chance), where the reference is the pre-trained arm's median dev score in the reproduction ledger
(``--ledger``) when it clears chance by ``study_report.MIN_MARGIN``, else a perfect score.
"""

from __future__ import annotations

import csv
import datetime
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("csv", None, "The CSV `python -m gpt_tf.analysis.zero_shot` appended to.")
    flags.DEFINE_string("out", None, "Output path without suffix: <out>.md and <out>.png.")
    flags.DEFINE_string("ledger", "bench/results/reproduction.jsonl", "Fine-tuned scores for the references.")
    flags.DEFINE_string("model_name", "transformer", "Row label of the run in the table and the figure.")


def references(ledger: Path, tasks) -> dict:
    """{task: (reference, source)}: the pre-trained arm's median dev score (chosen recipe), if usable."""
    from bench.experiments.finetune_runs import dev_score, load_ledger, median_spread
    from bench.experiments.reproduction import best_recipes, cell_runs
    from bench.experiments.study_report import MIN_MARGIN
    from gpt_tf.analysis.heuristics import HEURISTICS

    records = load_ledger(ledger) if ledger.is_file() else []
    chosen = best_recipes(records)
    refs = {}
    for task in tasks:
        runs = cell_runs(records, task, "pretrained", chosen.get((task, "pretrained"))).values()
        stats = median_spread(dev_score(r) / 100 for r in runs)
        if stats is not None and stats[0] - HEURISTICS[task].chance >= MIN_MARGIN:
            refs[task] = (stats[0], f"pre-trained tiny fine-tuned, median of {len(runs)} seed(s)")
        else:
            refs[task] = (1.0, "perfect score (no usable fine-tuned score)")
    return refs


def main(argv):
    del argv
    from bench.experiments.study_figures import zero_shot_figure
    from bench.experiments.study_report import zero_shot_section

    with open(FLAGS.csv) as f:
        rows = {(row["task"], int(row["step"])): row for row in csv.DictReader(f)}  # the last row wins
    if not rows:
        raise app.UsageError(f"{FLAGS.csv} has no rows")
    zs = {FLAGS.model_name: rows}
    refs = references(Path(FLAGS.ledger), sorted({t for t, _ in rows}))
    out = Path(FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    zero_shot_figure(zs, refs, str(out.with_suffix(".png")))
    section = zero_shot_section(zs, refs)
    section = [line.replace("](zero_shot.png)", f"]({out.with_suffix('.png').name})") for line in section]
    written = datetime.datetime.now().isoformat(timespec="seconds")
    head = [f"Written {written} by `python -m bench.experiments.zero_shot_curve --csv={FLAGS.csv} --out={FLAGS.out}`.", ""]
    out.with_suffix(".md").write_text("\n".join(section[:1] + [""] + head + section[2:]) + "\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["csv", "out"])
    app.run(main)
