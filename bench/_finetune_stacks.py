"""The stacks `bench/finetune_speed.py` times (its speed, ab and profile modes; ``bench/costs.py``'s ``gpt1``
too), each in its own worker process, and the data they share.

``prepare_data``: an 8k BPE trained with the project's tokenizer on the first ``books`` Gutenberg
books of ``../shared/data/books/train``; the SST-2 training texts (``glue/SST-2/train.tsv``,
67,349) tokenized with it into the project's task TFRecords, 6% of them held out by id hash as the
``dev`` split that evaluation reads (so both phases run on training texts); and, for PyTorch, the
same records as token-id views (``<s> text <e>``, cut to n_ctx as `gpt_tf.data.transforms` does).
``gpt1_task_data``: a task's records in GPT-1's BPE and its first epoch's plan, for ``ours`` at GPT-1's size.

``ours``: `gpt_tf.training.task_objective.Finetuner`, the loop `python -m gpt_tf.train --task=sst2` runs: its
tf.data pipeline, its `strategy.run` train step (forward, Eq. 5 loss, backward, clipping, AdamW)
and its `predict` (the ``tiny`` size, or the spec's ``model``: ``gpt1`` for ``bench.costs --mode=gpt1``, on
any task's records).
``hf``: `transformers.Trainer` fine-tuning `OpenAIGPTForSequenceClassification`
of the same shape, driven from a callback, with dynamic padding (each batch padded to its longest
text) and ``train_sampling_strategy="group_by_length"`` (transformers 5's name for
``group_by_length=True``; it also orders evaluation by length).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from bench.harness import DATA, ROOT, TASK_FOLDERS, cpu_seconds, emit as _emit, use_speed_choices

VIEWS_FILE = "views.json"
HOLDOUT_FRACTION = 0.06


def train_bpe(root: Path, shared: Path, books: int, log=print) -> Path:
    """``root/bpe8k``: an 8k BPE trained on the first ``books`` books of ``shared/books/train`` (once)."""
    from gpt_tf.text.tokenizer import GPTTokenizer
    from pipelines.books import Book, find_book_files, load_book

    bpe = root / "bpe8k"
    if not (bpe / "encoder.json").exists():
        files = find_book_files(shared / "books" / "train")[:books]
        texts = [b.text for b in (load_book(f, shared / "books" / "train") for f in files) if isinstance(b, Book)]
        log(f"training an 8k BPE on {len(texts)} books")
        GPTTokenizer.train(texts, 8000, str(bpe), show_progress=False)
    return bpe


def every_length_buckets(n_ctx: int) -> tuple[int, ...]:
    """A bucket per length, 1 ... ``n_ctx``: the finest grid (the ``ours_every_length_lm0_bf16`` stack)."""
    return tuple(range(1, n_ctx + 1))


def define_data_flags(out: str) -> None:
    """The fine-tuning benches' shared flags: where their data lives (cached) and where the report goes."""
    from absl import flags

    flags.DEFINE_string("data_root", "data/bench_finetune_speed", "BPE and task records (cached; built on first use)")
    flags.DEFINE_string("shared_data", str(DATA), "the shared data folder (books, GLUE)")
    flags.DEFINE_string("out", out, "the JSON report (the .md goes beside it)")


def prepare_data(root: Path, shared: Path, books: int, n_ctx: int, log=print) -> Path:
    """Builds (or finds) the BPE, the SST-2 records and the PyTorch views under ``root``; returns the task folder."""
    from pipelines.finetune_data import build_task_data

    bpe, task_dir = train_bpe(root, shared, books, log), root / "sst2"
    build_task_data("sst2", shared / "glue" / "SST-2", bpe, task_dir, splits=["train"],
                    holdout_fraction=HOLDOUT_FRACTION, show_progress=False)
    views = task_dir / VIEWS_FILE
    if not views.exists():
        views.write_text(json.dumps({split: _views(task_dir, split, n_ctx) for split in ("train", "dev")}))
    return task_dir


