"""Shared pytest fixtures."""

import os
from pathlib import Path

import pytest

# The suite runs with TensorFlow's defaults: no settings probe (gpt_tf/autotune.py) in any command it starts,
# so that it stays deterministic and fast; tests/test_autotune.py drives the probe's logic with fake timings.
os.environ["GPT_TF_AUTOTUNE"] = "0"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (the project's real data, beside the repository).

    Skips the test when it is absent, except in CI (CI=true), where its absence is a failure.
    """
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if not path.is_dir():
        message = f"shared data folder not found at {path}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required when CI=true)")
        pytest.skip(message)
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`scripts/test.sh`: two workers, ``--dist loadgroup``), a test file runs whole on
    one worker (its module fixtures are built once) and tests/serving_e2e/ runs whole on one (its package
    fixtures, the exported models and the server, cost ~110 s). Runs before xdist reads the groups."""
    for item in items:
        group = "serving_e2e" if item.path.parent.name == "serving_e2e" else item.path.stem
        item.add_marker(pytest.mark.xdist_group(group))
