"""Tokenizer fidelity: our tokenizers vs GPT-1's released encoder (spaCy words), on real text.

For each set (the dev sets of SST-2, CoLA, RTE and MRPC, 399 Story Cloze stories, 1,500 paragraphs
of a held-out book) it encodes every text with the reference (``bench/reference_encoder.py``: the
release's ``ftfy`` -> ``text_standardize`` -> spaCy ``English().tokenizer`` -> lower -> ``bpe``),
with the offline ``GPTTokenizer`` and with the in-graph ``TFGPTTokenizer``, and reports:

* ``identical``: the share of texts whose ids equal the reference's;
* ``changed``: the token edit rate, Levenshtein distance between the id sequences summed over the
  set, over the reference's token count;
* ``offline == graph``: the share of texts on which the two tokenizers agree;
* examples of the remaining differences (words of the reference vs ours, around the first change).

    python -m bench.tokenizer_fidelity                  # writes bench/results/tokenizer_fidelity.{json,md}
    python -m bench.tokenizer_fidelity --skip_graph --examples=10

Needs spaCy (requirements-dev.txt) and ``../shared/data``.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path

from absl import app, flags

from bench.harness import ROOT

FLAGS = flags.FLAGS
DATA = ROOT.parent / "shared" / "data"
SETS = ("sst2", "cola", "rte", "mrpc", "story_cloze", "book")
TITLES = {"sst2": "SST-2 dev", "cola": "CoLA dev", "rte": "RTE dev, both sentences",
          "mrpc": "MRPC dev, both sentences", "story_cloze": "Story Cloze val stories",
          "book": "paragraphs of a held-out book"}
STORIES = 399
BOOK, PARAGRAPHS = "b0019", 1500  # the first book of books/valid


def fidelity_sets(data_dir: Path, names=SETS) -> dict:
    """``{set name: [text, ...]}`` read with the project's own readers."""
    from gpt_tf.tasks import get_task  # pylint: disable=import-outside-toplevel
    from pipelines import books, task_readers  # pylint: disable=import-outside-toplevel

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


def graph_ids(tokenizer, texts: list, batch: int = 64) -> list:
    """Ids of the in-graph tokenizer, batch by batch."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    out = []
    for i in range(0, len(texts), batch):
        out += tokenizer(tf.constant(texts[i: i + batch], tf.string)).to_list()
    return out


def measure(data_dir: Path, names, with_graph: bool, examples: int) -> dict:
    """Scores of every set, for the offline and (optionally) the in-graph tokenizer."""
    sys.path.insert(0, str(ROOT))
    from bench.reference_encoder import ReferenceEncoder  # pylint: disable=import-outside-toplevel
    from gpt_tf.text.tokenizer import GPTTokenizer  # pylint: disable=import-outside-toplevel
    reference = ReferenceEncoder(data_dir / "gpt1_bpe")
    offline = GPTTokenizer.from_dir(data_dir / "gpt1_bpe")
    graph = offline.tf_tokenizer() if with_graph else None
    results = {}
    for name, texts in fidelity_sets(data_dir, names).items():
        ref = [reference.encode(t) for t in texts]
        ours = offline.encode_batch(texts)
        row = {"title": TITLES[name], "offline": score(ref, ours)}
        if graph is not None:
            in_graph = graph_ids(graph, texts)
            row["graph"] = score(ref, in_graph)
            row["offline_equals_graph"] = sum(o == g for o, g in zip(ours, in_graph)) / len(texts)
            row["graph_differs_from_offline"] = [t for t, o, g in zip(texts, ours, in_graph) if o != g][:examples]
        row["examples"] = [difference_example(reference.words(t), offline.words(t))
                           for t, r, o in zip(texts, ref, ours) if r != o][:examples]
        results[name] = row
        print(f"{name}: offline {row['offline']['identical_share']:.2%} identical, "
              f"{row['offline']['changed_share']:.3%} changed", file=sys.stderr)
    return results


def markdown(results: dict) -> str:
    """The README's table, then the remaining differences."""
    graph = all("graph" in row for row in results.values())
    head = "| text | offline: texts identical | offline: tokens changed |"
    rule = "|---|---:|---:|"
    if graph:
        head += " in-graph: texts identical | in-graph: tokens changed | offline == in-graph |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for row in results.values():
        off = row["offline"]
        line = (f"| {row['title']} ({off['texts']:,}) | {off['identical_share']:.2%} "
                f"| {off['changed_share']:.3%} |")
        if graph:
            gr = row["graph"]
            line += (f" {gr['identical_share']:.2%} | {gr['changed_share']:.3%} "
                     f"| {row['offline_equals_graph']:.2%} |")
        lines.append(line)
    lines.append("")
    for name, row in results.items():
        for example in row["examples"]:
            lines.append(f"- {name}: {example}")
    return "\n".join(lines) + "\n"


def define_flags():
    flags.DEFINE_string("data_dir", str(DATA), "the shared data folder (GLUE, Story Cloze, books)")
    flags.DEFINE_string("sets", ",".join(SETS), f"comma-separated subset of {','.join(SETS)}")
    flags.DEFINE_bool("skip_graph", False, "offline tokenizer only (no TensorFlow)")
    flags.DEFINE_integer("examples", 5, "differences listed per set")
    flags.DEFINE_string("output", str(ROOT / "bench" / "results" / "tokenizer_fidelity"),
                        "writes OUTPUT.json and OUTPUT.md ('' to print only)")


def main(argv):
    del argv  # everything is a flag
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    names = [n for n in FLAGS.sets.split(",") if n]
    results = measure(Path(FLAGS.data_dir), names, not FLAGS.skip_graph, FLAGS.examples)
    table = markdown(results)
    print(table)
    if FLAGS.output:
        output = Path(FLAGS.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.with_suffix(".json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
        output.with_suffix(".md").write_text(table, encoding="utf-8")


if __name__ == "__main__":
    define_flags()
    app.run(main)
