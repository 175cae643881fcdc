"""Training throughput of our GPT-1 vs a keras-hub stack and vs PyTorch/transformers, same machine, same run.

For each preset × precision it times full training steps (forward, backward, global-norm clipping,
AdamW update; dropout on) on one identical random batch with three stacks (see
``bench/train_throughput_stacks.py``): ``ours``, ``keras_hub`` and ``torch``. Every stack lives in
its own fresh worker process. With ``--schedule=interleaved`` (default) the workers of one
preset × precision are started together and stepped round-robin, one step at a time, so that a
load change on a shared machine hits every stack alike; ``--schedule=sequential`` runs one worker
after the other and frees its memory first (for batches too big to hold three stacks at once).
Each step records the share of CPU time other processes used meanwhile; ``--wait_quiet=S`` waits
up to S seconds before each timed step for the machine to go quiet.
Peak FLOP/s for MFU is measured in the same run with a large matmul through TF and torch per
precision (best of the two).

    python -m bench.train_throughput --presets=gpt1,small --precisions=float32,bfloat16 \\
        --out=bench/results/train_throughput.json

Writes the JSON report, a markdown snippet next to it (``.md``) and prints the table.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from bench.train_throughput_report import machine_info, markdown, row_name, summarise

STACKS = ("ours", "keras_hub", "torch")
# Per-preset defaults for a 2-core CPU, sized so the default run (gpt1 + small) takes ~15 minutes.
PRESET_DEFAULTS = {
    "gpt1": {"batch": 2, "seq": 512, "warmup": 2, "steps": 3},
    "small": {"batch": 4, "seq": 256, "warmup": 3, "steps": 10},
    "tiny": {"batch": 8, "seq": 128, "warmup": 3, "steps": 10},
    "test": {"batch": 8, "seq": 32, "warmup": 3, "steps": 20},
}
TAG = "@@bench "  # prefix of the protocol lines a worker prints on stdout
ROOT = Path(__file__).resolve().parents[1]
FLAGS = flags.FLAGS


# ----------------------------------------------------------------------------- worker process


def _emit(kind, payload):
    print(f"{TAG}{kind} {json.dumps(payload)}", flush=True)


def worker_main(spec):
    """Worker: builds the stack, then runs one step per ``step`` line on stdin until stdin closes."""
    from bench.train_throughput_stacks import build_step, measure_peak, timed

    if spec["kind"] == "peak":
        _emit("RESULT", measure_peak(spec["lib"], spec["sizes"], spec["reps"], spec["threads"], spec["quiet_share"]))
        return
    step, info = build_step(spec)
    _emit("READY", info)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        loss, stats = timed(step)
        _emit("STEP", {**stats, "loss": loss})


# ----------------------------------------------------------------------------- driver side


class Worker:
    """One stack in a subprocess, driven line by line (stderr goes to a temp file, shown on failure).

    The subprocess is ``python -m <module> --worker=<spec as JSON>``; it answers on stdout with
    lines ``<tag><KIND> <JSON payload>``. ``code_root``: a folder whose packages (e.g. an older
    ``gpt_tf``) come before this checkout's; the worker then runs from there.
    """

    def __init__(self, spec, module="bench.train_throughput", tag=TAG, code_root=None):
        self.spec, self.tag = spec, tag
        self.stderr = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
        if code_root:
            env["PYTHONPATH"] = os.pathsep.join([str(code_root), str(ROOT)])
        cmd = [sys.executable, "-m", module, f"--worker={json.dumps(spec)}"]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
            cwd=code_root or ROOT,
        )

    def read(self, kind):
        """The payload of the next ``kind`` line; raises with the worker's stderr tail if it died."""
        for line in self.proc.stdout:
            if line.startswith(self.tag):
                got, payload = line[len(self.tag) :].split(" ", 1)
                if got == kind:
                    return json.loads(payload)
        self.proc.wait()
        self.stderr.seek(0)
        tail = "\n".join(self.stderr.read().splitlines()[-12:])
        raise RuntimeError(f"worker {self.spec} exited with {self.proc.returncode} before {kind}:\n{tail}")

    def ask(self, command, kind):
        """Sends one ``command`` line; returns the payload of the ``kind`` line that answers it."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read(kind)

    def step(self):
        """Runs one step; returns its wall seconds, own CPU seconds, loss and the others' CPU share."""
        return self.ask("step", "STEP")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        self.stderr.close()


