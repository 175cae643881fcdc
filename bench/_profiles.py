"""The profile modes: where a training step's time goes, ours against its peers, by each framework's own profiler.

    python -m bench.train_throughput --mode=profile --presets=tiny,small --precisions=float32   # ~3 min on 2 cores
    python -m bench.finetune_speed --mode=profile [--precision=bfloat16]                       # ~4 min on 2 cores

Steps are recorded with ``tf.profiler`` (ours, the keras-hub stack) or ``torch.profiler`` (PyTorch HF), one thread
per stack (an op's self time is then its share of the step, and the stacks compare core for core), and every op's
own (self) time goes to one kind:

    matmul      dense and batched matrix products (oneDNN / MKL in both frameworks), forward and backward
    optimizer   gradient clipping and the AdamW update (TF: the optimizer's name scope, which holds
                both; torch: under ``Optimizer.step``, plus clip_grad_norm_'s foreach / vector-norm ops)
    dropout     random masks and their application, forward and backward
    other ops   everything else the graph / autograd runs: GELU, layer norm, softmax, adds, copies
    outside ops wall time minus all ops' time: Python, dispatch, input pipeline waits, and on a
                shared machine the time the thread waited for a core

Beside the kinds, the seconds per op type (TF's ``OpType``, torch's ``aten::`` name) name the few ops that make a
kind large. A step that is mostly ``matmul`` in both stacks is compute-bound: the same oneDNN kernels run the same
products, so one stack can be only as much faster as the other's non-matmul time allows.

* Pre-training (``bench/results/pretrain_profile_<cpu>.{json,md}``): each stack of ``bench/_train_stacks.py`` in its
  own worker, with the preset, batch, precision and settings of ``train_throughput``'s stacks, warms up; then the
  stacks take turns, ``ROUNDS`` times, each recording ``--steps`` steps (so a change in the machine's speed hits
  all alike). ms per 1,000 tokens, the costliest op types, and the matmul column's GFLOP/s (the model's matmul
  FLOPs per token, ``GPTConfig.flops_per_token``, over that column's time): how near each runs to the core's peak.
* Fine-tuning (``bench/results/finetune_profile.{json,md}``): ours with buckets at λ = 0 (HF's objective) and HF
  Trainer on ``finetune_speed``'s data and shape, each in its own worker, record ``--train_steps`` training steps
  after ``--profile_warmup_steps`` and one evaluation pass. ms per example.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Clock, Worker, apply_settings, cpu_slug, emit, new_report, save_report, timed, worker_result

KINDS = ("matmul", "optimizer", "dropout", "other ops", "outside ops")
OTHERS = "others' CPU"
STACK_NAMES = {"ours": "ours", "keras_hub": "keras-hub stack", "torch": "PyTorch HF"}
TOP_OPS = 6
ROUNDS = 3  # pre-training: each stack records --steps steps per round, the stacks taking turns

# ----------------------------------------------------------------------------- op time by kind


def tf_kind(name: str, optimizer_scope: str) -> str | None:
    """The kind of a TF executor event ``scope/op:OpType``; None for events that are not ops."""
    if ":" not in name or "::" in name:  # op events are scope:OpType; ExecutorState::Process etc. wrap them
        return None
    scope, op_type = name.rsplit(":", 1)
    if optimizer_scope in scope:
        return "optimizer"
    if "dropout" in scope.lower():
        return "dropout"
    return "matmul" if "MatMul" in op_type else "other ops"


def tf_compute_events(logdir: str):
    """``(name, picoseconds)`` of every event on TF's executor threads in the newest trace under
    ``logdir`` (``tf.profiler.experimental.start(logdir)`` ... ``stop()``); op events are named ``scope:OpType``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))[-1]
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    for plane in space.planes:
        for line in plane.lines:
            if line.name.startswith("tf_Compute"):
                for event in line.events:
                    yield plane.event_metadata[event.metadata_id].name, event.duration_ps


def tf_op_seconds(logdir: str, optimizer_scope: str) -> tuple[dict, dict]:
    """Self seconds per kind and per op type of the ops in the newest trace under ``logdir``."""
    seconds, types = collections.Counter(), collections.Counter()
    for name, picoseconds in tf_compute_events(logdir):
        kind = tf_kind(name, optimizer_scope)
        if kind:
            seconds[kind] += picoseconds / 1e12
            types[name.rsplit(":", 1)[1]] += picoseconds / 1e12
    return dict(seconds), dict(types)


TORCH_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
# torch.nn.utils.clip_grad_norm_ (the models themselves use none of these).
TORCH_CLIP_OPS = {"aten::_foreach_norm", "aten::linalg_vector_norm", "aten::_foreach_mul_", "aten::stack",
                  "aten::clamp"}


