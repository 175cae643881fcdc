"""bench/experiments/reproduction.py: which recipe a cell of the table takes, and which runs fill it."""

from __future__ import annotations

import sys

from bench.experiments.reproduction import best_recipes, cell_runs


def _run(task, arm, seed, lr, score):
    return {"stage": "sweep" if seed == 0 else "table", "task": task, "arm": arm, "seed": seed,
            "recipe": {"learning_rate": lr}, "metrics": {"dev": {"accuracy": score}}}


def test_a_cell_takes_the_best_seed0_sweep_recipe_and_only_that_recipes_seeds():
    records = [_run("rte", "pretrained", 0, "1e-3", 0.50), _run("rte", "pretrained", 0, "5e-4", 0.60),
               _run("rte", "pretrained", 1, "5e-4", 0.58), _run("rte", "pretrained", 1, "1e-3", 0.99),
               _run("rte", "scratch", 0, "1e-3", 0.70)]
    # A later seed's score (0.99 at 1e-3) does not choose the recipe: the seed-0 sweep does, per arm.
    assert best_recipes(records) == {("rte", "pretrained"): {"learning_rate": "5e-4"},
                                     ("rte", "scratch"): {"learning_rate": "1e-3"}}
    cell = cell_runs(records, "rte", "pretrained", {"learning_rate": "5e-4"})
    assert sorted(cell) == [0, 1] and {r["metrics"]["dev"]["accuracy"] for r in cell.values()} == {0.60, 0.58}
    assert cell_runs(records, "cola", "pretrained", {"learning_rate": "5e-4"}) == {}


def test_recorded_commands_hold_no_path_of_this_machine():
    """Ledgers and the generated docs record commands as a user types them from the repository root."""
    from bench.harness import ROOT, shown_command

    cmd = [sys.executable, "-m", "gpt_tf.train", f"--data_dir={ROOT / 'data' / 'tasks' / 'rte'}",
           f"--init_checkpoint={ROOT / 'runs' / 'books'}", "--run_dir=/elsewhere/run"]
    assert shown_command(cmd) == ("python -m gpt_tf.train --data_dir=data/tasks/rte --init_checkpoint=runs/books "
                                  "--run_dir=/elsewhere/run")


def test_the_scale_table_puts_both_sizes_and_both_arms_side_by_side():
    """bench/experiments/reproduction.py --stage=scale: per task, each size's arms (median [min–max] (seeds) of the chosen recipe),
    the gain from pre-training at each size, and the small model's pre-trained median minus the tiny one's, under the
    command that wrote it (docs/reproduction.md includes the file whole)."""
    from bench.experiments.reproduction import scale_cells as cells
    from bench.experiments.reproduction import scale_section as section

    tiny = [_run("rte", "pretrained", 0, "1e-3", 0.60), _run("rte", "pretrained", 1, "1e-3", 0.58),
            _run("rte", "pretrained", 2, "1e-3", 0.62), _run("rte", "scratch", 0, "1e-3", 0.52)]
    small = [_run("rte", "pretrained", 0, "1e-3", 0.65), _run("rte", "pretrained", 0, "5e-4", 0.50)]
    text = section({"tiny": cells(tiny), "small": cells(small)})
    rows = [line for line in text.splitlines() if line.startswith(("| tiny", "| small"))]
    assert rows[0].split(" | ")[1:4] == ["60.0 [58.0–62.0] (3)", "52.0 [52.0–52.0] (1)", "+8.0"], rows[0]
    assert rows[1].split(" | ")[1:5] == ["65.0 [65.0–65.0] (1)", "–", "–", "+5.0 |"], rows[1]
    assert "cola" not in text  # a task no size ran has no table
    assert text.startswith("Written by `python -m bench.experiments.reproduction --stage=scale` from ")
    assert not text.lstrip().startswith("#") and text.endswith("|\n")  # no heading of its own inside the page
