"""LoRA against full fine-tuning, and int8 against float32, on SST-2 with the shipped presets.

    python -m bench.lora_int8                        # tiny and small, ~40 min on 2 cores
    python -m bench.lora_int8 --presets=gpt1_tiny_books_en --train_limit=2000   # a quick look

For each preset, three fine-tunings of ``GPT1TextClassifier`` through the Python API (``compile`` / ``fit``, the
README's block), each in its own process so that its peak memory is its own: full fine-tuning, and
``backbone.enable_lora(4)`` and ``enable_lora(16)`` (adapters on every block's ``c_attn``; W_y trains too). All
from seed 0 on the first ``--train_limit`` SST-2 training sentences, one epoch, batch 32, the same length-bucket
plan. Each row: dev accuracy (the 872 dev sentences), trainable parameters, the median training step time, the
epoch's wall time, and the process's peak resident memory (and its resident memory before ``fit``).

Then the weight formats (``--weights``, default float32 and int8; ``gpt_tf.gpt1.weight_formats``): the fully
fine-tuned classifier, saved with ``save_to_preset``, is loaded once and copied into each format in one process.
Each row: the preset's weights file size, dev accuracy, and ``predict`` examples/s on the dev sentences at
``--predict_batch`` per call, the models taking turns (``--predict_rounds`` rounds each after one warm-up; the
median). With formats other than float32, the preset's language model generates greedily from
``--generate_prompts`` dev sentences' first words in each format: the share of tokens the same as float32's.

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

from absl import app, flags

from bench.harness import ROOT, Clock, Worker, cpu_slug, emit, header, machine_info, median, save_report

MODES = {"full": None, "lora4": 4, "lora16": 16}
FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_list("presets", ["gpt1_tiny_books_en", "gpt1_small_books_en"], "The presets to fine-tune.")
    flags.DEFINE_list("modes", list(MODES), "full, lora4, lora16.")
    flags.DEFINE_integer("train_limit", 20000, "The first N SST-2 training sentences (0: all 67,349).")
    flags.DEFINE_float("learning_rate", 5e-4, "Full fine-tuning's peak learning rate (the reproduction's SST-2 recipe).")
    flags.DEFINE_float("lora_learning_rate", 2e-3, "LoRA's peak learning rate.")
    flags.DEFINE_integer("predict_rounds", 3, "int8: predict rounds per model after a warm-up round.")
    flags.DEFINE_list("weights", ["float32", "int8"], "The weight formats compared (gpt_tf.gpt1.weight_formats).")
    flags.DEFINE_integer("predict_batch", 64, "Examples per predict call.")
    flags.DEFINE_integer("generate_prompts", 20, "Prompts the language model continues in each format.")
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


def _accuracy(model, x, y, batch: int = 64) -> float:
    return float((model.predict(x, batch_size=batch, verbose=0).argmax(-1) == y).mean())


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


def same_generations(preset: str, formats: list, prompts: list, new_tokens: int = 32) -> dict:
    """The share of greedily generated tokens (``new_tokens`` after each prompt) the same as float32's, per format."""
    import numpy as np

    import gpt_tf
    from gpt_tf.gpt1.weight_formats import with_weights

    lm = gpt_tf.GPT1CausalLM.from_preset(preset)
    ids = {}
    for name in formats:
        model = lm if name == "float32" else with_weights(lm, name)
        model.compile(sampler="greedy")
        x = model.preprocessor.generate_preprocess(prompts, sequence_length=64)
        lengths = np.asarray(x["padding_mask"]).sum(-1)
        out = np.asarray(model.make_generate_function()(x, stop_token_ids=None)["token_ids"])
        ids[name] = [row[n:n + new_tokens] for row, n in zip(out, lengths)]
    return {name: float(np.mean([np.mean(a == b) for a, b in zip(ids[name], ids["float32"])])) for name in formats}


