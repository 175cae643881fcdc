"""What a job costs on this CPU, in time and memory: fine-tuning GPT-1 at its own size (``--mode=gpt1``), LoRA and int8
on the shipped presets (``--mode=lora_int8``), building a pre-training corpus (``--mode=corpus``).

    python -m bench.costs --mode=gpt1         # ~2 h on 2 cores -> bench/results/finetune_gpt1.{json,md}
    python -m bench.costs --mode=lora_int8    # tiny and small, ~40 min on 2 cores -> lora_int8_<cpu>.{json,md}
    python -m bench.costs --mode=lora_int8 --presets=gpt1_tiny_books_en --train_limit=2000   # a quick look
    python -m bench.costs --mode=corpus --baseline_ref=main   # -> bench/results/corpus_build_<cpu>.{json,md}

**GPT-1** (``run_gpt1``): what GPT-1 itself (117M, random weights: the speed is the same) costs, in each of
``--precisions``, a worker process per measurement (its peak memory its own), one after another: per task of
``--tasks``, ``bench/_finetune_stacks.py``'s ``ours`` at GPT-1's size with ``configs/finetune_<task>_gpt1.flags``'s
recipe (batch 32, λ 0.5, length buckets, its ``--n_ctx``) on the task's training records tokenized with GPT-1's BPE
(``data/tasks_gpt1/<task>``, built when missing), one untimed step, then ``--steps`` timed steps on the plan's batches
at its lengths' quantiles (shortest, median, longest by default: real batches of the seeded epoch plan); the epoch's
time is a line fitted to them (a fixed cost per step plus one per padded token, ``_epoch_seconds``) summed over the
plan's lengths; then generation tokens/s (``bench.generation.Generate``: a 32-token prompt and 128 new tokens,
the key/value cache, three timed calls after one) and the exported classifier's ``predict`` examples/s
(``_servers.Exported``: SST-2's 872 dev sentences, batches of 32, three timed passes after one); threads as the
command line's (TensorFlow's default, every core). The project's picked settings
(``gpt_tf/speed/autotune.py``) apply before the workers start.

**LoRA and int8** (``run_lora_int8``): for each preset, three fine-tunings of ``GPT1TextClassifier`` through the
Python API (``compile`` / ``fit``, the README's block), each in its own process so that its peak memory is its own:
full fine-tuning, and ``backbone.enable_lora(4)`` and ``enable_lora(16)`` (adapters on every block's ``c_attn``; W_y
trains too). All from seed 0 on the first ``--train_limit`` SST-2 training sentences, one epoch, batch 32, the same
length-bucket plan. Each row: dev accuracy (the 872 dev sentences), trainable parameters, the median training step
time, the epoch's wall time, and the process's peak resident memory (and its resident memory before ``fit``). Then
the weight formats (``--weights``; ``gpt_tf.gpt1.weight_formats``): the fully fine-tuned classifier, saved with
``save_to_preset``, loaded once and copied into each format in one process (``--presets=gpt1``: GPT-1's shapes with
random weights, speed only). Each row: the weights file's size, dev accuracy, and ``predict`` examples/s on the dev
sentences, tokenized once and batched by ``sorted_batches`` (``--predict_batch``), the models taking turns
(``--predict_rounds`` after one warm-up; the median); the share of the preset LM's greedy tokens (``--generate_prompts``
dev openings + 32) as float32's.

**Corpus** (``run_corpus``): each of ``--corpora`` built as a user builds it, by one ``python -m
pipelines.pretrain_data`` process (a BPE of ``--vocab`` trained on the books, then records of ``--n_ctx``,
``books/valid`` held out): its wall and CPU seconds, peak resident memory and others' CPU share
(``bench.harness.measured_run``); one folder's also by ``--baseline_ref``'s code (a temporary `git worktree`).

The machine may be shared: each timing also records the share of the CPU other processes used meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from absl import app, flags

from bench._finetune_stacks import TAG, gpt1_task_data, worker_main
from bench._servers import Exported, server_stats, sst2
from bench.generation import Generate, same_generations
from bench.finetune_speed import measure
from bench.harness import DATA, ROOT, TASK_FOLDERS, Clock, Worker, apply_settings, base_checkout, child_env, cpu_slug
from bench.harness import emit, header, machine_info, measured_run, new_report, save_report, worker_result

FLAGS = flags.FLAGS
FINETUNINGS = {"full": None, "lora4": 4, "lora16": 16}  # --mode=lora_int8: the LoRA rank of each


def define_flags():
    flags.DEFINE_enum("mode", None, ["gpt1", "lora_int8", "corpus"], "what to measure (see the module doc)")
    flags.DEFINE_string("shared_data", str(DATA), "the shared data folder (GLUE, GPT-1's BPE, books)")
    flags.DEFINE_string("out", None, "the JSON report (.md beside it); default: bench/results/finetune_gpt1.json, "
                        "--mode=lora_int8: lora_int8_<cpu>.json, --mode=corpus: corpus_build_<cpu>.json")
    flags.DEFINE_list("tasks", ["rte", "mrpc", "stsb", "cola", "sst2", "story_cloze"], "--mode=gpt1: tasks "
                      "(configs/finetune_<task>_gpt1.flags)")
    flags.DEFINE_list("precisions", ["float32", "mixed_bfloat16"], "--mode=gpt1: precisions")
    flags.DEFINE_integer("steps", 3, "--mode=gpt1: timed fine-tuning steps per task (after one untimed)")
    flags.DEFINE_integer("batch_size", 32, "--mode=gpt1: the recipes' batch size")
    flags.DEFINE_list("presets", ["gpt1_tiny_books_en", "gpt1_small_books_en"], "--mode=lora_int8: the presets "
                      "(gpt1: GPT-1's shapes, random weights: predict speed only)")
    flags.DEFINE_list("finetunings", list(FINETUNINGS), "--mode=lora_int8: full, lora4, lora16")
    flags.DEFINE_integer("train_limit", 20000, "--mode=lora_int8: the first N SST-2 training sentences (0: all 67,349)")
    flags.DEFINE_float("learning_rate", 5e-4, "--mode=lora_int8: full fine-tuning's peak learning rate (the "
                       "reproduction's SST-2 recipe)")
    flags.DEFINE_float("lora_learning_rate", 2e-3, "--mode=lora_int8: LoRA's peak learning rate")
    flags.DEFINE_integer("predict_rounds", 3, "--mode=lora_int8: predict rounds per format after a warm-up")
    flags.DEFINE_list("weights", ["float32", "int8"], "--mode=lora_int8: the weight formats compared "
                      "(gpt_tf.gpt1.weight_formats: float32, bfloat16, int8, int8_weight_only)")
    flags.DEFINE_integer("predict_batch", 64, "--mode=lora_int8: examples per predict call")
    flags.DEFINE_integer("generate_prompts", 20, "--mode=lora_int8: prompts the preset LM continues in each format")
    flags.DEFINE_string("corpora", "books/train,books/train+books_extra/train", "--mode=corpus: the corpora built, "
                        "comma-separated; each a folder under --shared_data, or several joined by '+'")
    flags.DEFINE_integer("vocab", 8000, "--mode=corpus: the BPE's size")
    flags.DEFINE_integer("n_ctx", 128, "--mode=corpus: the records' context")
    flags.DEFINE_string("baseline_ref", "main", "--mode=corpus: git ref whose code builds the first corpus too ('' for "
                        "none)")
    flags.DEFINE_string("worker", None, "internal: run as a worker with this JSON spec")


# ----------------------------------------------------------------------------- GPT-1 at its own size


def run_gpt1(args, log) -> tuple[dict, str]:
    """``--mode=gpt1``'s report and its markdown (see the module doc), with the load average seen."""
    shared, rows = Path(args.shared_data), []
    common = {"batch_size": args.batch_size, "threads": 0, "glue_dir": str(shared / "glue"), "new_tokens": 128,
              "tokenizer_dir": str(shared / "gpt1_bpe"), "n_ctx": 64, "lm_coef": 0.5, "buckets": True, "train_steps": 1}
    jobs = [(p, t) for p in args.precisions for t in [*args.tasks, "generate", "exported"]]
    for precision, job in jobs:
        spec, plan = {**common, "precision": precision, "stack": job}, None
        if job in TASK_FOLDERS:
            folder, n_ctx, plan = gpt1_task_data(shared, job, args.batch_size)
            spec.update(stack="ours", model="gpt1", task_dir=str(folder.resolve()), n_ctx=n_ctx)
        # Timed: the plan's batches at its lengths' quantiles (shortest, ..., longest), after one untimed step
        order = sorted(range(len(plan or [])), key=lambda i: plan[i])
        picks = [order[round(q * (len(order) - 1) / max(1, args.steps - 1))] for q in range(args.steps) if order]
        worker, load = Worker(spec, "bench.costs", tag=TAG), os.getloadavg()
        try:
            info = worker.read("READY")
            commands = ["train", *(f"seek {i}" for i in picks)] if plan else ["eval"] * 4
            runs = [measure(worker, command) for command in commands]
        finally:
            worker.close()
        timed, row = runs[1:], {"job": job, "precision": precision, "info": info, "runs": runs,
                                "load_average": [round(x, 1) for x in (*load, *os.getloadavg())]}
        seconds = sum(m["s"] for m in timed)
        row.update(peak_rss_mib=max(m["peak_rss_mib"] for m in runs), per_s=sum(m["examples"] for m in timed) / seconds,
                   per_cpu_s=sum(m["examples"] for m in timed) / sum(m["cpu_s"] for m in timed),
                   others_cpu_share=round(median([m["others_cpu_share"] for m in timed]), 3))
        if plan:
            lengths = [plan[i] for i in picks]
            epoch = {key: _epoch_seconds(lengths, [m[key] for m in timed], plan) for key in ("s", "cpu_s")}
            row.update(n_ctx=spec["n_ctx"], steps_per_epoch=len(plan), timed_lengths=lengths,
                       epoch_minutes=epoch["s"] / 60, epoch_cpu_minutes=epoch["cpu_s"] / 60,
                       epoch_per_s=len(plan) * args.batch_size / epoch["s"])
        rows.append(row)
        log(f"  {precision} {job}: {row['per_s']:.2f}/s, peak {row['peak_rss_mib']} MiB"
            + (f", {row['epoch_minutes']:.0f} min per epoch" if plan else "") + f"; load {row['load_average']}")
    report = {**new_report("bench.costs"), "rows": rows}
    return report, gpt1_markdown(report)


