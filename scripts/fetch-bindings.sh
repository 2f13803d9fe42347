#!/usr/bin/env bash
# Puts several releases of the vendors' Python bindings side by side, unpacked and not installed,
# for the tests that run the real binding over a simulated native library:
#   .bindings/amdsmi/<version>/amdsmi           tests/test_amdsmi_binding.py, tests/test_amd.py
#   .bindings/nvidia-ml-py/<version>/pynvml.py  tests/test_nvidia_native.py (beside the pinned one)
# Both wheels are pure Python; the native libraries they load are simulated by the tests.
# AMDSMI_VERSIONS / NVML_VERSIONS override the lists (space separated).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
DEST=.bindings

# amdsmi: the releases whose keys differ (docs/amd.md). nvidia-ml-py: the oldest release the
# `nvidia` extra allows and one from the 12 series; the newest is the dev extra's pin.
AMDSMI_VERSIONS="${AMDSMI_VERSIONS:-6.0.2 6.2.4 6.3.0 7.0.2}"
NVML_VERSIONS="${NVML_VERSIONS:-11.525.150 12.535.77}"

unpack() {  # unpack <distribution> <version>
    local folder="$DEST/$1/$2"
    if [ -f "$folder/.complete" ]; then return 0; fi
    local download
    download="$(mktemp -d)"
    trap 'rm -rf "$download"' RETURN
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: "$1==$2" -d "$download"
    rm -rf "$folder"
    "$PY" - "$download" "$folder" <<'PYEOF'
import pathlib, sys, zipfile
(wheel,) = pathlib.Path(sys.argv[1]).glob("*.whl")
zipfile.ZipFile(wheel).extractall(sys.argv[2])
PYEOF
    # Marks a finished unpack, so an interrupted one is redone rather than half used.
    touch "$folder/.complete"
}

for version in $AMDSMI_VERSIONS; do unpack amdsmi "$version"; done
for version in $NVML_VERSIONS; do unpack nvidia-ml-py "$version"; done
