"""Which Keras backend the model runs on, TensorFlow's drop-in pieces, and what stays TensorFlow's alone.

The GPT-1 family (``gpt_tf/gpt1/``: backbone, language model, tasks) and the layers, head, losses and optimizer it
is built on compute with ``keras.ops``: they run under ``KERAS_BACKEND=jax``, ``torch`` and ``tensorflow``. On
TensorFlow a few pieces of that math run by TensorFlow code of the same arithmetic that is faster on a CPU
(``tf_pieces()``: ``gpt_tf/nn/tf_pieces.py``: the fused C++ kernels, the padded weight gradients, the written-out
gradients of layer norm and the cross-entropy, ...); elsewhere Keras's own ops run. The choice is made at run
time, piece by piece, from ``keras.config.backend()``: one model, not one per backend.

TensorFlow's alone (``require_tensorflow`` raises one line naming the feature under another backend): the
command lines (``python -m gpt_tf.train`` and the other ``python -m`` entry points, which take TensorFlow for
their own process: ``tensorflow_for_command``), the training loop (``tf.distribute``), checkpoints and run
folders, the TF Serving export and the server, the zero-shot scorer. One command line keeps the backend asked for
(``asked``): pre-training under ``KERAS_BACKEND=jax`` runs Keras's ``fit`` on JAX (``gpt_tf/training/keras_fit.py``,
``keras.distribution`` over the devices). Preprocessing (the tokenizers and the
preprocessors) is ``tf.data`` and TensorFlow ops on every backend, as keras-hub's is.

The modules the family's package imports (``gpt_tf/gpt1/``, the loop, checkpoints, the task pipelines) take
TensorFlow as ``tf`` from here: imported at the first use of one of its names, so the model, its optimizer and
``fit`` on JAX or PyTorch run where TensorFlow is not installed (``tools/jax_pretrain.py --tokens``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

ENV = "KERAS_BACKEND"
TENSORFLOW = "tensorflow"


class _ImportedOnUse:
    """A module imported at the first use of one of its names (then each name is kept)."""

    def __init__(self, module: str):
        self._module = module

    def __getattr__(self, name: str):
        value = getattr(importlib.import_module(self._module), name)
        setattr(self, name, value)
        return value

    def __repr__(self) -> str:
        return f"<{self._module}, imported at first use>"


tf = _ImportedOnUse(TENSORFLOW)


class BackendError(RuntimeError):
    """A TensorFlow-only feature used under another Keras backend (the message names both)."""


def name() -> str:
    """The Keras backend in use: ``"tensorflow"``, ``"jax"``, ``"torch"``, ..."""
    import keras  # pylint: disable=import-outside-toplevel

    return keras.config.backend()


def asked() -> str:
    """The backend ``KERAS_BACKEND`` asks for ("" when unset), read before Keras is imported."""
    return os.environ.get(ENV, "").strip()


def on_tensorflow() -> bool:
    return name() == TENSORFLOW


def tf_pieces():
    """``gpt_tf.nn.tf_pieces`` (TensorFlow's faster pieces of the model's math) when Keras runs on TensorFlow,
    else None (Keras's ops compute them)."""
    if not on_tensorflow():
        return None
    from gpt_tf.nn import tf_pieces as pieces  # pylint: disable=import-outside-toplevel

    return pieces


def draws16(shape, seed_generator):
    """Uniform int32 draws in [-32768, 32768), 16 random bits each, from ``seed_generator`` (a
    ``keras.random.SeedGenerator``), off TensorFlow (whose stream is ``tf_pieces.dropout16``'s). On JAX from
    ``jax.random.bits`` at 16 bits (half a threefry word per element; ``keras.random.randint`` spends two words on
    each, for an unbiased range); elsewhere ``keras.random.randint``."""
    import keras  # pylint: disable=import-outside-toplevel

    if name() == "jax":
        import jax  # pylint: disable=import-outside-toplevel

        bits = jax.random.bits(seed_generator.next(), tuple(shape), dtype="uint16")
        return keras.ops.cast(bits, "int32") - 32768
    return keras.random.randint(shape, -32768, 32768, dtype="int32", seed=seed_generator)


def require_tensorflow(what: str) -> None:
    """Raises ``BackendError`` (one line) unless Keras runs on TensorFlow: ``what`` is TensorFlow's alone."""
    if not on_tensorflow():
        raise BackendError(f"{what} runs on TensorFlow only, and Keras runs on {name()} here (KERAS_BACKEND="
                           f"{os.environ.get(ENV, '') or 'unset'}): run it with KERAS_BACKEND=tensorflow (the "
                           "GPT-1 models, their fit, predict and generate, and their presets work on every backend)")


COMMAND_PACKAGES = ("gpt_tf", "pipelines", "serving", "tools", "bench")
CONSOLE_SCRIPTS = "gpt-tf-"  # the installed commands' names (gpt-tf-train, gpt-tf-export, ...: pyproject.toml)


def running_a_command() -> bool:
    """Whether this process was started as one of the project's command lines (``python -m gpt_tf.train``,
    ``gpt-tf-train``, ...). One that picks another backend (``tools.jax_pretrain``) imports Keras before anything
    imports TensorFlow."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return (getattr(main, "name", "").split(".")[0] in COMMAND_PACKAGES
            or os.path.basename(sys.argv[0] if sys.argv else "").startswith(CONSOLE_SCRIPTS))


def command_name() -> str:
    """This process's command line: ``gpt_tf.train`` for ``python -m gpt_tf.train``, else the program's file name."""
    name = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") or ""
    return name.removesuffix(".__main__") or os.path.basename(sys.argv[0] or "")


def configured() -> str:
    """The backend Keras will take when it is imported: ``KERAS_BACKEND``, else the ``backend`` of Keras's config file
    (``$KERAS_HOME/keras.json``, by default ``~/.keras/keras.json``), else TensorFlow."""
    if asked():
        return asked()
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            return str(json.load(f).get("backend") or TENSORFLOW).strip()
    except (OSError, ValueError, AttributeError):
        return TENSORFLOW


def tensorflow_for_command(command: str = "") -> tuple[dict, str]:
    """What this process's environment must change for its Keras to run on TensorFlow, as the command lines must
    (see the module doc; Keras reads its backend when it is imported): ``({"KERAS_BACKEND": "tensorflow"}, the one
    line to show)`` where Keras would take another backend, ``({}, "")`` where it takes TensorFlow. Raises
    ``BackendError`` when Keras was already imported with another backend."""
    command = command or command_name()
    if "keras" in sys.modules:
        if not on_tensorflow():
            raise BackendError(f"{command} runs on TensorFlow, but Keras was imported on {name()} first; run it in a "
                               "process of its own (python -m ...) or with KERAS_BACKEND=tensorflow")
        return {}, ""
    backend = configured()
    if backend == TENSORFLOW:
        return {}, ""
    source = f"{ENV}={backend}" if asked() else f"the backend {backend} of Keras's keras.json"
    return {ENV: TENSORFLOW}, (f"{command}: runs on TensorFlow (its loop, checkpoints and exports are TensorFlow's); "
                               f"{source} applies to the Python API only (and to pre-training: gpt_tf.train without "
                               "--task)")