def _epoch_seconds(lengths: list, seconds: list, plan: list) -> float:
    """An epoch's seconds: a step's time fitted as ``a + b * length`` (least squares over the timed steps: a fixed
    cost, the optimizer's update among it, plus one per padded token) and summed over the epoch plan's lengths."""
    import numpy as np

    if len(set(lengths)) < 2:  # one length timed: every step costs its mean
        return float(np.mean(seconds)) * len(plan)
    b, a = np.polyfit(lengths, seconds, 1)
    return float(a * len(plan) + b * sum(plan))


def gpt1_markdown(report: dict) -> str:
    m = report["machine"]
    loads = [x for r in report["rows"] for x in r["load_average"][::3]]
    lines = [f"`{report['command']}`", "", f"{m['cpu']}, {m['cores']} cores, {report['date']}; tensorflow "
             f"{m['versions']['tensorflow']}. GPT-1's size (117M), random weights. The machine was shared: load "
             f"average (1 min) {min(loads):.1f} to {max(loads):.1f} over the runs (2 cores).", "",
             "| task | precision | n_ctx | steps per epoch | timed steps' buckets | examples/s (epoch) | minutes per "
             "epoch | CPU-minutes per epoch | 3 epochs, hours | peak memory | others' CPU |",
             "|---|---|---:|---:|---|" + "---:|" * 6]
    for r in (r for r in report["rows"] if "epoch_minutes" in r):
        lines.append(f"| {r['job']} | {r['precision']} | {r['n_ctx']} | {r['steps_per_epoch']} | {r['timed_lengths']} "
                     f"| {r['epoch_per_s']:.2f} | {r['epoch_minutes']:.0f} | {r['epoch_cpu_minutes']:.0f} | "
                     f"{3 * r['epoch_minutes'] / 60:.1f} | {r['peak_rss_mib'] / 1024:.1f} GiB | "
                     f"{100 * r['others_cpu_share']:.0f}% |")
    lines += ["", "| measurement | precision | rate | per CPU s | peak memory | others' CPU |",
              "|---|---|" + "---:|" * 4]
    names = {"generate": "generation, key/value cache (tokens/s)", "exported": "exported classifier predict "
             "(examples/s)"}
    lines += [f"| {names[r['job']]} | {r['precision']} | {r['per_s']:.1f} | {r['per_cpu_s']:.1f} | "
              f"{r['peak_rss_mib'] / 1024:.1f} GiB | {100 * r['others_cpu_share']:.0f}% |"
              for r in report["rows"] if r["job"] in names]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- LoRA and int8


