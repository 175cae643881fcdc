"""Shared pytest fixtures."""

import os
from pathlib import Path

import pytest


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
