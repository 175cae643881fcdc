"""LoRA against full fine-tuning, and int8 against float32, on SST-2 with the shipped presets.

    python -m bench.lora_int8                        # tiny and small, ~40 min on 2 cores
    python -m bench.lora_int8 --presets=gpt1_tiny_books_en --train_limit=2000   # a quick look

For each preset, three fine-tunings of ``GPT1TextClassifier`` through the Python API (``compile`` / ``fit``, the
README's block), each in its own process so that its peak memory is its own: full fine-tuning, and
``backbone.enable_lora(4)`` and ``enable_lora(16)`` (adapters on every block's ``c_attn``; W_y trains too). All
from seed 0 on the first ``--train_limit`` SST-2 training sentences, one epoch, batch 32, the same length-bucket
plan. Each row: dev accuracy (the 872 dev sentences), trainable parameters, the median training step time, the
epoch's wall time, and the process's peak resident memory (and its resident memory before ``fit``).

Then int8: the fully fine-tuned classifier, saved with ``save_to_preset``, is loaded twice in one process, one
copy ``quantize("int8")``-ed. Each row: the preset's weights file size, dev accuracy, and ``predict`` examples/s on
the dev sentences, the two models taking turns (``--predict_rounds`` rounds each after one warm-up; the median).

The machine may be shared: each timing also records the share of the CPU other processes used meanwhile.
Writes ``bench/results/lora_int8_<cpu>.{json,md}``.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path
from statistics import median

from absl import app, flags

from bench.harness import ROOT, Clock, cpu_slug, emit, header, machine_info, save_report, worker_result

MODES = {"full": None, "lora4": 4, "lora16": 16}
FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_list("presets", ["gpt1_tiny_books_en", "gpt1_small_books_en"], "The presets to fine-tune.")
    flags.DEFINE_list("modes", list(MODES), "full, lora4, lora16.")
    flags.DEFINE_integer("train_limit", 20000, "The first N SST-2 training sentences (0: all 67,349).")
    flags.DEFINE_float("learning_rate", 5e-4, "Full fine-tuning's peak learning rate (the reproduction's SST-2 recipe).")
    flags.DEFINE_float("lora_learning_rate", 2e-3, "LoRA's peak learning rate.")
    flags.DEFINE_integer("predict_rounds", 3, "int8: predict rounds per model after a warm-up round.")
    flags.DEFINE_string("glue_dir", str(ROOT.parent / "shared/data/glue"), "GLUE's folder (SST-2/{train,dev}.tsv).")
    flags.DEFINE_string("output", "", "The report (JSON; .md beside it). Default: bench/results/lora_int8_<cpu>.json.")
    flags.DEFINE_string("worker", None, "Internal: run one measurement (a JSON spec) and answer on stdout.")


def sst2(glue_dir: str, split: str, limit: int = 0):
    """SST-2's texts and labels as the project reads them (``gpt_tf.data.task_readers``), the first ``limit`` (0: all)."""
    from gpt_tf.data.task_readers import read_examples
    from gpt_tf.tasks import get_task

    examples = read_examples(get_task("sst2"), Path(glue_dir) / "SST-2", split)[0]
    examples = examples[:limit] if limit else examples
    return [e.text_a for e in examples], [e.label for e in examples]


def rss_mib() -> dict:
    """This process's resident memory now and at its peak, MiB."""
    with open("/proc/self/status") as f:
        now = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"now": now / 1024, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _accuracy(model, x, y) -> float:
    return float((model.predict(x, batch_size=64, verbose=0).argmax(-1) == y).mean())


def finetune_worker(spec: dict) -> None:
    """One fine-tuning (full or LoRA): fit, evaluate, and the measurements; saves the full one for the int8 step."""
    import keras
    import keras_hub
    import numpy as np

    import gpt_tf.gpt1  # noqa: F401  (registers the family and its presets)
    from gpt_tf.gpt1.batching import bucketed

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
    before = rss_mib()

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    steps = StepClock()
    clock = Clock()
    classifier.fit(train, steps_per_epoch=steps_per_epoch, epochs=1, callbacks=[steps], verbose=0)
    fit = clock.read()
    peak = rss_mib()["peak"]
    result = {
        "dev_accuracy": _accuracy(classifier, dev_x, np.array(dev_y)),
        "trainable_params": trainable, "params": total,
        "step_ms_median": 1000 * median(steps.seconds[10:] or steps.seconds), "steps": len(steps.seconds),
        "fit_s": fit["s"], "others_cpu_share": fit["others_cpu_share"],
        "rss_before_fit_mib": before["now"], "peak_rss_mib": peak,
    }
    if spec.get("save_to"):
        classifier.save_to_preset(spec["save_to"])
    emit("RESULT", result)


