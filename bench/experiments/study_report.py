"""The study's report: ``results.md`` (tables, checks of the paper's claims, configuration, commands) and figures.

Everything here is computed from the ledger of ``bench/experiments/study.py`` (fine-tuning records, the zero-shot
CSVs, the LSTM pre-training record); nothing is typed in by hand. Cells are the median over seeds
with the range (min–max) when there are several. Figures follow the paper's Fig. 2 (left: dev score
against the number of transferred layers; right: zero-shot score over pre-training, transformer
solid, LSTM dashed) and Table 5 (bars per ablation arm), drawn with matplotlib's Agg backend.

Zero-shot normalisation (Fig. 2 right): ``(score − chance) / (reference − chance)`` with the
reference the ``full`` arm's median dev score on the same task, when that is at least
``MIN_MARGIN`` above chance; otherwise (no fine-tuning of that task, or a fine-tuned score too near
chance to divide by) a perfect score, 1.0, and the table says so.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
import statistics
from pathlib import Path

from gpt_tf.analysis.heuristics import HEURISTICS
from gpt_tf.metrics import spearman
from gpt_tf.runs.files import MODEL_CONFIG, RUN_CONFIGS, read_json

ARM_LABELS = {"full": "Transformer w/ aux LM (full)", "scratch": "Transformer w/o pre-training",
              "lm0": "Transformer w/o aux LM (λ = 0)", "lstm": "LSTM w/ aux LM"}
MIN_MARGIN = 0.05


def main_metric(task: str) -> str:
    """The task's headline metric (the first of its ``TaskSpec.metrics``: Matthews for CoLA, F1 for MRPC, ...)."""
    from gpt_tf.tasks import get_task

    return get_task(task).metrics[0]


def dev_score(record: dict) -> float:
    """The task's headline metric on its first eval split (``dev`` for all tasks here), in percent."""
    return 100 * record["metrics"]["dev"][main_metric(record["task"])]


def median_spread(values) -> tuple[float, float, float] | None:
    """(median, min, max) of ``values``, or None when there are none."""
    values = list(values)
    return (statistics.median(values), min(values), max(values)) if values else None


def _cell(values, n_seeds: int) -> str:
    """Median (min–max) over seeds, and how many seeds when fewer than the study's."""
    stats = median_spread(values)
    if stats is None:
        return "–"
    median, low, high = stats
    text = f"{median:.1f}" if low == high else f"{median:.1f} ({low:.1f}–{high:.1f})"
    return text if len(values) >= n_seeds else text + f" [{len(values)} of {n_seeds} seeds]"


def finetune_scores(records) -> dict:
    """{(task, arm): [dev score in % per seed]} of the fine-tuning records."""
    out = {}
    for r in records:
        if r["kind"] == "finetune":
            out.setdefault((r["task"], r["arm"]), []).append(dev_score(r))
    return out


def _median(scores, task, arm):
    stats = median_spread(scores.get((task, arm), []))
    return None if stats is None else stats[0]


def train_sizes(tasks_dir: str, tasks) -> dict:
    sizes = {}
    for task in tasks:
        path = Path(tasks_dir) / task / "manifest.json"
        if path.is_file():
            sizes[task] = json.loads(path.read_text())["counts"].get("train")
    return sizes


def _rho(xs, ys) -> str:
    return f"{spearman(xs, ys):+.2f}" if len(xs) >= 3 else "n/a (< 3 points)"