def _accuracy(model, dev, order, y) -> float:
    """Accuracy of ``predict`` over ``sorted_batches``' ``dev`` (``order``: theirs), in the caller's order."""
    from gpt_tf.gpt1.batching import restore

    return float((restore(model.predict(dev, verbose=0), order).argmax(-1) == y).mean())


def lora_worker(spec: dict) -> None:
    """One fine-tuning (full or LoRA): fit, evaluate, and the measurements; saves the full one for the int8 step."""
    import keras
    import keras_hub
    import numpy as np

    import gpt_tf.gpt1  # noqa: F401  (registers the family and its presets)
    from gpt_tf.gpt1.batching import bucketed, sorted_batches

    keras.utils.set_random_seed(0)
    train_x, train_y = sst2(spec["glue_dir"], "train", spec["train_limit"])
    dev_x, dev_y = sst2(spec["glue_dir"], "dev")
    classifier = keras_hub.models.TextClassifier.from_preset(spec["preset"], num_classes=2, lm_coef=0.0)
    if spec["rank"]:
        classifier.backbone.enable_lora(spec["rank"])
    train, steps_per_epoch = bucketed(classifier.preprocessor, train_x, train_y, batch_size=32)
    classifier.compile(learning_rate=spec["learning_rate"], warmup_fraction=0.05, train_steps=steps_per_epoch)
    trainable = int(sum(np.prod(v.shape) for v in classifier.trainable_weights))
    total = int(sum(np.prod(v.shape) for v in classifier.weights))
    before = server_stats(os.getpid())["rss_mb"]

    starts, seconds = [], []  # each training step's start and time, from keras's batch hooks
    begin = lambda batch, logs: starts.append(time.perf_counter())  # noqa: E731
    end = lambda batch, logs: seconds.append(time.perf_counter() - starts[-1])  # noqa: E731
    steps = keras.callbacks.LambdaCallback(on_train_batch_begin=begin, on_train_batch_end=end)
    clock = Clock()
    classifier.fit(train, steps_per_epoch=steps_per_epoch, epochs=1, callbacks=[steps], verbose=0)
    fit = clock.read()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dev, order = sorted_batches(classifier.preprocessor, dev_x, batch_size=64)
    result = {"dev_accuracy": _accuracy(classifier, dev, order, np.array(dev_y)),
              "trainable_params": trainable, "params": total, "step_ms_median": 1000 * median(seconds[10:] or seconds),
              "steps": len(seconds), "fit_s": fit["s"], "others_cpu_share": fit["others_cpu_share"],
              "rss_before_fit_mib": before, "peak_rss_mib": peak}
    if spec.get("save_to"):
        classifier.save_to_preset(spec["save_to"])
    emit("RESULT", result)


