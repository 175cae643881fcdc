r"""The shipped presets' logits on fixed text: the proof that a change left the models' outputs alone.

    python tools/preset_logits.py --out=/tmp/this.npz                        # this checkout
    python tools/preset_logits.py --checkout=/tmp/old --out=/tmp/old.npz     # another one (a `git worktree`)
    python tools/preset_logits.py --compare=/tmp/old.npz,/tmp/this.npz       # the largest difference per preset

Each checkout loads its own shipped presets (``gpt1_tiny_books_en``, ``gpt1_small_books_en``) with its own code,
as a user would (``GPT1CausalLM.from_preset``), and writes the float32 logits of four book sentences, tokenized
by the preset's own tokenizer and padded to one length, for every preset (``<name>`` in the ``.npz``). Two
checkouts compare only on the same machine and TensorFlow settings (oneDNN on or off rounds differently): run both
here with the same ``TF_ENABLE_ONEDNN_OPTS``. ``KERAS_BACKEND`` picks the backend both run on.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("gpt1_tiny_books_en", "gpt1_small_books_en")
TEXTS = ["the old man walked slowly into the room and looked at the fire .",
         "she said nothing for a long while .",
         "it was the best of times , it was the worst of times , it was the age of wisdom",
         "the children waited by the door"]


def logits(out: str) -> None:
    """In the checkout's own process: every shipped preset's logits into ``out``."""
    import keras
    import numpy as np

    import gpt_tf

    arrays = {}
    for name in PRESETS:
        lm = gpt_tf.GPT1CausalLM.from_preset(name)
        features = lm.preprocessor.generate_preprocess(TEXTS, sequence_length=24)
        logits_ = lm({"token_ids": features["token_ids"], "padding_mask": features["padding_mask"]})
        arrays[name] = np.asarray(keras.ops.convert_to_numpy(logits_), np.float32)
    np.savez(out, **arrays)


def compare(a: str, b: str) -> None:
    import numpy as np

    left, right = np.load(a), np.load(b)
    for name in PRESETS:
        diff = np.abs(left[name] - right[name])
        print(f"{name}: logits {left[name].shape}, max |difference| {diff.max():.3g}, "
              f"max |logit| {np.abs(left[name]).max():.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", default=str(ROOT), help="the checkout whose code and presets run")
    parser.add_argument("--out", help="the .npz written")
    parser.add_argument("--compare", help="two .npz files, comma-separated")
    parser.add_argument("--in_process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare.split(","))
    if args.in_process:
        return logits(args.out)
    checkout = Path(args.checkout).resolve()
    env = {**os.environ, "PYTHONPATH": str(checkout), "TF_CPP_MIN_LOG_LEVEL": "2", "GPT_TF_AUTOTUNE": "0"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--in_process",
                           f"--out={Path(args.out).resolve()}"], cwd=checkout, env=env, check=False)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
