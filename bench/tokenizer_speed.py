"""Tokenizer speed, this checkout vs a baseline git ref, side by side: offline encode rate, in-graph latency.

Each measurement is a fresh process (cold caches, as ``pipelines.pretrain_data`` starts) that loads
GPT-1's BPE, reads the first ``--books`` training books and times ``encode_batch`` over their
``text_blocks`` (the way ``pipelines/book_stream.py`` encodes a book). The baseline is the same
script run against ``git archive <ref>`` in a temporary folder. Rounds alternate the two so a load
change on a shared machine hits both alike. Reported: the best wall-clock rate of the rounds (the
least disturbed one) and the median rate per CPU-second of the process (all its threads: HF
``tokenizers`` encodes in parallel), which a busy machine disturbs less. With ``--graph_calls=N``
each process instead times N calls of the in-graph ``TFGPTTokenizer`` (a ``tf.function``) on
SST-2 training sentences joined to ~128 tokens, one and eight texts per call (medians).

    python -m bench.tokenizer_speed --baseline_ref=main --rounds=5
    python -m bench.tokenizer_speed --baseline_ref=main --rounds=5 --graph_calls=200   # in-graph latency
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from bench.harness import ROOT

FLAGS = flags.FLAGS
DATA = ROOT.parent / "shared" / "data"


def child(data_dir: Path, books_count: int) -> dict:
    """One measurement (run in a child process whose PYTHONPATH picks the tokenizer's source)."""
    from gpt_tf.text.tokenizer import GPTTokenizer  # pylint: disable=import-outside-toplevel
    from pipelines import books  # pylint: disable=import-outside-toplevel
    from pipelines.book_stream import text_blocks  # pylint: disable=import-outside-toplevel
    tokenizer = GPTTokenizer.from_dir(data_dir / "gpt1_bpe")
    root = data_dir / "books" / "train"
    texts = [b.text for b in (books.load_book(p, root) for p in books.find_book_files(root)[:books_count])
             if hasattr(b, "text")]
    blocks = [text_blocks(t) for t in texts]
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens = sum(len(ids) for book in blocks for ids in tokenizer.encode_batch(book))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    chars = sum(len(t) for t in texts)
    return {"books": len(texts), "chars": chars, "tokens": tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "chars_per_s": chars / seconds, "chars_per_cpu_s": chars / cpu_seconds}


def graph_child(data_dir: Path, calls: int) -> dict:
    """Median latency of the in-graph tokenizer on SST-2 texts of ~128 tokens, 1 and 8 per call."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from gpt_tf.text.tokenizer import GPTTokenizer  # pylint: disable=import-outside-toplevel
    offline = GPTTokenizer.from_dir(data_dir / "gpt1_bpe")
    graph = offline.tf_tokenizer()
    rows = (data_dir / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts, current = [], []
    for row in rows[: 20 * calls]:
        current.append(row.split("\t")[0])
        if len(offline.encode(" ".join(current))) >= 120:
            texts.append(" ".join(current))
            current = []
    result = {}
    for batch in (1, 8):
        inputs = [tf.constant(texts[(i * batch) % len(texts):][:batch]) for i in range(calls)]
        for x in inputs[:10]:
            graph(x)
        times = []
        for x in inputs:
            start = time.perf_counter()
            graph(x)
            times.append(time.perf_counter() - start)
        result[f"batch{batch}_ms"] = 1000 * statistics.median(times)
    return result


def run_child(source: Path, data_dir: Path, books_count: int, graph_calls: int = 0) -> dict:
    """Runs :func:`child` (or :func:`graph_child`) in a fresh interpreter on the code under ``source``."""
    env = dict(os.environ, PYTHONPATH=str(source), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                          f"--data_dir={data_dir}", f"--books={books_count}", f"--graph_calls={graph_calls}"],
                         capture_output=True, text=True, env=env, cwd=str(source), check=True)
    return json.loads(out.stdout.strip().split("\n")[-1])


def report_graph(runs: dict) -> None:
    """Medians over the rounds of each round's median latency, and their ratio."""
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    for name, values in medians.items():
        print(f"{name}: " + ", ".join(f"{key} {value:.2f}" for key, value in values.items()))
    if len(medians) == 2:
        mine, base = medians.values()
        print("ratio: " + ", ".join(f"{key} {mine[key] / base[key]:.2f}x" for key in mine))


def define_flags():
    flags.DEFINE_string("data_dir", str(DATA), "the shared data folder (books/train)")
    flags.DEFINE_integer("books", 10, "first N books of books/train")
    flags.DEFINE_string("baseline_ref", "main", "git ref to compare with ('' for none)")
    flags.DEFINE_integer("rounds", 3, "rounds per checkout")
    flags.DEFINE_integer("graph_calls", 0, "instead: median in-graph tokenizer latency over N calls (batch 1 and 8)")
    flags.DEFINE_bool("child", False, "internal: measure in this process and print JSON")


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if args.child:
        data_dir = Path(args.data_dir).resolve()
        print(json.dumps(graph_child(data_dir, args.graph_calls) if args.graph_calls else child(data_dir, args.books)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"this checkout": ROOT}
        if args.baseline_ref:
            archive = subprocess.run(["git", "archive", args.baseline_ref], cwd=ROOT, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            sources[f"baseline ({args.baseline_ref})"] = Path(tmp)
        runs = {name: [] for name in sources}
        for _ in range(args.rounds):
            for name, source in sources.items():
                runs[name].append(run_child(source, Path(args.data_dir).resolve(), args.books, args.graph_calls))
                print(f"{name}: {runs[name][-1]}", file=sys.stderr)
    if args.graph_calls:
        report_graph(runs)
        return
    best = {name: max(r["chars_per_s"] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r["chars_per_cpu_s"] for r in rs) for name, rs in runs.items()}
    for name in runs:
        print(f"{name}: best {best[name] / 1e6:.3f} M chars/s (wall), median {cpu[name] / 1e6:.3f} M chars "
              f"per CPU-second, {args.rounds} rounds ({runs[name][0]['chars']:,} chars, "
              f"{runs[name][0]['tokens']:,} tokens)")
    if len(runs) == 2:
        (mine, base) = runs
        print(f"ratio: {best[mine] / best[base]:.2f}x (best wall), {cpu[mine] / cpu[base]:.2f}x (CPU time)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