def wait_until_quiet(quiet_share, timeout_s, window_s=0.5):
    """Waits (at most ``timeout_s``) until other processes use ≤ ``quiet_share`` of the CPUs over a window.

    Called between steps, when every worker of ours is idle, so all busy CPU time is someone else's.
    Returns the seconds waited.
    """
    from bench.train_throughput_stacks import busy_seconds

    start = time.time()
    while time.time() - start < timeout_s:
        busy = busy_seconds()
        time.sleep(window_s)
        if (busy_seconds() - busy) / ((os.cpu_count() or 1) * window_s) <= quiet_share:
            break
    return time.time() - start


def run_group(specs, quiet_share, max_rounds, log, wait_quiet_s=0.0):
    """Starts ``specs``' workers one by one, then steps them round-robin; returns one row per spec.

    After the warm-up, rounds go on until every worker has ``steps`` quiet steps (other processes
    used at most ``quiet_share`` of the machine meanwhile) or ``max_rounds`` rounds have run.
    """
    workers, rows = [], []
    try:
        for spec in specs:
            start = time.time()
            workers.append(Worker(spec))
            rows.append({**spec, **workers[-1].read("READY"), "warmup_s": [], "steps_log": []})
            rows[-1]["build_s"] = round(time.time() - start, 1)
        warmup, steps = specs[0]["warmup"], specs[0]["steps"]
        for i in range(warmup + max_rounds):
            if i >= warmup and all(_quiet_count(r, quiet_share) >= steps for r in rows):
                break
            for worker, row in zip(workers, rows, strict=True):
                time.sleep(0.2)  # let the previous stack's spinning threads go idle
                waited = wait_until_quiet(quiet_share, wait_quiet_s) if wait_quiet_s and i >= warmup else 0.0
                result = worker.step()
                result["waited_s"] = round(waited, 1)
                if i < warmup:
                    row["warmup_s"].append(round(result["s"], 3))
                else:
                    row["steps_log"].append(result)
            log(_round_line(rows, i, warmup))
    finally:
        for worker in workers:
            worker.close()
    return rows


def _round_line(rows, i, warmup):
    """Progress line for round ``i`` (warm-up rounds first)."""
    if i < warmup:
        return f"  warm-up {i + 1}: " + ", ".join(f"{row_name(r)} {r['warmup_s'][-1]:.2f} s" for r in rows)
    last = [r["steps_log"][-1] for r in rows]
    return f"  round {i - warmup + 1}: " + ", ".join(
        f"{row_name(r)} {s['s']:.2f} s ({100 * s['others_cpu_share']:.0f}% others)"
        for r, s in zip(rows, last, strict=True)
    )


def _quiet_count(row, quiet_share):
    return sum(s["others_cpu_share"] <= quiet_share for s in row["steps_log"])


def measure_peaks(sizes, threads, quiet_share, log):
    """Best matmul FLOP/s per precision over TF, torch and ``sizes``, each library in its own process."""
    per_lib, best = {}, {}
    for lib in ("tf", "torch"):
        spec = {"kind": "peak", "lib": lib, "sizes": sizes, "reps": 6, "threads": threads, "quiet_share": quiet_share}
        worker = Worker(spec)
        try:
            per_lib[lib] = worker.read("RESULT")
        finally:
            worker.close()
        log(f"  {lib} matmul GFLOP/s: " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in per_lib[lib].items()))
        for key, flops in per_lib[lib].items():
            precision = key.split("@")[0]
            best[precision] = max(best.get(precision, 0.0), flops)
    return best, per_lib


