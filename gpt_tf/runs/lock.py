"""Who writes a run folder: one trainer at a time (``lock_run_dir``), and of a cluster, the chief (``chief_task``).

``lock_run_dir`` takes an advisory lock (``flock``) on ``.lock`` in the run folder for the life of the process: a
second trainer on the same folder stops with a clear message instead of both writing checkpoints (and one
resuming from the other's). The kernel drops the lock when the process ends, however it ends (``kill -9``
included), so a stale lock cannot stop the next run. No TensorFlow: both run before it starts.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket

LOCK_FILE = ".lock"


class RunDirLocked(RuntimeError):
    """Another process holds the run folder's lock; the message names the folder and the holder."""


def chief_task(workers: list, worker_index: int, environ=os.environ) -> bool:
    """Whether this process is the chief worker (from ``--workers`` / ``--worker_index`` or TF_CONFIG; no
    TensorFlow needed): the one that locks and writes the run folder."""
    if workers:
        return worker_index == 0
    try:
        cluster = json.loads(environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return True  # TensorFlow reports a bad TF_CONFIG itself
    task = cluster.get("task", {})
    kind, index = task.get("type"), int(task.get("index", 0))
    return kind in (None, "chief") or (kind == "worker" and index == 0 and "chief" not in cluster.get("cluster", {}))


def lock_run_dir(run_dir: str):
    """Takes ``run_dir``'s lock (exclusive, non-blocking) and returns its open file: keep it for the run.

    RunDirLocked when another process holds it. The file says who holds it (pid, host, since when).
    """
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that is still running"
        handle.close()
        raise RunDirLocked(f"{run_dir} is in use by another trainer ({holder}; lock file {path}): two trainers "
                           "on one run folder would overwrite each other's checkpoints. Wait for it to end, or give "
                           "another --run_dir") from None
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n")
    handle.flush()
    return handle
