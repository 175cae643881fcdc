"""Does pre-training pay off? Recipe sweeps per arm, then the 3-seed table and test-set predictions.

    # 1. sweep a recipe grid on dev, seed 0, for each arm (each arm gets its own sweep)
    python -m bench.experiments.reproduction --stage=sweep --arm=scratch --tasks=rte,mrpc \\
        --grid="learning_rate=2.5e-4,1e-3;epochs=3,6"
    python -m bench.experiments.reproduction --stage=sweep --arm=pretrained --tasks=rte,mrpc --grid="..."
    # 2. each (task, arm) with its best dev recipe, seeds 0-2 (seed 0 is the sweep's run, not redone)
    python -m bench.experiments.reproduction --stage=table --seeds=0,1,2
    # 3. seed 0 of each arm predicts the unlabeled test files (GLUE submission layout)
    python -m bench.experiments.reproduction --stage=predict --tasks=sst2,mrpc,stsb,story_cloze
    # 4. only rewrite the report from the ledger
    python -m bench.experiments.reproduction --stage=report
    # 5. the pre-trained arm's chosen recipes as flagfiles: configs/finetune_<task>_tiny.flags
    python -m bench.experiments.reproduction --stage=configs
    # 6. what scale bought: both sizes' ledgers side by side, one table per task: bench/results/reproduction_scale.md
    python -m bench.experiments.reproduction --stage=scale

Every run is one ``python -m gpt_tf.train --task`` process (``finetune_spec``: the task's flagfile, the arm's
initialisation, then the recipe's flags; ``run_one``; ``bench/experiments/study.py`` runs its own the same way and
can take this ledger's runs, ``ledger_run``), timed wall-clock; each finished run is one line of the ledger
(``--ledger``, with the commit that ran it), keyed by (task, arm, seed, recipe), so an interrupted stage resumes
and a run already in the ledger is never redone. The choice of recipe reads dev scores only; the test files are
predicted once, by the chosen recipe's seed-0 run, and never scored here. ``--stage=scale`` runs nothing: for each
size (``SCALE_LEDGERS``), arm and task, the dev scores of every seed of the arm's chosen recipe, as median [min–max]
(seeds), the gain from pre-training and what the bigger model adds, into ``SCALE_REPORT`` (which
``docs/reproduction.md`` includes).
"""

from __future__ import annotations

import datetime
import json
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from absl import app, flags

from bench.experiments.study_report import dev_score, main_metric, median_spread
from bench.harness import ROOT, git, run_command, shown_command

FLAGS = flags.FLAGS
ARMS = ("pretrained", "scratch")
# The recipe knobs a grid may name, with the gpt_tf.train flag each sets.
KNOBS = ("learning_rate", "epochs", "lm_coef", "warmup_fraction", "batch_size", "clf_pdrop", "weight_decay")
# Issue 13's goals for the pre-trained arm on dev (headline metric, in percent).
GOALS = {"sst2": 82, "cola": 15, "mrpc": 82, "stsb": 50, "rte": 56, "story_cloze": 62}
# --stage=scale: each model size's ledger, and what it is.
SCALE_LEDGERS = {"tiny": "bench/results/reproduction.jsonl", "small": "bench/results/reproduction_small.jsonl"}
SIZES = {"tiny": "5.2M parameters, 128 context", "small": "16.9M parameters, 256 context"}
SCALE_REPORT = "bench/results/reproduction_scale.md"
# Context per task, from the token lengths in the task manifests (max view lengths: SST-2 73,
# CoLA 52, STS-B 142, MRPC 135, RTE 370, Story Cloze 94); longer views are truncated by the
# documented rule of gpt_tf/data/transforms.py.
N_CTX = {"sst2": 64, "cola": 64, "stsb": 96, "mrpc": 128, "rte": 128, "story_cloze": 96}


