r"""Table 5's LSTM row on the books setup (issue #32 item 3), in pieces that resume.

    # 0. the pre-training records: every 16th train book of books_tiny's corpus (and 2 held-out books), its BPE
    python -m bench.experiments.lstm_table5 --stage=data
    # 1. pre-training, as often as needed: each call trains --minutes, then SIGTERM (the trainer checkpoints
    #    the step reached, exit 143); the next call resumes from the run folder's checkpoint
    python -m bench.experiments.lstm_table5 --stage=pretrain --steps=60 --minutes=15
    # 2. fine-tuning cells (task x seed); a cell already in the ledger is skipped
    python -m bench.experiments.lstm_table5 --stage=finetune --seeds=0,1,2
    # 3. the row (median [min-max] over the seeds done) and its note into docs/results.md
    python -m bench.experiments.lstm_table5 --stage=report

The LSTM is ``lstm_tiny`` (one layer of 744 units, about ``tiny``'s non-embedding parameters) pre-trained on
``books_tiny``'s books, BPE and 128-token windows (``pipelines.pretrain_data`` with the BPE of
``gpt_tf/presets/books_tiny/assets/tokenizer``), from every ``--books_every``-th train book only: the LSTM sees a small part
of the corpus's tokens on a 2-core CPU, and tokenizing all 140 MB here takes longer than the run. Its recipe is
``books_tiny``'s recipe (``gpt_tf/presets/books_tiny/log.jsonl``: batch 256, peak lr 1e-3, 2% warm-up
then cosine, decay 0.01, clip 1, seed 0), scaled to ``--steps`` updates by ``bench.experiments.study.lstm_pretrain_cmd``,
in float32 (this CPU has no bf16).
 Fine-tuning uses each task's small-model recipe
(``configs/finetune_<task>_tiny.flags``, chosen by ``bench/reproduction.py``) as in the reproduction table.
Everything goes to one ledger, ``bench/results/lstm_table5.jsonl``.
"""

from __future__ import annotations

import datetime
import json
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from absl import app, flags

from bench.experiments.finetune_runs import (ROOT, _child_env, append_ledger, dev_score, finetune_spec, load_ledger, median_spread,
                                 run_one, shown_command)
from bench.experiments.study import lstm_pretrain_cmd

BOOKS_LOG = ROOT / "gpt_tf" / "presets" / "books_tiny" / "log.jsonl"
LEDGER = ROOT / "bench" / "results" / "lstm_table5.jsonl"
TASKS = ("cola", "rte", "story_cloze")
ROW = "| LSTM w/ aux LM |"
NOTE_START, NOTE_END = "<!-- lstm_table5 -->", "<!-- /lstm_table5 -->"

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_enum("stage", None, ["data", "pretrain", "finetune", "report"], "What to do (see the module doc).")
    flags.DEFINE_string("books_dir", "../shared/data/books", "--stage=data: the books (index.tsv, train/, valid/).")
    flags.DEFINE_integer("books_every", 16, "--stage=data: every n-th train book (by id), for a corpus a CPU can tokenize.")
    flags.DEFINE_integer("valid_books", 2, "--stage=data: the first n held-out books.")
    flags.DEFINE_string("data_dir", "data/books_tiny_sub16", "The books' pre-training records (books_tiny's BPE).")
    flags.DEFINE_string("tasks_dir", "data/tasks_books", "Task records built with books_tiny's BPE.")
    flags.DEFINE_string("runs_root", "runs/lstm_table5", "Where the LSTM run and the fine-tuning runs go.")
    flags.DEFINE_integer("steps", 60, "Pre-training updates (books_tiny had 7,158 of 256 x 128 tokens).")
    flags.DEFINE_float("minutes", 15.0, "--stage=pretrain: stop this piece after this many minutes (0: to the end).")
    flags.DEFINE_list("seeds", ["0"], "--stage=finetune: seeds.")
    flags.DEFINE_list("tasks", list(TASKS), "--stage=finetune: tasks.")
    flags.DEFINE_bool("heldout", True, "--stage=finetune: first the LSTM's held-out perplexity, once (off in all but "
                      "one of several processes started side by side).")
    flags.DEFINE_string("ledger", str(LEDGER), "The JSONL ledger.")
    flags.DEFINE_string("results_md", "docs/results.md", "--stage=report: the file whose LSTM row is filled.")


def pick_books(index_tsv: Path, every: int, valid: int) -> dict[str, list[str]]:
    """Book ids by split: every ``every``-th train book in id order, the first ``valid`` held-out books."""
    rows = [line.split("\t") for line in Path(index_tsv).read_text().splitlines()[1:] if line.strip()]
    train = sorted(r[0] for r in rows if r[1] == "train")
    return {"train": train[::every], "valid": sorted(r[0] for r in rows if r[1] == "valid")[:valid]}


