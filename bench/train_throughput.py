"""Training throughput of our GPT-1 vs a keras-hub stack and vs PyTorch/transformers, same machine, same run.

For each preset × precision it times full training steps (forward, backward, global-norm clipping,
AdamW update; dropout on) on one identical random batch with three stacks (see
``bench/train_throughput_stacks.py``): ``ours``, ``keras_hub`` and ``torch``. Every stack lives in
its own fresh worker process. With ``--schedule=interleaved`` (default) the workers of one
preset × precision are started together and stepped round-robin, one step at a time, so that a
load change on a shared machine hits every stack alike; ``--schedule=sequential`` runs one worker
after the other and frees its memory first (for batches too big to hold three stacks at once).
Peak FLOP/s for MFU is measured in the same run with a large matmul through TF and torch per
precision (best of the two).

    python -m bench.train_throughput --presets=gpt1,small --precisions=float32,bfloat16 \\
        --out=bench/results/train_throughput.json

Writes the JSON report, a markdown snippet next to it (``.md``) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    """One stack in a subprocess, driven line by line (stderr goes to a temp file, shown on failure)."""

    def __init__(self, spec):
        self.spec = spec
        self.stderr = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "bench.train_throughput", "--worker", json.dumps(spec)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env, cwd=ROOT
        )

    def read(self, kind):
        """The payload of the next ``kind`` line; raises with the worker's stderr tail if it died."""
        for line in self.proc.stdout:
            if line.startswith(TAG):
                got, payload = line[len(TAG) :].split(" ", 1)
                if got == kind:
                    return json.loads(payload)
        self.proc.wait()
        self.stderr.seek(0)
        tail = "\n".join(self.stderr.read().splitlines()[-12:])
        raise RuntimeError(f"worker {self.spec} exited with {self.proc.returncode} before {kind}:\n{tail}")

    def step(self):
        """Runs one step; returns its wall seconds, own CPU seconds, loss and the others' CPU share."""
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self.read("STEP")

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
            for worker, row in zip(workers, rows):
                time.sleep(0.2)  # let the previous stack's spinning threads go idle
                waited = wait_until_quiet(quiet_share, wait_quiet_s) if wait_quiet_s and i >= warmup else 0.0
                result = worker.step()
                result["waited_s"] = round(waited, 1)
                if i < warmup:
                    row["warmup_s"].append(round(result["s"], 3))
                else:
                    row["steps_log"].append(result)
            log(f"  {'warm-up' if i < warmup else 'round'} {i + 1 if i < warmup else i - warmup + 1}: " + ", ".join(
                f"{_name(r)} {(r['steps_log'][-1]['s'] if i >= warmup else r['warmup_s'][-1]):.2f} s"
                + (f" ({100 * r['steps_log'][-1]['others_cpu_share']:.0f}% others)" if i >= warmup else "")
                for r in rows))
    finally:
        for worker in workers:
            worker.close()
    return rows


def _quiet_count(row, quiet_share):
    return sum(s["others_cpu_share"] <= quiet_share for s in row["steps_log"])


def _name(row):
    variant = row.get("variant") or "base"
    return row["stack"] + ("" if variant == "base" else f"[{variant}]")


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


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