def gpt1_task_data(shared: Path, task: str, batch_size: int) -> tuple[Path, int, list]:
    """The data of ``ours`` at GPT-1's size (``bench.costs --mode=gpt1``): the task's records tokenized with
    GPT-1's BPE (``data/tasks_gpt1/<task>``, built when missing), its ``configs/finetune_<task>_gpt1.flags``'s
    ``--n_ctx``, and its first epoch's plan: each global batch's padded length, in the order the fine-tuning loop
    (seed 0) takes them."""
    import tensorflow as tf

    from gpt_tf.data.records import read_manifest
    from gpt_tf.data.task_batches import bucket_lengths, epoch_plan
    from gpt_tf.data.transforms import load_task_spec, record_lengths
    from pipelines.finetune_data import build_task_data

    folder = Path(f"data/tasks_gpt1/{task}")
    build_task_data(task, shared / TASK_FOLDERS[task], shared / "gpt1_bpe", folder, show_progress=False,
                    **({"holdout_fraction": 0.2} if task == "story_cloze" else {}))
    flagfile = (ROOT / "configs" / f"finetune_{task}_gpt1.flags").read_text()
    n_ctx = int(next(line for line in flagfile.splitlines() if line.startswith("--n_ctx=")).split("=")[1])
    entry = read_manifest(str(folder))["splits"]["train"]
    records = next(iter(tf.data.TFRecordDataset(str(folder / entry["file"]), "GZIP").batch(entry["examples"] + 1)))
    lengths = record_lengths(load_task_spec(str(folder)), records, n_ctx)
    return folder, n_ctx, epoch_plan(lengths, bucket_lengths(n_ctx), batch_size, 0, 0, True)[1].numpy().tolist()


def _views(task_dir: Path, split: str, n_ctx: int) -> dict:
    """The split's records as ``<s> a <e>`` id lists (single-input truncation) and labels, in file order."""
    import tensorflow as tf

    from gpt_tf.config import get_size
    from gpt_tf.data.transforms import parse_record, special_ids_from_config

    special = special_ids_from_config(get_size("tiny"))
    ids, labels = [], []
    for s in tf.data.TFRecordDataset(str(task_dir / f"{split}.tfrecord.gz"), compression_type="GZIP"):
        record = parse_record(s)
        ids.append([special["start"], *record["tokens_a"].numpy()[: n_ctx - 2].tolist(), special["extract"]])
        labels.append(int(record["label"]))
    return {"input_ids": ids, "labels": labels, "pad": special["pad"]}


