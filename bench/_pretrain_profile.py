"""``bench.train_throughput --mode=profile``: where a pre-training step's time goes, ours against its peers.

    python -m bench.train_throughput --mode=profile --presets=tiny,small --precisions=float32
        # ~3 min on 2 cores -> bench/results/pretrain_profile_<cpu>.{json,md}

``bench.train_throughput`` (and ``bench.speed_table``) time the three stacks' pre-training step; this says why
they are where they are. Each stack of ``bench/_train_stacks.py`` (ours, the keras-hub stack, PyTorch HF) runs
in its own worker with the same preset, batch, precision and settings as there (the project's picked
settings, ``gpt_tf/autotune.py``, applied before the workers start), on one thread, and warms up; then the
stacks take turns, ``ROUNDS`` times, each recording ``--steps`` training steps (forward, LM loss, backward,
clipping, AdamW; dropout on) with its framework's profiler, so that a change in the machine's speed hits
every stack alike. Op time goes to the kinds of ``bench/_op_profile.py``, reported in ms per 1,000 tokens,
and the report lists each stack's costliest op types beside them.

A step that is mostly ``matmul`` in both stacks is compute-bound: the same oneDNN kernels run the same
products, so one stack can only be as much faster as the other's non-matmul time allows. The matmul
column's GFLOP/s (the model's matmul FLOPs per token over that column's time, ``GPTConfig.flops_per_token``)
says how near each stack runs to the core's peak.
"""

from __future__ import annotations

import datetime
import sys
import tempfile
import time
from pathlib import Path

from bench._op_profile import KINDS, per_unit_ms, tf_op_seconds, torch_op_seconds
from bench.harness import Worker, apply_settings, emit, machine_info, save_report, timed

STACK_NAMES = {"ours": "ours", "keras_hub": "keras-hub stack", "torch": "PyTorch HF"}
TOP_OPS = 6
OTHERS = "others' CPU"
# One thread per stack: an op's self time is then its share of the step (with more, ops overlap in time and
# their sum exceeds the step), and the stacks compare core for core, as bench.finetune_speed's profile does.
THREADS = 1
ROUNDS = 3  # each stack records --steps steps per round, the stacks taking turns


def profile_worker(spec: dict) -> None:
    """In the worker: builds the stack and warms it up (``READY``), then for each ``profile`` line on stdin records
    ``spec["steps"]`` steps under the framework's profiler and emits them (``RESULT``)."""
    from bench._train_stacks import build_step

    if spec["stack"] != "torch":  # one thread, before TensorFlow's first op (torch's: in build_step)
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(1)
    step, info = build_step(spec)
    for _ in range(spec["warmup"]):
        step()
    emit("READY", info)
    run = lambda: [step() for _ in range(spec["steps"])]  # noqa: E731
    for line in sys.stdin:
        if line.strip() != "profile":
            break
        if spec["stack"] == "torch":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                _, times = timed(run)
            op_s, op_types = torch_op_seconds(prof, by_type=True)
        else:
            import tensorflow as tf

            logdir = tempfile.mkdtemp(prefix="pretrain_profile_")
            tf.profiler.experimental.start(logdir)
            _, times = timed(run)
            tf.profiler.experimental.stop()
            op_s, op_types = tf_op_seconds(logdir, info["optimizer_scope"], by_type=True)
        emit("RESULT", {**times, "op_s": op_s, "op_types_s": op_types})


def add_round(total: dict, result: dict) -> dict:
    """``total`` with one more round of a stack: seconds and op times summed, others' CPU share averaged by time."""
    if not total:
        return {**result, "rounds": 1}
    out = {"rounds": total["rounds"] + 1, "s": total["s"] + result["s"],
           "others_cpu_share": (total["others_cpu_share"] * total["s"] + result["others_cpu_share"] * result["s"])
           / (total["s"] + result["s"])}
    for key in ("op_s", "op_types_s"):
        out[key] = {k: total[key].get(k, 0.0) + result[key].get(k, 0.0) for k in {*total[key], *result[key]}}
    return out


