"""The task readers on generated malformed files (``gpt_tf/data/task_readers.py``, ``task_rows.py``): GLUE TSV,
SNLI / MultiNLI JSONL, RACE JSON, Story Cloze and generic CSV, with random fields, wrong column counts, bytes
that are not UTF-8, stray quotes, wrong JSON types, huge numbers, deep nesting and lone surrogates.

Every file read either gives examples and counted skips, each naming its file and line, or stops with a
``ValueError`` whose message starts ``<file>:<line>:``; never another exception. Every example read is text
the tokenizer can take (UTF-8, no lone surrogate) with a label of the task. ``GPT_TF_FUZZ_EXAMPLES=N`` runs
N examples per test (``tests/small_runs.py``).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from gpt_tf.tasks import csv_task, get_task
from gpt_tf.data.task_readers import CsvOptions, read_examples
from tests.small_runs import fuzz_settings

# Text a field may hold: any Unicode, the characters that matter to the formats, and values a label takes.
CHARS = st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs"]), st.sampled_from(list('\t"\',\r\n\\\x00 ')))
VALUES = st.sampled_from(["0", "1", "2", "-", "", " ", "3.5", "5.0", "-1", "nan", "inf", "1e999", "1_0", "A", "E",
                          "neutral", "entailment", "contradiction", "not_entailment", "entails", "1 ", "\ufeff1"])
FIELD = st.one_of(st.text(CHARS, max_size=10), VALUES)
JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(CHARS, max_size=8), VALUES),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
GARBAGE = st.sampled_from([b"{", b"[" * 3000 + b"]" * 3000, b'{"sentence1": ' + b"9" * 5000 + b"}", b"\xff\xfe",
                           b'"\\ud800"', b'{"sentence1": "\\ud800", "sentence2": "b", "gold_label": "neutral"}',
                           b"\x00", b"null", b"[]", b'{"a": NaN}', b"\xef\xbb\xbf"])


def lines_of(row: st.SearchStrategy, raw_share: int = 4) -> st.SearchStrategy:
    """A file's lines (bytes): mostly ``row`` encoded as UTF-8, some raw bytes or known garbage."""
    line = st.one_of(*[row.map(lambda r: r.encode("utf-8", "surrogatepass"))] * raw_share, st.binary(max_size=20),
                     GARBAGE)
    return st.lists(line, max_size=8)


def file_bytes(header: bytes, lines: list, newline: bytes) -> bytes:
    return newline.join([header, *lines]) + newline


def check(task, path: Path, split: str, file: Path, rows=None, **options) -> None:
    """The property, with and without ``skip_malformed``; ``rows``: how many rows the file holds (each must be an
    example or a counted skip: nothing is dropped silently)."""
    for skip in (False, True):
        try:
            examples, skipped = read_examples(task, path, split, skip_malformed=skip, **options)
        except ValueError as err:
            assert re.match(rf"{re.escape(str(file))}:\d+: \S", str(err)), str(err)
            continue
        for s in skipped:
            assert s["file"] == str(file) and isinstance(s["line"], int) and s["line"] >= 1 and s["reason"], s
            assert skip or not s["reason"].startswith("malformed"), s
        if rows is not None and skip:
            assert len(examples) + len(skipped) == rows, (len(examples), skipped)
        for e in examples:
            texts = [e.text_a, *([e.text_b] if e.text_b is not None else []), *(e.choices or ())]
            assert all(isinstance(t, str) and t.strip() for t in texts), e
            for t in texts:
                t.encode("utf-8")  # no lone surrogate: the tokenizer takes it
            if e.label is not None and task.head != "regression":  # (a csv task's names are the file's own)
                assert isinstance(e.label, int) and 0 <= e.label < (len(task.label_names) or 10 ** 6), e
            elif e.label is not None:
                assert isinstance(e.label, float) and e.label == e.label and abs(e.label) != float("inf"), e


class Folder:
    """A fresh temporary folder per generated example (hypothesis runs many in one test)."""

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="fuzz_readers_"))
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


