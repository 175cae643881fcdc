"""What the command lines show on a console: TensorFlow's start-up kept quiet, progress that reads in a log.

* ``start_command()`` is the first thing a command line's ``main`` does after checking its flags: it finds the speed
  choices the command runs under (oneDNN's rewrites, fused kernels, thread pools: ``gpt_tf/speed/resolve.py``; by
  default ``auto``, this machine's settings measured once and cached, and for serving, ``serving=True``, the serving
  default) and, where the process's environment says otherwise for what TensorFlow or Keras read when they start
  (Keras on TensorFlow, oneDNN's setting, the log level), starts the command again under the right values, before
  any work is done (``gpt_tf/restart.py``, one line saying so).
* ``import_tensorflow()`` is the process's first TensorFlow import. In a command line's process it starts TensorFlow
  under those choices (a command without ``start_command``: resolved here, never started again), prints their one
  line (unless the caller passes its own, to print it once it decided the per-shape ones) and makes them the
  process's (``gpt_tf.speed.choices.set_current``). TensorFlow's C++ start-up lines (the oneDNN notice, the CUDA
  probe and its ``failed call to cuInit`` error on a machine without a GPU, the CPU-instructions notice) are written
  to file descriptor 2 before ``TF_CPP_MIN_LOG_LEVEL`` applies ("before absl::InitializeLog() is called"). They are
  captured while TensorFlow imports and probes its devices, and shown only if that fails; ``GPT_TF_VERBOSE=1`` in
  the environment keeps them. TensorFlow's later INFO and WARNING lines (XLA's notices under ``--jit_compile``, a GPU's)
  stay off by ``TF_CPP_MIN_LOG_LEVEL=2``, which a command starts with where it is unset (``gpt_tf/restart.py``; the
  project's modules never write the process's environment).
* ``progress()`` is a tqdm bar on a terminal. Where stderr is not a terminal (a file, a pipe, CI), a
  bar would be one long line of carriage returns; there it prints plain lines instead, with the bar's
  postfix (loss, perplexity, ...): one every ``every`` units (training steps), or, without ``every``,
  one every ``seconds`` and one at the end (data pipelines).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
import time

VERBOSE_ENV = "GPT_TF_VERBOSE"


def verbose() -> bool:
    """Whether the user asked for TensorFlow's own log lines (``GPT_TF_VERBOSE=1``)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


_STARTED: list = []  # the speed choices start_command found for this command's process


def start_command(speed=None, serving: bool = False):
    """At the start of a command line's ``main``, before it does any work: the speed choices it will run under
    (``speed``, a ``resolve.Resolution``; None: ``auto``, or serving's with ``serving``), its process started again
    first where TensorFlow or Keras must start otherwise than its environment says (``gpt_tf/restart.py``: only here,
    so no work is ever done twice). Returns the choices; ``import_tensorflow`` starts TensorFlow under them. Nothing
    happens in a process that is not one of the project's command lines."""
    from gpt_tf import backend, restart
    from gpt_tf.speed import resolve

    if not backend.running_a_command():
        return speed
    resolution = speed or resolve.for_command("auto", serving=serving)
    restart.restart_if_needed(resolution, verbose())
    _STARTED[:] = [(resolution, speed is None)]
    return resolution


def import_tensorflow(speed=None, serving: bool = False):
    """``import tensorflow`` under the run's speed choices (``speed``; else those ``start_command`` found; else
    ``auto``, or serving's with ``serving``) in a command line's process, with its start-up lines off the console (see
    the module doc); returns it. The choices' line is printed here unless the caller passed them."""
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        return tf
    from gpt_tf import backend

    if speed is None and not _STARTED and not backend.running_a_command():  # a user's program, a test
        return _quiet_import()
    from gpt_tf.speed import choices, resolve

    started, say = _STARTED[0] if _STARTED else (None, True)
    resolution = speed or started or resolve.for_command("auto", serving=serving)
    onednn = choices.onednn_in_effect()
    if resolution.choices.onednn not in (None, onednn):  # not started again under it (no start_command)
        resolution = dataclasses.replace(resolution, choices=resolution.choices.replace(onednn=onednn),
                                         how=f"{resolution.how}; oneDNN as this process started")
    tf = _quiet_import()
    choices.apply_threads(tf, resolution.choices)
    choices.set_current(resolution.choices)
    if speed is None and say:
        print(resolve.line(resolution), file=sys.stderr, flush=True)
    return tf


def _quiet_import():
    if verbose():
        import tensorflow as tf

        return tf
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # the CUDA probe (cuInit) happens here, still captured
        except BaseException:
            _restore_fd2(saved)
            captured.seek(0)
            sys.stderr.write(captured.read().decode("utf-8", "replace"))  # the lines that explain the failure
            sys.stderr.flush()
            raise
        _restore_fd2(saved)
    return tf


def _restore_fd2(saved: int) -> None:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def progress(iterable=None, *, total=None, initial=0, desc="", unit="it", disable=False, every=None):
    """A progress bar: tqdm on a terminal, else ``PlainProgress`` (plain lines, see the module doc)."""
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if disable or sys.stderr.isatty():
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, initial=initial, desc=desc, unit=unit, disable=disable,
                    dynamic_ncols=True)
    return PlainProgress(iterable, total=total, initial=initial, desc=desc, unit=unit, every=every)


def line_every(total: int, multiple_of: int = 1, lines: int = 20) -> int:
    """A period for about ``lines`` progress lines over ``total`` steps, a multiple of ``multiple_of``."""
    multiple_of = max(1, multiple_of)
    return multiple_of * max(1, math.ceil(total / max(1, lines) / multiple_of))


class PlainProgress:
    """The part of tqdm's interface the project uses, as plain lines on stderr.

    A line when the count passes a multiple of ``every``, or (``every`` None) when ``seconds`` have
    passed since the last line; and one at ``close()`` if the count moved since the last line.
    ``write()`` prints a message on stdout, as tqdm's does.
    """

    def __init__(self, iterable=None, *, total=None, initial=0, desc="", unit="it", every=None, seconds=15.0,
                 file=None):
        self.iterable, self.total, self.n, self.desc, self.unit = iterable, total, initial, desc, unit
        self.every, self.seconds = every, seconds
        self.file = file if file is not None else sys.stderr
        self.postfix, self.closed = "", False
        self._start, self._start_n, self._shown = time.monotonic(), initial, initial
        self._shown_at = self._start

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def update(self, n: int = 1) -> None:
        before, self.n = self.n, self.n + n
        if self.every:
            due = self.n // self.every > before // self.every
        else:
            due = time.monotonic() - self._shown_at >= self.seconds
        if due:
            self._line()

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def write(self, message: str) -> None:
        print(message, flush=True)

    def close(self) -> None:
        if not self.closed and self.n != self._shown:
            self._line()
        self.closed = True

    def _line(self) -> None:
        elapsed = time.monotonic() - self._start
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}{of} {self.unit}{pct}, {elapsed:.0f} s, {rate:.3g} {self.unit}/s{extra}",
              file=self.file, flush=True)
        self._shown, self._shown_at = self.n, time.monotonic()


def format_metrics(results: dict) -> str:
    """``{split: {metric: value, "examples": n}}`` as ``dev accuracy 0.5092 (872 examples)``, splits joined by ``; ``."""
    parts = []
    for split, metrics in results.items():
        if not isinstance(metrics, dict):  # e.g. "step"
            continue
        values = ", ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name != "examples")
        count = f" ({metrics['examples']:,} examples)" if "examples" in metrics else ""
        parts.append(f"{split} {values}{count}")
    return "; ".join(parts)
