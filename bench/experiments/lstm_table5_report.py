"""``python -m bench.experiments.lstm_table5 --stage=report``: Table 5's LSTM row and the note under the table
in docs/results.md, from the ledger (the pre-training, the held-out perplexity, the fine-tuning cells) and the
transformer's cells with the same recipes and seeds (``bench/results/reproduction.jsonl``)."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.experiments.finetune_runs import ROOT, dev_score, load_ledger, median_spread
from bench.experiments.lstm_table5 import BOOKS_LOG, REPRODUCTION, TASKS, books_recipe, pretrain_log

ROW = "| LSTM w/ aux LM |"
NOTE_START, NOTE_END = "<!-- lstm_table5 -->", "<!-- /lstm_table5 -->"


def row_and_note(records: list[dict], tasks=TASKS, ledger: str = "bench/results/lstm_table5.jsonl",
                 reference: dict | None = None) -> tuple[str, str]:
    """The table row (median [min-max] over seeds, avg of the medians) and the note under the table;
    ``reference``: task -> {seed: dev score} of the transformer with the same recipes."""
    cells, medians = [], []
    for task in tasks:
        spread = median_spread(dev_score(r) for r in records if r["kind"] == "finetune" and r["task"] == task)
        if spread is None:
            cells.append("–")
            continue
        med, low, high = spread
        n = sum(1 for r in records if r["kind"] == "finetune" and r["task"] == task)
        cells.append(f"{med:.1f}" + (f" [{low:.1f}–{high:.1f}]" if n > 1 else ""))
        medians.append(med)
    avg = f"{sum(medians) / len(medians):.1f}" if len(medians) == len(tasks) else "–"
    row = f"{ROW} {avg} | " + " | ".join(cells) + " |"
    done = [r for r in records if r["kind"] == "pretrain_done"]
    pieces = [r for r in records if r["kind"] == "pretrain_piece"]
    finetunes = [r for r in records if r["kind"] == "finetune"]
    seeds = sorted({r["seed"] for r in finetunes})
    lines = [NOTE_START, f"**The LSTM row** (`python -m bench.experiments.lstm_table5`, ledger `{ledger}`): "]
    gpu = bool(done) and done[-1].get("route") == "gpu"
    if gpu:
        d, data = done[-1], done[-1].get("data", {})
        ppl = (f"; held-out perplexity {d['valid_ppl']:.1f} on the 4,096 held-out windows where books_tiny's is 55.1"
               if d.get("valid_ppl") else "")
        lines[-1] += (f"`lstm_tiny` (one LSTM layer of 744 units, 3.17M parameters against `tiny`'s 3.16M outside the "
                      f"embeddings) pre-trained on a lent GPU ({d.get('device')}) by `bench.torch_pretrain.train "
                      f"--model=lstm_tiny` (`bench/torch_pretrain/lstm_model.py`: this LSTM in PyTorch, equal to "
                      f"gpt_tf's in its logits, `tests/test_torch_lstm.py`) on books_tiny's own windows "
                      f"(`{data.get('dir', '?')}`: {data.get('books', '?')} train books, {data.get('tokens', 0) / 1e6:.1f}M "
                      f"tokens in {data.get('windows', 0):,} windows) with books_tiny's recipe and update count: "
                      f"**{d['to_step']:,} updates, {d['tokens'] / 1e6:.1f}M tokens, as the transformer's 234.6M**, "
                      f"float32, {d['seconds'] / 60:.1f} min of updates{ppl}; imported by `{d['cmd']}`, "
                      f"{d['finished'][:10]}. ")
    elif done:
        d = done[-1]
        recipe = books_recipe()
        data = d.get("data", {})
        lines[-1] += (f"`lstm_tiny` (one LSTM layer of 744 units, 3.17M parameters against `tiny`'s 3.16M outside the "
                      f"embeddings) pre-trained on `{data.get('dir', '?')}`: {data.get('books', '?')} of books_tiny's 389 "
                      f"train books (every 16th by id; {data.get('tokens', 0) / 1e6:.2f}M tokens in "
                      f"{data.get('windows', 0):,} windows), cut by books_tiny's BPE into its 128-token windows, with "
                      f"books_tiny's recipe scaled to {d['to_step']:,} updates of {recipe['batch_size']} × "
                      f"{recipe['n_ctx']} tokens: "
                      f"**{d['tokens'] / 1e6:.1f}M tokens, {100 * d['tokens'] / 234.6e6:.1f}% of the transformer's "
                      f"234.6M**, in {len(pieces)} pieces, {sum(p['seconds'] for p in pieces) / 60:.0f} min of "
                      f"niced, contended CPU ({d['cpu']}, 2 cores shared with other jobs), finished {d['finished'][:10]}; "
                      f"`{d['cmd']}`. ")
    heldout = [r for r in records if r["kind"] == "heldout"]
    if heldout:
        h = heldout[-1]["result"]
        books = "the held-out books" if gpu else "2 held-out books"
        lines[-1] += (f"Its held-out perplexity: {h['perplexity']:.1f} over {h['tokens']:,} tokens of {books} "
                      f"(their unigram perplexity: {h['unigram_perplexity']:.1f}). ")
    if finetunes:
        lines[-1] += (f"Fine-tuned with each task's small-model recipe (`configs/finetune_<task>_tiny.flags`), "
                      f"seeds {seeds}, dev scores (median [min–max] where several seeds); e.g. "
                      f"`{finetunes[0]['cmd']}`; last run {max(r['finished'] for r in finetunes)[:10]}. ")
    if len(seeds) > 1 and 0 in seeds:
        zero = {r["task"]: dev_score(r) for r in finetunes if r["seed"] == 0}
        shown = ", ".join(f"{t} {zero[t]:.1f}" for t in tasks if t in zero)
        avg0 = f" (avg {sum(zero[t] for t in tasks) / len(tasks):.1f})" if all(t in zero for t in tasks) else ""
        lines[-1] += f"Seed 0 alone, the seed of the rows above: {shown}{avg0}. "
    missing = [t for t in tasks if not any(r["task"] == t for r in finetunes)]
    if missing:
        lines[-1] += f"Not fine-tuned yet: {', '.join(missing)} (`--stage=finetune` resumes the cells). "
    if gpu:
        lines[-1] += ("The LSTM saw the transformer's books, tokens and pre-training recipe, so the row compares "
                      "with the transformer's as the paper's does.")
    else:
        lines[-1] += ("The row is not a like-for-like comparison: the LSTM saw a small fraction of the transformer's "
                      "tokens. No transformer checkpoint exists at that many tokens (its earliest kept one is update "
                      "1,790, 58.6M tokens; its held-out perplexity was 170 at 9.8M tokens, the first point of its "
                      "curve), so the transformer's fine-tuned score at equal tokens is not known; the comparison "
                      "that holds is the LSTM row against the from-scratch row.")
    if reference:
        ref = {t: statistics.median(reference[t].values()) for t in tasks if reference.get(t)}
        cells = ", ".join(f"{t} {m:.1f}" for t, m in ref.items())
        if len(ref) == len(tasks) == len(medians):
            cells += f" (avg {sum(ref.values()) / len(ref):.1f}, the LSTM's {avg})"
        lines[-1] += (f" The transformer fine-tuned with the same recipes and seeds (the reproduction table's "
                      f"pre-trained cells, `bench/results/reproduction.jsonl`), medians: {cells}; the "
                      f"transformer rows above are the study's seed-0 runs, CoLA's with its earlier 3-epoch recipe.")
    lines.append(NOTE_END)
    return row, "\n".join(lines)


def write_report(path: Path, records: list[dict], ledger: str = "bench/results/lstm_table5.jsonl",
                 figure: str = "") -> None:
    """Replaces the LSTM row of Table 5 and the note right after the table (or after its old note); with the GPU
    route's log beside the ledger, ``figure`` (a PNG beside ``path``) gets both models' held-out curves."""
    from bench.experiments.reproduction import chosen_scores

    text = Path(path).read_text()
    repro = load_ledger(REPRODUCTION)
    row, note = row_and_note(records, ledger=ledger, reference=chosen_scores(repro, "pretrained", TASKS) if repro else None)
    log = pretrain_log(Path(ledger) if Path(ledger).is_absolute() else ROOT / ledger)
    if figure and log.is_file():
        from bench.experiments.pretrain_curves import plot_heldout_curves

        plot_heldout_curves({"transformer (tiny, books_tiny)": str(BOOKS_LOG), "LSTM (lstm_tiny)": str(log)},
                            str(Path(path).parent / figure), "the same books, tokens and recipe: held-out perplexity")
        note = note.replace(NOTE_END, f"\n![held-out perplexity of both models during pre-training]({figure})\n{NOTE_END}")
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(ROW))
    lines[at] = row
    if NOTE_START in text:
        start, end = lines.index(NOTE_START), lines.index(NOTE_END)
        lines[start:end + 1] = note.splitlines()
    else:
        lines[at + 1:at + 1] = ["", *note.splitlines()]
    Path(path).write_text("\n".join(lines) + "\n")
