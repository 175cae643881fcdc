"""Zero-shot heuristics of the paper's §5 ("Zero-shot Behaviors", Fig. 2 right): tasks solved by the LM alone.

    config = ZeroShotConfig(tasks=("sst2", "cola"), data_dirs=("glue/SST-2", "glue/CoLA"))
    suite = ZeroShotSuite(config, tokenizer, bos_id=separator_id)
    rows = suite.evaluate(lm, step=1000)   # one dict per task: score, chance, normalised score

Three kinds of heuristic, one code path each, all on ``gpt_tf.analysis.lm_scorer.LMScorer``:

* ``threshold`` (CoLA): the sentence's average token log-probability, ``acceptable`` iff above a
  threshold; the threshold maximises the Matthews correlation on ``train``, the score is on ``dev``.
* ``label_words`` (SST-2): append the cue word "very" to the sentence and compare the LM's
  log-probability of the label words "negative" / "positive" (a word's summed token log-probs).
* ``choice``: the candidate whose continuation has the highest average token log-probability.
  RACE: document + question → each answer. Story Cloze: the four sentences → each ending.
  DPRD (Winograd): the sentence up to the pronoun with each referent substituted → the rest of the
  sentence (the same words for both; the substitution changes their context, Trinh & Le 2018).

Splits: CoLA and SST-2 ``dev``; RACE ``dev`` (middle + high); DPRD ``test``; Story Cloze the hash
hold-out of ``val`` (``holdout_fraction``, 0.3 as ``data/tasks_books/story_cloze`` is built, so the
zero-shot and fine-tuned scores are on the same stories; 0 scores all of ``val``).

Normalisation as in Fig. 2 (right): ``(score − chance) / (reference − chance)``, where chance is
the metric of random guessing (accuracy 1/choices, Matthews 0) and ``reference`` a score the user
supplies per task. The paper used the state of the art; here it is the same model size's fine-tuned
score on the same split (``bench/experiments/study.py`` passes its full-transfer median). Without a reference
only the raw score is reported.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os

import numpy as np

from gpt_tf.metrics import METRICS
from gpt_tf.tasks import get_task
from gpt_tf.data.task_readers import read_examples
from gpt_tf.data.task_splits import sample_by_hash, split_by_hash
from gpt_tf.data.winograd import read_dpr


@dataclasses.dataclass(frozen=True)
class Heuristic:
    """How one task is solved zero-shot, and how it is scored."""

    task: str
    kind: str  # "threshold", "label_words" or "choice"
    metric: str  # a gpt_tf.metrics name
    chance: float  # the metric's value for random guessing
    eval_split: str
    fit_split: str = ""  # "threshold": the split the threshold is chosen on
    label_words: tuple[str, ...] = ()  # "label_words": one word per class, in label order
    cue: str = ""  # "label_words": appended to the text before the label word


HEURISTICS = {h.task: h for h in (
    Heuristic("cola", "threshold", "matthews", 0.0, "dev", fit_split="train"),
    Heuristic("sst2", "label_words", "accuracy", 0.5, "dev", label_words=("negative", "positive"), cue="very"),
    Heuristic("race", "choice", "accuracy", 0.25, "dev"),
    Heuristic("story_cloze", "choice", "accuracy", 0.5, "val"),
    Heuristic("dprd", "choice", "accuracy", 0.5, "test"),
)}
CSV_COLUMNS = ("step", "task", "split", "metric", "score", "chance", "reference", "normalized", "examples", "threshold")


@dataclasses.dataclass(frozen=True)
class ZeroShotConfig:
    """Which tasks (with their official-format folders) and how; ``every``: period in pre-training steps."""

    tasks: tuple[str, ...]
    data_dirs: tuple[str, ...]
    every: int = 0
    max_examples: int = 0  # per split, a fixed hash sample (0: all)
    holdout_fraction: float = 0.3  # Story Cloze: the hold-out of val that is scored
    batch_size: int = 32
    reference: dict = dataclasses.field(default_factory=dict)  # {task: reference score} for normalisation

    def problems(self) -> list[str]:
        """What is wrong with the configuration, before any data is read."""
        out = [f"unknown zero-shot task {t!r}; known: {', '.join(HEURISTICS)}" for t in self.tasks if t not in HEURISTICS]
        if len(self.tasks) != len(self.data_dirs):
            out.append(f"{len(self.tasks)} zero-shot task(s) {list(self.tasks)} but {len(self.data_dirs)} data dir(s)")
        out += [f"zero-shot data dir {d} does not exist" for d in self.data_dirs if not os.path.exists(d)]
        if not 0.0 <= self.holdout_fraction < 1.0:
            out.append(f"holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        unknown = sorted(set(self.reference) - set(self.tasks))
        if unknown:
            out.append(f"reference scores for tasks that are not evaluated: {unknown}")
        return out


def load_examples(task: str, data_dir: str, split: str, holdout_fraction: float = 0.3, max_examples: int = 0):
    """The labelled examples of ``task``'s ``split`` (Story Cloze ``val``: its hold-out part)."""
    if task == "dprd":
        examples, _ = read_dpr(data_dir, split)
    else:
        examples, _ = read_examples(get_task(task), data_dir, split)
    if task == "story_cloze" and holdout_fraction:
        _, examples = split_by_hash(examples, holdout_fraction, f"{data_dir} split {split!r}")
    if max_examples:
        examples = sample_by_hash(examples, max_examples)
    if any(e.label is None for e in examples):
        raise ValueError(f"{data_dir}: split {split!r} of {task} has unlabelled examples; zero-shot scoring needs labels")
    return examples


