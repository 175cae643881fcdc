"""The tokenizer: its speed against a git ref (``--mode=speed``), its ids against GPT-1's released encoder
(``fidelity``). What building a corpus's BPE and records costs: ``bench/costs.py --mode=corpus``.

    python -m bench.tokenizer --baseline_ref=main --rounds=5                     # offline encode rate
    python -m bench.tokenizer --baseline_ref=main --rounds=5 --graph_calls=200   # in-graph latency
    python -m bench.tokenizer --mode=fidelity          # -> bench/results/tokenizer_fidelity.{json,md} (needs spaCy)
    python -m bench.tokenizer --mode=fidelity --skip_graph --examples=10

**Speed.** Each measurement is a fresh process (cold caches, as ``pipelines.pretrain_data`` starts) that loads
GPT-1's BPE, reads the first ``--books`` training books and times ``encode_batch`` over their ``text_blocks`` (as
``pipelines/book_stream.py`` encodes a book). The baseline runs the same measurement on ``--baseline_ref``'s code
(a temporary `git worktree`); rounds alternate the two so a load change on a shared machine hits both alike.
Reported: the best wall-clock rate of the rounds (the least disturbed one) and the median rate per CPU-second of
the process (all its threads: HF ``tokenizers`` encodes in parallel), which a busy machine disturbs less. With
``--graph_calls=N`` each process times N calls of the in-graph ``TFGPTTokenizer`` (a ``tf.function``) instead, on
SST-2 training sentences joined to ~128 tokens, one and eight texts per call (medians).

**Fidelity.** For each set (the dev sets of SST-2, CoLA, RTE and MRPC, 399 Story Cloze stories, 1,500 paragraphs of
a held-out book) every text is encoded by the reference (``ReferenceEncoder`` below), the offline ``GPTTokenizer``
and the in-graph ``TFGPTTokenizer``: ``identical`` is the share of texts whose ids equal the reference's,
``changed`` the token edit rate (Levenshtein distance between the id sequences summed over the set, over the
reference's token count), ``offline == graph`` the share of texts on which the two tokenizers agree, with examples
of the remaining differences (the reference's words vs ours, around the first change). Needs spaCy (the dev extra).

The reference is the release's ``TextEncoder.encode`` (openai/finetune-transformer-lm ``text_utils.py``):
``ftfy.fix_text`` -> ``text_standardize`` -> spaCy -> per token ``lower()`` -> ``bpe()`` -> ``encoder.get(token, 0)``.
The release loaded ``spacy.load('en', disable=[...])`` with every pipeline component off, i.e. only its tokenizer;
here that is ``spacy.lang.en.English().tokenizer`` (the same English rules without a model package).
``text_standardize`` and ``bpe`` are copied from the release (``bpe``'s cache kept).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import ftfy
from absl import app, flags

FLAGS = flags.FLAGS
ROOT = Path(__file__).resolve().parents[1]  # not bench.harness's: a speed child runs with another checkout's code
DATA = ROOT.parent / "shared" / "data"
SETS = ("sst2", "cola", "rte", "mrpc", "story_cloze", "book")
TITLES = {"sst2": "SST-2 dev", "cola": "CoLA dev", "rte": "RTE dev, both sentences",
          "mrpc": "MRPC dev, both sentences", "story_cloze": "Story Cloze val stories",
          "book": "paragraphs of a held-out book"}
STORIES = 399
BOOK, PARAGRAPHS = "b0019", 1500  # the first book of books/valid

# ----------------------------------------------------------------------------- speed


def child(data_dir: Path, books_count: int) -> dict:
    """One measurement (run in a child process whose PYTHONPATH picks the tokenizer's source)."""
    from gpt_tf.text.tokenizer import GPTTokenizer
    from pipelines import books
    from pipelines.book_stream import text_blocks

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
    import tensorflow as tf

    from gpt_tf.text.tokenizer import GPTTokenizer

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
    """Runs this file's measurement in a fresh interpreter on the tokenizer code under ``source``."""
    from bench.harness import run_command

    stdout, _ = run_command([sys.executable, str(Path(__file__).resolve()), "--child", f"--data_dir={data_dir}",
                             f"--books={books_count}", f"--graph_calls={graph_calls}"], source)
    return json.loads(stdout.strip().split("\n")[-1])


def speed(args) -> None:
    """This checkout against ``--baseline_ref``, alternating; the rates (or latencies) and their ratio."""
    from bench.harness import base_checkout

    data_dir = Path(args.data_dir).resolve()
    with base_checkout(args.baseline_ref, "tokenizer_") if args.baseline_ref else contextlib.nullcontext() as base:
        sources = {"this checkout": ROOT, **({f"baseline ({args.baseline_ref})": base[0]} if base else {})}
        runs = {name: [] for name in sources}
        for _ in range(args.rounds):
            for name, source in sources.items():
                runs[name].append(run_child(source, data_dir, args.books, args.graph_calls))
                print(f"{name}: {runs[name][-1]}", file=sys.stderr)
    if args.graph_calls:  # medians over the rounds of each round's median latency
        medians = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
        for name, values in medians.items():
            print(f"{name}: " + ", ".join(f"{key} {value:.2f}" for key, value in values.items()))
        if len(medians) == 2:
            mine, base = medians.values()
            print("ratio: " + ", ".join(f"{key} {mine[key] / base[key]:.2f}x" for key in mine))
        return
    best = {name: max(r["chars_per_s"] for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(r["chars_per_cpu_s"] for r in rs) for name, rs in runs.items()}
    for name in runs:
        print(f"{name}: best {best[name] / 1e6:.3f} M chars/s (wall), median {cpu[name] / 1e6:.3f} M chars "
              f"per CPU-second, {args.rounds} rounds ({runs[name][0]['chars']:,} chars, "
              f"{runs[name][0]['tokens']:,} tokens)")
    if len(runs) == 2:
        mine, base = runs
        print(f"ratio: {best[mine] / best[base]:.2f}x (best wall), {cpu[mine] / cpu[base]:.2f}x (CPU time)")


# ----------------------------------------------------------------------------- fidelity: the release's encoder


def text_standardize(text):
    """fixes some issues the spacy tokenizer had on books corpus
    also does some whitespace standardization
    (verbatim from the release's text_utils.py)"""
    text = text.replace('—', '-')
    text = text.replace('–', '-')
    text = text.replace('―', '-')
    text = text.replace('…', '...')
    text = text.replace('´', "'")
    text = re.sub(r'''(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\\+|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)''', r' \1 ', text)
    text = re.sub(r'\s*\n\s*', ' \n ', text)
    text = re.sub(r'[^\S\n]+', ' ', text)
    return text.strip()


def get_pairs(word):
    """The set of adjacent symbol pairs of a word (a tuple of symbols)."""
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


class ReferenceEncoder:
    """The release's ``TextEncoder`` on a folder holding GPT-1's ``encoder_bpe_40000.json`` and ``vocab_40000.bpe``:
    ``words("Don't stop.")`` -> ``['do', "n't", 'stop', '.']``; ``encode(text)`` -> ids."""

    def __init__(self, bpe_dir):
        from spacy.lang.en import English

        bpe_dir = Path(bpe_dir)
        self.nlp = English().tokenizer
        self.encoder = json.loads((bpe_dir / "encoder_bpe_40000.json").read_text(encoding="utf-8"))
        merges = (bpe_dir / "vocab_40000.bpe").read_text(encoding="utf-8").split("\n")[1:-1]
        merges = [tuple(merge.split()) for merge in merges]
        self.bpe_ranks = dict(zip(merges, range(len(merges))))
        self.cache = {}

    def bpe(self, token):  # pylint: disable=too-many-branches
        """The release's ``bpe()``: lowest-rank merge first, ``</w>`` on the last symbol."""
        word = tuple(token[:-1]) + (token[-1] + '</w>',)
        if token in self.cache:
            return self.cache[token]
        pairs = get_pairs(word)
        if not pairs:
            return token + '</w>'
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float('inf')))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = ' '.join(word)
        if word == '\n  </w>':
            word = '\n</w>'
        self.cache[token] = word
        return word

    def words(self, text):
        """spaCy's tokens of the cleaned text, lower-cased: what ``bpe()`` is applied to."""
        return [token.text.lower() for token in self.nlp(text_standardize(ftfy.fix_text(text)))]

    def encode(self, text):
        """Token ids of one text, as the release computed them."""
        return [self.encoder.get(t, 0) for word in self.words(text) for t in self.bpe(word).split(' ')]