def define_flags():
    flags.DEFINE_string("presets", "gpt1,small", "comma-separated model presets")
    flags.DEFINE_string("precisions", "float32,bfloat16", "float32 and/or bfloat16")
    flags.DEFINE_string("stacks", ",".join(STACKS), "comma-separated subset of " + ",".join(STACKS))
    flags.DEFINE_integer("batch", None, "batch size (default: per preset)")
    flags.DEFINE_integer("seq", None, "sequence length (default: per preset)")
    flags.DEFINE_integer("warmup", None, "untimed steps (default: per preset)")
    flags.DEFINE_integer("steps", None, "timed steps (default: per preset)")
    flags.DEFINE_enum("schedule", "interleaved", ["interleaved", "sequential"], "how the stacks' workers take turns")
    flags.DEFINE_float("quiet_share", 0.1, "a step counts as quiet if other processes used at most this share of the CPUs")
    flags.DEFINE_integer("max_rounds", None, "timed rounds at most, stepping on while some stack has fewer than --steps "
                         "quiet steps (default: --steps, i.e. no waiting for quiet)")
    flags.DEFINE_float("wait_quiet", 0.0, "before each timed step, wait up to this many seconds for other processes to go quiet")
    flags.DEFINE_enum("torch_adamw", "fused", ["fused", "foreach", "default"],
                      "torch.optim.AdamW implementation (fused: the fastest on CPU)")
    flags.DEFINE_integer("threads", os.cpu_count(), "torch intra-op threads")
    flags.DEFINE_string("peak_sizes", "512,1024,2048,4096", "square matmul sizes for the peak FLOP/s")
    flags.DEFINE_string("out", "bench/results/train_throughput.json", "the JSON report (the .md snippet goes beside it)")
    flags.DEFINE_string("worker", None, "internal: run as a worker with this JSON spec")


def check_flags(args) -> None:
    for name in args.presets.split(","):
        if name not in PRESET_DEFAULTS:
            raise app.UsageError(f"--presets: unknown preset {name!r}; choose from {sorted(PRESET_DEFAULTS)}")
    for name in args.stacks.split(","):
        if name and name not in STACKS:
            raise app.UsageError(f"--stacks: unknown stack {name!r}; choose from {STACKS}")


def save_report(report: dict, text: str, out: Path, log) -> None:
    """Prints the markdown, writes the report as ``out`` (JSON) and ``out`` .md, with the load at the end."""
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    print("\n" + text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    log(f"wrote {out} and {out.with_suffix('.md')}")


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if args.worker:
        return worker_main(json.loads(args.worker))
    check_flags(args)
    report = {
        "command": " ".join(["python -m bench.train_throughput", *sys.argv[1:]]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "schedule": args.schedule,
        "quiet_share": args.quiet_share,
        "torch_adamw": args.torch_adamw,
        "wait_quiet_s": args.wait_quiet,
        "peak_matmul_sizes": args.peak_sizes,
        "rows": [],
    }
    print(f"{report['machine']['cpu']}, {report['machine']['cores']} cores; matmul peak:", flush=True)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    sizes = [int(n) for n in args.peak_sizes.split(",")]
    report["peak_flops"], report["peak_per_lib"] = measure_peaks(sizes, args.threads, args.quiet_share, log)
    stacks = [s for s in args.stacks.split(",") if s]
    for preset in args.presets.split(","):
        sizes = {k: getattr(args, k) or v for k, v in PRESET_DEFAULTS[preset].items()}
        for precision in args.precisions.split(","):
            specs = [
                {
                    "kind": "train",
                    "stack": s,
                    "preset": preset,
                    "precision": precision,
                    "threads": args.threads,
                    "torch_adamw": args.torch_adamw,
                    **sizes,
                }
                for s in stacks
            ]
            log(f"{preset} {precision}, batch {sizes['batch']} × {sizes['seq']}: " + ", ".join(map(row_name, specs)))
            groups = [specs] if args.schedule == "interleaved" else [[s] for s in specs]
            for group in groups:
                max_rounds = max(args.max_rounds or 0, sizes["steps"])
                report["rows"] += run_group(group, args.quiet_share, max_rounds, log, args.wait_quiet)
    summarise(report["rows"], report["peak_flops"], args.quiet_share)
    from gpt_tf.config import get_preset

    for preset in args.presets.split(","):
        counts = {row_name(r): r["n_params"] for r in report["rows"] if r["preset"] == preset}
        log(f"{preset}: parameters {counts}; config.n_params = {get_preset(preset).n_params:,}")
    save_report(report, markdown(report), Path(args.out), log)


if __name__ == "__main__":
    define_flags()
    app.run(main)