def torch_kind(event) -> str:
    """The kind of a torch profiler event, from its name and its ancestors' names."""
    names, parent = [event.name], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    if any(n.startswith("Optimizer.step") for n in names) or event.name in TORCH_CLIP_OPS:
        return "optimizer"
    if any("dropout" in n.lower() for n in names) or event.name == "aten::bernoulli_":
        return "dropout"
    return "matmul" if event.name in TORCH_MATMULS else "other ops"


def torch_op_seconds(prof) -> tuple[dict, dict]:
    """Self seconds per kind and per op name of the aten ops recorded (the ``aten::`` events: what the kernels ran)."""
    seconds, types = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.name.startswith("aten::"):
            seconds[torch_kind(event)] += event.self_cpu_time_total / 1e6
            types[event.name] += event.self_cpu_time_total / 1e6
    return dict(seconds), dict(types)


def tf_profiled(work, optimizer_scope: str) -> tuple:
    """``work()`` recorded by ``tf.profiler``: its result, the ``Clock`` reading, seconds by kind and by op type."""
    import tensorflow as tf

    logdir = tempfile.mkdtemp(prefix="bench_profile_")
    tf.profiler.experimental.start(logdir)
    result, times = timed(work)
    tf.profiler.experimental.stop()
    return result, times, *tf_op_seconds(logdir, optimizer_scope)


def torch_profiled(work) -> tuple:
    """``work()`` recorded by ``torch.profiler``: as ``tf_profiled``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result, times = timed(work)
    return result, times, *torch_op_seconds(prof)


def per_unit_ms(seconds: float, op_s: dict, units: float, others_share: float) -> dict:
    """ms per unit (example, or 1,000 tokens) of each kind; ``outside ops`` is the wall time no op accounts
    for; ``others' CPU`` the share of the machine other processes used meanwhile."""
    row = {kind: 1000 * op_s.get(kind, 0.0) / units for kind in KINDS[:-1]}
    row["outside ops"] = max(0.0, 1000 * (seconds - sum(op_s.values())) / units)
    row["total"] = 1000 * seconds / units
    row[OTHERS] = others_share
    return {k: round(v, 3) for k, v in row.items()}


def kind_cells(row: dict, digits: int) -> str:
    """The kinds' cells of a table row: time (share of the total)."""
    return " | ".join(f"{row[k]:.{digits}f} ({100 * row[k] / row['total']:.0f}%)" for k in KINDS)


# ----------------------------------------------------------------------------- the pre-training step


def pretrain_worker(spec: dict) -> None:
    """In a ``bench.train_throughput`` worker: builds the stack and warms it up (``READY``), then for each ``profile``
    line on stdin records ``spec["steps"]`` steps under the framework's profiler and emits them (``RESULT``)."""
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
        _, times, op_s, op_types = (torch_profiled(run) if spec["stack"] == "torch"
                                    else tf_profiled(run, info["optimizer_scope"]))
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


def pretrain_row(spec: dict, result: dict) -> dict:
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


def pretrain_markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["```bash", report["command"], "```", "",
             f"{m['cpu']}, {m['cores']} cores, {report['date']}; settings: {report['settings']}. Each stack in "
             f"its own process, one thread, the stacks taking turns: {report['warmup']} warm-up steps, then "
             f"{report['rounds']} rounds of {report['steps']} recorded steps under the framework's profiler (so the "
             "totals are slower than `bench.speed_table`'s unprofiled steps).", ""]
    for key, rows in report["rows"].items():
        preset, precision, batch, seq = key.split("|")
        lines += [f"**{preset}**, {precision}, batch {batch} × {seq}: ms per 1,000 tokens (share of the step)", "",
                  "| stack | " + " | ".join(KINDS) + " | total | tokens/s | matmul GFLOP/s | others' CPU |",
                  "|---|" + "---:|" * (len(KINDS) + 4)]
        lines += [f"| {STACK_NAMES[stack]} | {kind_cells(row, 1)} | {row['total']:.1f} | {row['tokens/s']:,.0f} "
                  f"| {row['matmul GFLOP/s']:.0f} | {100 * row[OTHERS]:.0f}% |" for stack, row in rows.items()]
        lines += ["", "Costliest op types (ms per 1,000 tokens):", ""]
        lines += [f"- {STACK_NAMES[stack]}: " + ", ".join(f"`{k}` {v:.1f}" for k, v in row["top ops"].items())
                  for stack, row in rows.items()]
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
    rows = {stack: pretrain_row(specs[stack], totals[stack]) for stack in specs}
    for stack, row in rows.items():
        log(f"  {STACK_NAMES[stack]}: {row}")
    return rows


