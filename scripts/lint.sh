#!/usr/bin/env bash
# The lint gates CI runs before the tests: ruff's linter (complexity at most 15), ruff's formatter
# in check mode, and mypy on core/ and plugins/. Settings live in pyproject.toml.
# Run ./scripts/setup.sh dev first (scripts/test.sh does); `.venv/bin/ruff format .` fixes layout.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${CORE_VENV:-.venv}"

failed=0
run() {
    echo "lint: $*" >&2
    "$@" || failed=1
}
run "$VENV/bin/ruff" check --quiet .
run "$VENV/bin/ruff" format --check --quiet .
run "$VENV/bin/mypy"
if [ "$failed" -ne 0 ]; then
    echo "lint: failed (see above)" >&2
fi
exit "$failed"