def summarise(rows, peaks, quiet_share):
    """Adds tokens/s, ms/step, CPU s/step, MFU and the ratios vs keras-hub and torch to each row.

    Within one preset × precision, the medians are over the quiet steps if every row has at least
    half its steps quiet, else over all steps (the same rule for every stack, so ratios stay fair).
    """
    from gpt_tf.config import get_preset

    groups = {}
    for row in rows:
        groups.setdefault((row["preset"], row["precision"]), []).append(row)
    for group in groups.values():
        quiet = {id(r): [s for s in r["steps_log"] if s["others_cpu_share"] <= quiet_share] for r in group}
        use_quiet = all(2 * len(quiet[id(r)]) >= max(len(r["steps_log"]), 1) for r in group)
        for row in group:
            steps = quiet[id(row)] if use_quiet else row["steps_log"]
            row["quiet_steps"], row["used_steps"] = len(quiet[id(row)]), "quiet" if use_quiet else "all"
            row["ms_per_step"] = 1e3 * _median([s["s"] for s in steps])
            row["cpu_s_per_step"] = _median([s["cpu_s"] for s in steps])
            row["tokens_per_s"] = row["batch"] * row["seq"] / (row["ms_per_step"] / 1e3)
            row["flops_per_token"] = get_preset(row["preset"]).flops_per_token(row["seq"])
            row["mfu"] = row["tokens_per_s"] * row["flops_per_token"] / peaks[row["precision"]]
            row["others_cpu_share"] = sum(s["others_cpu_share"] for s in row["steps_log"]) / len(row["steps_log"])
            row["final_loss"] = row["steps_log"][-1]["loss"]
        for row in group:
            for ref in ("keras_hub", "torch"):
                other = [r for r in group if r["stack"] == ref and (r.get("variant") or "base") == "base"]
                if other:
                    row[f"vs_{ref}"] = row["tokens_per_s"] / other[0]["tokens_per_s"]
                    row[f"cpu_vs_{ref}"] = other[0]["cpu_s_per_step"] / row["cpu_s_per_step"]