def build_data(books_dir: str, every: int, valid: int, data_dir: str) -> None:
    """Links the picked books into ``<data_dir>_books/{train,valid}`` and builds their records with the BPE."""
    picked, src = pick_books(Path(books_dir) / "index.tsv", every, valid), Path(f"{data_dir}_books")
    for split, ids in picked.items():
        (src / split).mkdir(parents=True, exist_ok=True)
        for book in ids:
            link = src / split / f"{book}.txt"
            if not link.exists():
                link.symlink_to((Path(books_dir) / split / f"{book}.txt").resolve())
    cmd = [sys.executable, "-m", "pipelines.pretrain_data", f"--input_dir={src / 'train'}", f"--valid_dir={src / 'valid'}",
           f"--output_dir={data_dir}", f"--tokenizer_dir={(BOOKS_LOG.parent / 'assets' / 'tokenizer').relative_to(ROOT)}", "--n_ctx=128",
           "--noprogress"]
    subprocess.run(cmd, cwd=ROOT, env=_child_env(), check=True)


def books_recipe(log_path: Path = BOOKS_LOG, data_dir: str = "data/books_tiny") -> dict:
    """books_tiny's pre-training recipe as a ``train_config.json`` (what ``lstm_pretrain_cmd`` scales)."""
    setting = json.loads(Path(log_path).read_text().splitlines()[0])["setting"]
    return {"data_dir": data_dir, "batch_size": setting["batch_size"], "grad_accum_steps": 1,
            "learning_rate": setting["learning_rate"], "lr_decay": "cosine", "weight_decay": setting["weight_decay"],
            "clip_norm": setting["clip_norm"], "precision": "float32", "seed": setting["seed"], "keep_checkpoints": 2,
            "eval_batches": 0, "train_steps": setting["steps"], "warmup_steps": setting["warmup"],
            "checkpoint_every": 500, "n_ctx": setting["meta"]["n_ctx"]}


def pretrain_cmd(runs_root: str, data_dir: str, steps: int) -> tuple[str, list[str]]:
    recipe = books_recipe(data_dir=data_dir)
    return lstm_pretrain_cmd(SimpleNamespace(runs_root=runs_root), recipe, "tiny", steps)


def last_step(run_dir: str) -> int:
    """The newest checkpoint's step of a run folder (0 when none)."""
    steps = [int(p.stem.split("-")[1]) for p in (Path(run_dir) / "checkpoints").glob("ckpt-*.index")]
    return max(steps, default=0)


