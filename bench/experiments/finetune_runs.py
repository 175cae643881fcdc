"""What every fine-tuning table shares: one run's command, running it timed, a resumable ledger, medians.

``reproduction.py`` (pre-trained vs scratch) and ``study.py`` (the §5 analysis) build their runs with
``finetune_spec`` and run them with ``run_one``; each finished run is one JSON line of a ledger, so an
interrupted table resumes where it stopped; ``ledger_run`` finds a run another ledger already holds.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import ROOT

# Context per task, from the token lengths in the task manifests (max view lengths: SST-2 73,
# CoLA 52, STS-B 142, MRPC 135, RTE 370, Story Cloze 94); longer views are truncated by the
# documented rule of gpt_tf/data/transforms.py.
N_CTX = {"sst2": 64, "cola": 64, "stsb": 96, "mrpc": 128, "rte": 128, "story_cloze": 96}


def finetune_spec(task: str, arm: str, seed: int, *, runs_root, tasks_dir, precision: str,
                  init_checkpoint: str = "", model: str = "", extra=(), recipe: str = "") -> dict:
    """One ``python -m gpt_tf.train --task`` run: the recipe of ``configs/finetune_<task><recipe>.flags``
    (``recipe=""``: the paper's; ``"_tiny"``: the small-model recipe chosen by ``bench/experiments/reproduction.py``).

    ``init_checkpoint`` (a pre-training run) or ``model`` (a preset, from scratch); ``extra``: more flags.
    """
    run_dir = Path(runs_root) / f"{task}_{arm}_s{seed}"
    cmd = [sys.executable, "-m", "gpt_tf.train", f"--flagfile=configs/finetune_{task}{recipe}.flags",
           f"--data_dir={Path(tasks_dir) / task}", f"--run_dir={run_dir}", f"--n_ctx={N_CTX[task]}",
           f"--precision={precision}", f"--seed={seed}", "--progress=false", "--json"]
    cmd.append(f"--init_checkpoint={init_checkpoint}" if init_checkpoint else f"--model={model}")
    return {"task": task, "arm": arm, "seed": seed, "run_dir": str(run_dir), "cmd": cmd + list(extra)}


def _child_env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")


def run_command(cmd: list[str]) -> tuple[str, float]:
    """Runs ``cmd`` from the repository root; returns its stdout and wall-clock seconds (raises on failure)."""
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True)
    seconds = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout, seconds


class BackgroundCommand:
    """Starts ``cmd`` from the repository root beside others, stderr to ``log``, stdout beside it;
    ``wait`` returns what ``run_command`` would."""

    def __init__(self, cmd: list[str], log):
        self.cmd, self.log, self.out = cmd, Path(log), Path(log).with_suffix(".stdout")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.start = time.time()
        with open(self.out, "w") as out, open(self.log, "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(), stdout=out, stderr=err, text=True)

    def finished(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        """SIGTERM (a trainer saves a checkpoint and exits), then waits for it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()

    def wait(self) -> tuple[str, float]:
        returncode = self.proc.wait()
        seconds = time.time() - self.start
        if returncode != 0:
            tail = self.log.read_text()[-3000:]
            raise RuntimeError(f"{shlex.join(self.cmd)} failed ({returncode}); its log {self.log} ends:\n{tail}")
        return self.out.read_text(), seconds


def relative(arg: str) -> str:
    """``arg`` with this checkout's absolute path taken out (a path under the repository root, or a flag's value that
    is one, as a user types it from the root): what the ledgers and docs record works on any machine."""
    return arg.replace(f"{ROOT}{os.sep}", "")


def shown_command(cmd: list[str]) -> str:
    """The command as a user types it from the repository root (``python -m ...``), paths relative to the root."""
    return shlex.join(relative(a) for a in cmd[1:]).replace("-m ", "python -m ", 1)


def run_one(spec: dict) -> dict:
    """Runs it; returns the spec with the final metrics and the wall-clock seconds."""
    stdout, seconds = run_command(spec["cmd"])
    metrics = json.loads(stdout.strip().splitlines()[-1])
    return {**spec, "cmd": shown_command(spec["cmd"]), "metrics": metrics,
            "seconds": round(seconds, 1), "finished": datetime.datetime.now().isoformat(timespec="seconds")}


def recipe_flags(task: str, suffix: str = "") -> dict:
    """The flags of ``configs/finetune_<task><suffix>.flags`` beyond the task flagfile it includes and the run's own
    folder and context: the recipe, as ``reproduction.py`` records it."""
    lines = (ROOT / "configs" / f"finetune_{task}{suffix}.flags").read_text().splitlines()
    flags = dict(line[2:].partition("=")[::2] for line in lines if line.startswith("--"))
    return {k: v for k, v in flags.items() if k not in ("flagfile", "run_dir", "n_ctx")}


def _flag_values(cmd: str) -> dict:
    return {a[2:].partition("=")[0]: a[2:].partition("=")[2] for a in shlex.split(cmd) if a.startswith("--")}


def ledger_run(spec: dict, arm: str, recipe: dict, records: list[dict]) -> dict | None:
    """The run of a ``reproduction.py`` ledger that ``spec`` would repeat: the same task and seed, ``arm`` there,
    ``recipe``, start, data, context and precision. Paths compare resolved from the repository root."""
    want = _flag_values(shown_command(spec["cmd"]))
    resolve = lambda path: str((ROOT / path).resolve()) if path else path  # noqa: E731
    for r in records:
        if (r["task"], r["arm"], r["seed"], r["recipe"]) != (spec["task"], arm, spec["seed"], recipe):
            continue
        have = _flag_values(r["cmd"])
        if all(have.get(k) == want.get(k) for k in ("precision", "n_ctx", "model")) and \
                all(resolve(have.get(k, "")) == resolve(want.get(k, "")) for k in ("data_dir", "init_checkpoint")):
            return r
    return None


def main_metric(task: str) -> str:
    """The task's headline metric (the first of its ``TaskSpec.metrics``: Matthews for CoLA, F1 for MRPC, ...)."""
    from gpt_tf.tasks import get_task

    return get_task(task).metrics[0]


def dev_metrics(record: dict) -> dict:
    """The primary task's metrics on its first eval split (``dev`` for all tasks here)."""
    return record["metrics"]["dev"]


def dev_score(record: dict) -> float:
    """The task's headline dev metric, in percent."""
    return 100 * dev_metrics(record)[main_metric(record["task"])]


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


def load_ledger(path: Path) -> list[dict]:
    """The records of finished runs (one JSON object per line), or [] when there is no ledger yet."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def append_ledger(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def median_spread(values) -> tuple[float, float, float] | None:
    """(median, min, max) of ``values``, or None when there are none."""
    values = list(values)
    return (statistics.median(values), min(values), max(values)) if values else None


def size_of(run) -> str:
    """The model size whose shape the pre-training run has (for the scratch arm's --model); ``run``: its
    ``gpt_tf.runs.folder.RunFolder``."""
    from gpt_tf.config import SIZES

    shape = ("n_embd", "n_layer", "n_head", "d_ff", "model_type")
    for name, size in SIZES.items():
        if all(getattr(size, k) == getattr(run.model_config, k) for k in shape):
            return name
    raise ValueError(f"{run.path}/model_config.json matches no model size's shape {shape}")
