"""Fine-tuning task specifications: the 12 datasets of the paper's Table 1, plus a generic CSV.

A `TaskSpec` says how a task's examples become model inputs (`input_type`, §3.3 and Figure 1),
which head scores them (`head`), what its labels mean (`label_names`, index = class id) and
which metrics report it (`metrics`, the first is the paper's headline metric).

    input_type        views per example          tasks
    single            <s> a <e>                  CoLA, SST-2 (classification)
    pair              <s> a $ b <e>              SNLI, MNLI, QNLI, RTE, SciTail (premise, hypothesis)
    pair_symmetric    <s> a $ b <e>, <s> b $ a <e>   MRPC, QQP (classification), STS-B (regression)
    multiple_choice   <s> context $ choice_k <e>     RACE (4 options), Story Cloze (2 endings)

`eval_splits` names the splits a trainer evaluates on: MNLI's matched and mismatched dev sets;
RACE's middle and high dev sets and "dev" (both together, RACE-all). Label names are the
human-readable classes; the readers (`gpt_tf/data/task_readers.py`) map each file's raw label
values (e.g. GLUE's "0"/"1") onto these indices.

The `csv` spec is a template for user data (a single-text classifier by default); build a
concrete one with `csv_task(...)`, or let `pipelines/finetune_data.py` infer its labels.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

INPUT_TYPES = ("single", "pair", "pair_symmetric", "multiple_choice")
HEADS = ("classification", "regression", "choice")
# The text fields of one example per input type (the serving signatures' input names); a multiple
# choice example also has its candidate answers.
INPUT_FIELDS = {
    "single": ("sentence",),
    "pair": ("premise", "hypothesis"),
    "pair_symmetric": ("sentence1", "sentence2"),
    "multiple_choice": ("context",),
}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """How one fine-tuning task is fed to the model and scored."""

    name: str
    input_type: str  # one of INPUT_TYPES
    head: str  # one of HEADS
    label_names: tuple[str, ...]  # () for regression; for "choice" one name per candidate index
    metrics: tuple[str, ...]  # names in gpt_tf.metrics.METRICS; the first is the headline metric
    num_choices: int = 0  # candidates per example for multiple_choice
    eval_splits: tuple[str, ...] = ("dev",)

    def __post_init__(self):
        """Validates the combination of fields (and turns lists into tuples)."""
        for field in ("label_names", "metrics", "eval_splits"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        problems = []
        if self.input_type not in INPUT_TYPES:
            problems.append(f"input_type {self.input_type!r} is not one of {INPUT_TYPES}")
        if self.head not in HEADS:
            problems.append(f"head {self.head!r} is not one of {HEADS}")
        if (self.input_type == "multiple_choice") != (self.head == "choice"):
            problems.append(f"head 'choice' goes with input_type 'multiple_choice' (got head "
                            f"{self.head!r}, input_type {self.input_type!r})")
        if self.head == "choice" and (self.num_choices < 2 or len(self.label_names) != self.num_choices):
            problems.append(f"a choice task needs num_choices >= 2 and one label name per choice "
                            f"(num_choices={self.num_choices}, label_names={self.label_names})")
        if self.head != "choice" and self.num_choices:
            problems.append(f"num_choices={self.num_choices} is only for multiple_choice tasks")
        if self.head == "regression" and self.label_names:
            problems.append(f"a regression task has no label names, got {self.label_names}")
        if len(set(self.label_names)) != len(self.label_names):
            problems.append(f"label names repeat: {self.label_names}")
        if not self.metrics:
            problems.append("at least one metric is needed")
        if problems:
            raise ValueError(f"invalid TaskSpec {self.name!r}: " + "; ".join(problems))

    @property
    def num_labels(self) -> int:
        """Output width of the head: classes, 1 for regression, candidates for choice."""
        return 1 if self.head == "regression" else len(self.label_names)

    @property
    def num_views(self) -> int:
        """K, the token sequences per example: 1, 2 (symmetric pair) or num_choices."""
        return {"pair_symmetric": 2, "multiple_choice": self.num_choices}.get(self.input_type, 1)

    def accepts_views(self, views: int) -> bool:
        """Whether the model takes ``views`` sequences per example: ``num_views``, or any number >= 1
        for multiple choice (the same weights score any number of candidates)."""
        return views >= 1 if self.input_type == "multiple_choice" else views == self.num_views

    @property
    def input_fields(self) -> tuple[str, ...]:
        """The text fields of one example (``INPUT_FIELDS``); multiple choice adds its candidates."""
        return INPUT_FIELDS[self.input_type]

    @property
    def head_units(self) -> int:
        """Output width of W_y: classes for classification, 1 for regression and per-candidate choice."""
        if self.head == "classification" and len(self.label_names) < 2:
            raise ValueError(f"task {self.name!r}: a classification head needs >= 2 label_names, "
                             f"got {self.label_names!r}")
        return len(self.label_names) if self.head == "classification" else 1

    def view_lengths(self, len_a: int, len_b: int, choice_lengths=()) -> list[int]:
        """Untruncated token count of each view of an example (special tokens included); the two
        orderings of a symmetric pair have the same length, listed once."""
        if self.input_type == "multiple_choice":
            return [len_a + len_b + c + 3 for c in choice_lengths]
        return [len_a + 2] if self.input_type == "single" else [len_a + len_b + 3]

    def to_dict(self) -> dict:
        """JSON-friendly dict (lists for tuples); `TaskSpec.from_dict` reverses it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TaskSpec":
        """Rebuilds a spec from `to_dict()` output (or a Keras get_config dict)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TaskSpec field(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(data))


def as_task_spec(task) -> TaskSpec:
    """A ``TaskSpec`` from a spec or its dict form (``TaskSpec.to_dict()`` / a Keras config)."""
    if isinstance(task, TaskSpec):
        return task
    if isinstance(task, Mapping):
        return TaskSpec.from_dict(task)
    raise TypeError(f"task must be a TaskSpec or a dict of its fields, got {type(task).__name__}")


_ACC = ("accuracy",)
_NLI3 = ("entailment", "neutral", "contradiction")

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        # Natural language inference (pair: premise, then hypothesis).
        TaskSpec("snli", "pair", "classification", _NLI3, _ACC),
        TaskSpec("mnli", "pair", "classification", _NLI3, _ACC,
                 eval_splits=("dev_matched", "dev_mismatched")),
        TaskSpec("qnli", "pair", "classification", ("entailment", "not_entailment"), _ACC),
        TaskSpec("rte", "pair", "classification", ("entailment", "not_entailment"), _ACC),
        TaskSpec("scitail", "pair", "classification", ("entails", "neutral"), _ACC),
        # Question answering and commonsense reasoning (multiple choice).
        TaskSpec("race", "multiple_choice", "choice", ("A", "B", "C", "D"), _ACC, num_choices=4,
                 eval_splits=("dev_middle", "dev_high", "dev")),
        TaskSpec("story_cloze", "multiple_choice", "choice", ("1", "2"), _ACC, num_choices=2),
        # Classification (single sentence).
        TaskSpec("cola", "single", "classification", ("unacceptable", "acceptable"), ("matthews",)),
        TaskSpec("sst2", "single", "classification", ("negative", "positive"), _ACC),
        # Semantic similarity (symmetric pair).
        TaskSpec("mrpc", "pair_symmetric", "classification", ("not_paraphrase", "paraphrase"),
                 ("f1", "accuracy")),
        TaskSpec("stsb", "pair_symmetric", "regression", (), ("pearson", "spearman")),
        TaskSpec("qqp", "pair_symmetric", "classification", ("not_duplicate", "duplicate"),
                 ("f1", "accuracy")),
        # Generic user data; label names are given by csv_task(...) or inferred from the files.
        TaskSpec("csv", "single", "classification", (), _ACC),
    )
}


def get_task(name: str) -> TaskSpec:
    """The registered spec called `name` (case-insensitive; '-' and '_' ignored, so 'SST-2' works)."""
    key = name.lower().replace("-", "").replace("_", "")
    for spec in TASKS.values():
        if spec.name.replace("_", "") == key:
            return spec
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")


def csv_task(input_type: str = "single", head: str = "classification",
             label_names: tuple[str, ...] = (), metrics: tuple[str, ...] | None = None,
             num_choices: int = 0, eval_splits: tuple[str, ...] = ("dev",)) -> TaskSpec:
    """A concrete generic `csv` task. Default metrics: accuracy, or pearson/spearman for regression."""
    if metrics is None:
        metrics = ("pearson", "spearman") if head == "regression" else _ACC
    return TaskSpec("csv", input_type, head, tuple(label_names), tuple(metrics), num_choices,
                    tuple(eval_splits))
