#!/usr/bin/env bash
# Creates .venv and installs core with the extras given as arguments (e.g. `dev`), every package
# at the version constraints.txt pins. Safe to run again: pip only installs what is missing.
#
# CORE_CONSTRAINTS=FILE installs through another constraints file; CORE_CONSTRAINTS=none installs
# the newest releases (scripts/update-pins.sh uses that to move the pins).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${CORE_VENV:-.venv}"
# PyTorch first and pinned: a bare `torch` requirement would let pip pick the registry's newest
# CUDA build (several GB) on a CPU machine. 2.13.0 is the CPU build this project's machines
# carry; set TORCH_SPEC to choose another build (e.g. a CUDA one on a GPU node).
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
CONSTRAINTS="${CORE_CONSTRAINTS:-constraints.txt}"

pip_install() {
    if [ "$CONSTRAINTS" = "none" ]; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    else
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --constraint "$CONSTRAINTS" "$@"
    fi
}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip_install --upgrade pip >/dev/null
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    # Unquoted on purpose: TORCH_SPEC may carry pip options such as --index-url.
    # shellcheck disable=SC2086
    pip_install $TORCH_SPEC
fi
# The build backend is pinned too: pip's isolated build environment would take the newest.
pip_install setuptools wheel
extras=""
if [ "$#" -gt 0 ]; then extras="[$(IFS=,; echo "$*")]"; fi
pip_install --no-build-isolation -e ".${extras}"
# The releases of amdsmi and nvidia-ml-py the binding tests run on (pure Python, unpacked, not
# installed); best effort: without them those tests skip, saying so.
case ",$*," in *,dev,*) PYTHON="$(cd "$VENV" && pwd)/bin/python" scripts/fetch-bindings.sh \
    || echo "setup: binding releases not fetched; their tests will skip" >&2 ;; esac