def profile_row(spec: dict, result: dict) -> dict:
    """ms per 1,000 tokens by kind, the matmul column's GFLOP/s and the top op types (ms per 1,000 tokens), over
    the rounds ``result`` sums."""
    from gpt_tf.config import get_size

    tokens = result["rounds"] * spec["steps"] * spec["batch"] * spec["seq"]
    row = per_unit_ms(result["s"], result["op_s"], tokens / 1000, result["others_cpu_share"])
    flops = get_size(spec["preset"]).flops_per_token(spec["seq"]) * tokens  # 6N + attention: the matmuls
    row["matmul GFLOP/s"] = round(flops / max(result["op_s"].get("matmul", 0.0), 1e-9) / 1e9, 1)
    row["tokens/s"] = round(tokens / result["s"], 1)
    top = sorted(result["op_types_s"].items(), key=lambda kv: -kv[1])[:TOP_OPS]
    row["top ops"] = {k: round(1e6 * v / tokens, 3) for k, v in top}
    return row


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["```bash", report["command"], "```", "",
             f"{m['cpu']}, {m['cores']} cores, {report['date']}; settings: {report['settings']}. Each stack in "
             f"its own process, one thread, the stacks taking turns: {report['warmup']} warm-up steps, then {report['rounds']} "
             f"rounds of {report['steps']} recorded steps under the framework's profiler (so the totals are slower than "
             "`bench.speed_table`'s unprofiled steps).", ""]
    for key, rows in report["rows"].items():
        preset, precision, batch, seq = key.split("|")
        lines += [f"**{preset}**, {precision}, batch {batch} × {seq}: ms per 1,000 tokens (share of the step)", "",
                  "| stack | " + " | ".join(KINDS) + " | total | tokens/s | matmul GFLOP/s | others' CPU |",
                  "|---|" + "---:|" * (len(KINDS) + 4)]
        for stack, row in rows.items():
            cells = [f"{row[k]:.1f} ({100 * row[k] / row['total']:.0f}%)" for k in KINDS]
            lines.append(f"| {STACK_NAMES[stack]} | " + " | ".join(cells) + f" | {row['total']:.1f} "
                         f"| {row['tokens/s']:,.0f} | {row['matmul GFLOP/s']:.0f} | {100 * row[OTHERS]:.0f}% |")
        lines += ["", "Costliest op types (ms per 1,000 tokens):", ""]
        for stack, row in rows.items():
            lines.append(f"- {STACK_NAMES[stack]}: " + ", ".join(f"`{k}` {v:.1f}" for k, v in row["top ops"].items()))
        lines.append("")
    return "\n".join(lines)


def profile_interleaved(specs: dict, rounds: int, log) -> dict:
    """The stacks' workers started together and warmed up, then recording in turns, ``rounds`` times (a load
    change on the machine hits every stack alike); a row per stack over all its rounds."""
    workers, totals = {}, {}
    try:
        for stack, spec in specs.items():
            workers[stack] = Worker(spec, "bench.train_throughput")
            workers[stack].read("READY")
        for i in range(rounds):
            for stack, worker in workers.items():
                time.sleep(0.2)  # let the previous stack's threads go idle
                totals[stack] = add_round(totals.get(stack, {}), worker.ask("profile", "RESULT"))
            log(f"  round {i + 1}: " + ", ".join(f"{STACK_NAMES[s]} {t['s']:.1f} s" for s, t in totals.items()))
    finally:
        for worker in workers.values():
            worker.close()
    rows = {stack: profile_row(specs[stack], totals[stack]) for stack in specs}
    for stack, row in rows.items():
        log(f"  {STACK_NAMES[stack]}: {row}")
    return rows


def main(args) -> None:
    """Profiles each preset × precision's three stacks, interleaved; writes the report."""
    from bench.speed_table import cpu_slug
    from bench.train_throughput import PRESET_DEFAULTS
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    settings = apply_settings()  # before any worker starts
    info = machine_info()
    report = {"command": " ".join(["python -m bench.train_throughput", *sys.argv[1:]]),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"), "machine": info,
              "settings": settings, "warmup": args.warmup or 3, "steps": args.steps or 2, "rounds": ROUNDS, "rows": {}}
    log(f"{info['cpu']}, {info['cores']} cores; {settings}")
    stacks = [s for s in args.stacks.split(",") if s]
    for preset in args.presets.split(","):
        sizes = {k: getattr(args, k) or v for k, v in PRESET_DEFAULTS[preset].items() if k in ("batch", "seq")}
        for precision in args.precisions.split(","):
            key = f"{preset}|{precision}|{sizes['batch']}|{sizes['seq']}"
            specs = {stack: {"kind": "profile", "stack": stack, "preset": preset, "precision": precision,
                             "threads": THREADS, "torch_adamw": args.torch_adamw, "warmup": report["warmup"],
                             "steps": report["steps"], **sizes} for stack in stacks}
            log(f"profiling {preset} {precision}: " + ", ".join(STACK_NAMES[s] for s in stacks))
            rows = profile_interleaved(specs, report["rounds"], log)
            report["rows"][key] = rows
    out = Path(args.out or f"bench/results/pretrain_profile_{cpu_slug(info)}.json")
    save_report(report, markdown(report), out, log)