def pretrain(ledger: Path, runs_root: str, data_dir: str, steps: int, minutes: float) -> bool:
    """One piece of pre-training; True once the run is complete."""
    if any(r["kind"] == "pretrain_done" for r in load_ledger(ledger)):
        print("pre-training already done (in the ledger)")
        return True
    run_dir, cmd = pretrain_cmd(runs_root, data_dir, steps)
    start_step, start = last_step(run_dir), time.time()
    print(f"piece from step {start_step}: {shown_command(cmd)}", flush=True)
    Path(runs_root).mkdir(parents=True, exist_ok=True)
    with open(Path(runs_root) / "pretrain.log", "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(), stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            stdout, _ = proc.communicate(timeout=60 * minutes if minutes else None)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the trainer checkpoints the step reached and exits 143
            stdout, _ = proc.communicate()
    seconds, reached = time.time() - start, last_step(run_dir)
    record = {"kind": "pretrain_piece", "run_dir": run_dir, "cmd": shown_command(cmd), "from_step": start_step,
              "to_step": reached, "seconds": round(seconds, 1), "returncode": proc.returncode, "cpu": _cpu_name(),
              "finished": datetime.datetime.now().isoformat(timespec="seconds")}
    append_ledger(ledger, record)
    print(json.dumps(record), flush=True)
    if proc.returncode == 0:
        train = json.loads((Path(data_dir) / "manifest.json").read_text())["splits"]["train"]
        append_ledger(ledger, {**record, "kind": "pretrain_done", "result": json.loads(stdout.strip().splitlines()[-1]),
                               "tokens": steps * books_recipe()["batch_size"] * books_recipe()["n_ctx"],
                               "data": {"dir": data_dir, "books": train["num_books"], "tokens": train["stream_tokens"],
                                        "windows": train["sequences"]}})
        return True
    if proc.returncode != 143:
        sys.exit(f"lstm_table5: pre-training failed ({proc.returncode}); see {runs_root}/pretrain.log")
    return False


def held_out(ledger: Path, runs_root: str, data_dir: str, steps: int, batches: int = 4) -> None:
    """The LSTM's held-out perplexity on ``batches`` batches of the held-out books, once (not fatal)."""
    if any(r["kind"] == "heldout" for r in load_ledger(ledger)):
        return
    _, cmd = pretrain_cmd(runs_root, data_dir, steps)
    cmd += ["--mode=eval", f"--eval_batches={batches}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"held-out evaluation failed ({proc.returncode}); going on:\n{proc.stderr[-1500:]}", flush=True)
        return
    append_ledger(ledger, {"kind": "heldout", "cmd": shown_command(cmd), "result": json.loads(proc.stdout.strip().splitlines()[-1])})


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def cell_specs(runs_root: str, tasks_dir: str, tasks, seeds) -> list[dict]:
    run_dir = str(Path(runs_root) / "lstm_tiny")
    return [finetune_spec(task, "lstm", int(seed), runs_root=Path(runs_root) / "finetune", tasks_dir=tasks_dir,
                          precision="float32", init_checkpoint=run_dir, recipe="_tiny")
            for seed in seeds for task in tasks]


def finetune(ledger: Path, specs: list[dict]) -> None:
    done = {(r["task"], r["seed"]) for r in load_ledger(ledger) if r["kind"] == "finetune"}
    for spec in specs:
        if (spec["task"], spec["seed"]) in done:
            print(f"skip {spec['task']} seed {spec['seed']}: in the ledger")
            continue
        record = {"kind": "finetune", **run_one(spec), "cpu": _cpu_name()}
        append_ledger(ledger, record)
        print(json.dumps({k: record[k] for k in ("task", "seed", "seconds")} | {"score": dev_score(record)}), flush=True)


def row_and_note(records: list[dict], tasks=TASKS) -> tuple[str, str]:
    """The table row (median [min-max] over seeds, avg of the medians) and the note under the table."""
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
    lines = [NOTE_START, "**The LSTM row** (`python -m bench.experiments.lstm_table5`, ledger "
             "`bench/results/lstm_table5.jsonl`): "]
    if done:
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
        lines[-1] += (f"Its held-out perplexity: {h['perplexity']:.1f} over {h['tokens']:,} tokens of 2 held-out books "
                      f"(their unigram perplexity: {h['unigram_perplexity']:.1f}). ")
    if finetunes:
        lines[-1] += (f"Fine-tuned with each task's small-model recipe (`configs/finetune_<task>_tiny.flags`), "
                      f"seeds {seeds}, dev scores (median [min–max] where several seeds); e.g. "
                      f"`{finetunes[0]['cmd']}`; last run {max(r['finished'] for r in finetunes)[:10]}. ")
    missing = [t for t in tasks if not any(r["task"] == t for r in finetunes)]
    if missing:
        lines[-1] += f"Not fine-tuned yet: {', '.join(missing)} (`--stage=finetune` resumes the cells). "
    lines[-1] += ("The row is not a like-for-like comparison: the LSTM saw a small fraction of the transformer's "
                  "tokens. No transformer checkpoint exists at that many tokens (its earliest kept one is update "
                  "1,790, 58.6M tokens; its held-out perplexity was 170 at 9.8M tokens, the first point of its "
                  "curve), so the transformer's fine-tuned score at equal tokens is not known; the comparison "
                  "that holds is the LSTM row against the from-scratch row.")
    lines.append(NOTE_END)
    return row, "\n".join(lines)


def write_report(path: Path, records: list[dict]) -> None:
    """Replaces the LSTM row of Table 5 and the note right after the table (or after its old note)."""
    text = Path(path).read_text()
    row, note = row_and_note(records)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(ROW))
    lines[at] = row
    if NOTE_START in text:
        start, end = lines.index(NOTE_START), lines.index(NOTE_END)
        lines[start:end + 1] = note.splitlines()
    else:
        lines[at + 1:at + 1] = ["", *note.splitlines()]
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv):
    del argv
    ledger = Path(FLAGS.ledger)
    if FLAGS.stage == "data":
        build_data(FLAGS.books_dir, FLAGS.books_every, FLAGS.valid_books, FLAGS.data_dir)
    elif FLAGS.stage == "pretrain":
        pretrain(ledger, FLAGS.runs_root, FLAGS.data_dir, FLAGS.steps, FLAGS.minutes)
    elif FLAGS.stage == "finetune":
        if not any(r["kind"] == "pretrain_done" for r in load_ledger(ledger)):
            sys.exit("lstm_table5: pre-training is not done yet (run --stage=pretrain until it is)")
        done = next(r for r in load_ledger(ledger) if r["kind"] == "pretrain_done")
        if FLAGS.heldout:
            held_out(ledger, FLAGS.runs_root, FLAGS.data_dir, done["to_step"])
        finetune(ledger, cell_specs(FLAGS.runs_root, FLAGS.tasks_dir, FLAGS.tasks, FLAGS.seeds))
    else:
        write_report(Path(FLAGS.results_md), load_ledger(ledger))


if __name__ == "__main__":
    define_flags()
    app.run(main)
