#!/usr/bin/env bash
# Puts the Python layer of several amdsmi releases side by side under .amdsmi-versions/<version>/amdsmi
# (pure-Python wheels, unpacked; nothing is installed), for tests/test_amdsmi_binding.py.
# The wheels need ROCm's libamd_smi.so at run time; the tests simulate it at the ctypes layer.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
DEST=.amdsmi-versions
mkdir -p "$DEST/wheels"
for version in ${AMDSMI_VERSIONS:-6.0.2 6.2.4 6.3.0 7.0.2}; do
    if [ -d "$DEST/$version/amdsmi" ]; then continue; fi
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "amdsmi==$version" -d "$DEST/wheels" 2>/dev/null
    "$PY" - "$DEST/wheels/amdsmi-$version-py3-none-any.whl" "$DEST/$version" <<'PYEOF'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PYEOF
done
