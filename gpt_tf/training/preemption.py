"""Preemption: on SIGTERM, finish the current update, checkpoint it, and stop; the same command resumes.

``StopRequest`` turns SIGTERM into a flag. The training step all-reduces that flag together with
the loss (one reduction it does anyway), so every worker of a multi-worker or TPU job learns of a
signal that reached any one of them at the same update, saves that same step and stops: no
worker is left waiting in a collective, no update is lost, and since the data position is a
function of the step (``Pretrainer``), none is repeated on resume.

``tf.distribute.experimental.PreemptionCheckpointHandler`` is not used: in TF 2.21 it does nothing
on Google Cloud TPU and CPU VMs (``failure_handling.py`` returns early for ``GCE_TPU`` and
``GCE_CPU``), and it numbers checkpoints by its own call counter; the all-reduced flag covers
every strategy with one code path.
"""

from __future__ import annotations

import signal
import threading

# What a preempted run exits with: 128 + SIGTERM, the status of a process ended by SIGTERM, which
# schedulers (and TF's own GCE handler) treat as "restart me"; 0 would tell them the job is done.
PREEMPTED_EXIT_CODE = 143


class Preempted(Exception):
    """Training stopped on request after saving a checkpoint at ``step``."""

    def __init__(self, step: int, checkpoint: str):
        super().__init__(f"preempted (SIGTERM): saved step {step} to {checkpoint}; run the same command to resume")
        self.step, self.checkpoint = step, checkpoint


class StopRequest:
    """While entered, SIGTERM sets ``requested`` instead of ending the process.

    Python delivers signals to the main thread only; entered in another thread it watches nothing.
    """

    def __init__(self, signals=(signal.SIGTERM,)):
        self.signals = tuple(signals)
        self.requested = False
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        self.requested = True

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False
