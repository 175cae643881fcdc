r"""Weight digests of three small runs: the proof that a change to the code left training's arithmetic alone.

    python tools/weight_digests.py                       # this checkout
    python tools/weight_digests.py --checkout=/tmp/old   # another one (e.g. a `git worktree` of main)

It runs, as a user would, from the checkout's root and with the checkout's code: the books → TFRecords builder
on two real books (GPT-1's BPE, context 32), 20 updates of pre-training (``--model=test``, ``--deterministic``),
SST-2 fine-tuned from that run, and a multi-task run (RTE with STS-B as the auxiliary task) from it, each on
the first 64 examples of its split. It prints one JSON object: for each run, the SHA-256 over its last
checkpoint's model tensors (names in sorted order with their bytes), over the tensors' bytes alone (the
same when only variable names changed) and over the sorted digests of the tensors one by one (``tensors_set``:
the same when only names or places changed, as when the model's layout did), the number of tensors, and the
training losses of every update (``losses``, from the run's TensorBoard log).

Two checkouts give the same digests only on the same machine and TensorFlow settings (oneDNN on or off rounds
differently): run both here, one after the other. ``--data`` is the shared data folder (default:
``../shared/data`` beside this checkout).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--batch_size=8", "--seed=3", "--deterministic", "--progress=false", "--json", "--log_every=1"]


def run(checkout: Path, module: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout), "TF_CPP_MIN_LOG_LEVEL": "2", "GPT_TF_AUTOTUNE": "0"}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=checkout, env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        sys.exit(f"{module} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def digests(run_dir: Path) -> dict:
    """The SHA-256s of the last checkpoint's model tensors (the optimizer's slots and seed generators left out)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(str(run_dir / "checkpoints"))
    names = sorted(n for n in reader.get_variable_to_shape_map()
                   if n.startswith("model") and "seed_generator" not in n and "OPTIMIZER_SLOT" not in n)
    named, values = hashlib.sha256(), hashlib.sha256()
    for name in names:
        data = reader.get_tensor(name).tobytes()
        named.update(name.encode() + b"\0" + data)
        values.update(data)
    each = sorted(hashlib.sha256(reader.get_tensor(name).tobytes()).hexdigest() for name in names)
    return {"named": named.hexdigest(), "values": values.hexdigest(),
            "tensors_set": hashlib.sha256("".join(each).encode()).hexdigest(), "tensors": len(names),
            "losses": losses(run_dir)}


def losses(run_dir: Path) -> dict:
    """The run's training losses by TensorBoard tag (``train/loss``; per task in a multi-task run,
    ``train/<task>/loss``), each a list in step order (one per logged update)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    by_tag = {}
    for path in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag.startswith("train/") and value.tag.endswith("loss"):
                    by_tag.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return {tag: [steps[step] for step in sorted(steps)] for tag, steps in sorted(by_tag.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", default=str(ROOT), help="the checkout whose code runs (default: this one)")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="the shared data folder")
    args = parser.parse_args()
    checkout, data = Path(args.checkout).resolve(), Path(args.data).resolve()
    bpe = data / "gpt1_bpe"
    with tempfile.TemporaryDirectory(prefix="digests-") as tmp:
        root = Path(tmp)
        for split, names in (("train", ("b0000", "b0001")), ("valid", ("b0019",))):
            (root / "books" / split).mkdir(parents=True)
            for name in names:
                src = next((data / "books").glob(f"*/{name}.txt"))
                (root / "books" / split / src.name).write_bytes(src.read_bytes()[:60_000])
        run(checkout, "pipelines.pretrain_data", f"--input_dir={root / 'books' / 'train'}",
            f"--valid_dir={root / 'books' / 'valid'}", f"--output_dir={root / 'lm_data'}", f"--tokenizer_dir={bpe}",
            "--n_ctx=32", "--shard_size=16", "--progress=false")
        for task, folder in (("sst2", "SST-2"), ("rte", "RTE"), ("stsb", "STS-B")):
            run(checkout, "pipelines.finetune_data", f"--task={task}", f"--data_dir={data / 'glue' / folder}",
                f"--tokenizer_dir={bpe}", f"--output_dir={root / task}", "--max_examples=64", "--progress=false")
        runs = {"pretraining": root / "pre", "finetuning": root / "sst2_run", "multi_task": root / "rte_stsb_run"}
        run(checkout, "gpt_tf.train", "--model=test", f"--data_dir={root / 'lm_data'}", f"--run_dir={runs['pretraining']}",
            "--train_steps=20", "--checkpoint_every=20", "--warmup_steps=2", "--learning_rate=1e-3", "--eval_batches=1",
            "--sample_length=4", *COMMON)
        start = f"--init_checkpoint={runs['pretraining']}"
        run(checkout, "gpt_tf.train", "--task=sst2", f"--data_dir={root / 'sst2'}", f"--run_dir={runs['finetuning']}",
            start, "--epochs=2", "--learning_rate=1e-3", *COMMON)
        run(checkout, "gpt_tf.train", "--task=rte", f"--data_dir={root / 'rte'}", f"--aux_data_dirs={root / 'stsb'}",
            f"--run_dir={runs['multi_task']}", start, "--epochs=2", "--learning_rate=1e-3", *COMMON)
        print(json.dumps({name: digests(path) for name, path in runs.items()}, indent=1))


if __name__ == "__main__":
    main()
