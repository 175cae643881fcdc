"""The README's "Python API" block at full scale: SST-2 dev accuracy and wall time of the recipe as written.

    python -m bench.experiments.python_api_sst2                   # -> bench/results/python_api_sst2.{json,md}
    python -m bench.experiments.python_api_sst2 --set "learning_rate=5e-4=>learning_rate=1e-3"   # a recipe tried on dev

The block (after ``<!-- python-api -->`` in README.md) runs in a fresh Python process from the repository
root, as a user would run it; ``--set OLD=>NEW`` edits it first (to try a recipe on dev: batch size,
subsample, learning rate; never the test set). Reported: its wall time (imports, fine-tuning, dev
evaluation, prediction, generation, saving and reloading: all of it), the dev accuracy its ``evaluate``
printed, the CPU, the load average before and after, the commit and the date.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import ROOT
from gpt_tf.precision import cpu_name

BLOCK = re.compile(r"^<!-- python-api -->\n```python\n(?P<body>.*?)^```", re.M | re.S)


def readme_block(readme: str) -> str:
    """The README's Python API block (ValueError if there is none)."""
    match = BLOCK.search(readme)
    if not match:
        raise ValueError("README.md has no <!-- python-api --> block")
    return match.group("body")


def edited(block: str, edits: list[tuple[str, str]]) -> str:
    """``block`` with each ``(old, new)`` replaced; ValueError naming an ``old`` that is not in it."""
    for old, new in edits:
        if old not in block:
            raise ValueError(f"{old!r} is not in the README block")
        block = block.replace(old, new)
    return block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", default=[], help="OLD=>NEW edit of the block (repeatable)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "python_api_sst2"))
    args = parser.parse_args()
    bad = [e for e in args.set if "=>" not in e]
    if bad:
        sys.exit(f"--set takes OLD=>NEW, got {bad}")
    edits = [tuple(e.split("=>", 1)) for e in args.set]
    block = edited(readme_block((ROOT / "README.md").read_text(encoding="utf-8")), edits)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    load_before = os.getloadavg()
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.time() - start
    if proc.returncode:
        sys.exit(f"the block failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    scores = [ast.literal_eval(line) for line in proc.stdout.splitlines() if line.startswith("{'accuracy'")]
    report = {"dev_accuracy": scores[0]["accuracy"] if scores else None, "wall_s": round(wall, 1),
              "edits": edits, "cpu": cpu_name(), "cores": os.cpu_count(), "load_before": load_before,
              "load_after": os.getloadavg(), "commit": commit.strip(), "date": datetime.datetime.now().isoformat(),
              "stdout": proc.stdout[-2000:]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(report, indent=2))
    Path(args.out + ".md").write_text(
        f"README Python API block, full scale: SST-2 dev accuracy **{report['dev_accuracy']:.4f}**, wall time "
        f"**{wall / 60:.1f} min** ({report['cpu']}, {report['cores']} cores, load {load_before[0]:.1f} → "
        f"{report['load_after'][0]:.1f}), commit {report['commit']}, {report['date']}; edits {edits or 'none'}.\n")
    print(json.dumps({k: v for k, v in report.items() if k != "stdout"}, indent=2))


if __name__ == "__main__":
    main()
