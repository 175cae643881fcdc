"""Training throughput of our GPT-1 vs a keras-hub stack and vs PyTorch/transformers, same machine, same run.

    python -m bench.train_throughput                     # --mode=stacks: the training step, three stacks
    python -m bench.train_throughput --mode=loop --model=small --batch_size=4 [--jit_compile] [--peak_tflops=989]
    python -m bench.train_throughput --mode=optimizer    # one AdamW update alone, ours vs torch's fused AdamW
    python -m bench.train_throughput --stacks= --threads=1 --precisions=float32   # the matmul peak only, one thread
    python -m bench.train_throughput --mode=profile --presets=tiny,small --precisions=float32   # where the time goes

Modes: ``stacks`` (below); ``loop``: the real pre-training loop (``Pretrainer``: reader, strategy, accumulation,
XLA) and its MFU, a row appended to ``bench/results/pretrain_throughput.{json,md}``; ``optimizer``: the optimizer
update alone, ours in graph and XLA against torch's fused AdamW (both in ``bench/_train_stacks.py``); ``profile``:
each stack's step under its framework's profiler, op time by kind against the peers (``bench/_profiles.py``;
``bench/results/pretrain_profile_<cpu>.{json,md}``). The stacks and profile modes apply the project's picked
settings (``gpt_tf/speed/autotune.py``) before their workers start, as the CLI runs.

For each preset × precision it times full training steps (forward, backward, global-norm clipping,
AdamW update; dropout on) on one identical random batch with three stacks (see
``bench/_train_stacks.py``): ``ours``, ``keras_hub`` and ``torch``. Every stack lives in
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

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from statistics import median

from absl import app, flags

from bench import _profiles
from bench._train_stacks import PRESET_DEFAULTS, build_step, run_loop, run_optimizer, worker_env
from bench.harness import Worker, apply_settings, base_checkout, emit, header, measure_peak, measure_peaks, new_report
from bench.harness import save_report, timed, wait_until_quiet

STACKS = ("ours", "keras_hub", "torch")  # the default; ours_jax (ours on JAX) is asked for by name
CHOICES = (*STACKS, "ours_jax")
FLAGS = flags.FLAGS


# ----------------------------------------------------------------------------- worker process


def worker_main(spec):
    """Worker: builds the stack, then runs one step per ``step`` line on stdin until stdin closes."""
    if spec["kind"] == "peak":
        emit("RESULT", measure_peak(spec["lib"], spec["sizes"], spec["reps"], spec["threads"], spec["quiet_share"],
                                    spec.get("precisions", ("float32", "bfloat16"))))
        return
    if spec["kind"] == "profile":
        return _profiles.pretrain_worker(spec)
    if spec["stack"] not in ("torch", "ours_jax"):  # TensorFlow's pools as the project's settings say (apply_settings)
        import tensorflow as tf

        from gpt_tf.speed import choices

        choices.apply_threads(tf, choices.current())
    step, info = build_step(spec)
    serve_steps(step, info, lambda loss: {"loss": loss})


def serve_steps(step, info: dict, answer) -> None:
    """A worker's side of ``run_group``: ``READY`` with ``info``, then for each ``step`` line on stdin one timed
    ``step()``, answered by ``STEP``: the ``Clock`` reading and ``answer(what step() returned)``."""
    emit("READY", info)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        result, stats = timed(step)
        emit("STEP", {**stats, **answer(result)})


# ----------------------------------------------------------------------------- statistics and report


def row_name(row):
    return f"{row['stack']}@{row['rev']}" if row.get("rev") else row["stack"]


def summarise(rows, peaks, quiet_share):
    """Adds tokens/s, ms/step, CPU s/step, MFU and the ratios vs keras-hub and torch to each row.

    Within one preset × precision, the medians are over the quiet steps if every row has at least
    half its steps quiet, else over all steps (the same rule for every stack, so ratios stay fair).
    """
    from gpt_tf.config import get_size

    groups = {}
    for row in rows:
        groups.setdefault((row["preset"], row["precision"]), []).append(row)
    for group in groups.values():
        quiet = {id(r): [s for s in r["steps_log"] if s["others_cpu_share"] <= quiet_share] for r in group}
        use_quiet = all(2 * len(quiet[id(r)]) >= max(len(r["steps_log"]), 1) for r in group)
        for row in group:
            steps = quiet[id(row)] if use_quiet else row["steps_log"]
            row["quiet_steps"], row["used_steps"] = len(quiet[id(row)]), "quiet" if use_quiet else "all"
            row["ms_per_step"] = 1e3 * median([s["s"] for s in steps])
            row["cpu_s_per_step"] = median([s["cpu_s"] for s in steps])
            row["tokens_per_s"] = row["batch"] * row["seq"] / (row["ms_per_step"] / 1e3)
            row["flops_per_token"] = get_size(row["preset"]).flops_per_token(row["seq"])
            row["mfu"] = row["tokens_per_s"] * row["flops_per_token"] / peaks[row["precision"]]
            row["others_cpu_share"] = sum(s["others_cpu_share"] for s in row["steps_log"]) / len(row["steps_log"])
            row["final_loss"] = row["steps_log"][-1]["loss"]
        for row in group:
            for ref in ("keras_hub", "torch"):
                other = [r for r in group if r["stack"] == ref and not r.get("rev")]
                if other:
                    row[f"vs_{ref}"] = row["tokens_per_s"] / other[0]["tokens_per_s"]
                    row[f"cpu_vs_{ref}"] = other[0]["cpu_s_per_step"] / row["cpu_s_per_step"]


def table_lines(rows):
    """The results as markdown table lines."""
    lines = ["| preset | precision | stack | batch × seq | params | tokens/s | ms/step | MFU | vs keras-hub "
             "| vs torch | CPU s/step | others' CPU | steps used |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = {k: f"{r[k]:.2f}×" if k in r else "–" for k in ("vs_keras_hub", "vs_torch")}
        lines.append(f"| {r['preset']} | {r['precision']} | {row_name(r)} | {r['batch']} × {r['seq']} "
                     f"| {r['n_params']:,} | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:,.0f} "
                     f"| {100 * r['mfu']:.1f}% | {ratio['vs_keras_hub']} | {ratio['vs_torch']} "
                     f"| {r['cpu_s_per_step']:.2f} | {100 * r['others_cpu_share']:.0f}% "
                     f"| {r['used_steps']} ({r['quiet_steps']}/{len(r['steps_log'])} quiet) |")
    return lines


def markdown(report):
    """The README snippet: the command, the machine, the measured peaks and the table."""
    m, peaks = report["machine"], report["peak_flops"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    lines = ["```bash", report["command"], "```", "",
             f"Measured {report['date']} on {m['cpu']} ({m['cores']} cores, {m['memory_gib']} GiB, "
             f"{' '.join(m['isa'])}); {versions}. Settings: {report.get('settings', 'not recorded')}.",
             f"MFU = tokens/s × `flops_per_token` (6N + 12·L·d·T) / peak, where peak is the matmul FLOP/s "
             f"measured in the same run (best of TF and torch over square matmuls of sizes "
             f"{report['peak_matmul_sizes']}): "
             + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items()) + ".",
             f"A step is forward + backward + global-norm clip + AdamW with dropout on, on one identical random "
             f"batch (torch: `torch.optim.AdamW`, `{report['torch_adamw']}` implementation); "
             f"each stack runs in its own process, schedule `{report['schedule']}`. This is a shared machine: "
             f'"others\' CPU" is the mean share of its CPU time that other processes used during the timed steps; '
             f"ms/step and CPU s/step (our process's own CPU time) are medians over the quiet steps (others ≤ "
             f"{100 * report['quiet_share']:.0f}%) when every stack of the preset × precision has at least half "
             f'its steps quiet, otherwise over all steps ("steps used").', ""]
    return "\n".join(lines + table_lines(report["rows"]) + ab_lines(report)) + "\n"


def base_pairs(rows):
    """With ``--base``: ``(this checkout's ours, ours at the base)`` rows of each preset × precision (the base's rows
    carry its ``rev``)."""
    for row in rows:
        if row["stack"].startswith("ours") and row.get("rev"):
            yield next(r for r in rows if r["stack"] == row["stack"] and not r.get("rev")
                       and (r["preset"], r["precision"]) == (row["preset"], row["precision"])), row


def ab_lines(report):
    """With ``--base``: this checkout's ours against the base's, per preset × precision (same run, interleaved)."""
    revs = report.get("revs")
    if not revs:
        return []
    lines = [""]
    for this, row in base_pairs(report["rows"]):
        lines.append(f"- {row['preset']} {row['precision']}: ours at {revs['this']} / ours at {revs['base']}: "
                     f"**{this['tokens_per_s'] / row['tokens_per_s']:.3f}×** "
                     f"({this['tokens_per_s']:,.0f} / {row['tokens_per_s']:,.0f} tokens/s)")
    return lines


# ----------------------------------------------------------------------------- driver side


def run_group(specs, quiet_share, max_rounds, log, wait_quiet_s=0.0, module="bench.train_throughput"):
    """Starts ``specs``' workers (``python -m <module> --worker``, each answering ``step`` lines with ``STEP``) one by
    one, then steps them round-robin; returns one row per spec.

    After the warm-up, rounds go on until every worker has ``steps`` quiet steps (other processes
    used at most ``quiet_share`` of the machine meanwhile) or ``max_rounds`` rounds have run.
    """
    workers, rows = [], []
    try:
        for spec in specs:
            start = time.time()
            workers.append(Worker(spec, module, code_root=spec.get("code_root"), env=worker_env(spec)))
            rows.append({**spec, **workers[-1].read("READY"), "warmup_s": [], "steps_log": []})
            rows[-1]["build_s"] = round(time.time() - start, 1)
        warmup, steps = specs[0]["warmup"], specs[0]["steps"]
        for i in range(warmup + max_rounds):
            if i >= warmup and all(_quiet_count(r, quiet_share) >= steps for r in rows):
                break
            for worker, row in zip(workers, rows, strict=True):
                time.sleep(0.2)  # let the previous stack's spinning threads go idle
                waited = wait_until_quiet(quiet_share, wait_quiet_s) if wait_quiet_s and i >= warmup else 0.0
                result = worker.ask("step", "STEP")
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


# ----------------------------------------------------------------------------- --mode=loop's report


def loop_markdown(rows) -> str:
    lines = [
        "| when (UTC) | device | model | batch × seq | accum | precision | XLA | strategy | tokens/s | ms/step | MFU "
        "| peak (source) | CPU s/step | our share of the cores | load avg start→end |",
        "|---|---|---|---|---:|---|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        share = r["cpu_s_per_step_median"] / (r["ms_per_step_median"] / 1e3 * r["cores"])  # < 100%: others ran too
        lines.append(
            f"| {r['when']} | {r['device']} | {r['model']} | {r['batch']} × {r['seq']} | {r['grad_accum_steps']} "
            f"| {r['precision']} | {'on' if r['jit_compile'] else 'off'} | {r['strategy']} ({r['replicas']}) "
            f"| {r['tokens_per_sec']:,.0f} | {r['ms_per_step_median']:,.0f} | {100 * r['mfu']:.1f}% "
            f"| {r['peak_flops'] / 1e12:.3g} TFLOP/s ({r['peak_source']}) | {r['cpu_s_per_step_median']:.2f} "
            f"| {share:.0%} | {r['loadavg_start_end'][0]:.1f}→{r['loadavg_start_end'][1]:.1f} |")
    commands = "\n".join(f"    {r['command']}" for r in rows)
    return "\n".join(lines) + f"\n\nCommands:\n\n{commands}\n"


def loop(args) -> None:
    """``--mode=loop``: one row appended to ``--out`` (JSON) and the table of every row rewritten beside it."""
    args.warmup = 3 if args.warmup is None else args.warmup
    args.steps = 10 if args.steps is None else args.steps
    row = run_loop(args)
    out = Path(args.out or "bench/results/pretrain_throughput.json")
    rows = json.loads(out.read_text()) if out.exists() else []
    rows.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    out.with_suffix(".md").write_text(loop_markdown(rows))
    print(loop_markdown([row]))


def define_flags():
    flags.DEFINE_enum("mode", "stacks", ["stacks", "loop", "optimizer", "profile"], "what to measure (the module doc)")
    flags.DEFINE_string("presets", "gpt1,small", "comma-separated model sizes (gpt_tf/config.py)")
    flags.DEFINE_string("precisions", "float32,bfloat16", "float32 and/or bfloat16")
    flags.DEFINE_string("stacks", ",".join(STACKS), "comma-separated subset of " + ",".join(CHOICES))
    flags.DEFINE_integer("batch", None, "batch size (default: per preset)")
    flags.DEFINE_integer("seq", None, "sequence length (default: per preset)")
    flags.DEFINE_integer("warmup", None, "untimed steps (default: per preset)")
    flags.DEFINE_integer("steps", None, "timed steps (default: per preset)")
    flags.DEFINE_enum("schedule", "interleaved", ["interleaved", "sequential"], "how the stacks' workers take turns")
    flags.DEFINE_float("quiet_share", 0.1, "a step counts as quiet if other processes used at most this share of "
                       "the CPUs")
    flags.DEFINE_integer("max_rounds", None, "timed rounds at most, stepping on while some stack has fewer than "
                         "--steps quiet steps (default: --steps, i.e. no waiting for quiet)")
    flags.DEFINE_float("wait_quiet", 0.0, "before each timed step, wait up to this many seconds for other processes to "
                       "go quiet")
    flags.DEFINE_enum("torch_adamw", "fused", ["fused", "foreach", "default"],
                      "torch.optim.AdamW implementation (fused: the fastest on CPU)")
    flags.DEFINE_integer("threads", os.cpu_count(), "torch intra-op threads")
    flags.DEFINE_string("peak_sizes", "512,1024,2048,4096", "square matmul sizes for the peak FLOP/s")
    flags.DEFINE_string("base", None, "--mode=stacks: also time ours as of this commit (a temporary git worktree), "
                        "interleaved with this checkout's")
    flags.DEFINE_string("out", None, "the JSON report (the .md goes beside it; default bench/results/"
                        "train_throughput.json, --mode=loop: pretrain_throughput.json, --mode=profile: "
                        "pretrain_profile_<cpu>.json)")
    flags.DEFINE_string("worker", None, "internal: run as a worker with this JSON spec")
    # --mode=loop (--warmup, --steps and --out above apply too)
    flags.DEFINE_string("model", "small", "--mode=loop: preset: gpt1, small, tiny or test")
    flags.DEFINE_integer("batch_size", 4, "--mode=loop: global batch, in sequences")
    flags.DEFINE_integer("grad_accum_steps", 1, "--mode=loop: micro-batches per update")
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16"], "--mode=loop: the Keras dtype policy")
    flags.DEFINE_bool("jit_compile", False, "--mode=loop: XLA-compile the step")
    flags.DEFINE_enum("strategy", "default", ["default", "one_device", "mirrored"],
                      "--mode=loop: the tf.distribute strategy")
    flags.DEFINE_float("peak_tflops", 0.0, "--mode=loop: peak for MFU (0: measure a matmul here)")
    # --mode=optimizer (--warmup above applies too)
    flags.DEFINE_integer("reps", 30, "--mode=optimizer: timed updates per stack and round")
    flags.DEFINE_integer("rounds", 3, "--mode=optimizer: rounds, each stack in turn")


def check_flags(args) -> None:
    for name in args.presets.split(","):
        if name not in PRESET_DEFAULTS:
            raise app.UsageError(f"--presets: unknown preset {name!r}; choose from {sorted(PRESET_DEFAULTS)}")
    for name in args.stacks.split(","):
        if name and name not in CHOICES:
            raise app.UsageError(f"--stacks: unknown stack {name!r}; choose from {CHOICES}")
    if args.mode == "profile" and "ours_jax" in args.stacks.split(","):
        raise app.UsageError("--mode=profile: the profiles are TensorFlow's and PyTorch's; leave ours_jax out")


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.mode in ("loop", "optimizer"):
        return {"loop": loop, "optimizer": run_optimizer}[args.mode](args)
    check_flags(args)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if args.mode == "profile":
        return _profiles.pretrain_profile(args, log)
    settings = apply_settings()  # before any worker starts
    report = {
        **new_report("bench.train_throughput"),
        "settings": settings,
        "schedule": args.schedule,
        "quiet_share": args.quiet_share,
        "torch_adamw": args.torch_adamw,
        "wait_quiet_s": args.wait_quiet,
        "peak_matmul_sizes": args.peak_sizes,
        "rows": [],
    }
    print(f"{header(report['machine'])}; matmul peak:", flush=True)
    sizes = [int(n) for n in args.peak_sizes.split(",")]
    report["peak_flops"], report["peak_per_lib"] = measure_peaks("bench.train_throughput", sizes, args.threads,
                                                                 args.quiet_share, log, args.precisions.split(","))
    stacks = [{"stack": s} for s in args.stacks.split(",") if s]
    with base_checkout(args.base) if args.base else contextlib.nullcontext((None, None)) as (tree, revs):
        if tree:  # ours as of --base, from its own checkout, beside this one's
            stacks.append({"stack": "ours", "rev": revs["base"], "code_root": str(tree)})
            report["revs"] = revs
        for preset in args.presets.split(",") if stacks else ():  # --stacks= : the matmul peak only
            sizes = {k: getattr(args, k) or v for k, v in PRESET_DEFAULTS[preset].items()}
            for precision in args.precisions.split(","):
                specs = [{"kind": "train", **stack, "preset": preset, "precision": precision, "threads": args.threads,
                          "torch_adamw": args.torch_adamw, **sizes} for stack in stacks]
                log(f"{preset} {precision}, batch {sizes['batch']} × {sizes['seq']}: "
                    + ", ".join(map(row_name, specs)))
                groups = [specs] if args.schedule == "interleaved" else [[s] for s in specs]
                for group in groups:
                    max_rounds = max(args.max_rounds or 0, sizes["steps"])
                    report["rows"] += run_group(group, args.quiet_share, max_rounds, log, args.wait_quiet)
    summarise(report["rows"], report["peak_flops"], args.quiet_share)
    from gpt_tf.config import get_size

    for preset in args.presets.split(",") if stacks else ():
        counts = {row_name(r): r["n_params"] for r in report["rows"] if r["preset"] == preset}
        log(f"{preset}: parameters {counts}; config.n_params = {get_size(preset).n_params:,}")
    save_report(report, markdown(report), Path(args.out or "bench/results/train_throughput.json"), log)


if __name__ == "__main__":
    define_flags()
    app.run(main)
