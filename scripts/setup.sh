#!/usr/bin/env bash
# Creates .venv and installs core with the extras given as arguments (e.g. `dev`).
# Safe to run again: pip only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
# PyTorch first and pinned: a bare `torch` requirement would let pip pick the registry's newest
# CUDA build (several GB) on a CPU machine. 2.13.0 is the CPU build this project's machines
# carry; set TORCH_SPEC to choose another build (e.g. a CUDA one on a GPU node).
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
    # Unquoted on purpose: TORCH_SPEC may carry pip options such as --index-url.
    # shellcheck disable=SC2086
    .venv/bin/python -m pip install --quiet --disable-pip-version-check $TORCH_SPEC
fi
extras=""
if [ "$#" -gt 0 ]; then extras="[$(IFS=,; echo "$*")]"; fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras}"