def requests(h: Heuristic, examples, encode) -> list[tuple[list[int], list[int]]]:
    """The (prefix, continuation) token requests of ``examples``, example-major, candidate-minor."""
    if h.kind == "threshold":
        return [([], encode(e.text_a)) for e in examples]
    if h.kind == "label_words":
        words = [encode(w) for w in h.label_words]
        return [(encode(f"{e.text_a} {h.cue}"), w) for e in examples for w in words]
    if h.task == "dprd":  # the referent substituted for the pronoun; the rest of the sentence is scored
        return [(encode(f"{e.text_a} {c}"), encode(e.text_b)) for e in examples for c in e.choices]
    out = []
    for e in examples:
        context = encode(" ".join(t for t in (e.text_a, e.text_b) if t))
        out += [(context, encode(c)) for c in e.choices]
    return out


def best_threshold(scores, labels) -> float:
    """The threshold t maximising Matthews correlation of ``score > t`` against ``labels`` (1 = positive).

    Candidates are the midpoints between consecutive distinct scores and the two ends (all / none
    positive); ties go to the lowest threshold.
    """
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(np.int64)
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels[order]
    distinct = np.flatnonzero(np.diff(s) != 0) + 1  # k such that the top k differ from the rest
    ks = np.concatenate([[0], distinct, [len(s)]])
    tp = np.concatenate([[0], np.cumsum(y)])[ks].astype(np.float64)
    fp = ks - tp
    pos, neg = float(y.sum()), float(len(y) - y.sum())
    fn, tn = pos - tp, neg - fp
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    mcc = np.where(denom > 0, (tp * tn - fp * fn) / np.where(denom > 0, denom, 1.0), 0.0)
    k = int(ks[len(mcc) - 1 - int(np.argmax(mcc[::-1]))])  # the last maximum: the most positives, lowest t
    if k == 0:
        return float(s[0])
    if k == len(s):
        return float(s[-1]) - 1.0
    return float((s[k - 1] + s[k]) / 2)


def normalised(score: float, chance: float, reference) -> float | None:
    """``(score − chance) / (reference − chance)``: 0 at chance, 1 at the reference (Fig. 2 right)."""
    if reference is None or reference == chance:
        return None
    return (score - chance) / (reference - chance)