def ablation_section(scores, tasks, sizes, n_seeds: int) -> list[str]:
    head = " | ".join(f"{t} ({main_metric(t)})" for t in tasks)
    lines = ["## Ablations (Table 5)", "", f"| method | avg | {head} |", "|---|---:|" + "---:|" * len(tasks)]
    for arm, label in ARM_LABELS.items():
        medians = [_median(scores, t, arm) for t in tasks]
        avg = sum(medians) / len(medians) if medians and None not in medians else None
        cells = " | ".join(_cell(scores.get((t, arm), []), n_seeds) for t in tasks)
        lines.append(f"| {label} | {'–' if avg is None else f'{avg:.1f}'} | {cells} |")
    deltas = {t: _median(scores, t, "full") - _median(scores, t, "scratch") for t in tasks
              if None not in (_median(scores, t, "full"), _median(scores, t, "scratch"))}
    if deltas:
        mean = sum(deltas.values()) / len(deltas)
        wins = sum(d > 0 for d in deltas.values())
        lines += ["", f"**Pre-training vs none:** mean Δ = **{mean:+.1f}** points over {len(deltas)} tasks "
                  f"(better on {wins} of {len(deltas)}); the paper: +14.8 on its 9 tasks."]
    rows = sorted((sizes.get(t) or 0, t) for t in tasks
                  if None not in (_median(scores, t, "full"), _median(scores, t, "lm0")))
    if rows:
        lines += ["", "### λ (the auxiliary LM objective) against training-set size", "",
                  "| task | train examples | λ = 0.5 | λ = 0 | Δ (aux LM) |", "|---|---:|---:|---:|---:|"]
        gains = []
        for size, t in rows:
            full, lm0 = _median(scores, t, "full"), _median(scores, t, "lm0")
            gains.append(full - lm0)
            lines.append(f"| {t} | {size:,} | {full:.1f} | {lm0:.1f} | {full - lm0:+.1f} |")
        paper = "the paper: the auxiliary objective helps the larger datasets (NLI, QQP) more than the smaller ones."
        if len({size for size, _ in rows}) == 1:
            lines += ["", f"Every task here was fine-tuned on the same {rows[0][0]:,} examples, so this table shows "
                      f"λ's effect at one size only, not a trend with size; {paper}"]
        else:
            lines += ["", f"Spearman ρ(train size, Δ aux LM) = {_rho([s for s, _ in rows], gains)}; {paper}"]
    return lines


def layer_section(scores, tasks, layers, n_layer, n_seeds: int) -> list[str]:
    ks = sorted(set(layers) | {n_layer})
    arm = lambda k: "full" if k == n_layer else f"transfer{k}"
    lines = ["## Layer transfer (Fig. 2 left)", "", "![layer transfer](layer_transfer.png)", "",
             "| blocks transferred | " + " | ".join(tasks) + " |", "|---:|" + "---:|" * len(tasks)]
    for k in ks:
        label = f"{k} (embeddings only)" if k == 0 else f"{k} (all)" if k == n_layer else str(k)
        lines.append(f"| {label} | " + " | ".join(_cell(scores.get((t, arm(k)), []), n_seeds) for t in tasks) + " |")
    checks = []
    for t in tasks:
        points = [(k, _median(scores, t, arm(k))) for k in ks if _median(scores, t, arm(k)) is not None]
        if len(points) >= 2:
            rise = points[-1][1] - points[0][1]
            checks.append(f"{t}: {points[-1][0]} vs {points[0][0]} blocks {rise:+.1f} points, "
                          f"ρ(blocks, score) = {_rho([k for k, _ in points], [v for _, v in points])}")
    if checks:
        lines += ["", "Does the curve rise with layers? " + "; ".join(checks) + ". The paper: every transferred "
                  "layer helps, up to 9% on MultiNLI for full transfer."]
    return lines


def read_zero_shot(records) -> dict:
    """{model: {(task, step): row}} from the zero-shot CSVs (the last row of a (task, step) wins)."""
    out = {}
    for r in records:
        if r["kind"] == "zero_shot" and Path(r["csv"]).is_file():
            with open(r["csv"]) as f:
                for row in csv.DictReader(f):
                    out.setdefault(r["model"], {})[(row["task"], int(row["step"]))] = row
    return out


def zero_shot_references(scores, tasks) -> dict:
    """{task: (reference, source)} for the normalisation (see the module doc)."""
    refs = {}
    for t in tasks:
        full = _median(scores, t, "full")
        chance = HEURISTICS[t].chance
        if full is not None and full / 100 - chance >= MIN_MARGIN:
            refs[t] = (full / 100, "fine-tuned (full, median)")
        else:
            refs[t] = (1.0, "perfect score (no usable fine-tuned score)")
    return refs