# ----------------------------------------------------------------------------- fidelity: the comparison


def fidelity_sets(data_dir: Path, names=SETS) -> dict:
    """``{set name: [text, ...]}`` read with the project's own readers."""
    from gpt_tf.tasks import get_task
    from gpt_tf.data import task_readers
    from pipelines import books

    def examples(task, folder, split):
        return task_readers.read_examples(get_task(task), data_dir / folder, split)[0]

    sets = {}
    for name in names:
        if name in ("sst2", "cola"):
            sets[name] = [e.text_a for e in examples(name, f"glue/{'SST-2' if name == 'sst2' else 'CoLA'}", "dev")]
        elif name in ("rte", "mrpc"):
            sets[name] = [t for e in examples(name, f"glue/{name.upper()}", "dev") for t in (e.text_a, e.text_b)]
        elif name == "story_cloze":
            sets[name] = [e.text_a for e in examples(name, "story_cloze", "val")[:STORIES]]
        elif name == "book":
            root = data_dir / "books" / "valid"
            text = books.load_book(root / f"{BOOK}.txt", root).text
            sets[name] = [p for p in text.split("\n\n") if p.strip()][:PARAGRAPHS]
        else:
            raise ValueError(f"unknown set {name!r}; known: {', '.join(SETS)}")
    return sets


