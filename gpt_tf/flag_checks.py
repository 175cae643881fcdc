"""Flag values checked before anything runs: one table of rules, one line per problem, exit status 2.

``gpt_tf.train`` parses its flags with ``lenient_parser`` (absl stops at the first bad enum value
or unknown flag; this parser collects every one) and calls ``problems(FLAGS)`` right after,
before TensorFlow is imported and before anything is written. ``NUMERIC`` has a rule for every
integer and float flag of the CLI (``tests/test_flags.py`` checks that none is missing, so a new
flag gets its rule here); enum flags are checked by absl against their ``DEFINE_enum`` values;
``CHOICES`` lists the string flags whose value must be a known name. ``MODE_ONLY`` names the flags
that apply to one kind of run only (pre-training or fine-tuning, ``--task``): ``mode_problems``
rejects one given for the other kind, so that no flag is silently ignored.

No TensorFlow here: only the registries of names (``gpt_tf.config``, ``gpt_tf.tasks``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable, Optional

from absl import flags

from gpt_tf.convert import preset_io

EXIT_STATUS = 2


@dataclasses.dataclass(frozen=True)
class Rule:
    """A numeric flag's valid values: ``[lo, hi]`` (or ``[lo, hi)`` with ``hi_open``), or ``sentinel``."""

    lo: Optional[float] = None
    hi: Optional[float] = None
    hi_open: bool = False
    sentinel: Optional[float] = None  # a special value outside the range (e.g. -1: keep the model size's)

    def check(self, value) -> Optional[str]:
        """Why ``value`` is invalid, or None."""
        if value is None or (self.sentinel is not None and value == self.sentinel):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        too_low = self.lo is not None and value < self.lo
        too_high = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if not (too_low or too_high):
            return None
        return "must be " + self.describe()

    def describe(self) -> str:
        if self.hi is None:
            text = {0: ">= 0", 1: "positive"}.get(self.lo, f">= {self.lo:g}")
        else:
            text = f"in [{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        return text if self.sentinel is None else f"{self.sentinel:g} or {text}"


POSITIVE, NON_NEGATIVE = Rule(lo=1), Rule(lo=0)
PROBABILITY = Rule(lo=0, hi=1, hi_open=True)

NUMERIC = {
    # model
    "n_ctx": Rule(lo=2, sentinel=0), "dropout": Rule(lo=0, hi=1, hi_open=True, sentinel=-1),
    "attn_pdrop": Rule(lo=0, hi=1, hi_open=True, sentinel=-1), "pad_vocab_to": NON_NEGATIVE,
    # optimisation
    "batch_size": POSITIVE, "grad_accum_steps": POSITIVE, "train_steps": POSITIVE,
    "learning_rate": Rule(lo=0, hi=10.0), "warmup_steps": NON_NEGATIVE, "weight_decay": Rule(lo=0, hi=1),
    "clip_norm": NON_NEGATIVE, "seed": Rule(lo=0, hi=2**32 - 1),
    "train_budget_minutes": NON_NEGATIVE, "min_train_steps": NON_NEGATIVE,
    # fine-tuning
    "epochs": POSITIVE, "buckets_per_octave": POSITIVE, "lm_coef": NON_NEGATIVE, "clf_pdrop": PROBABILITY, "warmup_fraction": Rule(lo=0, hi=1),
    "transfer_layers": Rule(lo=-1),
    # devices
    "num_cpu_devices": POSITIVE, "worker_index": NON_NEGATIVE,
    "model_parallel": POSITIVE, "num_processes": POSITIVE, "process_id": NON_NEGATIVE,
    # periods and sizes of logs, checkpoints, evaluation, samples
    "log_every": POSITIVE, "checkpoint_every": POSITIVE, "keep_checkpoints": POSITIVE, "eval_every": NON_NEGATIVE,
    "eval_batches": NON_NEGATIVE, "sample_every": NON_NEGATIVE, "sample_length": POSITIVE,
    "temperature": NON_NEGATIVE, "top_k": NON_NEGATIVE,
    "zero_shot_every": NON_NEGATIVE, "zero_shot_max_examples": NON_NEGATIVE,
}


def _known_models() -> tuple:
    from gpt_tf.config import SIZES

    return tuple(SIZES)


def _known_tasks() -> tuple:
    from gpt_tf.tasks import TASKS

    return tuple(TASKS)


# String flags whose value must be one of a registry's names ("" = not given, always fine).
CHOICES: dict[str, Callable[[], tuple]] = {"model": _known_models, "task": _known_tasks}