def _normalised(row, reference):
    return (float(row["score"]) - float(row["chance"])) / (reference - float(row["chance"]))


def zero_shot_section(zs, refs) -> list[str]:
    tasks = sorted({t for rows in zs.values() for t, _ in rows})
    lines = ["## Zero-shot over pre-training (Fig. 2 right)", "", "![zero-shot](zero_shot.png)", "",
             "Raw score (normalised in brackets). References: " +
             "; ".join(f"{t} {refs[t][0]:.3f} ({refs[t][1]})" for t in tasks) + ".", "",
             "| model | step | " + " | ".join(tasks) + " |", "|---|---:|" + "---:|" * len(tasks)]
    checks = []
    for model, rows in sorted(zs.items(), reverse=True):
        steps = sorted({s for _, s in rows})
        for s in steps:
            cells = [f"{float(rows[(t, s)]['score']):.3f} [{_normalised(rows[(t, s)], refs[t][0]):+.2f}]"
                     if (t, s) in rows else "–" for t in tasks]
            lines.append(f"| {model} | {s} | " + " | ".join(cells) + " |")
        for t in tasks:
            pts = [(s, float(rows[(t, s)]["score"])) for s in steps if (t, s) in rows]
            if pts:
                checks.append(f"{model} {t}: ρ(step, score) = {_rho([s for s, _ in pts], [v for _, v in pts])}")
    if checks:
        lines += ["", "Do the zero-shot scores rise over pre-training? " + "; ".join(checks) +
                  ". The paper: they rise steadily, and the LSTM's vary more."]
    return lines


def departures(config, train_config, model_config, sizes) -> list[str]:
    tokens = train_config["train_steps"] * train_config["batch_size"] * model_config["n_ctx"]
    built = ", ".join(f"{t} {n:,}" for t, n in sizes.items())
    sub = f"{config['train_subsample']:,} training examples per task (hash sample)" if config["train_subsample"] else \
        "the task data as built in `" + config["tasks_dir"] + "` (" + built + ")"
    recipe = (f"{config['epochs']} epoch(s) of the paper's recipe" if config.get("recipe", "paper") == "paper" else
              "each task's small-model recipe for every arm (`configs/finetune_<task>_tiny.flags`, chosen on dev by "
              "`bench/experiments/reproduction.py`)")
    return ["## Where this small scale departs from the paper", "",
            f"- Model: preset `{config['preset']}` ({model_config['n_layer']} blocks × {model_config['n_embd']} dims, "
            f"n_ctx {model_config['n_ctx']}, {model_config['vocab_size']:,} BPE tokens), not 12 × 768 with 40k BPE.",
            f"- Pre-training: {train_config['train_steps']:,} updates of {train_config['batch_size']} × "
            f"{model_config['n_ctx']} tokens ({tokens / 1e6:.1f}M tokens) on Gutenberg books, not 100 epochs of "
            "BooksCorpus (~800M words) with 64 × 512-token batches.",
            f"- Fine-tuning: {sub}, {recipe}, seeds {config['seeds']}, shorter contexts "
            "(bench/experiments/reproduction.N_CTX), precision " + config["precision"] + "; dev sets, not test sets."
            + (" Story Cloze is scored on a 30% hold-out of its val file (the paper fine-tunes on val and tests on "
               "test)." if "story_cloze" in config["tasks"] + config["zero_shot_tasks"] else ""),
            f"- The LSTM baseline: one layer with about the transformer's non-embedding parameters "
            f"(`lstm_{config['preset']}`), pre-trained {config['lstm_steps']:,} updates with the same recipe; the "
            "paper's had 2048 units.",
            "- Zero-shot: " + ", ".join(config["zero_shot_tasks"])
            + (f" on a {config['zero_shot_max_examples']}-example hash sample per split"
               if config["zero_shot_max_examples"] else "") + "; RACE and DPRD only when their "
            "files are given (not in ../shared/data). The normalising reference is this model's own fine-tuned score, "
            "not the 2018 state of the art.",
            "- Hardware: 2 shared CPU cores (other jobs ran at the same time), so times are contended."]


