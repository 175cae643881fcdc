"""What the command line tells the operator after a fault stopped a run: what the run folder still holds, and
how to go on (the words of ``python -m gpt_tf.train``'s last line; nothing here reads flags)."""

from __future__ import annotations

import errno
import json
import os
import re

from gpt_tf.runs.files import CHECKPOINTS
from gpt_tf.write_errors import WriteError


def newest_checkpoint(run_dir: str) -> str:
    """The run's newest listed checkpoint, as a phrase ("its checkpoint at step N (prefix)"), or "" when none."""
    import tensorflow as tf

    try:
        prefix = tf.train.latest_checkpoint(os.path.join(run_dir, CHECKPOINTS))
    except (tf.errors.OpError, OSError):
        prefix = None
    return f"its checkpoint at step {prefix.rsplit('-', 1)[-1]} ({prefix})" if prefix else ""


def resume_hint(fault: WriteError, run_dir: str, training: bool) -> str:
    """What the operator does after a write the storage refused (what the run still holds, and how to go on)."""
    if not training:
        return "the run folder is as it was: fix the storage and run the same command again"
    if fault.errno == errno.ENOENT:
        return "put the folder back to resume it, or run the command again to train anew"
    newest = newest_checkpoint(run_dir)
    kept = f"the run is intact up to {newest}" if newest else "the run has no checkpoint yet"
    return f"{kept}: {fault.remedy} and run the same command to resume"


def worker_lost(err, run_dir: str, workers: tuple = (), worker_index: int = 0) -> str:
    """One line for a ``multi_worker`` cluster that lost a worker (TensorFlow aborted the collectives); the cluster
    and this worker from ``workers`` and ``worker_index`` (``--workers``), else from ``TF_CONFIG``."""
    text = err.message
    if workers:
        config = {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": worker_index}}
    else:
        try:
            config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        except ValueError:
            config = {}
    cluster, own = config.get("cluster", {}), config.get("task", {})
    # The failed op may name this worker's own device (an eager collective: "{{function_node ...task:0...}}"): not lost
    this = (own.get("type"), int(own.get("index", -1)))
    tasks = sorted({(job, int(t)) for job, t in re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", text)} - {this})
    named = [f"{job} {t}" + (f" ({cluster[job][t]})" if t < len(cluster.get(job, ())) else "") for job, t in tasks]
    lost = ", ".join(named) or "a worker"
    newest = newest_checkpoint(run_dir) or "no checkpoint yet"
    return (f"the cluster lost {lost}: it stopped answering, and TensorFlow aborted this worker's collectives; training "
            f"stopped, the run holds {newest}: restart every worker with the same command to resume from it")