def problems(flag_values: flags.FlagValues, numeric: dict = NUMERIC, choices: dict = CHOICES) -> list[str]:
    """One line per flag whose value breaks its rule (flags the CLI does not define are skipped)."""
    out = []
    for name, rule in numeric.items():
        if name in flag_values:
            why = rule.check(flag_values[name].value)
            if why:
                out.append(f"--{name}={flag_values[name].value} {why}")
    for name, known in choices.items():
        value = flag_values[name].value if name in flag_values else ""
        if value and value not in known():
            out.append(f"--{name}={value} is not one of {', '.join(known())}")
    return out


# Flags that apply to one kind of run only: given (on the command line or in a flagfile) for the
# other kind they are an error, not silently ignored.
MODE_ONLY = {
    "pre-training": ("warmup_steps", "train_budget_minutes", "min_train_steps", "keep_checkpoints", "eval_every", "eval_batches", "sample_every", "sample_prompt",
                     "sample_length", "zero_shot_tasks", "zero_shot_data_dirs", "zero_shot_every",
                     "zero_shot_max_examples", "zero_shot_reference_json"),
    "fine-tuning": ("transfer_layers", "epochs", "lm_coef", "clf_pdrop", "warmup_fraction",
                    "aux_data_dirs", "task_mixture", "length_buckets", "buckets_per_octave", "predict_split"),
}


def mode_problems(flag_values: flags.FlagValues) -> list[str]:
    """One line per given flag that does not apply to this kind of run (``--task``: fine-tuning), and
    ``--init_checkpoint``'s problems (it applies to both: the weights either kind starts from)."""
    finetuning = bool(flag_values.task)
    other = "pre-training" if finetuning else "fine-tuning"
    out = [f"--{name} applies to {other} only ({'drop --task' if finetuning else 'add --task'} or drop the flag)"
           for name in MODE_ONLY[other] if name in flag_values and flag_values[name].present]
    if flag_values.init_checkpoint and flag_values["model"].present:
        out.append("--model: with --init_checkpoint the model is the pre-trained one (drop --model)")
    if flag_values.init_checkpoint:
        try:
            preset_io.locate(flag_values.init_checkpoint)  # a folder, a checkpoint prefix or a shipped preset's name
        except ValueError as err:
            out.append(f"--init_checkpoint={err}")
    generating = [f"--{name}" for name in ("prompt", "temperature", "top_k", "weights")
                  if name in flag_values and flag_values[name].present]
    if generating and flag_values.mode != "generate":
        out.append(f"{', '.join(generating)} only apply to --mode=generate")
    if finetuning and flag_values.lr_decay != "linear":
        out.append(f"--lr_decay={flag_values.lr_decay}: fine-tuning decays linearly (the paper's recipe); "
                   "give --lr_decay=linear or drop the flag")
    return out


# The flags of one pre-training route only: TensorFlow's loop (tf.distribute, its timing, its periodic callbacks,
# continued pre-training from its checkpoints) or Keras's fit on JAX (keras.distribution). Given with a value other
# than the default for the other route (a flagfile's value set back to the default is fine), they are one error.
TF_LOOP_ONLY = ("strategy", "num_cpu_devices", "tpu", "tpu_zone", "gcp_project", "workers", "worker_index",
                "grad_accum_steps", "deterministic", "train_budget_minutes", "min_train_steps", "keep_checkpoints",
                "eval_every", "sample_every", "sample_prompt", "sample_length", "zero_shot_tasks",
                "zero_shot_data_dirs", "zero_shot_every", "zero_shot_max_examples", "zero_shot_reference_json",
                "init_checkpoint", "speed")
KERAS_FIT_ONLY = ("distribution", "model_parallel", "coordinator_address", "num_processes", "process_id")


def route_problems(fv: flags.FlagValues, keras_fit: bool) -> list[str]:
    """One line naming the given flags the run's route does not have (``keras_fit``: pre-training by Keras's fit
    under ``KERAS_BACKEND=jax``; else TensorFlow's loop)."""
    names = TF_LOOP_ONLY if keras_fit else KERAS_FIT_ONLY
    given = [f"--{name}={fv[name].value}" for name in names if name in fv and fv[name].value != fv[name].default]
    if keras_fit and fv["precision"].value == "auto":  # it times TensorFlow's kernels
        given.append("--precision=auto")
    if not given:
        return []
    if keras_fit:
        return [f"{', '.join(given)}: TensorFlow's training loop only; under KERAS_BACKEND=jax pre-training runs "
                "Keras's fit (gpt_tf/training/keras_fit.py): give them their defaults (--flagfile=configs/"
                "keras_fit.flags after the recipe's does) and --precision=float32 or mixed_bfloat16"]
    return [f"{', '.join(given)}: pre-training under KERAS_BACKEND=jax only (keras.distribution); this command "
            "runs TensorFlow's loop"]


