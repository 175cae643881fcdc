"""``bench.finetune_speed --mode=profile``: where a fine-tuning step's time goes, in gpt_tf and in HF Trainer.

    python -m bench.finetune_speed --mode=profile     # ~4 min on 2 cores -> bench/results/finetune_profile.{json,md}
    python -m bench.finetune_speed --mode=profile --precision=bfloat16 --out=bench/results/finetune_profile_bf16.json

Op time by kind, side by side (this module is the mode's implementation; ``finetune_speed`` parses the flags).

`bench/finetune_speed.py` times the two stacks; this says why they are where they are. Each stack runs
in its own process, on the same data, shape and settings as finetune_speed (the `tiny` shape, SST-2
training texts, n_ctx 64, batch 32, one thread, λ = 0 for ours: HF's objective), warms up, then
records ``--steps`` training steps and one evaluation pass with the framework's own profiler
(`tf.profiler` for ours, `torch.profiler` for HF). Every op's own (self) time goes to one kind
(matmul, optimizer, dropout, other ops, outside ops: ``bench/_op_profile.py``).

A stack whose time is mostly ``matmul`` is compute-bound: the same oneDNN kernels run the same
products in both stacks, so it cannot get much faster than the other without doing fewer products.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

from bench._op_profile import KINDS, per_unit_ms, tf_op_seconds, torch_op_seconds
from bench.harness import ROOT, Clock, machine_info, timed

TAG = "@@finetune_profile "
OTHERS = "others' CPU"


# ----------------------------------------------------------------------------- ours (TensorFlow)


def profile_ours(spec: dict, warmup_steps: int, steps: int) -> dict:
    import tempfile

    import tensorflow as tf

    from bench._finetune_stacks import Ours

    stack = Ours(spec)
    scope = stack.tuner.optimizer.name
    stack.train(warmup_steps)
    stack.evaluate()
    out = {}
    for phase, work in (("train", lambda: stack.train(steps)), ("eval", stack.evaluate)):
        logdir = tempfile.mkdtemp(prefix=f"finetune_profile_{phase}_")
        tf.profiler.experimental.start(logdir)
        result, times = timed(work)
        tf.profiler.experimental.stop()
        out[phase] = {**times, "examples": result["examples"], "op_s": tf_op_seconds(logdir, scope)}
    return out


# ----------------------------------------------------------------------------- HF Trainer (PyTorch)

def profile_hf(spec: dict, warmup_steps: int, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from bench._finetune_stacks import HF

    out, state = {}, {}

    def serve(hf) -> bool:
        """Called before training and whenever ``hf.target`` steps are done: warm-up, then record."""
        if not hf.target:
            hf.target = warmup_steps
            return True
        if "prof" not in state:
            state["prof"] = profile(activities=[ProfilerActivity.CPU])
            state["prof"].start()
            state["clock"] = Clock()
            hf.target += steps
            return True
        times = state["clock"].read()
        state["prof"].stop()
        out["train"] = {**times, "examples": steps * spec["batch_size"], "op_s": torch_op_seconds(state["prof"])}
        return False

    hf = HF(spec, serve)
    hf.evaluate()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result, times = timed(hf.evaluate)
    out["eval"] = {**times, "examples": result["examples"], "op_s": torch_op_seconds(prof)}
    if serve(hf):
        hf.trainer.train()
    return out


# ----------------------------------------------------------------------------- report


def per_example_ms(result: dict) -> dict:
    """ms per example of each kind (``bench._op_profile.per_unit_ms``)."""
    return per_unit_ms(result["s"], result["op_s"], result["examples"], result["others_cpu_share"])


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = [f"`{report['command']}`", "",
             f"{m['cpu']}, {m['cores']} cores, {report['date']}; tensorflow {m['versions']['tensorflow']}, torch "
             f"{m['versions']['torch']}, transformers {m['versions']['transformers']}. Settings: "
             + ", ".join(f"{k} {v}" for k, v in s.items()) + ".", ""]
    for phase, title in (("train", "Training step"), ("eval", "Evaluation (forward pass)")):
        lines += [f"{title}: ms per example (share of the stack's wall time)", "",
                  "| stack | " + " | ".join(KINDS) + " | total | examples/s | others' CPU |",
                  "|---|" + "---:|" * (len(KINDS) + 3)]
        for stack, rows in report["rows"].items():
            row = rows[phase]
            cells = [f"{row[k]:.2f} ({100 * row[k] / row['total']:.0f}%)" for k in KINDS]
            lines.append(f"| {stack} | " + " | ".join(cells) + f" | {row['total']:.2f} | {1000 / row['total']:.0f} "
                         f"| {100 * row[OTHERS]:.0f}% |")
        lines.append("")
    return "\n".join(lines)


def worker_main(spec: dict) -> None:
    """In the worker process: profiles ``spec["stack"]`` and prints the result on one ``TAG`` line."""
    profile = profile_ours if spec["stack"] == "ours" else profile_hf
    print(TAG + json.dumps(profile(spec, spec["warmup_steps"], spec["train_steps"])), flush=True)


def run_profile(args, task_dir: Path, log) -> dict:
    """Profiles ours (λ = 0) and HF Trainer one after the other, each in a ``bench.finetune_speed`` worker."""
    from bench._finetune_stacks import lengths_summary

    bf16 = args.precision != "float32"
    short, ours_precision = ("bf16", "mixed_bfloat16") if bf16 else ("fp32", "float32")
    stacks = {f"gpt_tf, buckets, λ = 0, {short}": {"stack": "ours", "buckets": True, "lm_coef": 0.0,
                                                   "precision": ours_precision},
              f"HF Trainer, {short}": {"stack": "hf", "precision": "bfloat16" if bf16 else "float32"}}
    common = {"profile": True, "task_dir": str(task_dir), "batch_size": args.batch_size, "n_ctx": args.n_ctx,
              "threads": args.threads, "train_steps": args.train_steps, "warmup_steps": args.profile_warmup_steps}
    rows = {}
    for name, stack in stacks.items():
        log(f"profiling {name} ...")
        worker = [sys.executable, "-m", "bench.finetune_speed", f"--worker={json.dumps({**common, **stack})}"]
        done = subprocess.run(worker, text=True, capture_output=True, cwd=ROOT)
        line = next((x for x in done.stdout.splitlines() if x.startswith(TAG)), None)
        if done.returncode or line is None:
            raise RuntimeError(f"{name}: the worker failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        result = json.loads(line[len(TAG):])
        rows[name] = {phase: per_example_ms(result[phase]) for phase in ("train", "eval")}
        log(f"  {name}: {rows[name]}")
    return {"command": " ".join(["python -m bench.finetune_speed", *sys.argv[1:]]),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine_info(),
            "settings": {"model": "tiny (4 x 256, 4 heads, FFN 1024, 8k BPE)", "n_ctx": args.n_ctx,
                         "batch": args.batch_size, "precision": short, "warm-up steps": args.profile_warmup_steps,
                         "recorded steps": args.train_steps, "threads per stack": args.threads,
                         "texts": lengths_summary(task_dir)},
            "rows": rows}
