"""The study's figures in the paper's style (Fig. 2 left and right, Table 5 as bars), with matplotlib's Agg backend.

Each point is the median over seeds; error bars span min–max. Zero-shot curves: one colour per task,
the transformer solid and the LSTM dashed, as in Fig. 2 (right).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.experiments.finetune_runs import median_spread  # noqa: E402


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
    plt.close(fig)


def _errorbar(ax, xs, stats, **kwargs):
    med = [s[0] for s in stats]
    ax.errorbar(xs, med, yerr=[[m - s[1] for m, s in zip(med, stats)], [s[2] - m for m, s in zip(med, stats)]],
                capsize=3, marker="o", markersize=4, **kwargs)


def layer_figure(scores, tasks, layers, n_layer, path):
    """Dev score against the number of transferred blocks (0 = embeddings only), one line per task."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
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
    fig, ax = plt.subplots(figsize=(5, 3.6))
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
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(tasks) + 2), 3.6))
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


def stsb_figure(curves, cells, anchors, path):
    """STS-B dev Pearson by epoch, one line per arm of the 10-epoch runs; the 3-epoch cells (ours' seeds, the
    reference's) as points at epoch 3; the published anchors as dotted lines."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, style in (("pretrained", "-o"), ("scratch", "--s")):
        if curves.get(arm):
            ax.plot(range(1, len(curves[arm]) + 1), curves[arm], style, markersize=4, label=f"ours, {arm}, seed 0")
    for name, marker, dx in (("pretrained", "bx", -0.12), ("reference", "k^", 0.12)):
        if cells.get(name):
            label = "ours, pre-trained, 3-epoch cells" if name == "pretrained" else "reference (PyTorch), 3-epoch cells"
            ax.plot([3 + dx] * len(cells[name]), cells[name], marker, markersize=5, label=label)
    for anchor, colour in zip(anchors, ("tab:green", "tab:gray", "tab:purple")):
        ax.axhline(anchor["pearson"], color=colour, linestyle=":", linewidth=1)
        ax.text(0.7, anchor["pearson"] + 1.2, f"{anchor['what']}: {anchor['pearson']}", fontsize=7, color=colour)
    ax.set_xlim(0.5, 10.5)
    ax.set_xticks(range(1, 11))
    ax.set_ylim(0, 90)
    _style(ax, "fine-tuning epoch", "dev Pearson × 100", "STS-B: the tiny books model and the published anchors")
    ax.legend(fontsize=7, frameon=False, loc="center right")
    _save(fig, path)
