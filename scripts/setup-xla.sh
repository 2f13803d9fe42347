#!/usr/bin/env bash
# Creates .venv-xla: torch-xla with the one PyTorch release it loads under, and core (editable)
# with the `xla`, `zoo` and `inference` extras and pytest, every other package at the version constraints.txt
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
        pip_install "torch==$TORCH_VERSION"
    fi
fi
pip_install --constraint constraints.txt setuptools wheel
# The `xla` extra is what `pip install 'core[xla]'` brings: torch-xla and the torch it needs.
pip_install --constraint constraints.txt --no-build-isolation -e ".[xla,zoo,inference]" pytest
installed=$("$VENV/bin/python" -c "from importlib.metadata import version as v; print(v('torch'), v('torch-xla'))")
echo "setup-xla: $VENV has torch and torch-xla $installed, built in $(( $(date +%s) - started ))s" >&2
