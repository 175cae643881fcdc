#!/usr/bin/env bash
# README command 2: set up (with the test extras: pytest, torch CPU, transformers) and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# setup.sh installs gpt-tf editable; PYTHONPATH still puts this checkout first, for a .venv shared by several
# checkouts (git worktrees) whose editable install points at another one, and for the tests' own child processes.
export PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2
# Two workers (pytest-xdist): most tests wait on one-core work (a subprocess's start-up, a server), so two
# of them share the 2 cores well; a file, and tests/serving_e2e/ as a whole, stay on one worker, the
# longest groups handed out first (tests/conftest.py; --no-loadscope-reorder keeps that order instead of
# xdist's by number of tests). Later arguments win: `bash scripts/test.sh -n 0` runs in one process.
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder "$@"
