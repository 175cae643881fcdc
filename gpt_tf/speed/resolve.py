"""A run's speed choices, found once, before any model is built (``--speed=auto|default|<file>``).

* ``for_command(spec)``, before TensorFlow starts: ``auto`` takes this machine's CPU settings (oneDNN's rewrites, the
  fused kernels, the thread pools: ``autotune.py``, timed once per machine and cached); ``default`` the defaults
  (``SpeedChoices()``: the fused kernels where they load, nothing padded, the stock GELU, TensorFlow's own oneDNN
  setting); a path, the choices in that JSON file (a run folder's ``speed_choices.json``, say). The variables set by
  hand override any of them (``choices.environment``); ``GPT_TF_AUTOTUNE=0`` makes ``auto`` measure nothing and
  take the defaults. Serving takes ``autotune.serving_choices()``.
* ``for_model(resolution, config, dtype)``, after TensorFlow started and the precision is known: with ``auto``, the
  per-shape fields for the model's shapes (the padded weight gradients, ``aliased_grads.decide``; the GELU kernel of
  evaluation passes, ``inference_gelu.decide``), each read from its cache file or timed now (tens of milliseconds
  per shape) and cached.
* ``line(resolution)``: the one line a command prints.
* ``autotune(config, dtype)``: the same for the Python API, as ``SpeedChoices``
  (``choices.set_current(resolve.autotune(config, "float32"))``). oneDNN's setting and the thread pools act only
  where TensorFlow has not started yet (a command line starts its process under them: ``gpt_tf/restart.py``).
"""

from __future__ import annotations

import dataclasses
import os

from gpt_tf.speed import autotune as settings
from gpt_tf.speed import choices
from gpt_tf.speed.choices import SpeedChoices, shape_key

SPECS = ("auto", "default")


@dataclasses.dataclass(frozen=True)
class Resolution:
    """A run's choices, where they come from, whether the per-shape fields are still to be timed, and the fields
    set by hand (``{field: "VARIABLE=value"}``)."""
    choices: SpeedChoices
    how: str
    measuring: bool = False
    by_hand: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"choices": self.choices.to_dict(), "how": self.how, "measuring": self.measuring,
                "by_hand": dict(self.by_hand)}

    @classmethod
    def from_dict(cls, fields: dict) -> "Resolution":
        return cls(SpeedChoices.from_dict(fields["choices"]), fields["how"], bool(fields["measuring"]),
                   dict(fields["by_hand"]))


def spec_problem(spec: str) -> str:
    """Why ``--speed=spec`` cannot be used ("" when it can): neither a keyword nor a readable choices file."""
    if spec in SPECS:
        return ""
    if not os.path.isfile(spec):
        return f"--speed={spec}: neither auto, default nor a JSON file of speed choices"
    try:
        SpeedChoices.load(spec)
    except ValueError as e:
        return f"--speed={spec}: {e}"
    return ""


def for_command(spec: str = "auto", serving: bool = False) -> Resolution:
    """The choices a command starts TensorFlow under (see the module doc); those its parent resolved where it was
    restarted (``gpt_tf/restart.py``). ValueError (one line) for a file that does not hold choices."""
    env = choices.environment()
    if env.handed_over is not None:
        return Resolution.from_dict(env.handed_over)
    measuring = False
    if serving:
        base, how = settings.serving_choices(), "the serving default"
    elif spec == "default":
        base, how = SpeedChoices(), "--speed=default"
    elif spec == "auto" and not env.measuring:
        base, how = SpeedChoices(), "auto, nothing measured: GPT_TF_AUTOTUNE=0"
    elif spec == "auto":
        base, how = settings.process_choices()
        how, measuring = f"auto: {how}", True
    else:
        base, how = SpeedChoices.load(spec), f"--speed={spec}"
    return Resolution(env.apply(base), how, measuring, dict(env.spelled))


def for_model(resolution: Resolution, config, dtype: str) -> Resolution:
    """``resolution`` with the per-shape fields of ``config``'s model computing in ``dtype`` (``float32`` or
    ``bfloat16``) decided, where it is ``auto`` and they are not set by hand; as it is otherwise. TensorFlow runs."""
    if not resolution.measuring:
        return resolution
    from gpt_tf.speed import aliased_grads, inference_gelu

    fields = {}
    with choices.using(resolution.choices):  # timed as the run will compute (the kernels as chosen)
        if "padded_grads" not in resolution.by_hand:
            fields["padded_grads"] = tuple(shape_key(nx, units, dtype)
                                           for nx, units in aliased_grads.dense_shapes(config)
                                           if aliased_grads.decide(nx, units, dtype))
        if "inference_gelu" not in resolution.by_hand:
            onednn = choices.onednn_in_effect()
            fields["inference_gelu"] = tuple(shape_key(nx, units, dtype)
                                             for nx, units in inference_gelu.gelu_shapes(config)
                                             if inference_gelu.decide(nx, units, dtype, onednn))
    how = f"{resolution.how}; per shape: {os.path.dirname(aliased_grads.cache_path())}"
    return Resolution(resolution.choices.replace(**fields), how, False, resolution.by_hand)


def line(resolution: Resolution, kernels: str = "") -> str:
    """``speed choices (<how>): <the choices>[; set by hand: ...][; <kernels>]``: what a command prints, once."""
    hand = f"; set by hand: {', '.join(resolution.by_hand.values())}" if resolution.by_hand else ""
    kernels = f"; {kernels}" if kernels else ""
    return f"speed choices ({resolution.how}): {resolution.choices.describe()}{hand}{kernels}"


def autotune(config, dtype: str = "float32") -> SpeedChoices:
    """This machine's fastest choices for ``config``'s model computing in ``dtype``, as ``--speed=auto`` finds them
    (cached per machine and shape; timed where not cached yet). Set them with ``choices.set_current``."""
    return for_model(for_command("auto"), config, dtype).choices