def pretrain_profile(args, log) -> None:
    """``train_throughput --mode=profile``: each preset × precision's stacks, interleaved; writes the report."""
    from bench._train_stacks import PRESET_DEFAULTS

    settings = apply_settings()  # before any worker starts
    report = {**new_report("bench.train_throughput", "minutes"), "settings": settings, "warmup": args.warmup or 3,
              "steps": args.steps or 2, "rounds": ROUNDS, "rows": {}}
    info = report["machine"]
    log(f"{info['cpu']}, {info['cores']} cores; {settings}")
    stacks = [s for s in args.stacks.split(",") if s]
    for preset in args.presets.split(","):
        sizes = {k: getattr(args, k) or v for k, v in PRESET_DEFAULTS[preset].items() if k in ("batch", "seq")}
        for precision in args.precisions.split(","):
            specs = {stack: {"kind": "profile", "stack": stack, "preset": preset, "precision": precision, "threads": 1,
                             "torch_adamw": args.torch_adamw, "warmup": report["warmup"], "steps": report["steps"],
                             **sizes} for stack in stacks}
            log(f"profiling {preset} {precision}: " + ", ".join(STACK_NAMES[s] for s in stacks))
            key = f"{preset}|{precision}|{sizes['batch']}|{sizes['seq']}"
            report["rows"][key] = profile_interleaved(specs, report["rounds"], log)
    out = Path(args.out or f"bench/results/pretrain_profile_{cpu_slug(info)}.json")
    save_report(report, pretrain_markdown(report), out, log)


# ----------------------------------------------------------------------------- fine-tuning


def _finetune_ours(spec: dict, warmup_steps: int, steps: int) -> dict:
    from bench._finetune_stacks import Ours

    stack = Ours(spec)
    stack.train(warmup_steps)
    stack.evaluate()
    out = {}
    for phase, work in (("train", lambda: stack.train(steps)), ("eval", stack.evaluate)):
        result, times, op_s, _ = tf_profiled(work, stack.tuner.optimizer.name)
        out[phase] = {**times, "examples": result["examples"], "op_s": op_s}
    return out


def _finetune_hf(spec: dict, warmup_steps: int, steps: int) -> dict:
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
        out["train"] = {**times, "examples": steps * spec["batch_size"], "op_s": torch_op_seconds(state["prof"])[0]}
        return False

    hf = HF(spec, serve)
    hf.evaluate()  # warm-up
    result, times, op_s, _ = torch_profiled(hf.evaluate)
    out["eval"] = {**times, "examples": result["examples"], "op_s": op_s}
    if serve(hf):
        hf.trainer.train()
    return out


def finetune_worker(spec: dict) -> None:
    """In a ``bench.finetune_speed`` worker: profiles ``spec["stack"]``; one ``RESULT`` line."""
    profile = _finetune_ours if spec["stack"] == "ours" else _finetune_hf
    emit("RESULT", profile(spec, spec["warmup_steps"], spec["train_steps"]))


def finetune_profile(args, task_dir: Path, log) -> dict:
    """``finetune_speed --mode=profile``: ours (λ = 0) and HF Trainer one after the other, each in its own worker."""
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
        result = worker_result({**common, **stack}, "bench.finetune_speed")
        rows[name] = {phase: per_unit_ms(r["s"], r["op_s"], r["examples"], r["others_cpu_share"])
                      for phase, r in result.items()}
        log(f"  {name}: {rows[name]}")
    return {**new_report("bench.finetune_speed"),
            "settings": {"model": "tiny (4 x 256, 4 heads, FFN 1024, 8k BPE)", "n_ctx": args.n_ctx,
                         "batch": args.batch_size, "precision": short, "warm-up steps": args.profile_warmup_steps,
                         "recorded steps": args.train_steps, "threads per stack": args.threads,
                         "texts": lengths_summary(task_dir)},
            "rows": rows}


def finetune_markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = [f"`{report['command']}`", "",
             f"{m['cpu']}, {m['cores']} cores, {report['date']}; tensorflow {m['versions']['tensorflow']}, torch "
             f"{m['versions']['torch']}, transformers {m['versions']['transformers']}. Settings: "
             + ", ".join(f"{k} {v}" for k, v in s.items()) + ".", ""]
    for phase, title in (("train", "Training step"), ("eval", "Evaluation (forward pass)")):
        lines += [f"{title}: ms per example (share of the stack's wall time)", "",
                  "| stack | " + " | ".join(KINDS) + " | total | examples/s | others' CPU |",
                  "|---|" + "---:|" * (len(KINDS) + 3)]
        lines += [f"| {stack} | {kind_cells(rows[phase], 2)} | {rows[phase]['total']:.2f} "
                  f"| {1000 / rows[phase]['total']:.0f} | {100 * rows[phase][OTHERS]:.0f}% |"
                  for stack, rows in report["rows"].items()]
        lines.append("")
    return "\n".join(lines)
