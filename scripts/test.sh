#!/usr/bin/env bash
# README command 2: set up (with the test extras: pytest, torch CPU, transformers) and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m pytest -q "$@"
