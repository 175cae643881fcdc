"""Files around a fine-tuning run: its run configs and submission files (checkpoints: ``gpt_tf.checkpoints``)."""

from __future__ import annotations

import csv
import dataclasses
import io
import os

from typing import Optional

from gpt_tf.config import GPTConfig
from gpt_tf.run_dir import DATA_FILE, write_json_atomic, write_text_atomic
from gpt_tf.task_model import task_predictions

# GLUE's submission files: name per task (and eval split) and whether labels are written as ids.
GLUE_SUBMISSIONS = {
    "cola": ("CoLA", True), "sst2": ("SST-2", True), "mrpc": ("MRPC", True), "qqp": ("QQP", True),
    "stsb": ("STS-B", False), "mnli": ("MNLI", False), "qnli": ("QNLI", False), "rte": ("RTE", False),
}


# Column names of non-GLUE submission files (Story Cloze: the official id and answer columns).
SUBMISSION_HEADER = {"story_cloze": ("InputStoryid", "AnswerRightEnding")}


def save_run_configs(run_dir: str, model_config: GPTConfig, config, data: Optional[dict] = None) -> None:
    """``model_config.json``, ``finetune_config.json`` (so eval/predict rebuild the same model) and
    ``data.json`` (the data's identity, ``gpt_tf.run_dir``), each written atomically."""
    for name, obj in (("model_config.json", model_config), ("finetune_config.json", config)):
        write_json_atomic(os.path.join(run_dir, name), dataclasses.asdict(obj))
    if data is not None:
        write_json_atomic(os.path.join(run_dir, DATA_FILE), data)


def submission_key(guid: str, split: str) -> str:
    """The id a submission row carries: the file's own ``index`` for GLUE (guid ``<split>-<index>``), else the guid."""
    return guid[len(split) + 1:] if guid.startswith(split + "-") else guid


def write_submission(tuner, split: str, run_dir: str, write: bool = True) -> str:
    """Predictions for ``split`` as ``index<TAB>prediction`` (GLUE's layout and file names for GLUE tasks),
    keyed by each example's own id (GLUE's ``index`` column; Story Cloze's ``InputStoryid``, with the
    predicted ``AnswerRightEnding``).

    Every worker must call it (prediction is collective); only those with ``write`` write the file.
    """
    from pipelines.transforms import split_guids

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
