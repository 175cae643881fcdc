"""Server-side batching of concurrent requests to one signature (TF Serving's ``--enable_batching``).

A request waits in a queue; a batch thread takes the oldest request and every queued request
that can join it (same input names, dtypes and non-batch dimensions) up to ``max_batch_size``
rows. Requests that arrive while a batch runs form the next one. Unlike TF Serving, which waits
up to ``batch_timeout_micros`` for every batch to fill, the thread waits (at most that long after
the oldest request arrived) only for the rows it expects: those of the batch it just answered
(their clients are likely to send again) plus those that were queued then. A lone client never
waits, and N concurrent clients are gathered into batches of N instead of the first to come
back running alone. With a timeout of 0 nothing waits. The batch's inputs are concatenated along dimension 0, run once, and the outputs split
back. If a merged run fails (say one request holds a text the graph rejects),
each request is re-run on its own so that only the bad one gets the error. Requests of 0 rows or
of more than ``max_batch_size`` rows bypass the queue and run alone.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import grpc
import numpy as np

from serving import monitoring
from serving.errors import ServingError


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """The supported fields of TF Serving's ``BatchingParameters`` (``--batching_parameters_file``)."""

    max_batch_size: int = 32
    batch_timeout_micros: int = 0
    num_batch_threads: int = 1
    max_enqueued_batches: int = 100

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value < (0 if field.name == "batch_timeout_micros" else 1):
                raise ValueError(f"batching parameter {field.name} must be positive, got {value}")


class _Task:
    def __init__(self, inputs: dict):
        self.inputs = inputs
        self.rows = next(iter(inputs.values())).shape[0] if inputs else 0
        self.key = tuple(sorted((k, v.dtype.str, v.shape[1:]) for k, v in inputs.items()))
        self.arrived = time.monotonic()
        self.done = threading.Event()
        self.outputs, self.error = None, None


class Batcher:
    """Runs ``run(inputs: {name: array}) -> {name: array}`` on merged batches of concurrent calls."""

    def __init__(self, run, params: BatchingParameters, name: str = "batcher"):
        self._run, self.params = run, params
        self._queue: collections.deque = collections.deque()
        self._queued_rows = 0
        self._expected = 1  # rows the next batch waits for (see the module doc)
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True)
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def __call__(self, inputs: dict) -> dict:
        """Outputs of ``inputs``, run in a batch with other concurrent calls (blocks until done)."""
        task = _Task(inputs)
        if not 0 < task.rows <= self.params.max_batch_size or len({v.shape[0] for v in inputs.values()}) > 1:
            return self._run(inputs)
        with self._cond:
            if self._closed:  # a request that picked this version just before it was unloaded
                return self._run(inputs)
            if self._queued_rows + task.rows > self.params.max_enqueued_batches * self.params.max_batch_size:
                raise ServingError(grpc.StatusCode.UNAVAILABLE,
                                   "The batch scheduling queue to which this task was submitted is full")
            self._queue.append(task)
            self._queued_rows += task.rows
            self._cond.notify()
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.outputs

    def close(self) -> None:
        """Runs what is queued, then stops the batch threads; later calls run unbatched."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def _take(self, batch: list, rows: int) -> int:
        """Moves queued tasks that fit and match ``batch[0]`` into ``batch`` (lock held)."""
        for task in list(self._queue):
            if task.key == batch[0].key and rows + task.rows <= self.params.max_batch_size:
                self._queue.remove(task)
                self._queued_rows -= task.rows
                batch.append(task)
                rows += task.rows
        return rows

    def _next_batch(self) -> list:
        """Blocks for the next batch; [] when closed and drained."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return []
            first = self._queue.popleft()
            self._queued_rows -= first.rows
            batch = [first]
            rows = self._take(batch, first.rows)
            deadline = first.arrived + self.params.batch_timeout_micros / 1e6
            while rows < min(self._expected, self.params.max_batch_size) and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
                rows = self._take(batch, rows)
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if not batch:
                return
            self._execute(batch)
            with self._cond:
                self._expected = sum(t.rows for t in batch) + self._queued_rows

    def _execute(self, batch: list) -> None:
        monitoring.record_batch_size(sum(t.rows for t in batch))
        if len(batch) > 1:
            try:
                merged = {k: np.concatenate([t.inputs[k] for t in batch]) for k in batch[0].inputs}
                outputs = self._run(merged)
                total = sum(t.rows for t in batch)
                if all(np.ndim(v) > 0 and np.shape(v)[0] == total for v in outputs.values()):
                    bounds = np.cumsum([t.rows for t in batch])[:-1]
                    parts = {k: np.split(v, bounds) for k, v in outputs.items()}
                    for i, task in enumerate(batch):
                        task.outputs = {k: parts[k][i] for k in outputs}
                        task.done.set()
                    return
            except Exception:  # noqa: BLE001 -- each request is re-run alone below and gets its own error
                pass
        for task in batch:
            try:
                task.outputs = self._run(task.inputs)
            except Exception as err:  # noqa: BLE001 -- handed to the waiting request
                task.error = err
            task.done.set()