def wall_clock(records) -> str:
    """The fine-tuning runs' span of wall-clock time (runs overlap with --part and the LSTM's pre-training)."""
    spans = [(datetime.datetime.fromisoformat(r["finished"]) - datetime.timedelta(seconds=r["seconds"]),
              datetime.datetime.fromisoformat(r["finished"])) for r in records if r.get("finished")]
    if not spans:
        return ""
    start, end = min(a for a, _ in spans), max(b for _, b in spans)
    return (f"; the fine-tuning runs span {start:%Y-%m-%d %H:%M}–{end:%H:%M} of wall-clock time "
            f"({(end - start).total_seconds() / 3600:.2f} h)")


MARKED = re.compile(r"^<!-- (?P<name>[\w.-]+): written by .*? -->$.*?^<!-- /(?P=name) -->$", re.M | re.S)


def marked_sections(text: str) -> list[str]:
    """The sections other commands write into ``results.md`` between their markers (``<!-- NAME: written by
    CMD -->`` ... ``<!-- /NAME -->``): a rewrite of the study's report keeps them, after its own text."""
    return [m.group(0) for m in MARKED.finditer(text)]


def write_report(records, config, out_dir: Path, command: str, seconds: float, tasks_dir: str) -> None:
    """Writes ``out_dir/results.md`` and the PNG figures from the study's records."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pre = config["pretrained"]  # the run's files as written (the report quotes them)
    train_config = read_json(os.path.join(pre, RUN_CONFIGS["pretrain"]))
    model_config = read_json(os.path.join(pre, MODEL_CONFIG))
    scores, sizes = finetune_scores(records), train_sizes(tasks_dir, config["tasks"])
    zs = read_zero_shot(records)
    refs = zero_shot_references(scores, sorted({t for rows in zs.values() for t, _ in rows}))
    by_kind = {}
    for r in records:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r.get("seconds", 0.0)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    lines = ["# The paper's §5 analysis at a small, CPU scale", "",
             f"Produced by `{command}` (last written {now}, {os.cpu_count()} CPU cores, "
             f"load average {os.getloadavg()[0]:.1f} at writing). Recorded compute: "
             + ", ".join(f"{k} {v / 3600:.2f} h" for k, v in sorted(by_kind.items()))
             + f" (total {sum(by_kind.values()) / 3600:.2f} h, excluding the transformer's own pre-training)"
             + wall_clock(records) + ("" if seconds is None else f"; this invocation {seconds / 3600:.2f} h")
             + f". {sum(r['kind'] == 'finetune' for r in records)} fine-tuning runs.", ""]
    seeds = len(config["seeds"])
    lines += ablation_section(scores, config["tasks"], sizes, seeds) + ["", "![ablations](ablations.png)", ""]
    lines += layer_section(scores, config["transfer_tasks"], config["layers"], config["n_layer"], seeds) + [""]
    if zs:
        lines += zero_shot_section(zs, refs) + [""]
    lines += departures(config, train_config, model_config, sizes) + [""]
    lines += ["## Configuration", "", "```json", json.dumps({"study": config, "pretrained_train_config": train_config,
              "pretrained_model_config": model_config}, indent=1, sort_keys=True), "```", "",
              "## Runs (from the repository root)", ""]
    lines += [f"- `{r['cmd']}` — {r['seconds']:.0f} s"
              + (f", dev {json.dumps(r['metrics']['dev'])}" if r["kind"] == "finetune" else "")
              + (f" (run for and taken from `{r['reused_from']}`)" if r.get("reused_from") else "") for r in records]
    path = out_dir / "results.md"
    kept = marked_sections(path.read_text(encoding="utf-8") if path.exists() else "")
    path.write_text("\n".join(lines) + "\n" + "".join("\n" + block + "\n" for block in kept), encoding="utf-8")
    ablation_figure(scores, config["tasks"], ARM_LABELS, out_dir / "ablations.png")
    layer_figure(scores, config["transfer_tasks"], config["layers"], config["n_layer"], out_dir / "layer_transfer.png")
    if zs:
        zero_shot_figure(zs, refs, out_dir / "zero_shot.png")

# ----------------------------------------------------------------------------- figures
# In the paper's style (Fig. 2 left and right, Table 5 as bars): each point is the median over seeds, error bars
# span min–max; zero-shot curves one colour per task, the transformer solid and the LSTM dashed.


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _style(ax, xlabel, ylabel, title):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, frameon=False)


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    _pyplot().close(fig)


def _errorbar(ax, xs, stats, **kwargs):
    med = [s[0] for s in stats]
    ax.errorbar(xs, med, yerr=[[m - s[1] for m, s in zip(med, stats)], [s[2] - m for m, s in zip(med, stats)]],
                capsize=3, marker="o", markersize=4, **kwargs)


def layer_figure(scores, tasks, layers, n_layer, path):
    """Dev score against the number of transferred blocks (0 = embeddings only), one line per task."""
    fig, ax = _pyplot().subplots(figsize=(5, 3.6))
    ks = sorted(set(layers) | {n_layer})
    for task in tasks:
        points = [(k, median_spread(scores.get((task, "full" if k == n_layer else f"transfer{k}"), []))) for k in ks]
        points = [(k, s) for k, s in points if s is not None]
        if points:
            _errorbar(ax, [k for k, _ in points], [s for _, s in points], label=task)
    ax.set_xticks(ks)
    _style(ax, "# of layers transferred", "dev score (%)", "Transfer of pre-trained layers (cf. Fig. 2 left)")
    _save(fig, path)


def zero_shot_figure(zs, refs, path):
    """Normalised zero-shot score against pre-training updates; transformer solid, LSTM dashed."""
    fig, ax = _pyplot().subplots(figsize=(5, 3.6))
    tasks = sorted({t for rows in zs.values() for t, _ in rows})
    colours = {t: f"C{i}" for i, t in enumerate(tasks)}
    for model, style in (("transformer", "-"), ("lstm", "--")):
        rows = zs.get(model, {})
        for task in tasks:
            pts = sorted((s, r) for (t, s), r in rows.items() if t == task)
            if pts:
                ref = refs[task][0]
                ys = [(float(r["score"]) - float(r["chance"])) / (ref - float(r["chance"])) for _, r in pts]
                ax.plot([s for s, _ in pts], ys, style, color=colours[task], marker="o", markersize=3,
                        label=f"{task} ({'Transformer' if model == 'transformer' else 'LSTM'})")
    ax.axhline(0.0, color="grey", lw=0.8)
    _style(ax, "pre-training updates", "normalised zero-shot score", "Zero-shot behaviour (cf. Fig. 2 right)")
    _save(fig, path)


def ablation_figure(scores, tasks, arm_labels, path):
    """Grouped bars: per task, one bar per ablation arm (Table 5)."""
    fig, ax = _pyplot().subplots(figsize=(max(5, 1.1 * len(tasks) + 2), 3.6))
    width = 0.8 / len(arm_labels)
    for i, (arm, label) in enumerate(arm_labels.items()):
        xs, stats = [], []
        for j, task in enumerate(tasks):
            s = median_spread(scores.get((task, arm), []))
            if s is not None:
                xs.append(j + (i - (len(arm_labels) - 1) / 2) * width)
                stats.append(s)
        if stats:
            med = [s[0] for s in stats]
            ax.bar(xs, med, width, label=label, yerr=[[m - s[1] for m, s in zip(med, stats)],
                                                       [s[2] - m for m, s in zip(med, stats)]], capsize=2)
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels(tasks)
    ax.axhline(0.0, color="grey", lw=0.8)
    _style(ax, "task", "dev score (%)", "Ablations (cf. Table 5)")
    _save(fig, path)