def define_flags():
    flags.DEFINE_enum("stage", None, ["sweep", "table", "predict", "report", "configs", "scale"],
                      "What to run (see the module doc).")
    flags.DEFINE_enum("arm", "pretrained", ARMS, "--stage=sweep: which arm's grid this is.")
    flags.DEFINE_list("tasks", list(N_CTX), "Tasks (their folders under --tasks_dir).")
    flags.DEFINE_string("grid", "", "--stage=sweep: 'knob=v1,v2;knob=v3' over " + ", ".join(KNOBS) + ".")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "--stage=table: seeds per cell.")
    flags.DEFINE_list("arms", list(ARMS), "--stage=table: the arms to run (several processes can share a table).")
    flags.DEFINE_string("pretrained", "runs/books_tiny", "The pre-training run the pretrained arm starts from.")
    flags.DEFINE_string("model", "tiny", "The model size of the scratch arm (the pre-trained run's shape).")
    flags.DEFINE_string("tasks_dir", "data/tasks_books", "Task TFRecords built with the pre-trained run's BPE.")
    flags.DEFINE_string("runs_root", "runs/reproduction", "Where the fine-tuning runs go.")
    flags.DEFINE_string("ledger", "bench/results/reproduction.jsonl", "The ledger; the report goes beside it (.md).")
    flags.DEFINE_string("predictions_dir", "bench/results/test_predictions", "--stage=predict: <arm>/<file>.tsv "
                        "(<arm>_<model>/ for a --model other than tiny).")
    flags.DEFINE_string("precision", "float32", "Fine-tuning precision flag.")


# ----------------------------------------------------------------------------- a fine-tuning run and the ledger
# (the study's runs too)


def finetune_spec(task: str, arm: str, seed: int, *, runs_root, tasks_dir, precision: str,
                  init_checkpoint: str = "", model: str = "", extra=(), recipe: str = "") -> dict:
    """One ``python -m gpt_tf.train --task`` run: the recipe of ``configs/finetune_<task><recipe>.flags``
    (``recipe=""``: the paper's; ``"_tiny"``: the small-model recipe chosen here, ``--stage=configs``).

    ``init_checkpoint`` (a pre-training run) or ``model`` (a preset, from scratch); ``extra``: more flags.
    """
    run_dir = Path(runs_root) / f"{task}_{arm}_s{seed}"
    cmd = [sys.executable, "-m", "gpt_tf.train", f"--flagfile=configs/finetune_{task}{recipe}.flags",
           f"--data_dir={Path(tasks_dir) / task}", f"--run_dir={run_dir}", f"--n_ctx={N_CTX[task]}",
           f"--precision={precision}", f"--seed={seed}", "--progress=false", "--json"]
    cmd.append(f"--init_checkpoint={init_checkpoint}" if init_checkpoint else f"--model={model}")
    return {"task": task, "arm": arm, "seed": seed, "run_dir": str(run_dir), "cmd": cmd + list(extra)}


def run_one(spec: dict) -> dict:
    """Runs it; returns the spec with the final metrics and the wall-clock seconds."""
    stdout, seconds = run_command(spec["cmd"])
    metrics = json.loads(stdout.strip().splitlines()[-1])
    return {**spec, "cmd": shown_command(spec["cmd"]), "metrics": metrics,
            "seconds": round(seconds, 1), "finished": datetime.datetime.now().isoformat(timespec="seconds")}