def lengths_summary(task_dir: Path) -> dict:
    views = json.loads((task_dir / VIEWS_FILE).read_text())
    out = {}
    for split, v in views.items():
        n = sorted(len(x) for x in v["input_ids"])
        out[split] = {"examples": len(n), "mean_tokens": round(sum(n) / len(n), 2), "median_tokens": n[len(n) // 2],
                      "max_tokens": n[-1]}
    return out


def padding_summary(task_dir: Path, batch_size: int, n_ctx: int) -> dict:
    """Tokens per training example after padding, over one epoch of SST-2's training texts: ours
    (the real `epoch_plan`, default buckets) and HF Trainer's (its `group_by_length` sampler,
    `get_length_grouped_indices`, then each batch padded to its longest text as `HF.collate` does)."""
    import numpy as np
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    from gpt_tf.data.task_batches import bucket_lengths, epoch_plan

    lengths = np.array([len(x) for x in json.loads((task_dir / VIEWS_FILE).read_text())["train"]["input_ids"]])
    _, padded = epoch_plan(lengths, bucket_lengths(n_ctx), batch_size, 0, 0, training=True)
    _, every = epoch_plan(lengths, every_length_buckets(n_ctx), batch_size, 0, 0, training=True)
    order = np.array(get_length_grouped_indices(lengths.tolist(), batch_size,
                                                generator=torch.Generator().manual_seed(0)))
    hf_batches = [lengths[order[i:i + batch_size]] for i in range(0, len(order), batch_size)]
    hf = sum(b.max() * len(b) for b in hf_batches) / len(order)
    return {"unpadded": round(float(lengths.mean()), 2), "ours_buckets": round(float(np.mean(padded)), 2),
            "ours_every_length": round(float(np.mean(every)), 2),
            "hf_group_by_length": round(float(hf), 2)}


# ----------------------------------------------------------------------------- ours


class Ours:
    """`Finetuner` on the bench data: ``train(k)`` runs k real train steps, ``evaluate()`` one `predict` pass."""

    def __init__(self, spec):
        import tempfile

        import keras
        import tensorflow as tf

        from gpt_tf.config import get_size
        from gpt_tf.training.task_objective import FinetuneConfig, Finetuner
        from gpt_tf.data.transforms import load_task_spec

        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
        if spec["precision"] != "float32":
            keras.mixed_precision.set_dtype_policy(spec["precision"])
        task_dir = spec["task_dir"]
        model_config = get_size(spec.get("model", "tiny"), n_ctx=spec["n_ctx"])
        use_speed_choices(model_config, "float32" if spec["precision"] == "float32" else "bfloat16")
        config = FinetuneConfig(data_dir=task_dir, run_dir=tempfile.mkdtemp(prefix="finetune_speed_"),
                                batch_size=spec["batch_size"], lm_coef=spec["lm_coef"], precision=spec["precision"],
                                seed=0, length_buckets=spec["buckets"])
        self.tuner = Finetuner(load_task_spec(task_dir), model_config, config, tf.distribute.get_strategy(),
                               log=lambda m: None)
        if spec.get("every_length"):  # a bucket per length: read by the datasets built below and by predict
            self.tuner.buckets = every_length_buckets(spec["n_ctx"])
        self.iterator = iter(self.tuner._dataset(self.tuner.heads[0], "train", training=True))
        self.step, self.batch_size = self.tuner._train_steps[0], spec["batch_size"]
        self.no_stop = tf.constant(0.0)  # the update's stop request (TrainLoop.make_update)
        self.info = {"n_params": int(sum(v.shape.num_elements() for v in self.tuner.model.trainable_variables)),
                     "buckets": list(getattr(self.tuner, "buckets", [spec["n_ctx"]]))}

    def train(self, steps: int) -> dict:
        model = self.tuner.heads[0].model
        for _ in range(steps):
            model.reset_metrics()  # as the loop does before each update
            self.step(self.iterator, self.no_stop)
        return {"examples": steps * self.batch_size, "loss": float(model.get_metrics_result()["loss"])}

    def evaluate(self) -> dict:
        outs, _ = self.tuner.predict("dev")
        return {"examples": int(len(outs))}

    def seek(self, batch: int) -> None:
        """The next step takes the run's global batch ``batch`` (``bench.costs --mode=gpt1``: a step of a
        chosen length)."""
        self.iterator = iter(self.tuner._dataset(self.tuner.heads[0], "train", training=True, start_batch=batch))


def _stepped(paced, serve) -> bool:
    """After one training step of a paced stack (``KerasFit``, ``HF``): whether its training is to stop (its chunk
    ended and ``serve`` has no further chunk)."""
    paced.done += 1
    return paced.done == paced.target and not serve(paced)


class KerasFit:
    """The Python API: ``GPT1TextClassifier.fit`` / ``predict`` on the same SST-2 token ids, in the length-bucketed
    batches of ``gpt_tf.gpt1.batching`` (``bucketed`` for ``fit``: the command line's order; ``sorted_batches`` for
    ``predict``), each padded to its bucket; the update is the model's ``train_step``, as the loop's. As HF's
    ``Trainer`` below: one ``fit`` call for the whole run, paused every k steps by a callback (``serve``), so a chunk
    times ``fit``'s steady state, as a user's epoch sees it."""

    def __init__(self, spec, serve):
        import keras
        import numpy as np
        import tensorflow as tf

        import gpt_tf
        from gpt_tf.config import get_size
        from gpt_tf.gpt1.batching import bucketed, sorted_batches
        from gpt_tf.nn.optim import WarmupDecay, make_optimizer
        from gpt_tf.data.records import read_manifest

        tf.config.threading.set_intra_op_parallelism_threads(spec["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(spec["threads"])
        if spec["precision"] != "float32":
            keras.mixed_precision.set_dtype_policy(spec["precision"])
        keras.utils.set_random_seed(0)
        views = json.loads((Path(spec["task_dir"]) / VIEWS_FILE).read_text())
        tokenizer = gpt_tf.GPT1Tokenizer(read_manifest(spec["task_dir"])["tokenizer"]["dir"])
        backbone = gpt_tf.GPT1Backbone.from_gpt_config(get_size("tiny", n_ctx=spec["n_ctx"]), dtype=spec["precision"])
        preprocessor = gpt_tf.GPT1TaskPreprocessor(tokenizer, sequence_length=spec["n_ctx"])
        self.model = gpt_tf.GPT1TextClassifier(backbone, 2, preprocessor, lm_coef=spec["lm_coef"], compile=False)
        schedule = WarmupDecay(6.25e-5, 10, 10**6, "linear")  # a fixed schedule: no retrace between fit calls
        self.model.compile(optimizer=make_optimizer(schedule))
        ragged = lambda rows: tf.ragged.constant([r[1:-1] for r in rows], tf.int32)  # noqa: E731  (<s>, <e> off)
        train_y = np.asarray(views["train"]["labels"])
        self.train_batches, _ = bucketed(preprocessor, {"sentence": ragged(views["train"]["input_ids"])}, train_y,
                                 batch_size=spec["batch_size"])
        self.dev, _ = sorted_batches(preprocessor, {"sentence": ragged(views["dev"]["input_ids"])},
                                     batch_size=spec["batch_size"])
        self.info = {"n_params": int(sum(v.shape.num_elements() for v in self.model.trainable_variables)),
                     "buckets": "the command line's bucketed order (gpt_tf.gpt1.batching)"}
        self.done, self.target, bench = 0, 0, self

        class Pace(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if _stepped(bench, serve):
                    self.model.stop_training = True

        self.pace = Pace()

    def run(self) -> None:
        self.model.fit(self.train_batches.repeat(), steps_per_epoch=10**9, epochs=1, callbacks=[self.pace], verbose=0)

    def evaluate(self) -> dict:
        out = self.model.predict(self.dev, verbose=0)
        return {"examples": int(len(out))}


# ----------------------------------------------------------------------------- transformers


class HF:
    """`transformers.Trainer` fine-tuning `OpenAIGPTForSequenceClassification`, paused every k steps by a callback."""

    def __init__(self, spec, serve):
        import tempfile

        import torch
        from transformers import OpenAIGPTForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

        from bench._train_stacks import hf_config
        from gpt_tf.config import get_size

        torch.set_num_threads(spec["threads"])
        torch.manual_seed(0)
        views = json.loads((Path(spec["task_dir"]) / VIEWS_FILE).read_text())
        self.pad = views["train"]["pad"]
        config = hf_config(get_size("tiny", n_ctx=spec["n_ctx"]), summary_first_dropout=0.1, num_labels=2,
                           pad_token_id=self.pad)
        model = OpenAIGPTForSequenceClassification(config)
        self.data = {split: [{"input_ids": ids, "labels": y} for ids, y in zip(v["input_ids"], v["labels"])]
                     for split, v in views.items()}
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="finetune_speed_hf_"), use_cpu=True,
            bf16=spec["precision"] == "bfloat16",
            per_device_train_batch_size=spec["batch_size"], per_device_eval_batch_size=spec["batch_size"],
            train_sampling_strategy="group_by_length", learning_rate=6.25e-5, lr_scheduler_type="linear",
            warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0, max_steps=10**6, seed=0,
            dataloader_num_workers=0, logging_strategy="no", save_strategy="no", eval_strategy="no",
            report_to="none", disable_tqdm=True)
        bench = self

        class Pace(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if _stepped(bench, serve):
                    control.should_training_stop = True

        self.trainer = Trainer(model=model, args=args, train_dataset=self.data["train"], data_collator=self.collate,
                               callbacks=[Pace()])
        self.done, self.target = 0, 0
        self.info = {"n_params": int(sum(p.numel() for p in model.parameters() if p.requires_grad))}

    def collate(self, rows):
        """Dynamic padding: each batch padded to its longest text (what DataCollatorWithPadding does)."""
        import torch

        longest = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), longest), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, :len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["labels"] for r in rows])}

    def run(self) -> None:
        self.trainer.train()

    def evaluate(self) -> dict:
        out = self.trainer.predict(self.data["dev"])
        return {"examples": int(len(out.predictions))}


