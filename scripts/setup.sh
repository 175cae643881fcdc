#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs the pinned stack; `setup.sh dev` adds the test extras.
# Idempotent: re-running only installs what changed in the requirements files.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
req=requirements.txt
[[ "${1:-}" == "dev" ]] && req=requirements-dev.txt
if [[ ! -x .venv/bin/python ]]; then
  echo "==> creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$(cat requirements.txt "$req" | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  echo "==> installing $req (about a minute on a fresh machine)"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  touch "$stamp"
fi