def int8_worker(spec: dict) -> None:
    """The float32 classifier against its copies in other weight formats: size, dev accuracy, predict examples/s,
    alternating; the preset's language model's greedy tokens."""
    import keras_hub
    import numpy as np

    import gpt_tf.gpt1  # noqa: F401
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.batching import sorted_batches
    from gpt_tf.gpt1.build import backbone_for
    from gpt_tf.gpt1.weight_formats import with_weights

    dev_x, dev_y = sst2(spec["glue_dir"], "dev")
    dev_y, formats, batch = np.array(dev_y), spec["weights"], spec["predict_batch"]
    if spec["preset_dir"]:
        float32 = keras_hub.models.TextClassifier.from_preset(spec["preset_dir"])
    else:  # GPT-1's shapes, random weights (speed only), the tiny preset's tokenizer and so its vocabulary
        tiny = keras_hub.models.TextClassifier.from_preset("gpt1_tiny_books_en", num_classes=2)
        config = get_size(spec["lm_preset"], vocab_size=get_size("tiny").vocab_size)
        float32 = type(tiny)(backbone_for(config), 2, preprocessor=tiny.preprocessor)
    models = {name: float32 if name == "float32" else with_weights(float32, name) for name in formats}
    dev, order = sorted_batches(float32.preprocessor, dev_x, batch_size=batch)  # tokenized once: the model's time
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models.items():
            model.save_to_preset(f"{tmp}/{name}")
            size = sum(p.stat().st_size for p in Path(tmp, name).glob("*.weights.h5"))
            accuracy = _accuracy(model, dev, order, dev_y) if spec["preset_dir"] else None
            rows[name] = {"weights_mib": size / 2**20, "dev_accuracy": accuracy, "rates": [], "others": []}
    for r in range(spec["predict_rounds"] + 1):
        for name, model in models.items():
            clock = Clock()
            model.predict(dev, verbose=0)
            reading = clock.read()
            if r:  # round 0 warms up
                rows[name]["rates"].append(len(dev_x) / reading["s"])
                rows[name]["others"].append(reading["others_cpu_share"])
    prompts = [" ".join(x.split()[:6]) for x in dev_x[:spec["prompts"]]]
    same = same_generations(spec["lm_preset"], formats, prompts) if spec["prompts"] and formats != ["float32"] else {}
    emit("RESULT", {name: {"weights_mib": row["weights_mib"], "dev_accuracy": row["dev_accuracy"],
                           "predict_examples_per_s": median(row["rates"]), "rates": row["rates"],
                           "others_cpu_share": max(row["others"]), "same_greedy_tokens": same.get(name)}
                    for name, row in rows.items()})


