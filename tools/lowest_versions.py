r"""The oldest stack pyproject.toml allows: constraints that pin every runtime and serving dependency to its lower
bound (and everything else to constraints.txt's pin), to prove the lower bounds with a run of the suite.

    python tools/lowest_versions.py > /tmp/lowest.txt
    python -m venv .venv-lowest
    .venv-lowest/bin/pip install -c /tmp/lowest.txt -e ".[serving]" pytest pytest-xdist hypothesis
    .venv-lowest/bin/python -m pytest -n 2 tests/test_tokenizer.py tests/test_transforms.py tests/test_task_data.py \
        tests/test_pipelines.py tests/test_shakespeare.py tests/test_gpt1_family.py tests/test_model_cards.py \
        tests/test_gpt1_fit.py tests/test_gpt1_presets_cli.py tests/test_train.py tests/test_run_folder.py \
        tests/test_protos.py tests/test_serving_units.py tests/test_keras_hub_adapter.py

A lower bound ``>=X`` becomes ``==X``; a dependency of those (a package pyproject does not name) keeps its
constraints.txt pin unless it conflicts, and then the resolver says so. The tests listed need nothing of the
``dev`` extra (no PyTorch, JAX or ``transformers``).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower())


def lowest() -> dict[str, str]:
    """{distribution: its lower bound} of the runtime dependencies and the serving extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["serving"]]:
        found = re.search(r">=\s*([\w.]+)", requirement)
        if found:
            bounds[_name(requirement)] = found.group(1)
    return bounds


def constraints() -> str:
    bounds = lowest()
    lines = []
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#") and _name(line.split("==")[0]) in bounds:
            continue
        lines.append(line)
    lines += [f"{name}=={version}" for name, version in sorted(bounds.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(constraints())