def edit_distance(a, b) -> int:
    """Levenshtein distance of two sequences (common prefix and suffix stripped first)."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start: len(a) - end], b[start: len(b) - end]
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def score(reference: list, ours: list) -> dict:
    """Identical texts and token edit rate of ``ours`` against ``reference`` (lists of id lists)."""
    same = sum(r == o for r, o in zip(reference, ours))
    edits = sum(edit_distance(r, o) for r, o in zip(reference, ours) if r != o)
    tokens = sum(len(r) for r in reference)
    return {"texts": len(reference), "identical": same, "identical_share": same / len(reference),
            "tokens": tokens, "edits": edits, "changed_share": edits / max(tokens, 1)}


def difference_example(ref_words: list, our_words: list, context: int = 3) -> str:
    """``'ref words' -> 'our words'`` around the first place the two word lists part."""
    ref_words = [w.strip(" ") if w.isspace() else w for w in ref_words]  # spaCy's '\n ' is bpe()'s '\n'
    ops = difflib.SequenceMatcher(None, ref_words, our_words, autojunk=False).get_opcodes()
    _, i1, i2, j1, j2 = next((op for op in ops if op[0] != "equal"), ("equal", 0, 0, 0, 0))

    def show(words, lo, hi):
        return " ".join(words[max(lo - context, 0): hi + context]).replace("\n", "\\n")
    return f"{show(ref_words, i1, i2)!r} -> {show(our_words, j1, j2)!r}"


def fidelity(data_dir: Path, names, with_graph: bool, examples: int) -> dict:
    """Scores of every set, for the offline and (optionally) the in-graph tokenizer."""
    from gpt_tf.text.tokenizer import GPTTokenizer

    reference = ReferenceEncoder(data_dir / "gpt1_bpe")
    offline = GPTTokenizer.from_dir(data_dir / "gpt1_bpe")
    graph = offline.tf_tokenizer() if with_graph else None
    results = {}
    for name, texts in fidelity_sets(data_dir, names).items():
        ref = [reference.encode(t) for t in texts]
        ours = offline.encode_batch(texts)
        row = {"title": TITLES[name], "offline": score(ref, ours)}
        if graph is not None:
            import tensorflow as tf

            in_graph = [ids for i in range(0, len(texts), 64)
                        for ids in graph(tf.constant(texts[i: i + 64], tf.string)).to_list()]
            row["graph"] = score(ref, in_graph)
            row["offline_equals_graph"] = sum(o == g for o, g in zip(ours, in_graph)) / len(texts)
            row["graph_differs_from_offline"] = [t for t, o, g in zip(texts, ours, in_graph) if o != g][:examples]
        row["examples"] = [difference_example(reference.words(t), offline.words(t))
                           for t, r, o in zip(texts, ref, ours) if r != o][:examples]
        results[name] = row
        print(f"{name}: offline {row['offline']['identical_share']:.2%} identical, "
              f"{row['offline']['changed_share']:.3%} changed", file=sys.stderr)
    return results


def fidelity_markdown(results: dict) -> str:
    """The table of docs/benchmarks.md, then the remaining differences."""
    graph = all("graph" in row for row in results.values())
    lines = ["| text | offline: texts identical | offline: tokens changed |"
             + (" in-graph: texts identical | in-graph: tokens changed | offline == in-graph |" if graph else ""),
             "|---|---:|---:|" + ("---:|---:|---:|" if graph else "")]
    for row in results.values():
        off, gr = row["offline"], row.get("graph")
        lines.append(f"| {row['title']} ({off['texts']:,}) | {off['identical_share']:.2%} "
                     f"| {off['changed_share']:.3%} |"
                     + (f" {gr['identical_share']:.2%} | {gr['changed_share']:.3%} "
                        f"| {row['offline_equals_graph']:.2%} |" if graph else ""))
    lines.append("")
    lines += [f"- {name}: {example}" for name, row in results.items() for example in row["examples"]]
    return "\n".join(lines) + "\n"


def define_flags():
    flags.DEFINE_enum("mode", "speed", ["speed", "fidelity"], "what to measure (see the module doc)")
    flags.DEFINE_string("data_dir", str(DATA), "the shared data folder (GPT-1's BPE, books, GLUE, Story Cloze)")
    flags.DEFINE_integer("books", 10, "--mode=speed: the first N books of books/train")
    flags.DEFINE_string("baseline_ref", "main", "--mode=speed: git ref to compare with ('' for none)")
    flags.DEFINE_integer("rounds", 3, "--mode=speed: rounds per checkout")
    flags.DEFINE_integer("graph_calls", 0, "--mode=speed: instead, the median in-graph tokenizer latency over N calls "
                         "(batch 1 and 8)")
    flags.DEFINE_bool("child", False, "internal: measure in this process and print JSON")
    flags.DEFINE_string("sets", ",".join(SETS), f"--mode=fidelity: comma-separated subset of {','.join(SETS)}")
    flags.DEFINE_bool("skip_graph", False, "--mode=fidelity: the offline tokenizer only (no TensorFlow)")
    flags.DEFINE_integer("examples", 5, "--mode=fidelity: differences listed per set")
    flags.DEFINE_string("output", None, "--mode=fidelity: writes OUTPUT.json and OUTPUT.md (default "
                        "bench/results/tokenizer_fidelity; '' to print only)")


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if args.child:
        data_dir = Path(args.data_dir).resolve()
        print(json.dumps(graph_child(data_dir, args.graph_calls) if args.graph_calls else child(data_dir, args.books)))
        return
    if args.mode == "speed":
        return speed(args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    results = fidelity(Path(args.data_dir), [n for n in args.sets.split(",") if n], not args.skip_graph, args.examples)
    table = fidelity_markdown(results)
    print(table)
    output = ROOT / "bench" / "results" / "tokenizer_fidelity" if args.output is None else args.output
    if output:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.with_suffix(".json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
        output.with_suffix(".md").write_text(table, encoding="utf-8")


if __name__ == "__main__":
    define_flags()
    app.run(main)
