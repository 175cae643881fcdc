"""Readers of the fine-tuning datasets in their official formats -> `Example`s.

    read_examples(task, path_or_dir, split, skip_malformed=False, csv_options=None)
        -> (examples, skipped)          skipped: [{"file", "line", "reason"}, ...]

Formats (`path_or_dir` is the dataset's folder, or one file to read for any split):
  GLUE TSV   `{split}.tsv`: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte. Read with csv QUOTE_NONE (GLUE
             texts hold stray quotes); columns by header name, every row must have the header's column
             count. CoLA train/dev have no header (source, label, mark, sentence); its test has `index
             sentence`. Test files lack the label column -> label None. MNLI splits: train, dev_matched,
             dev_mismatched, test_matched, test_mismatched (GLUE TSV, or MultiNLI's
             `multinli_1.0_{split}.jsonl`).
  SNLI       `snli_1.0_{split}.jsonl` (sentence1, sentence2, gold_label).
  SciTail    `scitail_1.0_{split}.tsv` (premise, hypothesis, entails|neutral; no header), found in the
             folder, its `tsv_format/` or `SciTailV1.1/tsv_format/`.
  RACE       `RACE/{train,dev,test}/{middle,high}/*.txt`, one JSON per article -> one Example per
             question: text_a = article, text_b = question, choices = the 4 options, label = A..D -> 0..3.
             Splits: train, dev, test (both levels) and dev_middle, dev_high, test_middle, ... .
  Story Cloze  `cloze_test_{split}__*.csv` (split val or test): InputStoryid, InputSentence1..4,
             RandomFifthSentenceQuiz1/2, AnswerRightEnding -> text_a = the 4 sentences, 2 choices, label 0/1.
  csv        generic: `{split}.csv` / `{split}.tsv` with columns named by `CsvOptions`.

Conventions (rows are read by `gpt_tf.data.task_rows`). Labels are class indices into
`task.label_names` (a float score for STS-B / regression csv). A gold label '-' (SNLI/MNLI: no
annotator consensus) is always skipped, as the official evaluation does, and counted in `skipped`. A malformed row (wrong column count, unknown label, empty
text, non-numeric or out-of-range score, bad JSON, JSON too deep or with an integer too long to read, a JSON
value where text belongs, a lone surrogate, bytes that are not UTF-8) raises `ValueError("{file}:{line}: ...")`, or with
`skip_malformed=True` is skipped and counted. Nothing is dropped silently.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Optional

from gpt_tf.tasks import TaskSpec
from gpt_tf.data.task_rows import BadRow, Example, Rows, bad_utf8, first_file, iter_table, label_index, label_map, \
    parse_json, parse_score, peek_header, read_table, require_columns, text_field

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")
STS_RANGE = (0.0, 5.0)
NO_CONSENSUS = "-"
_NO_CONSENSUS_REASON = "gold_label '-' (no annotator consensus; skipped by convention)"
RACE_LEVELS = ("middle", "high")
_BINARY = {"0": 0, "1": 1}
# GLUE: (text_a column, text_b column or None, label column, raw label -> index or None for a score).
_GLUE_COLUMNS = {
    "cola": ("sentence", None, "label", _BINARY),
    "sst2": ("sentence", None, "label", _BINARY),
    "mrpc": ("#1 String", "#2 String", "Quality", _BINARY),
    "stsb": ("sentence1", "sentence2", "score", None),
    "qqp": ("question1", "question2", "is_duplicate", _BINARY),
    "mnli": ("sentence1", "sentence2", "gold_label", None),
    "qnli": ("question", "sentence", "label", None),
    "rte": ("sentence1", "sentence2", "label", None),
}
_COLA_NO_HEADER = ("source", "label", "mark", "sentence")
_STORY_COLUMNS = ("InputStoryid", "InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4",
                  "RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2")
_STORY_LABEL = "AnswerRightEnding"


@dataclasses.dataclass(frozen=True)
class CsvOptions:
    """Columns of a generic CSV/TSV. `label_names=()` infers them: the sorted distinct values
    (numerically when all are numbers). `delimiter=None`: tab for .tsv, comma otherwise; `quoting`
    None: csv.QUOTE_NONE for tab-separated files (GLUE style), csv.QUOTE_MINIMAL otherwise."""

    text_a_column: str
    text_b_column: Optional[str] = None
    label_column: Optional[str] = "label"
    delimiter: Optional[str] = None
    label_names: tuple[str, ...] = ()
    guid_column: Optional[str] = None
    quoting: Optional[int] = None


def _glue_file(task: TaskSpec, folder: Path, split: str) -> Path:
    extra = [f"multinli_1.0_{split}.jsonl"] if task.name == "mnli" else []
    return first_file(folder, [f"{split}.tsv", *extra], split)


def _read_glue(task: TaskSpec, path: Path, split: str, rows: Rows) -> list[Example]:
    """One GLUE TSV (or MultiNLI jsonl) file."""
    if path.suffix == ".jsonl":
        return _read_nli_jsonl(task, path, split, rows)
    col_a, col_b, col_label, raw_map = _GLUE_COLUMNS[task.name]
    header = None
    if task.name == "cola" and peek_header(path, "\t", csv.QUOTE_NONE)[:2] != ("index", "sentence"):
        header = _COLA_NO_HEADER
    if task.name in ("qnli", "rte", "mnli"):
        raw_map = label_map(task)
    columns = header or peek_header(path, "\t", csv.QUOTE_NONE)
    labeled = col_label in columns
    if not labeled and not split.startswith("test"):
        raise ValueError(f"{path}:1: no {col_label!r} column in a {split!r} file; header {list(columns)}")
    require_columns(path, columns, (col_a, col_b))
    id_col = next((c for c in ("index", "id", "pairID") if c in columns), None)

    def parse(rec, line):
        label = None
        if labeled:
            raw = rec[col_label]
            if task.name == "mnli" and raw == NO_CONSENSUS:
                return rows.skip(path, line, _NO_CONSENSUS_REASON)
            label = parse_score(raw, *STS_RANGE) if raw_map is None else label_index(raw, raw_map)
        return Example(f"{split}-{rec[id_col] if id_col else line}", text_field(rec[col_a], col_a),
                       text_field(rec[col_b], col_b) if col_b else None, None, label)

    return read_table(path, rows, parse, header)


def _read_nli_jsonl(task: TaskSpec, path: Path, split: str, rows: Rows) -> list[Example]:
    """SNLI / MultiNLI jsonl: one JSON object per line with sentence1, sentence2, gold_label."""
    out, mapping = [], label_map(task)
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                bad = bad_utf8([text])
                if bad:
                    raise BadRow(bad.replace(" in field 1", ""))
                rec = parse_json(text)
                if not isinstance(rec, dict):
                    raise BadRow("not a JSON object")
                gold = rec.get("gold_label")
                if gold == NO_CONSENSUS:
                    rows.skip(path, line, _NO_CONSENSUS_REASON)
                    continue
                label = None if gold is None and split.startswith("test") else label_index(gold, mapping, "gold_label")
                guid = f"{split}-{rec.get('pairID', line)}"
                out.append(Example(guid, text_field(rec.get("sentence1"), "sentence1"),
                                   text_field(rec.get("sentence2"), "sentence2"), None, label))
            except BadRow as err:
                rows.bad(path, line, str(err))
    return out


def _snli_file(folder: Path, split: str) -> Path:
    return first_file(folder, [f"snli_1.0_{split}.jsonl", f"{split}.jsonl"], split)


def _scitail_file(folder: Path, split: str) -> Path:
    name = f"scitail_1.0_{split}.tsv"
    for sub in (".", "tsv_format", "SciTailV1.1/tsv_format", "SciTailV1/tsv_format"):
        if (folder / sub / name).is_file():
            return folder / sub / name
    raise FileNotFoundError(f"{folder}: no {name} (looked in ., tsv_format/, SciTailV1.1/tsv_format/)")


def _read_scitail(task: TaskSpec, path: Path, split: str, rows: Rows) -> list[Example]:
    """SciTail tsv_format: premise, hypothesis, label; no header."""
    mapping = label_map(task)

    def parse(rec, line):
        return Example(f"{split}-{line}", text_field(rec["premise"], "premise"),
                       text_field(rec["hypothesis"], "hypothesis"), None, label_index(rec["label"], mapping))

    return read_table(path, rows, parse, ("premise", "hypothesis", "label"))


def _race_files(folder: Path, split: str) -> list[Path]:
    """RACE/{train,dev,test}/{middle,high}/*.txt of a split ('dev' = both levels, 'dev_high' one)."""
    root = folder / "RACE" if (folder / "RACE").is_dir() else folder
    base, _, level = split.partition("_")
    levels = (level,) if level else RACE_LEVELS
    if base not in ("train", "dev", "test") or any(lv not in RACE_LEVELS for lv in levels):
        raise ValueError(f"RACE split {split!r} is not one of train, dev, test[_middle|_high]")
    files = [p for lv in levels for p in sorted((root / base / lv).glob("*.txt"))]
    if not files:
        raise FileNotFoundError(f"{root}: no RACE files for split {split!r} "
                                f"(looked for {base}/{{{','.join(levels)}}}/*.txt)")
    return files


def _race_questions(rec: dict, guid: str, mapping: dict, num_choices: int, path: Path, rows: Rows):
    """Examples of one RACE article; malformed questions are reported one by one."""
    lists = [rec.get(k) for k in ("questions", "options", "answers")]
    if not isinstance(rec.get("article"), str) or not all(isinstance(x, list) for x in lists):
        raise BadRow("expected keys article (string), questions, options, answers (lists)")
    questions, options, answers = lists
    if not len(questions) == len(options) == len(answers):
        raise BadRow(f"{len(questions)} questions, {len(options)} option lists, {len(answers)} answers")
    article, out = text_field(rec["article"], "article"), []
    for q, (question, opts, answer) in enumerate(zip(questions, options, answers), start=1):
        try:
            if not isinstance(opts, list) or len(opts) != num_choices:
                raise BadRow(f"expected {num_choices} options, got {opts!r}")
            choices = tuple(text_field(o, f"option {i}") for i, o in enumerate(opts, start=1))
            if not isinstance(question, str):
                raise BadRow(f"the question is {'null' if question is None else 'not a string'}")
            out.append(Example(f"{guid}#{q}", article, text_field(question, "question") if question.strip() else None,
                               choices, label_index(answer, mapping, "answer")))
        except BadRow as err:
            rows.bad(path, 1, f"question {q}: {err}")
    return out


def _read_race(task: TaskSpec, files: list[Path], split: str, rows: Rows) -> list[Example]:
    out = []
    for path in files:
        guid = f"{split.partition('_')[0]}/{path.parent.name}/{path.stem}"
        try:
            data = path.read_bytes()
            try:
                text = data.decode("utf-8-sig")
            except UnicodeDecodeError as err:
                raise BadRow(f"invalid UTF-8: byte 0x{data[err.start]:02x}", data[:err.start].count(b"\n") + 1) from None
            rec = parse_json(text)
            if not isinstance(rec, dict):
                raise BadRow("not a JSON object")
            out.extend(_race_questions(rec, guid, label_map(task), task.num_choices, path, rows))
        except BadRow as err:
            rows.bad(path, err.line, str(err))
    return out


def _story_file(folder: Path, split: str) -> Path:
    def key(name: str) -> str:  # official names: cloze_test_{val,test}__{spring2016,winter2018}.csv
        name = name.lower()
        return name[len("cloze_test_"):] if name.startswith("cloze_test_") else name

    found = sorted(p for p in folder.glob("*.csv") if p.is_file() and key(p.name).startswith(
        (f"{split}_", f"{split}.")))
    if len(found) != 1:
        raise FileNotFoundError(f"{folder}: expected one [cloze_test_]{split}_*.csv Story Cloze file for split "
                                f"{split!r}, found {[p.name for p in found] or 'none'}")
    return found[0]


def _read_story_cloze(task: TaskSpec, path: Path, split: str, rows: Rows) -> list[Example]:
    """Story Cloze csv: 4 story sentences as context, 2 candidate endings, AnswerRightEnding 1|2."""
    columns = peek_header(path, ",", csv.QUOTE_MINIMAL)
    require_columns(path, columns, _STORY_COLUMNS)
    mapping = {name: i for i, name in enumerate(task.label_names)}

    def parse(rec, line):
        story = " ".join(text_field(rec[f"InputSentence{i}"], f"InputSentence{i}") for i in range(1, 5))
        choices = tuple(text_field(rec[f"RandomFifthSentenceQuiz{i}"], f"RandomFifthSentenceQuiz{i}")
                        for i in (1, 2))
        label = label_index(rec[_STORY_LABEL].strip(), mapping, _STORY_LABEL) if _STORY_LABEL in rec else None
        return Example(text_field(rec["InputStoryid"], "InputStoryid"), story, None, choices, label)

    return read_table(path, rows, parse, None, ",", csv.QUOTE_MINIMAL)


def _csv_file(folder: Path, split: str) -> Path:
    return first_file(folder, [f"{split}.csv", f"{split}.tsv"], split)


def csv_dialect(path: Path, options: CsvOptions) -> tuple[str, int]:
    """(delimiter, quoting) for a generic file, per CsvOptions' defaults."""
    delimiter = options.delimiter or ("\t" if path.suffix.lower() == ".tsv" else ",")
    quoting = options.quoting if options.quoting is not None else (
        csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL)
    return delimiter, quoting


def _sorted_labels(values) -> tuple[str, ...]:
    """Distinct label values, sorted numerically when all are numbers, else as strings."""
    values = set(values)
    try:
        return tuple(sorted(values, key=float))
    except ValueError:
        return tuple(sorted(values))


def infer_csv_labels(paths, options: CsvOptions) -> tuple[str, ...]:
    """The distinct values of the label column over `paths`, sorted (see CsvOptions)."""
    values = []
    for path in paths:
        delimiter, quoting = csv_dialect(Path(path), options)
        header = None
        for _, row in iter_table(Path(path), delimiter, quoting):
            if header is None:
                header = row
                if options.label_column not in header:
                    break
            elif len(row) == len(header) and not bad_utf8(row):  # bad rows are reported when read
                value = dict(zip(header, row))[options.label_column].strip()
                if value:
                    values.append(value)
    return _sorted_labels(values)


def _read_csv(task: TaskSpec, path: Path, split: str, rows: Rows, options: CsvOptions) -> list[Example]:
    """Generic CSV/TSV with a header naming the columns."""
    if task.input_type == "multiple_choice":
        raise ValueError("the generic csv reader supports single/pair/pair_symmetric tasks only")
    delimiter, quoting = csv_dialect(path, options)
    columns = peek_header(path, delimiter, quoting)
    require_columns(path, columns, (options.text_a_column, options.text_b_column, options.guid_column))
    labeled = bool(options.label_column) and options.label_column in columns
    if options.label_column and not labeled and not split.startswith("test"):
        raise ValueError(f"{path}:1: no label column {options.label_column!r}; header {list(columns)}")
    names = options.label_names or task.label_names or (
        infer_csv_labels([path], options) if labeled and task.head != "regression" else ())
    mapping = {name: i for i, name in enumerate(names)}
    if task.input_type != "single" and not options.text_b_column:
        raise ValueError(f"a {task.input_type} csv task needs CsvOptions.text_b_column")

    def parse(rec, line):
        label = None
        if labeled:
            raw = rec[options.label_column].strip()
            label = parse_score(raw) if task.head == "regression" else label_index(raw, mapping)
        guid = rec[options.guid_column] if options.guid_column else line
        text_b = text_field(rec[options.text_b_column], options.text_b_column) if options.text_b_column else None
        return Example(f"{split}-{guid}", text_field(rec[options.text_a_column], options.text_a_column), text_b,
                       None, label)

    return read_table(path, rows, parse, None, delimiter, quoting)


def split_files(task: TaskSpec, path_or_dir, split: str) -> list[Path]:
    """The input file(s) of `split` (a file path is used as is, for any split)."""
    path = Path(path_or_dir)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{task.name}: {path} is neither a file nor a folder")
    if task.name in GLUE_TASKS:
        return [_glue_file(task, path, split)]
    finders = {"snli": _snli_file, "scitail": _scitail_file, "story_cloze": _story_file, "csv": _csv_file}
    if task.name == "race":
        return _race_files(path, split)
    if task.name not in finders:
        raise ValueError(f"no reader for task {task.name!r}")
    return [finders[task.name](path, split)]


def _standard_splits(task: TaskSpec) -> list[str]:
    return {"mnli": ["train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"],
            "race": ["train", "dev_middle", "dev_high", "test_middle", "test_high"],
            "story_cloze": ["val", "test"]}.get(task.name, ["train", "dev", "test"])


def missing_split_reason(task: TaskSpec, data_dir) -> str:
    """Why the first standard split of `task` is not found under `data_dir` (what its finder looked for)."""
    try:
        split_files(task, data_dir, _standard_splits(task)[0])
    except (FileNotFoundError, ValueError) as err:
        return str(err)
    return f"{data_dir}: its {_standard_splits(task)[0]} split is there"


def available_splits(task: TaskSpec, data_dir) -> list[str]:
    """The standard splits of `task` whose files exist under `data_dir` (a single file: the first
    standard split, `train`, or `val` for Story Cloze)."""
    candidates = _standard_splits(task)
    if Path(data_dir).is_file():
        return candidates[:1]
    found = []
    for split in candidates:
        try:
            split_files(task, data_dir, split)
            found.append(split)
        except (FileNotFoundError, ValueError):
            pass
    return found


def read_examples(task: TaskSpec, path_or_dir, split: str, skip_malformed: bool = False,
                  csv_options: Optional[CsvOptions] = None) -> tuple[list[Example], list[dict]]:
    """Examples of one split, and the skipped rows [{"file", "line", "reason"}] (see module doc)."""
    rows, files = Rows(skip_malformed), split_files(task, path_or_dir, split)
    if task.name == "race":
        examples = _read_race(task, files, split, rows)
    elif task.name == "csv":
        if csv_options is None:
            raise ValueError("the csv task needs csv_options (CsvOptions naming the columns)")
        examples = _read_csv(task, files[0], split, rows, csv_options)
    else:
        reader = {"snli": _read_nli_jsonl, "scitail": _read_scitail,
                  "story_cloze": _read_story_cloze}.get(task.name, _read_glue)
        examples = reader(task, files[0], split, rows)
    return examples, rows.skipped
