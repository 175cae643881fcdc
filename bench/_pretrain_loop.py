r"""``bench.train_throughput --mode=loop``: tokens/s and MFU of the pre-training loop itself, ``Pretrainer``, as
``python -m gpt_tf.train`` runs it.

``--mode=stacks`` times one step function on one batch, three stacks side by side; this
times the real loop instead, under the strategy, precision and ``--jit_compile`` given: the tf.data
reader over GZIP TFRecords, ``strategy.run``, gradient accumulation, the all-reduce, clipping and
AdamW, with dropout on. The records hold random tokens (speed does not depend on them).

MFU = tokens/s × ``GPTConfig.flops_per_token`` / peak. The peak is ``--peak_tflops`` when given
(989 for an H100 SXM's dense BF16, the datasheet figure), else the best square-matmul FLOP/s
measured here, on the same device, in the compute dtype.

    # on a GPU machine (the figure the README asks for):
    python -m bench.train_throughput --mode=loop --model=gpt1 --batch_size=64 --precision=mixed_bfloat16 \
        --jit_compile --peak_tflops=989 --out=bench/results/pretrain_throughput_gpu.json
    # here (CPU):
    python -m bench.train_throughput --mode=loop --model=small --batch_size=4 --precision=mixed_bfloat16 --jit_compile

``--warmup`` untimed steps (default 3: tracing, XLA compilation), then ``--steps`` timed ones (default 10).
Each run appends one row to ``--out`` (JSON, default ``bench/results/pretrain_throughput.json``) and rewrites the
markdown table next to it (``.md``).
On a shared CPU, "our share of the cores" (process CPU time ÷ wall time × cores, medians) shows how
much of the machine the run had: other processes took the rest.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from absl import flags

from bench.harness import cpu_seconds, header, machine_info, measure_peak

OUT = "bench/results/pretrain_throughput.json"


def define_flags():
    """The loop's own flags (``--warmup``, ``--steps`` and ``--out`` are ``bench.train_throughput``'s)."""
    flags.DEFINE_string("model", "small", "--mode=loop: model size: gpt1, small, tiny or test")
    flags.DEFINE_integer("batch_size", 4, "--mode=loop: global batch, in sequences")
    flags.DEFINE_integer("grad_accum_steps", 1, "--mode=loop: micro-batches per update")
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16"], "--mode=loop: the Keras dtype policy")
    flags.DEFINE_bool("jit_compile", False, "--mode=loop: XLA-compile the step")
    flags.DEFINE_enum("strategy", "default", ["default", "one_device", "mirrored"],
                      "--mode=loop: the tf.distribute strategy")
    flags.DEFINE_float("peak_tflops", 0.0, "--mode=loop: peak for MFU (0: measure a matmul here)")


def _write_random_records(folder: Path, vocab: int, n_ctx: int, sequences: int, seed: int = 0) -> None:
    """GZIP TFRecords of random (n_ctx + 1)-token windows and a manifest, as ``pipelines.pretrain_data`` writes."""
    import numpy as np

    from pipelines.book_stream import write_split
    from pipelines.pretrain_data import PretrainConfig
    from pipelines.records import COMPRESSION, MANIFEST

    stream = np.random.default_rng(seed).integers(0, vocab, sequences * n_ctx + 1)
    cfg = PretrainConfig(input_dir="", output_dir=str(folder), tokenizer_dir="", n_ctx=n_ctx, shard_size=sequences,
                         show_progress=False)
    shards = write_split(stream, cfg, "train", folder)
    manifest = {"n_ctx": n_ctx, "record": {"compression": COMPRESSION}, "splits": {"train": {"shards": shards}}}
    (folder / MANIFEST).write_text(json.dumps(manifest))


class _StepClock:
    """The ``TrainCallbacks`` hooks ``Pretrainer.train`` calls, keeping the time each step ended."""

    def __init__(self):
        self.ends, self.cpu = [time.perf_counter()], [cpu_seconds()]

    def on_log(self, step, stats):
        del step, stats

    def on_step_end(self, step, trainer):
        del step, trainer
        self.ends.append(time.perf_counter())
        self.cpu.append(cpu_seconds())


def _device() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        names = [tf.config.experimental.get_device_details(g).get("device_name", "GPU") for g in gpus]
        return f"{len(gpus)}× {names[0]}"
    return header(machine_info())


def run(args) -> dict:
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow()
    import keras

    from gpt_tf.config import get_size
    from gpt_tf.strategy import make_strategy
    from gpt_tf.training.lm_objective import Pretrainer, TrainConfig

    strategy = make_strategy(args.strategy)
    if args.precision != "float32":
        keras.mixed_precision.set_dtype_policy(args.precision)
    model_config = get_size(args.model)
    total = args.warmup + args.steps + 1  # the last step also saves a checkpoint: not timed
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        _write_random_records(data, model_config.vocab_size, model_config.n_ctx, max(4 * args.batch_size, 64))
        config = TrainConfig(data_dir=str(data), run_dir=str(Path(tmp) / "run"), batch_size=args.batch_size,
                             grad_accum_steps=args.grad_accum_steps, train_steps=total, warmup_steps=1,
                             precision=args.precision, jit_compile=args.jit_compile, log_every=10**9,
                             checkpoint_every=10**9)
        trainer = Pretrainer(model_config, config, strategy, log=lambda message: None)
        clock = _StepClock()
        trainer.train(clock)
    timed = slice(args.warmup, args.warmup + args.steps)  # step k (from 1) took ends[k] - ends[k - 1]
    seconds = [b - a for a, b in zip(clock.ends[:-1], clock.ends[1:])][timed]
    cpu = [b - a for a, b in zip(clock.cpu[:-1], clock.cpu[1:])][timed]
    tokens_per_step = args.batch_size * model_config.n_ctx
    tokens_per_sec = tokens_per_step * len(seconds) / sum(seconds)
    compute_dtype = "bfloat16" if args.precision == "mixed_bfloat16" else "float32"
    peak = args.peak_tflops * 1e12 or max(v for k, v in measure_peak("tf", (1024, 2048, 4096), 3, 0, 1.0).items()
                                          if k.startswith(compute_dtype + "@"))
    flops = model_config.flops_per_token(model_config.n_ctx)
    return {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench.train_throughput " + " ".join(sys.argv[1:]),
        "device": _device(), "replicas": strategy.num_replicas_in_sync, "tensorflow": tf.__version__,
        "model": args.model, "params": model_config.n_params, "batch": args.batch_size, "seq": model_config.n_ctx,
        "grad_accum_steps": args.grad_accum_steps, "precision": args.precision, "jit_compile": args.jit_compile,
        "strategy": args.strategy, "timed_steps": len(seconds),
        "ms_per_step_median": 1e3 * statistics.median(seconds), "tokens_per_sec": tokens_per_sec,
        "flops_per_token": flops, "peak_flops": peak, "peak_source": "given" if args.peak_tflops else "measured matmul",
        "mfu": tokens_per_sec * flops / peak,
        "cpu_s_per_step_median": statistics.median(cpu), "cores": os.cpu_count(),
        "loadavg_start_end": [load_start[0], os.getloadavg()[0]],
    }


def markdown(rows) -> str:
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


def main(args) -> None:
    """One row appended to ``--out`` (JSON) and the table of every row rewritten beside it."""
    args.warmup = 3 if args.warmup is None else args.warmup
    args.steps = 10 if args.steps is None else args.steps
    row = run(args)
    out = Path(args.out or OUT)
    rows = json.loads(out.read_text()) if out.exists() else []
    rows.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown([row]))

