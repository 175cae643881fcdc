#!/usr/bin/env bash
# README command 2: set up (with the test extras: pytest, torch CPU, transformers) and run the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev || exit $?
# setup.sh installs gpt-tf editable; PYTHONPATH still puts this checkout first, for a .venv shared by several
# checkouts (git worktrees) whose editable install points at another one, and for the tests' own child processes.
export PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2
# Two workers (pytest-xdist): most tests wait on one-core work (a subprocess's start-up, a server), so two
# of them share the 2 cores well; a file, and tests/serving_e2e/ as a whole, stay on one worker, the
# longest groups handed out first (tests/conftest.py; --no-loadscope-reorder keeps that order instead of
# xdist's by number of tests). Later arguments win: `bash scripts/test.sh -n 0` runs in one process.
PYTEST=(.venv/bin/python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder)
"${PYTEST[@]}" "$@"
status=$?

# The numerics-sensitive tests (tests/conftest.py's NUMERICS) a second time, with TensorFlow's oneDNN rewrites in
# the mode this run did not use: TensorFlow turns them on by itself on CPUs with AVX-512's neural-network
# instructions and leaves them off on AVX2-only ones, and the two round differently, so every run sees what both
# kinds of CPU compute. No test selected (a run of other files) is not a failure.
onednn=$(.venv/bin/python -c "from tensorflow.python.util import _pywrap_util_port as p; print(int(p.IsMklEnabled()))" \
         2>/dev/null | tail -n 1)
if [[ "$onednn" != 0 && "$onednn" != 1 ]]; then
  echo "==> cannot tell whether TensorFlow's oneDNN rewrites are on here; the numerics tests ran in one mode only" >&2
  exit 1
fi
flip=$((1 - onednn))
echo "==> the numerics tests again with oneDNN's rewrites $( ((flip)) && echo on || echo off)" \
     "(TF_ENABLE_ONEDNN_OPTS=$flip; the run above had them $( ((onednn)) && echo on || echo off))"
TF_ENABLE_ONEDNN_OPTS=$flip "${PYTEST[@]}" -m numerics "$@"
flipped=$?
[[ $flipped == 5 ]] && flipped=0  # pytest: no test collected
exit $(( status != 0 ? status : flipped ))
