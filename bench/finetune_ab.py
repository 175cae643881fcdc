"""A/B of a change to the fine-tuning step: this checkout against an older commit, on the same batches.

    python -m bench.finetune_ab --base=07ded34      # ~8 min -> bench/results/finetune_ab.{json,md}

Two workers of `bench/finetune_speed.py` (the same stack, default ``ours_bucketed_bf16``: λ = 0.5,
mixed_bfloat16, length buckets, the `tiny` shape on SST-2's training texts), one running this checkout,
one running ``--base`` from a temporary `git worktree`. Both start from the same seed, so round r of
each trains on the same ``--train_steps`` batches; they alternate (the order flips every round) and
round 0 is warm-up. The figure is the ratio of the mean examples/s over the counted rounds; the
per-round pairs are in the report. Differences under ~2% are within the noise of a quiet 2-core machine.
The rounds are `bench.finetune_speed.run`'s (training only: neither worker is an evaluation stack).
"""

from __future__ import annotations

import datetime
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from absl import app, flags

from bench.finetune_speed import STACKS, run
from bench.finetune_speed_stacks import define_data_flags
from bench.train_throughput import save_report
from bench.train_throughput_report import machine_info

ROOT = Path(__file__).resolve().parents[1]
FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("base", None, "the commit to compare this checkout against", required=True)
    flags.DEFINE_enum("stack", "ours_bucketed_bf16", [s for s, v in STACKS.items() if v["stack"] == "ours"],
                      "bench.finetune_speed stack both workers run")
    flags.DEFINE_integer("train_steps", 100, "training steps per worker per round")
    flags.DEFINE_integer("rounds", 6, "counted rounds (after one warm-up round)")
    flags.DEFINE_float("wait_quiet", 0.0, "before each measurement, wait up to this many "
                       "seconds for other processes to use at most 10% of the CPUs")
    define_data_flags("bench/results/finetune_ab.json")


def git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def markdown(report: dict) -> str:
    s, r = report["settings"], report["result"]
    lines = [f"`{report['command']}`", "",
             f"{report['machine']['cpu']}, {report['date']}: this checkout ({s['this']}) against {s['base']}, stack "
             f"{s['stack']}, {s['train_steps']} steps per round, {s['rounds']} counted rounds.", "",
             "| round | base examples/s | this examples/s |", "|---:|---:|---:|"]
    lines += [f"| {i + 1} | {a:.1f} | {b:.1f} |" for i, (a, b) in enumerate(zip(r["base"], r["this"]))]
    lines += ["", f"Mean: base {r['base_mean']:.1f}, this {r['this_mean']:.1f} examples/s: **{r['ratio']:.3f}×**."]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    from bench.finetune_speed_stacks import prepare_data

    log = lambda msg: print(msg, flush=True)  # noqa: E731
    task_dir = prepare_data(Path(FLAGS.data_root), Path(FLAGS.shared_data), 20, 64, log).resolve()
    spec = {"task_dir": str(task_dir), "batch_size": 32, "n_ctx": 64, "threads": 1, "train_steps": FLAGS.train_steps,
            "precision": "float32", **STACKS[FLAGS.stack]}
    base_rev, this_rev = git("rev-parse", "--short", FLAGS.base), git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        this_rev += " + uncommitted changes"
    tree = Path(tempfile.mkdtemp(prefix="finetune_ab_")) / "base"
    git("worktree", "add", "--detach", str(tree), base_rev)
    try:
        logs = run(FLAGS, {"base": spec, "this": spec}, log, code_roots={"base": tree})
    finally:
        git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(tree.parent, ignore_errors=True)
    rates = {name: [m["examples_per_s"] for m in logs[name]["train"]] for name in ("base", "this")}
    means = {name: statistics.mean(v) for name, v in rates.items()}
    report = {"command": " ".join(["python -m bench.finetune_ab", *sys.argv[1:]]),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine_info(),
              "settings": {"this": this_rev, "base": base_rev, "stack": FLAGS.stack, "train_steps": FLAGS.train_steps,
                           "rounds": FLAGS.rounds},
              "result": {**rates, "base_mean": means["base"], "this_mean": means["this"],
                         "ratio": means["this"] / means["base"]}}
    save_report(report, markdown(report), Path(FLAGS.out), log)


if __name__ == "__main__":
    define_flags()
    app.run(main)