def int8_worker(spec: dict) -> None:
    """The saved float32 classifier against its copies in other weight formats: size, dev accuracy, predict
    examples/s, alternating; the preset's language model's greedy tokens."""
    import keras_hub
    import numpy as np

    import gpt_tf.gpt1  # noqa: F401
    from gpt_tf.gpt1.weight_formats import with_weights

    dev_x, dev_y = sst2(spec["glue_dir"], "dev")
    dev_y = np.array(dev_y)
    formats = spec.get("weights", ["float32", "int8"])
    float32 = keras_hub.models.TextClassifier.from_preset(spec["preset_dir"])
    models = {name: float32 if name == "float32" else with_weights(float32, name) for name in formats}
    batch = spec.get("predict_batch", 64)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models.items():
            model.save_to_preset(f"{tmp}/{name}")
            size = sum(p.stat().st_size for p in Path(tmp, name).glob("*.weights.h5"))
            rows[name] = {"weights_mib": size / 2**20, "dev_accuracy": _accuracy(model, dev_x, dev_y, batch),
                          "rates": [], "others": []}
    for r in range(spec["predict_rounds"] + 1):
        for name, model in models.items():
            clock = Clock()
            model.predict(dev_x, batch_size=batch, verbose=0)
            reading = clock.read()
            if r:  # round 0 warms up
                rows[name]["rates"].append(len(dev_x) / reading["s"])
                rows[name]["others"].append(reading["others_cpu_share"])
    same = same_generations(spec["lm_preset"], formats, [" ".join(x.split()[:6]) for x in dev_x[:spec["prompts"]]]) \
        if spec.get("prompts") and formats != ["float32"] else {}
    emit("RESULT", {name: {"weights_mib": row["weights_mib"], "dev_accuracy": row["dev_accuracy"],
                           "predict_examples_per_s": median(row["rates"]), "rates": row["rates"],
                           "others_cpu_share": max(row["others"]), "same_greedy_tokens": same.get(name)}
                    for name, row in rows.items()})


def run_worker(spec: dict) -> dict:
    worker = Worker(spec, "bench.lora_int8")
    try:
        return worker.read("RESULT")
    finally:
        worker.close()


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
    lines += ["", f"Predict: {report.get('predict_batch', 64)} examples per call. Greedy tokens: the preset's language "
              f"model continuing {report.get('generate_prompts', 0)} prompts by 32 tokens, the share the same as "
              "float32's.", "",
              "| preset (fully fine-tuned) | weights | weights file (MiB) | dev accuracy | predict (examples/s) | "
              "× float32 | greedy tokens as float32's | others' CPU |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for preset, rows in report["int8"].items():
        base = rows.get("float32", {}).get("predict_examples_per_s")
        for name, r in rows.items():
            same, rate = r.get("same_greedy_tokens"), r["predict_examples_per_s"]
            lines.append(f"| {preset} | {name} | {r['weights_mib']:.1f} | {100 * r['dev_accuracy']:.1f} | "
                         f"{rate:.0f} | {f'{rate / base:.2f}×' if base else ''} | "
                         f"{'' if same is None else f'{same:.0%}'} | {100 * r['others_cpu_share']:.0f}% |")
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
              "predict_batch": FLAGS.predict_batch, "generate_prompts": FLAGS.generate_prompts,
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
                report["finetune"][preset][mode] = run_worker(spec)
                log(f"  {report['finetune'][preset][mode]}")
            if "full" in FLAGS.modes:
                log(f"{preset} int8 ...")
                report["int8"][preset] = run_worker({"kind": "int8", "preset_dir": f"{tmp}/{preset}",
                                                     "glue_dir": FLAGS.glue_dir, "weights": FLAGS.weights,
                                                     "predict_rounds": FLAGS.predict_rounds, "lm_preset": preset,
                                                     "predict_batch": FLAGS.predict_batch,
                                                     "prompts": FLAGS.generate_prompts})
    out = Path(FLAGS.output or ROOT / "bench/results" / f"lora_int8_{cpu_slug(info)}.json")
    save_report(report, markdown(report), out, log)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    define_flags()
    app.run(main)
