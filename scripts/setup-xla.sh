#!/usr/bin/env bash
# Creates .venv-xla: torch-xla with the one PyTorch release it loads under, and core (editable)
# with the `xla`, `zoo`, `inference` and `digits` extras and pytest, every other package at the version constraints.txt
# pins. The XLA plugin's tests and benchmark run there, on XLA's CPU device (PJRT_DEVICE=CPU);
# the main .venv keeps its own PyTorch. Safe to run again: pip only installs what is missing.
#
# torch comes from PyTorch's CPU index where it is reachable (about 200 MB), else from the package
# index (its CUDA build: about 3 GB with NVIDIA's libraries, which run fine without a GPU).
# TORCH_XLA_TORCH_SPEC chooses another build. Prints how long the build took.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${CORE_XLA_VENV:-.venv-xla}"
# The pair pyproject's `xla` extra pins: torch-xla 2.9.0 is built for PyTorch 2.9.
TORCH_XLA_VERSION="2.9.0"
TORCH_VERSION="2.9.0"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
started=$(date +%s)

# The CUDA build of torch takes 7.3 GB installed (measured in .venv-xla) and pip first downloads
# its 3.3 GB of wheels to the temporary folder. A disk that fills half-way through leaves a broken
# environment and a pip traceback, so this says beforehand what is needed and what is free.
INSTALLED_MB=7500
DOWNLOADED_MB=3500

free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
filesystem() { df -P "$1" | awk 'NR == 2 { print $1 }'; }

require_free_disk() {
    local what=$1 venv_folder temp_folder
    venv_folder=$(dirname "$(realpath -m "$VENV")")
    temp_folder=${TMPDIR:-/tmp}
    local -a checks=("$venv_folder:$INSTALLED_MB" "$temp_folder:$DOWNLOADED_MB")
    if [ "$(filesystem "$venv_folder")" = "$(filesystem "$temp_folder")" ]; then
        checks=("$venv_folder:$(( INSTALLED_MB + DOWNLOADED_MB ))")
    fi
    local check folder needed free
    for check in "${checks[@]}"; do
        folder=${check%:*}
        needed=${check##*:}
        free=$(free_mb "$folder")
        if [ "$free" -lt "$needed" ]; then
            echo "setup-xla: $what needs about $needed MB free in $folder; $free MB are free" \
                "(set CORE_XLA_VENV or TMPDIR to a roomier folder, or TORCH_XLA_TORCH_SPEC to a CPU build)" >&2
            exit 1
        fi
    done
}

pip_install() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
pip_install --constraint constraints.txt --upgrade pip >/dev/null
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$TORCH_VERSION'))" \
    >/dev/null 2>&1; then
    if [ -n "${TORCH_XLA_TORCH_SPEC:-}" ]; then
        # Unquoted on purpose: the spec may carry pip options such as --index-url.
        # shellcheck disable=SC2086
        pip_install $TORCH_XLA_TORCH_SPEC
    elif ! pip_install --retries 0 --timeout 20 "torch==$TORCH_VERSION" --index-url "$CPU_INDEX" 2>/dev/null; then
        echo "setup-xla: PyTorch's CPU index is not reachable; torch $TORCH_VERSION from the package index" >&2
        require_free_disk "torch $TORCH_VERSION's CUDA build with NVIDIA's libraries"
        # No wheel cache: the CUDA build's wheels would stay on disk beside what they installed,
        # doubling its footprint; a CI machine starts with an empty cache anyway.
        pip_install --no-cache-dir "torch==$TORCH_VERSION"
    fi
fi
pip_install --constraint constraints.txt setuptools wheel
# The `xla` extra is what `pip install 'core[xla]'` brings: torch-xla and the torch it needs.
pip_install --constraint constraints.txt --no-build-isolation -e ".[xla,zoo,inference,digits]" pytest
installed=$("$VENV/bin/python" -c "from importlib.metadata import version as v; print(v('torch'), v('torch-xla'))")
echo "setup-xla: $VENV has torch and torch-xla $installed, built in $(( $(date +%s) - started ))s" >&2