# ----------------------------------------------------------------------------- worker process

TAG = "@@finetune_speed "


def emit(kind: str, payload: dict) -> None:
    _emit(kind, payload, TAG)


def _timed(fn) -> dict:
    start_wall, start_cpu = time.perf_counter(), cpu_seconds()
    out = fn()
    return {**out, "s": time.perf_counter() - start_wall, "cpu_s": cpu_seconds() - start_cpu,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def worker_main(spec: dict, more: dict | None = None) -> None:
    """Answers ``train`` (``spec['train_steps']`` steps) and ``eval`` (one pass) lines on stdin until it closes;
    ``more``: other stacks by name (a class as ``Ours``, with ``evaluate`` at least)."""
    stacks = {"ours": Ours, **(more or {})}
    if spec["stack"] in stacks:
        stack = stacks[spec["stack"]](spec)
        emit("READY", stack.info)
        for line in sys.stdin:
            command = line.strip()
            if command.startswith("seek "):  # untimed: the iterator the next steps read
                stack.seek(int(command.split()[1]))
                command = "train"
            emit("DONE", _timed(lambda: stack.train(spec["train_steps"]) if command == "train" else stack.evaluate()))
        return

    def serve(paced) -> bool:
        """Between training chunks of a paced stack (HF's ``Trainer``, Keras's ``fit``): answer commands; True to
        train the next chunk, False at the end."""
        if paced.target:  # a chunk just ended
            emit("DONE", {"examples": spec["train_steps"] * spec["batch_size"],
                          "s": time.perf_counter() - paced.start, "cpu_s": cpu_seconds() - paced.start_cpu})
        for line in sys.stdin:
            if line.strip() == "eval":
                emit("DONE", _timed(paced.evaluate))
                continue
            paced.target = paced.done + spec["train_steps"]
            paced.start, paced.start_cpu = time.perf_counter(), cpu_seconds()
            return True
        return False

    paced = (KerasFit if spec["stack"] == "keras_fit" else HF)(spec, serve)
    emit("READY", paced.info)
    if serve(paced):
        paced.run()