def int8_worker(spec: dict) -> None:
    """The saved float32 classifier against its int8 copy: size, dev accuracy, predict examples/s, alternating."""
    import keras_hub
    import numpy as np

    import gpt_tf.gpt1  # noqa: F401

    dev_x, dev_y = sst2(spec["glue_dir"], "dev")
    dev_y = np.array(dev_y)
    models = {"float32": keras_hub.models.TextClassifier.from_preset(spec["preset_dir"]),
              "int8": keras_hub.models.TextClassifier.from_preset(spec["preset_dir"])}
    models["int8"].quantize("int8")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models.items():
            model.save_to_preset(f"{tmp}/{name}")
            size = sum(p.stat().st_size for p in Path(tmp, name).glob("*.weights.h5"))
            rows[name] = {"weights_mib": size / 2**20, "dev_accuracy": _accuracy(model, dev_x, dev_y), "rates": [],
                          "others": []}
    for r in range(spec["predict_rounds"] + 1):
        for name, model in models.items():
            clock = Clock()
            model.predict(dev_x, batch_size=64, verbose=0)
            reading = clock.read()
            if r:  # round 0 warms up
                rows[name]["rates"].append(len(dev_x) / reading["s"])
                rows[name]["others"].append(reading["others_cpu_share"])
    emit("RESULT", {name: {"weights_mib": row["weights_mib"], "dev_accuracy": row["dev_accuracy"],
                           "predict_examples_per_s": median(row["rates"]), "rates": row["rates"],
                           "others_cpu_share": max(row["others"])} for name, row in rows.items()})


def markdown(report: dict) -> str:
    lines = [f"# LoRA and int8 on SST-2 ({report['command']})", "", header(report["machine"]) + f"; {report['date']}", "",
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
    lines += ["", "| preset (fully fine-tuned) | weights | weights file (MiB) | dev accuracy | predict (examples/s) | "
              "others' CPU |", "|---|---|---:|---:|---:|---:|"]
    for preset, rows in report["int8"].items():
        for name, r in rows.items():
            lines.append(f"| {preset} | {name} | {r['weights_mib']:.1f} | {100 * r['dev_accuracy']:.1f} | "
                         f"{r['predict_examples_per_s']:.0f} | {100 * r['others_cpu_share']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    if FLAGS.worker:
        spec = json.loads(FLAGS.worker)
        (int8_worker if spec.get("kind") == "int8" else finetune_worker)(spec)
        return
    unknown = set(FLAGS.modes) - set(MODES)
    if unknown:
        raise app.UsageError(f"--modes: unknown {sorted(unknown)}; choose from {list(MODES)}")
    if not Path(FLAGS.glue_dir, "SST-2", "train.tsv").is_file():
        raise app.UsageError(f"--glue_dir={FLAGS.glue_dir}: no SST-2/train.tsv there")
    info = machine_info()
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    report = {"command": "python -m bench.lora_int8 " + " ".join(
        f"--{k}={v}" for k, v in (("presets", ",".join(FLAGS.presets)), ("train_limit", FLAGS.train_limit))),
              "machine": info, "date": time.strftime("%Y-%m-%d"), "train_limit": FLAGS.train_limit,
              "learning_rate": FLAGS.learning_rate, "lora_learning_rate": FLAGS.lora_learning_rate,
              "finetune": {}, "int8": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in FLAGS.presets:
            report["finetune"][preset] = {}
            for mode in FLAGS.modes:
                rank = MODES[mode]
                spec = {"preset": preset, "rank": rank, "train_limit": FLAGS.train_limit, "glue_dir": FLAGS.glue_dir,
                        "learning_rate": FLAGS.lora_learning_rate if rank else FLAGS.learning_rate,
                        "save_to": f"{tmp}/{preset}" if mode == "full" else ""}
                log(f"{preset} {mode} ...")
                report["finetune"][preset][mode] = worker_result(spec, "bench.lora_int8")
                log(f"  {report['finetune'][preset][mode]}")
            if "full" in FLAGS.modes:
                log(f"{preset} int8 ...")
                spec = {"kind": "int8", "preset_dir": f"{tmp}/{preset}", "glue_dir": FLAGS.glue_dir,
                        "predict_rounds": FLAGS.predict_rounds}
                report["int8"][preset] = worker_result(spec, "bench.lora_int8")
    out = Path(FLAGS.output or ROOT / "bench/results" / f"lora_int8_{cpu_slug(info)}.json")
    save_report(report, markdown(report), out, log)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    define_flags()
    app.run(main)