def lora_int8_markdown(report: dict) -> str:
    lines = [f"# LoRA and int8 on SST-2 ({report['command']})", "",
             header(report["machine"]) + f"; {report['date']}", "",
             f"Seed 0, the first {report['train_limit'] or 67349:,} SST-2 training sentences, one epoch, batch 32, "
             f"λ = 0; full fine-tuning at peak learning rate {report['learning_rate']:g}, LoRA at "
             f"{report['lora_learning_rate']:g}; dev: the 872 dev sentences.", "",
             "| preset | fine-tuning | dev accuracy | trainable parameters | step (median ms) | epoch (s) | "
             "peak memory (MiB) | memory before fit (MiB) | others' CPU |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, rows in report["finetune"].items():
        for mode, r in rows.items():
            lines.append(f"| {preset} | {mode} | {100 * r['dev_accuracy']:.1f} | {r['trainable_params']:,} "
                         f"({100 * r['trainable_params'] / r['params']:.2f}%) | {r['step_ms_median']:.0f} | "
                         f"{r['fit_s']:.0f} | {r['peak_rss_mib']:.0f} | {r['rss_before_fit_mib']:.0f} | "
                         f"{100 * r['others_cpu_share']:.0f}% |")
    lines += ["", f"Predict: the dev sentences tokenized once, in batches of {report['predict_batch']} sorted by "
              "length bucket (`sorted_batches`). Greedy tokens: the preset's language "
              f"model continuing {report.get('generate_prompts', 0)} prompts by 32 tokens, the share the same as "
              "float32's.", "", "| preset (fully fine-tuned) | weights | weights file (MiB) | dev accuracy | "
              "predict (examples/s) | × float32 | greedy tokens as float32's | others' CPU |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for preset, rows in report["int8"].items():
        base = rows.get("float32", {}).get("predict_examples_per_s")
        for name, r in rows.items():
            same, rate = r.get("same_greedy_tokens"), r["predict_examples_per_s"]
            accuracy = "–" if r["dev_accuracy"] is None else f"{100 * r['dev_accuracy']:.1f}"
            lines.append(f"| {preset} | {name} | {r['weights_mib']:.1f} | {accuracy} | {rate:.0f} | "
                         f"{f'{rate / base:.2f}×' if base else ''} | {'' if same is None else f'{same:.0%}'} | "
                         f"{100 * r['others_cpu_share']:.0f}% |")
    return "\n".join(lines) + "\n"


def run_lora_int8(args, log) -> tuple[dict, str]:
    """``--mode=lora_int8``'s report and its markdown (see the module doc)."""
    unknown = set(args.finetunings) - set(FINETUNINGS)
    if unknown:
        raise app.UsageError(f"--finetunings: unknown {sorted(unknown)}; choose from {list(FINETUNINGS)}")
    glue_dir = str(Path(args.shared_data) / "glue")
    if not Path(glue_dir, "SST-2", "train.tsv").is_file():
        raise app.UsageError(f"--shared_data={args.shared_data}: no glue/SST-2/train.tsv there")
    shown = (("mode", "lora_int8"), ("presets", ",".join(args.presets)), ("train_limit", args.train_limit),
             ("finetunings", ",".join(args.finetunings)), ("weights", ",".join(args.weights)),
             ("predict_batch", args.predict_batch))
    report = {"command": "python -m bench.costs " + " ".join(f"--{k}={v}" for k, v in shown),
              "machine": machine_info(), "date": time.strftime("%Y-%m-%d"), "train_limit": args.train_limit,
              "learning_rate": args.learning_rate, "lora_learning_rate": args.lora_learning_rate,
              "predict_batch": args.predict_batch, "generate_prompts": args.generate_prompts,
              "finetune": {}, "int8": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            report["finetune"][preset] = {}
            for name in args.finetunings if preset != "gpt1" else ():  # gpt1: GPT-1's shapes, speed only
                rank = FINETUNINGS[name]
                spec = {"kind": "lora", "preset": preset, "rank": rank, "train_limit": args.train_limit,
                        "glue_dir": glue_dir, "learning_rate": args.lora_learning_rate if rank else args.learning_rate,
                        "save_to": f"{tmp}/{preset}" if name == "full" else ""}
                log(f"{preset} {name} ...")
                report["finetune"][preset][name] = worker_result(spec, "bench.costs")
                log(f"  {report['finetune'][preset][name]}")
            if "full" in args.finetunings or preset == "gpt1":
                log(f"{preset} weight formats ...")
                spec = {"kind": "int8", "preset_dir": f"{tmp}/{preset}" if preset != "gpt1" else "",
                        "glue_dir": glue_dir, "lm_preset": preset, "weights": args.weights,
                        "predict_rounds": args.predict_rounds, "predict_batch": args.predict_batch,
                        "prompts": args.generate_prompts if preset != "gpt1" else 0}
                report["int8"][preset] = worker_result(spec, "bench.costs")
    return report, lora_int8_markdown(report)


# ----------------------------------------------------------------------------- building a corpus


def run_corpus(args, log) -> tuple[dict, str]:
    """``--mode=corpus``'s report and its markdown: each corpus built by this checkout's code (and, one folder's, by
    ``--baseline_ref``'s)."""
    report = {**new_report("bench.costs"), "vocab": args.vocab, "n_ctx": args.n_ctx, "runs": []}
    data, rows = Path(args.shared_data).resolve(), report["runs"]
    with base_checkout(args.baseline_ref, "corpus_") if args.baseline_ref else contextlib.nullcontext() as base:
        for name in args.corpora.split(","):
            folders = [data / f for f in name.split("+")]
            codes = {"this checkout": ROOT, **({args.baseline_ref: base[0]} if base and len(folders) == 1 else {})}
            for code, source in codes.items():
                with tempfile.TemporaryDirectory(prefix="corpus_build_") as tmp:
                    run = measured_run([sys.executable, "-m", "pipelines.pretrain_data", f"--output_dir={tmp}/data",
                                        f"--input_dir={','.join(map(str, folders))}", f"--tokenizer_dir={tmp}/bpe",
                                        f"--valid_dir={data / 'books' / 'valid'}", f"--n_ctx={args.n_ctx}",
                                        f"--train_tokenizer_vocab={args.vocab}", "--noprogress"], cwd=str(source),
                                       env=child_env(source))
                    if run.pop("returncode"):
                        raise SystemExit(f"{name} ({code}) failed:\n{run['output_tail']}")
                    train = json.loads(Path(tmp, "data", "manifest.json").read_text())["splits"]["train"]
                rows.append({"corpus": name, "code": code, "books": train["num_books"],
                             "tokens": train["stream_tokens"],
                             "mb": sum(p.stat().st_size for f in folders for p in f.rglob("*.txt")) / 1e6,
                             **{k: v for k, v in run.items() if k != "output_tail"}})
                log(json.dumps(rows[-1]))
    lines = [header(report["machine"]), "", "| corpus | training books (MB) | tokens | code | wall s | CPU s | "
             "peak RSS MiB | others' CPU share |", "|---|---:|---:|---|---:|---:|---:|---:|"] + [
        f"| {r['corpus']} | {r['books']} ({r['mb']:.0f}) | {r['tokens']:,} | {r['code']} | {r['seconds']:.0f} | "
        f"{r['cpu_seconds']:.0f} | {r['peak_rss_mib']:.0f} | {r['others_cpu_share']:.0%} |" for r in rows]
    return report, "\n".join(lines) + "\n"


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if args.worker:
        spec = json.loads(args.worker)
        if spec.get("kind") in ("lora", "int8"):
            return {"lora": lora_worker, "int8": int8_worker}[spec["kind"]](spec)
        return worker_main(spec, {"generate": Generate, "exported": Exported})
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if args.mode == "gpt1":
        # Before any worker starts: they inherit the settings the project picks on this machine (as the CLI runs).
        log(apply_settings())
        report, text = run_gpt1(args, log)
        return save_report(report, text, Path(args.out or "bench/results/finetune_gpt1.json"), log)
    if args.mode not in ("lora_int8", "corpus"):
        raise app.UsageError("--mode: gpt1, lora_int8 or corpus")
    report, text = (run_lora_int8 if args.mode == "lora_int8" else run_corpus)(args, log)
    name = {"lora_int8": "lora_int8", "corpus": "corpus_build"}[args.mode]  # the results' file, by CPU
    out = args.out or ROOT / "bench" / "results" / f"{name}_{cpu_slug(report['machine'])}.json"
    save_report(report, text, Path(out), log)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    define_flags()
    app.run(main)
