"""A fine-tuning run's predictions as submission files: GLUE's layout and file names, Story Cloze's columns.

``--mode=predict`` writes ``<run_dir>/<TASK>.<split>.tsv`` (``index<TAB>prediction``), whole or not at all
(``gpt_tf/runs/files.py``'s atomic write): an older submission stays until it is replaced.
"""

from __future__ import annotations

import csv
import io
import os

from gpt_tf.runs.files import write_text_atomic
from gpt_tf.nn.task_head import task_predictions

# GLUE's submission files: name per task (and eval split) and whether labels are written as ids.
GLUE_SUBMISSIONS = {
    "cola": ("CoLA", True), "sst2": ("SST-2", True), "mrpc": ("MRPC", True), "qqp": ("QQP", True),
    "stsb": ("STS-B", False), "mnli": ("MNLI", False), "qnli": ("QNLI", False), "rte": ("RTE", False),
}


# Column names of non-GLUE submission files (Story Cloze: the official id and answer columns).
SUBMISSION_HEADER = {"story_cloze": ("InputStoryid", "AnswerRightEnding")}


def submission_key(guid: str, split: str) -> str:
    """The id a submission row carries: the file's own ``index`` for GLUE (guid ``<split>-<index>``), else the guid."""
    return guid[len(split) + 1:] if guid.startswith(split + "-") else guid


def write_submission(tuner, split: str, run_dir: str, write: bool = True) -> str:
    """Predictions for ``split`` as ``index<TAB>prediction`` (GLUE's layout and file names for GLUE tasks),
    keyed by each example's own id (GLUE's ``index`` column; Story Cloze's ``InputStoryid``, with the
    predicted ``AnswerRightEnding``).

    Every worker must call it (prediction is collective); only those with ``write`` write the file.
    """
    from gpt_tf.data.transforms import split_guids

    task = tuner.task
    outs, _ = tuner.predict(split)
    preds = task_predictions(task, outs)
    guids = split_guids(tuner.config.data_dir, split)
    if len(guids) != len(preds):
        raise ValueError(f"{tuner.config.data_dir}: {len(guids)} records in split {split!r} but {len(preds)} predictions")
    name, as_ids = GLUE_SUBMISSIONS.get(task.name, (task.name, False))
    if task.name == "mnli":
        name = "MNLI-mm" if "mismatched" in split else "MNLI-m"
    path = os.path.join(run_dir, f"{name}.{split}.tsv")
    if not write:
        return path
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t", lineterminator="\n")
    writer.writerow(SUBMISSION_HEADER.get(task.name, ("index", "prediction")))
    for guid, p in zip(guids, preds):
        key = submission_key(guid, split)
        if task.head == "regression":
            writer.writerow([key, f"{float(p):.3f}"])
        else:
            writer.writerow([key, int(p) if as_ids else task.label_names[int(p)]])
    write_text_atomic(path, text.getvalue())  # whole or not at all: an older submission stays until replaced
    return path
