"""A command line's process started with what TensorFlow and Keras read from the environment when they start.

TensorFlow reads oneDNN's setting (``TF_ENABLE_ONEDNN_OPTS``) and its C++ log level (``TF_CPP_MIN_LOG_LEVEL``), and
Keras its backend (``KERAS_BACKEND``), once, from the environment the process started with. Where a command line
needs other values than its environment gives -- Keras on TensorFlow for a TensorFlow command
(``backend.tensorflow_for_command``), the oneDNN setting of the run's speed choices (``gpt_tf/speed/resolve.py``),
TensorFlow's INFO and WARNING lines off (``TF_CPP_MIN_LOG_LEVEL=2`` where it is unset, unless ``GPT_TF_VERBOSE=1``
asked for them: a quiet console, ``gpt_tf/console.py``) -- it starts again, once, at the start of its ``main``,
before it does any work (``console.start_command``: a command started again later would do its work twice): the
same interpreter, arguments, folder and process id (``os.execve``, ~0.4 s), with a copy of its environment changed
in those variables and holding its resolved choices (``GPT_TF_SPEED_CHOICES``, for this process id only: nothing is
resolved or measured twice, and the commands it starts resolve their own). It says so in one line on stderr, unless
the log level alone changed. Nothing restarts where nothing must change, a restarted process never restarts again,
and a process that is not one of the project's command lines (a user's program, a test) never restarts.
"""

from __future__ import annotations

import json
import os
import sys

from gpt_tf import backend
from gpt_tf.speed import choices

LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


def changes_for(resolution) -> tuple[dict, list]:
    """``(variables to change, lines saying why)`` for a command process to start under ``resolution``'s choices
    with Keras on TensorFlow (both empty where its environment gives them)."""
    changes, keras_line = backend.tensorflow_for_command()
    lines = [keras_line] if keras_line else []
    wanted = resolution.choices.onednn
    if wanted is not None and wanted != choices.onednn_in_effect():
        changes = {**changes, choices.ONEDNN: "1" if wanted else "0"}
        lines.append(f"{backend.command_name()}: oneDNN's rewrites {'on' if wanted else 'off'}, as the speed choices "
                     f"say ({resolution.how})")
    return changes, lines


def quiet_log(changes: dict, verbose: bool) -> dict:
    """``changes`` with ``TF_CPP_MIN_LOG_LEVEL=2`` where the environment leaves TensorFlow's INFO and WARNING lines
    on and nobody asked for them (``verbose``: ``console.verbose()``)."""
    if verbose or os.environ.get(LOG_LEVEL, "").strip():
        return changes
    return {**changes, LOG_LEVEL: "2"}


def restart_if_needed(resolution, verbose: bool) -> None:
    """In a command line's process that has not imported TensorFlow or Keras yet: starts it again under
    ``changes_for(resolution)`` and ``quiet_log`` where they change anything (never returns then); else returns."""
    if (not backend.running_a_command() or "tensorflow" in sys.modules or "keras" in sys.modules
            or choices.environment().handed_over is not None):
        return
    changes, lines = changes_for(resolution)
    if changes:
        named = " ".join(f"{k}={v}" for k, v in changes.items())
        lines.append(f"{backend.command_name()}: starting again with {named} (TensorFlow and Keras read them when "
                     "they start)")
    changes = quiet_log(changes, verbose)
    if not changes:
        return
    if lines:
        print("\n".join(lines), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    handed = json.dumps({**resolution.to_dict(), "pid": os.getpid()})  # execve keeps the pid: its children ignore it
    env = {**os.environ, **changes, choices.HANDED_OVER: handed}  # a copy for the new start
    os.execve(sys.executable, sys.orig_argv, env)