GLUE_HEADERS = {"sst2": "sentence\tlabel", "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
                "sentence1\tsentence2\tscore", "rte": "index\tsentence1\tsentence2\tlabel",
                "mrpc": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"}


@fuzz_settings(120)
@given(task=st.sampled_from(sorted(GLUE_HEADERS) + ["cola"]), split=st.sampled_from(["train", "test"]),
       header=st.one_of(st.none(), st.lists(FIELD, max_size=4).map("\t".join)),
       lines=lines_of(st.lists(FIELD, max_size=11).map("\t".join)), newline=st.sampled_from([b"\n", b"\r\n", b"\r"]))
@example(task="sst2", split="train", header=None, lines=[b'a "quoted\tword\tfield', b"ok\t1"], newline=b"\n")
def test_glue_tsv(task, split, header, lines, newline):
    with Folder() as folder:
        if header is None:
            head = b"" if task == "cola" else GLUE_HEADERS[task].encode()
        else:
            head = header.encode("utf-8")
        path = folder / f"{split}.tsv"
        data = file_bytes(head, lines, newline) if head or task != "cola" else b"\n".join(lines)
        path.write_bytes(data)
        segments = [x for x in re.split(rb"\r\n|\r|\n", data.removeprefix(b"\xef\xbb\xbf")) if x]
        has_header = task != "cola" or data.startswith(b"index\tsentence")
        check(get_task(task), folder, split, path, rows=len(segments) - has_header)


NLI_ROW = st.fixed_dictionaries({}, optional={"sentence1": st.one_of(FIELD, JSON_VALUE),
                                              "sentence2": st.one_of(FIELD, JSON_VALUE),
                                              "gold_label": st.one_of(VALUES, JSON_VALUE), "pairID": JSON_VALUE})


@fuzz_settings(120)
@given(split=st.sampled_from(["train", "test"]), lines=lines_of(NLI_ROW.map(json.dumps)))
@example(split="train", lines=[b'{"sentence1": "a", "sentence2": "b", "gold_label": ["neutral"]}'])  # was a TypeError
@example(split="train", lines=[b"[" * 3000 + b"]" * 3000])  # was a RecursionError
@example(split="train", lines=[b'{"sentence1": ' + b"9" * 5000 + b"}"])  # was a ValueError naming no file
@example(split="test", lines=[b'{"sentence1": "\\ud800", "sentence2": "b"}'])  # was an example the tokenizer refuses
def test_snli_jsonl(split, lines):
    with Folder() as folder:
        path = folder / f"snli_1.0_{split}.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        check(get_task("snli"), folder, split, path)


RACE_ARTICLE = st.fixed_dictionaries({}, optional={
    "article": st.one_of(FIELD, JSON_VALUE), "questions": st.one_of(st.lists(FIELD, max_size=3), JSON_VALUE),
    "options": st.one_of(st.lists(st.lists(FIELD, min_size=3, max_size=5), max_size=3), JSON_VALUE),
    "answers": st.one_of(st.lists(st.sampled_from(["A", "B", "C", "D", "E", ""]), max_size=3), JSON_VALUE)})


@fuzz_settings(120)
@given(article=st.one_of(RACE_ARTICLE.map(lambda a: json.dumps(a, indent=1).encode("utf-8", "surrogatepass")),
                         st.binary(max_size=30), GARBAGE))
@example(article=b'{"article": "x", "questions": ["q"], "options": [["a", "b", "c", "d"]], "answers": [["A"]]}')
@example(article=b'{"article": ' + b"[" * 3000 + b"]" * 3000 + b"}")
def test_race_json(article):
    with Folder() as folder:
        path = folder / "RACE" / "dev" / "high" / "1.txt"
        path.parent.mkdir(parents=True)
        path.write_bytes(article)
        check(get_task("race"), folder, "dev_high", path)


STORY_HEADER = ("InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,RandomFifthSentenceQuiz1,"
                "RandomFifthSentenceQuiz2,AnswerRightEnding")


def csv_row(fields):
    return ",".join(f if i % 2 else '"' + f.replace('"', '""') + '"' for i, f in enumerate(fields))


@fuzz_settings(120)
@given(header=st.one_of(st.none(), st.lists(FIELD, max_size=8).map(",".join)),
       lines=lines_of(st.one_of(st.lists(FIELD, max_size=9).map(",".join), st.lists(FIELD, max_size=9).map(csv_row))),
       newline=st.sampled_from([b"\n", b"\r\n"]))
@example(header=None, lines=[b'1,"unterminated,a,b,c,d,e,1', b"2,a,b,c,d,e,f,1"], newline=b"\n")
def test_story_cloze_csv(header, lines, newline):
    with Folder() as folder:
        path = folder / "cloze_test_val__spring2016.csv"
        path.write_bytes(file_bytes((STORY_HEADER if header is None else header).encode("utf-8"), lines, newline))
        check(get_task("story_cloze"), folder, "val", path)


@fuzz_settings(120)
@given(head=st.sampled_from(["classification", "regression"]), suffix=st.sampled_from([".csv", ".tsv"]),
       header=st.one_of(st.none(), st.lists(FIELD, max_size=4).map(",".join)),
       lines=lines_of(st.lists(FIELD, max_size=4).map(",".join)))
def test_generic_csv(head, suffix, header, lines):
    with Folder() as folder:
        path = folder / f"train{suffix}"
        delimiter = "\t" if suffix == ".tsv" else ","
        head_line = (header or f"text{delimiter}label").replace(",", delimiter)
        path.write_bytes(file_bytes(head_line.encode("utf-8"), [x.replace(b",", delimiter.encode()) for x in lines],
                                    b"\n"))
        check(csv_task("single", head), folder, "train", path, csv_options=CsvOptions("text", label_column="label"))