def table_lines(rows):
    """The results as markdown table lines."""
    lines = [
        "| preset | precision | stack | batch × seq | params | tokens/s | ms/step | MFU | vs keras-hub | vs torch "
        "| CPU s/step | others' CPU | steps used |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = {k: f"{r[k]:.2f}×" if k in r else "–" for k in ("vs_keras_hub", "vs_torch")}
        lines.append(
            f"| {r['preset']} | {r['precision']} | {_name(r)} | {r['batch']} × {r['seq']} | {r['n_params']:,} "
            f"| {r['tokens_per_s']:,.0f} | {r['ms_per_step']:,.0f} | {100 * r['mfu']:.1f}% "
            f"| {ratio['vs_keras_hub']} | {ratio['vs_torch']} | {r['cpu_s_per_step']:.2f} | {100 * r['others_cpu_share']:.0f}% "
            f"| {r['used_steps']} ({r['quiet_steps']}/{len(r['steps_log'])} quiet) |"
        )
    return lines


def markdown(report):
    """The README snippet: the command, the machine, the measured peaks and the table."""
    m, peaks = report["machine"], report["peak_flops"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    return "\n".join([
        "```bash",
        report["command"],
        "```",
        "",
        f"Measured {report['date']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB, "
        f"{' '.join(m['isa'])}); {versions}.",
        f"MFU = tokens/s × `flops_per_token` (6N + 12·L·d·T) / peak, where peak is the matmul FLOP/s measured in "
        f"the same run (best of TF and torch over square matmuls of sizes {report['peak_matmul_sizes']}): "
        + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items()) + ".",
        f"A step is forward + backward + global-norm clip + AdamW with dropout on, on one identical random batch "
        f"(torch: `torch.optim.AdamW`, `{report['torch_adamw']}` implementation); "
        f"each stack runs in its own process, schedule `{report['schedule']}`. This is a shared machine: "
        f"\"others' CPU\" is the mean share of its CPU time that other processes used during the timed steps; "
        f"ms/step and CPU s/step (our process's own CPU time) are medians over the quiet steps (others ≤ "
        f"{100 * report['quiet_share']:.0f}%) when every stack of the preset × precision has at least half its "
        f"steps quiet, otherwise over all steps (\"steps used\").",
        *_variant_notes(report["rows"]),
        "",
        *table_lines(report["rows"]),
    ]) + "\n"


def _variant_notes(rows):
    """One line naming the monkeypatched options behind each ``ours[variant]`` row, if any."""
    from bench.train_throughput_variants import parse

    variants = sorted({r["variant"] for r in rows if (r.get("variant") or "base") != "base"})
    if not variants:
        return []
    return ["`ours[v]` rows: our model with the speed options of `bench/train_throughput_variants.py` applied: "
            + "; ".join(f"`{v}` = {' + '.join(sorted(parse(v)))}" for v in variants) + "."]


def machine_info():
    """CPU model, core count, memory and library versions of this machine."""
    from importlib import metadata

    with open("/proc/cpuinfo") as f:
        cpuinfo = f.read().splitlines()
    cpu = next((l.split(":", 1)[1].strip() for l in cpuinfo if l.startswith("model name")), "unknown CPU")
    flags = next((l.split(":", 1)[1].split() for l in cpuinfo if l.startswith("flags")), [])
    versions = {}
    for package in ("tensorflow", "keras", "keras-hub", "torch", "transformers", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "isa": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags],
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "versions": versions,
        "loadavg_at_start": os.getloadavg(),
    }


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="gpt1,small", help="comma-separated model presets")
    parser.add_argument("--precisions", default="float32,bfloat16", help="float32 and/or bfloat16")
    parser.add_argument("--stacks", default=",".join(STACKS), help="comma-separated subset of " + ",".join(STACKS))
    parser.add_argument("--variants", default="", help="extra runs of ours with these speed variants")
    parser.add_argument("--batch", type=int, help="batch size (default: per preset)")
    parser.add_argument("--seq", type=int, help="sequence length (default: per preset)")
    parser.add_argument("--warmup", type=int, help="untimed steps (default: per preset)")
    parser.add_argument("--steps", type=int, help="timed steps (default: per preset)")
    parser.add_argument("--schedule", choices=("interleaved", "sequential"), default="interleaved")
    parser.add_argument("--quiet_share", type=float, default=0.1,
                        help="a step counts as quiet if other processes used at most this share of the CPUs")
    parser.add_argument("--max_rounds", type=int, help="timed rounds at most, stepping on while some stack has "
                        "fewer than --steps quiet steps (default: --steps, i.e. no waiting for quiet)")
    parser.add_argument("--wait_quiet", type=float, default=0.0,
                        help="before each timed step, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--torch_adamw", choices=("fused", "foreach", "default"), default="fused",
                        help="torch.optim.AdamW implementation (fused: the fastest on CPU)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    parser.add_argument("--peak_sizes", default="512,1024,2048,4096", help="square matmul sizes for the peak FLOP/s")
    parser.add_argument("--out", default="bench/results/train_throughput.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in args.presets.split(","):
        if name not in PRESET_DEFAULTS:
            parser.error(f"--presets: unknown preset {name!r}; choose from {sorted(PRESET_DEFAULTS)}")
    for name in args.stacks.split(","):
        if name and name not in STACKS:
            parser.error(f"--stacks: unknown stack {name!r}; choose from {STACKS}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    argv = sys.argv[1:] if argv is None else argv
    report = {
        "command": " ".join(["python -m bench.train_throughput", *argv]),
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
    report["peak_flops"], report["peak_per_lib"] = measure_peaks([int(n) for n in args.peak_sizes.split(",")], args.threads, args.quiet_share, log)
    runs = [(s, "base") for s in args.stacks.split(",") if s] + [("ours", v) for v in args.variants.split(",") if v]
    for preset in args.presets.split(","):
        sizes = {k: getattr(args, k) or v for k, v in PRESET_DEFAULTS[preset].items()}
        for precision in args.precisions.split(","):
            specs = [{"kind": "train", "stack": s, "variant": v, "preset": preset, "precision": precision,
                      "threads": args.threads, "torch_adamw": args.torch_adamw, **sizes} for s, v in runs]
            log(f"{preset} {precision}, batch {sizes['batch']} × {sizes['seq']}: " + ", ".join(map(_name, specs)))
            groups = [specs] if args.schedule == "interleaved" else [[s] for s in specs]
            for group in groups:
                max_rounds = max(args.max_rounds or 0, sizes["steps"])
                report["rows"] += run_group(group, args.quiet_share, max_rounds, log, args.wait_quiet)
    summarise(report["rows"], report["peak_flops"], args.quiet_share)
    from gpt_tf.config import get_preset

    for preset in args.presets.split(","):
        counts = {_name(r): r["n_params"] for r in report["rows"] if r["preset"] == preset}
        log(f"{preset}: parameters {counts}; config.n_params = {get_preset(preset).n_params:,}")
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    text = markdown(report)
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(text)
    log(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