def strategy_problems(fv: flags.FlagValues, environ=os.environ) -> list[str]:
    """--strategy and the flags that describe its devices or cluster (pre-training and fine-tuning)."""
    problems = []
    if fv.num_cpu_devices > 1 and fv.strategy != "mirrored":
        problems.append("--num_cpu_devices > 1 only makes sense with --strategy=mirrored")
    if fv.strategy == "tpu" and not fv.tpu:
        problems.append("--strategy=tpu needs --tpu (a TPU name, or `local` on a TPU VM)")
    if fv.workers and fv.strategy != "multi_worker":
        problems.append("--workers only makes sense with --strategy=multi_worker")
    if fv.workers and "TF_CONFIG" in environ:
        problems.append("--workers and the TF_CONFIG environment variable both describe the cluster; give one")
    if fv.workers and not 0 <= fv.worker_index < len(fv.workers):
        problems.append(f"--worker_index={fv.worker_index} is not an index of --workers ({len(fv.workers)} given)")
    if fv.strategy == "multi_worker" and not fv.workers and "TF_CONFIG" not in environ:
        problems.append("--strategy=multi_worker needs the cluster: --workers=host:port,... --worker_index=i, or TF_CONFIG")
    if fv.jit_compile and (fv.strategy in ("mirrored", "multi_worker") or fv.num_cpu_devices > 1):
        problems.append(f"--jit_compile compiles the model's whole train_step, the update's collectives with it, which "
                        f"tf.distribute cannot run inside XLA: give it with one replica (not --strategy={fv.strategy}); "
                        "TPUs compile anyway")
    return problems


def finetune_problems(fv: flags.FlagValues) -> list[str]:
    """Missing values and contradictions of a fine-tuning command (``--task``), before anything runs."""
    problems = []
    if fv.mode == "generate":
        problems.append("--mode=generate is for language models, not with --task")
    if fv.transfer_layers >= 0 and not fv.init_checkpoint:
        problems.append("--transfer_layers needs --init_checkpoint (without it nothing is transferred)")
    if fv.mode in ("eval", "predict") and fv.run_dir and not os.path.isdir(os.path.join(fv.run_dir, "checkpoints")):
        problems.append(f"--mode={fv.mode} needs a fine-tuned run: no checkpoints in --run_dir={fv.run_dir}")
    for path in fv.aux_data_dirs:
        if not os.path.isfile(os.path.join(path, "manifest.json")):
            problems.append(f"--aux_data_dirs: {path} has no manifest.json; build it with `python -m pipelines.finetune_data`")
    if fv.task_mixture:
        try:
            weights = [float(w) for w in fv.task_mixture]
        except ValueError:
            weights = []
        if len(weights) != 1 + len(fv.aux_data_dirs) or min(weights) < 0 or not sum(weights) > 0:
            problems.append(f"--task_mixture={','.join(fv.task_mixture)} needs {1 + len(fv.aux_data_dirs)} "
                            "non-negative numbers with a positive sum (--data_dir first, then --aux_data_dirs)")
    return problems


def fail(prog: str, found: list[str], what: str = "invalid flags") -> None:
    """Prints the problems, one per line, and exits with status 2 (a usage error)."""
    print(f"{prog}: {what}:\n  " + "\n  ".join(found), file=sys.stderr, flush=True)
    sys.exit(EXIT_STATUS)


def _offending_arg(argv: list[str], name: str) -> Optional[int]:
    """Index of the command-line argument that set flag ``name`` (None: it came from a flagfile)."""
    for i, arg in enumerate(argv[1:], start=1):
        key = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("-") and key in (name, f"no{name}"):
            return i
    return None


def lenient_parser(prog: str, flag_values: flags.FlagValues = flags.FLAGS):
    """An absl ``flags_parser`` that reports every bad flag of the command line at once (status 2).

    absl raises at the first enum value not in its list or unknown flag; each is recorded and its
    argument dropped, and parsing goes on (up to one round per argument). A bad value inside a
    flagfile stops the rounds (the flagfile cannot be dropped without losing its other flags).
    """

    def parse(argv: list[str]) -> list[str]:
        argv, found = list(argv), []
        for _ in range(len(argv)):
            try:
                rest = flag_values(argv)
                break
            except flags.Error as err:
                flag_values.unparse_flags()
                found.append(str(err).replace("\n", " "))
                name = getattr(err, "flagname", None) or _flag_in_message(str(err))
                index = _offending_arg(argv, name) if name else None
                if index is None:
                    fail(prog, found)
                del argv[index]
        else:
            fail(prog, found)
        if found:
            fail(prog, found + problems(flag_values))
        return rest

    return parse


def _flag_in_message(message: str) -> Optional[str]:
    """The flag name in absl's error text: "flag --name=...: ..." or "Unknown command line flag 'name'"."""
    for start, end in (("flag --", "="), ("flag '", "'")):
        if start in message:
            return message.split(start, 1)[1].split(end, 1)[0]
    return None
