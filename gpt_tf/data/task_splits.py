"""How the fine-tuning builder carves its output splits: hold-out by guid hash, train subsample, RACE-all.

Both rules hash the example id (``gpt_tf.data.common.hash_unit``), so they do not depend on file
order and give the same examples on every machine. See ``pipelines/finetune_data.py``'s doc.
"""

from __future__ import annotations

import collections
from typing import Optional

from gpt_tf.data.common import hash_unit
from gpt_tf.data.task_rows import Example


def split_by_hash(examples: list[Example], fraction: float, where: str) -> tuple[list, list]:
    """(train, dev) by guid hash; at least one example on each side."""
    if len(examples) < 2:
        raise ValueError(f"--holdout_fraction needs at least 2 examples in {where}, found {len(examples)}")
    guids = collections.Counter(e.guid for e in examples)
    dup = next((g for g, n in guids.items() if n > 1), None)
    if dup is not None:
        raise ValueError(f"{where}: guid {dup!r} occurs {guids[dup]} times; a hold-out by guid needs unique ids")
    chosen = {e.guid for e in examples if hash_unit(e.guid) < fraction}
    chosen = chosen or {min(guids, key=hash_unit)}
    if len(chosen) == len(examples):
        chosen.discard(max(guids, key=hash_unit))
    return [e for e in examples if e.guid not in chosen], [e for e in examples if e.guid in chosen]


def sample_by_hash(examples: list[Example], n: int) -> list[Example]:
    """The n examples with the smallest guid hash, in their original order."""
    keep = set(sorted(range(len(examples)), key=lambda i: (hash_unit(examples[i].guid), i))[:n])
    return [e for i, e in enumerate(examples) if i in keep]


def plan_outputs(task, examples: dict, holdout_fraction: float, holdout_split: Optional[str],
                 train_subsample: Optional[int] = None):
    """Output splits {name: examples} (+ hold-out and RACE-all), and the hold-out and subsample manifest entries."""
    out, holdout, subsample = dict(examples), None, None
    if holdout_fraction:
        if not 0.0 < holdout_fraction < 1.0:
            raise ValueError(f"--holdout_fraction must be in (0, 1), got {holdout_fraction}")
        source = holdout_split or ("train" if "train" in out else next(iter(out)))
        if source not in out:
            raise ValueError(f"--holdout_split {source!r} is not among the splits read {sorted(out)}")
        clash = sorted({"train", "dev"} & (set(out) - {source}))
        if clash:
            raise ValueError(f"holding out from {source!r} writes 'train' and 'dev', but split(s) {clash} "
                             "are also read; pick other --splits")
        train, dev = split_by_hash(out.pop(source), holdout_fraction, f"split {source!r}")
        out["train"], out["dev"] = train, dev
        holdout = {"source_split": source, "fraction": holdout_fraction, "train": len(train), "dev": len(dev),
                   "rule": "an example is in dev iff int(sha256(guid).hexdigest()[:15], 16) / 16**15 < fraction"}
    if train_subsample:
        if "train" not in out:
            raise ValueError(f"--train_subsample needs a 'train' split; the outputs are {sorted(out)}")
        available = len(out["train"])
        out["train"] = sample_by_hash(out["train"], train_subsample)
        subsample = {"kept": len(out["train"]), "available": available,
                     "rule": "the N examples with the smallest int(sha256(guid).hexdigest()[:15], 16)"}
    if task.name == "race":
        for base in ("train", "dev", "test"):
            parts = [f"{base}_{lv}" for lv in ("middle", "high")]
            if base not in out and all(p in out for p in parts):
                out[base] = out[parts[0]] + out[parts[1]]
    return out, holdout, subsample
