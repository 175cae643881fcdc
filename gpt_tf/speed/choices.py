"""The speed choices a run makes: one value, set once per process, read by the code that traces graphs.

Every choice that changes what TensorFlow computes on a CPU (not what it means: the results are the same to float32
rounding) is a field of ``SpeedChoices``:

* ``fused_kernels``: the fused C++ kernels in training graphs (``gpt_tf/speed/kernels``), where they are built and
  load;
* ``padded_grads``: the weight shapes whose gradient runs on a zero-padded operand (``aliased_grads.py``);
* ``inference_gelu``: the GELU layers whose evaluation passes run the GELU kernel (``inference_gelu.py``);
* ``onednn``: oneDNN's graph rewrites (``TF_ENABLE_ONEDNN_OPTS``; None: TensorFlow's default for the CPU), read by
  TensorFlow when it starts, so a command line starts its process with it (``gpt_tf/restart.py``);
* ``intra_op_threads``, ``inter_op_threads``: TensorFlow's thread pools (0: its default).

Shapes are ``"<inputs>x<units> <dtype>"`` (``shape_key``), ``"*"`` every shape. The process's choices are set like
Keras's global dtype policy: ``set_current``, ``current`` and ``using`` (a block). Nothing here measures:
``gpt_tf/speed/resolve.py`` finds a run's choices (``--speed=auto``: timed once per machine and shape, cached) before
any model is built. Without a choice made, ``current()`` is ``SpeedChoices()`` with the variables set by hand.

``environment()`` is the one reading of the environment variables that override a choice by hand
(``GPT_TF_FUSED_KERNELS``, ``GPT_TF_PAD_WEIGHT_GRADS``, ``GPT_TF_INFERENCE_GELU``: 0 or 1;
``TF_ENABLE_ONEDNN_OPTS``; ``TF_NUM_INTRAOP_THREADS``, ``TF_NUM_INTEROP_THREADS``), of ``GPT_TF_AUTOTUNE=0``
(nothing measured: the defaults) and of the choices a command line hands the process it restarts. No TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import threading
from typing import Optional

from gpt_tf.speed.machine_cache import onednn_default

EVERY = "*"
# The environment variables of the choices (read by ``environment()`` alone).
AUTOTUNE = "GPT_TF_AUTOTUNE"
HANDED_OVER = "GPT_TF_SPEED_CHOICES"  # set by a command line for the process it restarts (gpt_tf/restart.py)
FUSED_KERNELS, PAD_WEIGHT_GRADS = "GPT_TF_FUSED_KERNELS", "GPT_TF_PAD_WEIGHT_GRADS"
INFERENCE_GELU = "GPT_TF_INFERENCE_GELU"
ONEDNN, INTRA_THREADS, INTER_THREADS = "TF_ENABLE_ONEDNN_OPTS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"
BY_HAND = {FUSED_KERNELS: "fused_kernels", PAD_WEIGHT_GRADS: "padded_grads", INFERENCE_GELU: "inference_gelu",
           ONEDNN: "onednn", INTRA_THREADS: "intra_op_threads", INTER_THREADS: "inter_op_threads"}
OFF = ("0", "false", "off", "no")
_SHAPE = re.compile(r"^\d+x\d+ [a-z0-9]+$")


def shape_key(nx: int, units: int, dtype: str) -> str:
    """``"256x1024 float32"``: a dense layer of ``nx`` inputs and ``units`` outputs computing in ``dtype``."""
    return f"{int(nx)}x{int(units)} {dtype}"


@dataclasses.dataclass(frozen=True)
class SpeedChoices:
    """What a run computes faster, and how (see the module doc); JSON through ``to_dict`` / ``from_dict``."""
    fused_kernels: bool = True
    padded_grads: tuple = ()
    inference_gelu: tuple = ()
    onednn: Optional[bool] = None
    intra_op_threads: int = 0
    inter_op_threads: int = 0

    def __post_init__(self):
        for name in ("padded_grads", "inference_gelu"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(s, str) and (s == EVERY or _SHAPE.match(s)) for s in value):
                raise ValueError(f"speed choices: {name} must list shapes such as \"256x1024 float32\" or \"*\", "
                                 f"got {value!r}")
            object.__setattr__(self, name, tuple(sorted(set(value))))
        for name in ("fused_kernels", "onednn"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "onednn" and value is None):
                raise ValueError(f"speed choices: {name} must be true or false{' or null' * (name == 'onednn')}, "
                                 f"got {value!r}")
        for name in ("intra_op_threads", "inter_op_threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"speed choices: {name} must be a whole number >= 0 (0: TensorFlow's default), "
                                 f"got {value!r}")

    def pads(self, nx: int, units: int, dtype: str) -> bool:
        """Whether a training graph's ``[nx, units]`` weight in ``dtype`` takes the padded weight gradient."""
        return EVERY in self.padded_grads or shape_key(nx, units, dtype) in self.padded_grads

    def gelu_kernel(self, nx: int, units: int, dtype: str) -> bool:
        """Whether an evaluation pass's ``[nx, units]`` GELU layer in ``dtype`` runs the GELU kernel."""
        return EVERY in self.inference_gelu or shape_key(nx, units, dtype) in self.inference_gelu

    def replace(self, **fields) -> "SpeedChoices":
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "padded_grads": list(self.padded_grads),
                "inference_gelu": list(self.inference_gelu)}

    @classmethod
    def from_dict(cls, fields: dict) -> "SpeedChoices":
        """The choices of a JSON object (fields left out keep their defaults); ValueError names a wrong field."""
        if not isinstance(fields, dict):
            raise ValueError(f"speed choices: a JSON object of {', '.join(cls.field_names())} expected")
        unknown = sorted(set(fields) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"speed choices: unknown field {unknown[0]!r} (known: {', '.join(cls.field_names())})")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})

    @classmethod
    def load(cls, path: str) -> "SpeedChoices":
        """The choices in the JSON file ``path`` (a run folder's ``speed_choices.json``, say); ValueError in one
        line."""
        try:
            with open(path) as f:
                return cls.from_dict(json.load(f))
        except OSError as e:
            raise ValueError(f"speed choices: cannot read {path}: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"speed choices: {path} is not JSON ({e.msg}, line {e.lineno})") from None
        except ValueError as e:
            raise ValueError(f"{e} in {path}") from None

    @staticmethod
    def field_names() -> tuple:
        return tuple(f.name for f in dataclasses.fields(SpeedChoices))

    def describe(self) -> str:
        """``oneDNN on, fused kernels on, threads intra 0/inter 0, padded weight gradients: 256x1024 float32, GELU
        kernel in evaluation: none``."""
        onednn = {None: "as TensorFlow's default", True: "on", False: "off"}[self.onednn]

        def shapes(values):
            return "every shape" if EVERY in values else ", ".join(values) or "none"

        return (f"oneDNN {onednn}, fused kernels {'on' if self.fused_kernels else 'off'}, threads intra "
                f"{self.intra_op_threads}/inter {self.inter_op_threads}, padded weight gradients: "
                f"{shapes(self.padded_grads)}, GELU kernel in evaluation: {shapes(self.inference_gelu)}")


@dataclasses.dataclass(frozen=True)
class Environment:
    """What the environment says about the choices (``environment()``)."""
    overrides: dict = dataclasses.field(default_factory=dict)  # SpeedChoices field -> value, set by hand
    spelled: dict = dataclasses.field(default_factory=dict)    # SpeedChoices field -> "VARIABLE=value" as set
    measuring: bool = True                                     # False under GPT_TF_AUTOTUNE=0
    handed_over: Optional[dict] = None                         # this restarted command's resolved choices

    def apply(self, choices: SpeedChoices) -> SpeedChoices:
        """``choices`` with the fields set by hand replaced."""
        return choices.replace(**self.overrides)


def environment(environ=None) -> Environment:
    """The one reading of the environment variables that concern the speed choices (see the module doc); an
    empty variable is unset, a thread count that is not a whole number is ignored."""
    environ = os.environ if environ is None else environ
    overrides, spelled = {}, {}
    for name, field in BY_HAND.items():
        value = environ.get(name, "").strip()
        if not value:
            continue
        if field.endswith("threads"):
            if not value.isdigit():
                continue
            overrides[field] = int(value)
        elif field in ("padded_grads", "inference_gelu"):
            overrides[field] = () if value.lower() in OFF else (EVERY,)
        else:
            overrides[field] = value.lower() not in OFF
        spelled[field] = f"{name}={value}"
    handed = json.loads(environ.get(HANDED_OVER, "").strip() or "{}")
    return Environment(overrides, spelled, measuring=environ.get(AUTOTUNE, "1").strip().lower() not in OFF,
                       handed_over=handed if handed.get("pid") == os.getpid() else None)  # not a parent's


_current: list = []  # the process's choices: [] until set, or until first read


def set_current(choices: SpeedChoices) -> None:
    """Makes ``choices`` this process's (read by every graph traced from now on)."""
    if not isinstance(choices, SpeedChoices):
        raise TypeError(f"set_current takes SpeedChoices, got {type(choices).__name__}")
    _current[:] = [choices]


def current() -> SpeedChoices:
    """This process's choices; where none were set, ``SpeedChoices()`` with the variables set by hand (read now,
    once)."""
    if not _current:
        set_current(environment().apply(SpeedChoices()))
    return _current[0]


@contextlib.contextmanager
def using(choices: SpeedChoices):
    """``choices`` for the block (the ones before restored after it)."""
    before = list(_current)
    set_current(choices)
    try:
        yield choices
    finally:
        _current[:] = before


class TracingFlag:
    """A flag that is on inside ``with flag.on():`` in this thread only: what a graph traced there reads (the
    kernels' ``portable()``, the inference GELU's ``passes()``)."""

    def __init__(self):
        self._local = threading.local()

    def __bool__(self) -> bool:
        return getattr(self._local, "on", False)

    @contextlib.contextmanager
    def on(self):
        before, self._local.on = bool(self), True
        try:
            yield
        finally:
            self._local.on = before


def apply_threads(tf, choices: SpeedChoices) -> None:
    """Sizes TensorFlow's thread pools (``tf``: the imported module) as ``choices`` say (0: its default); call right
    after the import, before any op runs (later, the pools stay as they are)."""
    for count, setter in ((choices.intra_op_threads, tf.config.threading.set_intra_op_parallelism_threads),
                          (choices.inter_op_threads, tf.config.threading.set_inter_op_parallelism_threads)):
        if count > 0:
            try:
                setter(count)
            except RuntimeError:  # the runtime started already
                pass


def onednn_in_effect(environ=None) -> bool:
    """Whether TensorFlow runs oneDNN's rewrites in this process (or will, once it starts): as the environment sets
    them, else TensorFlow's default for this CPU."""
    by_hand = environment(environ).overrides.get("onednn")
    return onednn_default() if by_hand is None else by_hand
