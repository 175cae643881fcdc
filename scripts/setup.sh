#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs gpt-tf into it, editable, with the `serving` extra (export, server,
# client: what the README's commands use): `pip install -c constraints.txt -e ".[serving]"`; `setup.sh dev` adds
# the test and benchmark extras (`-e ".[dev]"`, which includes `serving`). pyproject.toml declares ranges;
# constraints.txt pins the one stack the tests and the README's numbers ran on, so both modes install exactly it.
# Idempotent: re-running installs again only when pyproject.toml or constraints.txt changed (a stamp per mode
# in .venv). Measured on a fresh .venv (README, "Install"): the runtime stack 49-77 s and 2.5 GB; the test
# extras 60-63 s more, 3.7 GB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
PIN=(-c constraints.txt)  # the tested stack; pyproject.toml's ranges alone would take the newest releases
mode=runtime target=".[serving]"
[[ "${1:-}" == "dev" ]] && mode=dev target=".[dev]"
stamp() { echo ".venv/.installed-$1-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"; }

# torch is a test-time reference only. On Linux x86_64, PyPI's torch is the CUDA build: a 527 MB wheel
# that pulls 17 CUDA 13 packages (cuBLAS 423 MB, cuDNN 366 MB, ...). PyTorch's index has the CPU build
# (192 MB); it is taken from there when that index answers, at constraints.txt's pin (`torch==X`, which the CPU
# build `X+cpu` meets), and the dev install then keeps it. Where only PyPI answers, pip installs PyPI's build
# with the rest.
cpu_torch() {
  [[ "$(uname -sm)" == "Linux x86_64" ]] || return 0
  local pin
  pin=$(grep -oE '^torch==[^ #]+' constraints.txt)  # tests/test_dependencies.py checks it finds the one pin
  "${PIP[@]}" "${PIN[@]}" --retries 0 --extra-index-url https://download.pytorch.org/whl/cpu "$pin+cpu" 2>/dev/null \
    || echo "==> torch's CPU build is not reachable (download.pytorch.org): PyPI's CUDA build instead, several GB"
}

if [[ ! -x .venv/bin/python ]]; then
  echo "==> creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
if [[ ! -f "$(stamp "$mode")" ]]; then
  echo "==> pip install -c constraints.txt -e \"$target\" (on a fresh machine about 1 min for the runtime stack, 1 more for the test extras)"
  "${PIP[@]}" --upgrade pip
  [[ "$mode" == dev ]] && cpu_torch
  # setuptools warns on every editable install that folders named like the packages may shadow them: here
  # they are the packages themselves.
  PYTHONWARNINGS="ignore:Editable installation" "${PIP[@]}" "${PIN[@]}" -e "$target"
  touch "$(stamp "$mode")" "$(stamp runtime)"  # the test extras include the runtime stack and `serving`
fi
# gpt_tf's fused CPU kernels (gpt_tf/speed/kernels): built once per machine (~10 s) into ~/.cache/gpt_tf/kernels.
# Without a C++ compiler this prints why and training runs TensorFlow's stock ops (same results, slower).
.venv/bin/python -m gpt_tf.speed.kernels
