"""Held-out perplexity against tokens seen for several pre-training runs on one set of axes (``log.jsonl`` files
of ``bench.torch_pretrain.train``, e.g. books_tiny's transformer and Table 5's LSTM on the same tokens).

    python -m bench.experiments.pretrain_curves --out=docs/lstm_vs_transformer_books.png \\
        --logs="transformer (tiny)=gpt_tf/presets/gpt1_tiny_books_en/log.jsonl,LSTM (lstm_tiny)=bench/results/lstm_table5_books_pretrain_log.jsonl"
"""

from __future__ import annotations

from absl import app, flags

from bench.torch_pretrain.convert import read_log_file


def plot_heldout_curves(logs: dict[str, str], out: str, title: str = "") -> dict[str, float]:
    """Draws each run's held-out perplexity (log scale) against tokens seen into ``out``; returns the final ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=120)
    finals = {}
    for label, path in logs.items():
        _, rows = read_log_file(path)
        if not rows:
            raise ValueError(f"{path}: no held-out evaluation rows (valid_ppl)")
        finals[label] = rows[-1]["valid_ppl"]
        ax.plot([r["tokens"] / 1e6 for r in rows], [r["valid_ppl"] for r in rows], marker="o", ms=3, lw=2,
                label=f"{label}: {finals[label]:.1f} after {rows[-1]['tokens'] / 1e6:.1f}M tokens")
    ax.set_yscale("log")
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title(title or "held-out perplexity during pre-training")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return finals


def main(argv):
    del argv
    logs = dict(item.split("=", 1) for item in flags.FLAGS.logs)
    print(plot_heldout_curves(logs, flags.FLAGS.out))


if __name__ == "__main__":
    flags.DEFINE_list("logs", None, "label=path of a log.jsonl, comma-separated.", required=True)
    flags.DEFINE_string("out", None, "The PNG to write.", required=True)
    app.run(main)