def load_ledger(path: Path) -> list[dict]:
    """The records of finished runs (one JSON object per line), or [] when there is no ledger yet."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def append_ledger(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def recipe_flags(task: str, suffix: str = "") -> dict:
    """The flags of ``configs/finetune_<task><suffix>.flags`` beyond the task flagfile it includes and the run's own
    folder and context: the recipe, as this ledger records it."""
    lines = (ROOT / "configs" / f"finetune_{task}{suffix}.flags").read_text().splitlines()
    found = dict(line[2:].partition("=")[::2] for line in lines if line.startswith("--"))
    return {k: v for k, v in found.items() if k not in ("flagfile", "run_dir", "n_ctx")}


def _flag_values(cmd: str) -> dict:
    return {a[2:].partition("=")[0]: a[2:].partition("=")[2] for a in shlex.split(cmd) if a.startswith("--")}


def ledger_run(spec: dict, arm: str, suffix: str, records: list[dict]) -> dict | None:
    """The run of this ledger that ``spec`` would repeat: the same task and seed, ``arm`` here, the recipe of
    ``configs/finetune_<task><suffix>.flags``, start, data, context and precision. Paths compare resolved from the
    repository root."""
    recipe, want = recipe_flags(spec["task"], suffix), _flag_values(shown_command(spec["cmd"]))
    resolve = lambda path: str((ROOT / path).resolve()) if path else path  # noqa: E731
    for r in records:
        if (r["task"], r["arm"], r["seed"], r["recipe"]) != (spec["task"], arm, spec["seed"], recipe):
            continue
        have = _flag_values(r["cmd"])
        if all(have.get(k) == want.get(k) for k in ("precision", "n_ctx", "model")) and \
                all(resolve(have.get(k, "")) == resolve(want.get(k, "")) for k in ("data_dir", "init_checkpoint")):
            return r
    return None


def size_of(run) -> str:
    """The model size whose shape the pre-training run has (the scratch arm's ``--model``); ``run``: its
    ``gpt_tf.runs.folder.RunFolder``."""
    from gpt_tf.config import SIZES

    shape = ("n_embd", "n_layer", "n_head", "d_ff", "model_type")
    for name, size in SIZES.items():
        if all(getattr(size, k) == getattr(run.model_config, k) for k in shape):
            return name
    raise ValueError(f"{run.path}/model_config.json matches no model size's shape {shape}")


# ----------------------------------------------------------------------------- the stages


def parse_grid(text: str) -> list[dict]:
    """'a=1,2;b=3' -> [{a: 1, b: 3}, {a: 2, b: 3}] (values as gpt_tf.train flag strings)."""
    recipes = [{}]
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, values = part.partition("=")
        if name not in KNOBS or not values:
            raise ValueError(f"--grid: {part!r} is not knob=v1,v2 with a knob among {KNOBS}")
        recipes = [{**r, name: v.strip()} for r in recipes for v in values.split(",")]
    return recipes


def key(record: dict) -> tuple:
    return record["task"], record["arm"], record["seed"], json.dumps(record["recipe"], sort_keys=True)


def spec(task: str, arm: str, seed: int, recipe: dict) -> dict:
    name = "_".join(f"{k}{v}" for k, v in sorted(recipe.items())) or "default"
    s = finetune_spec(task, arm, seed, runs_root=Path(FLAGS.runs_root) / name, tasks_dir=FLAGS.tasks_dir,
                      precision=FLAGS.precision, init_checkpoint=FLAGS.pretrained if arm == "pretrained" else "",
                      model=FLAGS.model, extra=[f"--{k}={v}" for k, v in sorted(recipe.items())])
    return {**s, "recipe": recipe}


def best_recipes(records: list[dict]) -> dict:
    """(task, arm) -> the recipe with the best seed-0 dev score among the sweep's runs."""
    best = {}
    for r in records:
        if r["stage"] != "sweep" or r["seed"] != 0:
            continue
        cell = (r["task"], r["arm"])
        if cell not in best or dev_score(r) > dev_score(best[cell]):
            best[cell] = r
    return {cell: r["recipe"] for cell, r in best.items()}


def run_all(specs: list[dict], stage: str, records: list[dict]) -> None:
    commit = git("rev-parse", "--short", "HEAD")
    have = {key(r) for r in records}
    todo = [s for s in specs if key(s) not in have]
    print(f"{stage}: {len(specs)} runs, {len(specs) - len(todo)} already in {FLAGS.ledger}", flush=True)
    for i, s in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {s['task']} {s['arm']} seed {s['seed']} {s['recipe']} ...", flush=True)
        record = {**run_one(s), "stage": stage, "commit": commit}
        print(f"    {record['seconds']:.0f} s, dev {main_metric(s['task'])} {dev_score(record):.1f}", flush=True)
        records.append(record)
        append_ledger(Path(FLAGS.ledger), record)
        write_report(records)


def predict(records: list[dict]) -> None:
    """Seed 0 of each arm's chosen recipe writes the test split's submission file."""
    chosen = best_recipes(records)
    for (task, arm), recipe in sorted(chosen.items()):
        if task not in FLAGS.tasks:
            continue
        run = next((r for r in records if key(r) == key({"task": task, "arm": arm, "seed": 0, "recipe": recipe})), None)
        cmd = spec(task, arm, 0, recipe)["cmd"] + ["--mode=predict", "--predict_split=test"]
        stdout, _ = run_command(cmd)
        written = Path(json.loads(stdout.strip().splitlines()[-1])["path"])  # --json: {"split", "path"}
        folder = arm if FLAGS.model == "tiny" else f"{arm}_{FLAGS.model}"  # the sizes' files side by side
        out = Path(FLAGS.predictions_dir) / folder / f"{written.name.split('.')[0]}.tsv"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(written, out)
        print(f"{task} {arm}: {shown_command(cmd)} -> {out} (dev {dev_score(run):.1f})", flush=True)


def cell_runs(records, task, arm, recipe):
    runs = [r for r in records if (r["task"], r["arm"]) == (task, arm) and r["recipe"] == recipe]
    return {r["seed"]: r for r in runs}


def write_report(records: list[dict]) -> None:
    """bench/results/reproduction.md: the table (median, min-max over seeds), then every sweep."""
    chosen = best_recipes(records)
    lines = ["# Pre-trained vs from scratch, each arm with its own recipe chosen on dev", "",
             "Written by `python -m bench.experiments.reproduction --stage=report` from `" + FLAGS.ledger + "`.", "",
             "| task | metric | goal | pre-trained median [min–max] | seeds | from scratch median [min–max] "
             "| seeds | Δ median | s/run (pre / scratch) |", "|---|---|---:|---|---:|---|---:|---:|---|"]
    deltas = []
    for task in N_CTX:
        cells = {arm: cell_runs(records, task, arm, chosen[(task, arm)]) for arm in ARMS if (task, arm) in chosen}
        if not cells:
            continue
        stats = {arm: median_spread(dev_score(r) for r in runs.values()) for arm, runs in cells.items()}
        fmt = lambda s: "–" if not s else f"{s[0]:.1f} [{s[1]:.1f}–{s[2]:.1f}]"
        both = stats.get("pretrained") and stats.get("scratch")
        delta = stats["pretrained"][0] - stats["scratch"][0] if both else None
        if delta is not None:
            deltas.append(delta)
        secs = " / ".join(f"{statistics.median(r['seconds'] for r in cells[a].values()):.0f}" if cells.get(a) else "–"
                          for a in ARMS)
        lines.append(f"| {task} | {main_metric(task)} | {GOALS[task]} | {fmt(stats.get('pretrained'))} | "
                     f"{len(cells.get('pretrained', {}))} | {fmt(stats.get('scratch'))} "
                     f"| {len(cells.get('scratch', {}))} | {'–' if delta is None else f'{delta:+.1f}'} | {secs} |")
    if deltas:
        lines.append(f"| **mean Δ** ({len(deltas)} tasks) | | 10 | | | | | **{statistics.mean(deltas):+.1f}** | |")
    lines += ["", "Chosen recipes (best seed-0 dev score of each arm's sweep):", ""]
    tried = {}
    for r in records:
        if r["stage"] == "sweep" and r["seed"] == 0:
            tried[(r["task"], r["arm"])] = tried.get((r["task"], r["arm"]), 0) + 1
    lines += [f"- {task} {arm}: `{json.dumps(recipe, sort_keys=True)}` (best of {tried[(task, arm)]} tried)"
              for (task, arm), recipe in sorted(chosen.items())]
    lines += ["", "## Every run", "", "| stage | task | arm | seed | recipe | dev | seconds |",
              "|---|---|---|---:|---|---:|---:|"]
    for r in records:
        lines.append(f"| {r['stage']} | {r['task']} | {r['arm']} | {r['seed']} "
                     f"| `{json.dumps(r['recipe'], sort_keys=True)}` | {dev_score(r):.1f} | {r['seconds']:.0f} |")
    lines += ["", "Commands: each run's exact `cmd` is in the ledger."]
    Path(FLAGS.ledger).with_suffix(".md").write_text("\n".join(lines) + "\n")


def write_configs(records: list[dict], configs_dir: Path) -> list[Path]:
    """configs/finetune_<task>_tiny.flags: the task's flagfile, then the pre-trained arm's chosen recipe."""
    chosen = best_recipes(records)
    written = []
    for task in N_CTX:
        recipe = chosen.get((task, "pretrained"))
        if recipe is None:
            continue
        runs = cell_runs(records, task, "pretrained", recipe)
        stats = median_spread(dev_score(r) for r in runs.values())
        path = configs_dir / f"finetune_{task}_tiny.flags"
        lines = [f"# The small-model fine-tuning recipe for {task}, chosen on dev by bench/experiments/reproduction.py",
                 f"# for a `tiny` books model: dev {main_metric(task)} median {stats[0]:.1f} "
                 f"[{stats[1]:.1f}-{stats[2]:.1f}] over {len(runs)} seed(s).",
                 f"# Run: python -m gpt_tf.train --flagfile=configs/finetune_{task}_tiny.flags "
                 f"--init_checkpoint=gpt1_tiny_books_en --data_dir=data/tasks_books/{task}",
                 "# Written by `python -m bench.experiments.reproduction --stage=configs`; the paper's recipe stays in "
                 f"finetune_{task}.flags (gpt1).",
                 f"--flagfile=configs/finetune_{task}.flags", f"--run_dir=runs/finetune_{task}_tiny",
                 f"--n_ctx={N_CTX[task]}"]
        lines += [f"--{k}={v}" for k, v in sorted(recipe.items())]
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


def scale_cells(records: list[dict]) -> dict:
    """(task, arm) -> the dev scores (× 100) of every seed of the arm's chosen recipe."""
    return {(task, arm): [dev_score(r) for r in cell_runs(records, task, arm, recipe).values()]
            for (task, arm), recipe in best_recipes(records).items()}


def _spread(scores: list[float]) -> str:
    if not scores:
        return "–"
    mid, low, high = median_spread(scores)
    return f"{mid:.1f} [{low:.1f}–{high:.1f}] ({len(scores)})"


def _median(scores: list[float]) -> float | None:
    return median_spread(scores)[0] if scores else None


def signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


def scale_section(by_size: dict[str, dict]) -> str:
    """``SCALE_REPORT``: one table per task that any size ran."""
    tasks = [t for t in N_CTX if any((t, arm) in c for c in by_size.values() for arm in ARMS)]
    lines = ["Written by `python -m bench.experiments.reproduction --stage=scale` from "
             + " and ".join(f"`{path}`" for path in SCALE_LEDGERS.values()) + ".", "",
             "Dev metric × 100: median [min–max] (seeds), each arm with its own recipe chosen on dev; gain: "
             "pre-trained minus scratch at the same size; scale: the small model's pre-trained median minus the tiny "
             "one's.", ""]
    for task in tasks:
        lines += [f"**{task}** ({main_metric(task)})", "",
                  "| size | pre-trained | from scratch | gain from pre-training | scale (pre-trained) |",
                  "|---|---|---|---:|---:|"]
        for size, found in by_size.items():
            pre, scratch = found.get((task, "pretrained"), []), found.get((task, "scratch"), [])
            gain = _median(pre) - _median(scratch) if pre and scratch else None
            tiny = by_size.get("tiny", {}).get((task, "pretrained"), [])
            scale = _median(pre) - _median(tiny) if size != "tiny" and pre and tiny else None
            lines.append(f"| {size} ({SIZES[size]}) | {_spread(pre)} | {_spread(scratch)} | {signed(gain)} | "
                         f"{signed(scale) if size != 'tiny' else ''} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv):
    del argv
    if FLAGS.stage == "scale":
        text = scale_section({size: scale_cells(load_ledger(ROOT / path)) for size, path in SCALE_LEDGERS.items()})
        (ROOT / SCALE_REPORT).write_text(text, encoding="utf-8")
        print(text)
        return
    records = load_ledger(Path(FLAGS.ledger))
    if FLAGS.stage == "sweep":
        recipes = parse_grid(FLAGS.grid)
        run_all([spec(t, FLAGS.arm, 0, r) for t in FLAGS.tasks for r in recipes], "sweep", records)
    elif FLAGS.stage == "table":
        chosen = best_recipes(records)
        missing = [f"{t}/{a}" for t in FLAGS.tasks for a in ARMS if (t, a) not in chosen]
        if missing:
            raise app.UsageError(f"no sweep yet for {', '.join(missing)}: run --stage=sweep first")
        specs = [spec(t, a, int(s), chosen[(t, a)]) for t in FLAGS.tasks for a in FLAGS.arms for s in FLAGS.seeds]
        run_all(specs, "table", records)
    elif FLAGS.stage == "predict":
        predict(records)
    elif FLAGS.stage == "configs":
        for path in write_configs(records, ROOT / "configs"):
            print(path.relative_to(ROOT))
    write_report(records)
    print(Path(FLAGS.ledger).with_suffix(".md").read_text())


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("stage")
    app.run(main)
