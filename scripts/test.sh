#!/usr/bin/env bash
# Installs everything the tests need into .venv, then runs them. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh dev || exit $?
.venv/bin/python -m pytest "$@"
status=$?
# pytest exits 5 when it collected no test (e.g. a -k filter that matches nothing): not a failure.
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 0
fi
exit "$status"