class ZeroShotSuite:
    """Loads and tokenises the tasks once; ``evaluate(lm)`` scores them with any LM of that tokenizer.

    ``bos_id`` is put before every scored text (the pre-training corpus's document separator).
    """

    def __init__(self, config: ZeroShotConfig, tokenizer, bos_id: int | None = None):
        problems = config.problems()
        if problems:
            raise ValueError("invalid zero-shot configuration: " + "; ".join(problems))
        self.config, self.bos_id = config, bos_id
        self.data = {}
        for task, data_dir in zip(config.tasks, config.data_dirs):
            h = HEURISTICS[task]
            splits = [h.eval_split] + ([h.fit_split] if h.fit_split else [])
            self.data[task] = {}
            for split in splits:
                examples = load_examples(task, data_dir, split, config.holdout_fraction, config.max_examples)
                self.data[task][split] = (examples, requests(h, examples, tokenizer.encode))

    def evaluate(self, lm, step: int | None = None) -> list[dict]:
        """One row per task (see ``CSV_COLUMNS``) for the LM's current weights."""
        from gpt_tf.analysis.lm_scorer import LMScorer  # TensorFlow: imported only when scoring

        scorer = LMScorer(lm, bos_id=self.bos_id, batch_size=self.config.batch_size)
        return [self._evaluate_task(HEURISTICS[task], scorer, step) for task in self.config.tasks]

    def record(self, rows: list[dict], writer, step: int, csv_path: str) -> None:
        """``evaluate``'s rows to TensorBoard (``writer``) and appended to the CSV at ``csv_path``."""
        write_summaries(writer, rows, step)
        append_csv(csv_path, rows)

    def _evaluate_task(self, h: Heuristic, scorer, step) -> dict:
        examples, reqs = self.data[h.task][h.eval_split]
        labels = np.array([e.label for e in examples], np.int64)
        threshold = None
        if h.kind == "threshold":
            fit_examples, fit_reqs = self.data[h.task][h.fit_split]
            threshold = best_threshold(scorer.mean_logprobs(fit_reqs), [e.label for e in fit_examples])
            predictions = (scorer.mean_logprobs(reqs) > threshold).astype(np.int64)
        else:
            sums, counts = scorer.score(reqs)
            values = sums if h.kind == "label_words" else sums / counts  # log P(word) vs average log-prob
            predictions = values.reshape(len(examples), -1).argmax(axis=1)
        score = METRICS[h.metric](labels, predictions)
        reference = self.config.reference.get(h.task)
        held_out = h.task == "story_cloze" and self.config.holdout_fraction  # fine-tuning's name for that part
        return {"step": step, "task": h.task, "split": "dev" if held_out else h.eval_split, "metric": h.metric,
                "score": score,
                "chance": h.chance, "reference": reference, "normalized": normalised(score, h.chance, reference),
                "examples": len(examples), "threshold": threshold}


def append_csv(path: str, rows: list[dict]) -> None:
    """Appends ``rows`` to a CSV with ``CSV_COLUMNS`` (the header is written when the file is new). The file is
    rewritten whole and renamed into place (``write_text_atomic``): a full disk never leaves a torn last row."""
    from gpt_tf.runs.files import write_text_atomic

    old = ""
    if os.path.isfile(path):
        with open(path, encoding="utf-8", newline="") as f:
            old = f.read()
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    if not old:
        writer.writeheader()
    writer.writerows({k: ("" if row.get(k) is None else row[k]) for k in CSV_COLUMNS} for row in rows)
    write_text_atomic(path, old + out.getvalue())


def write_summaries(writer, rows: list[dict], step: int) -> None:
    """TensorBoard scalars ``zero_shot/<task>`` (raw) and ``zero_shot_normalized/<task>``."""
    import tensorflow as tf

    with writer.as_default(step=step):
        for row in rows:
            tf.summary.scalar(f"zero_shot/{row['task']}", row["score"])
            if row["normalized"] is not None:
                tf.summary.scalar(f"zero_shot_normalized/{row['task']}", row["normalized"])
