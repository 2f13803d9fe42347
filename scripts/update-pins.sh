#!/usr/bin/env bash
# Tests core against the newest releases of everything it installs, and moves the pins there.
#
# Builds a fresh virtual environment without constraints.txt (CORE_CONSTRAINTS=none), runs the
# whole suite in it, and only if it passes rewrites constraints.txt from what was installed.
# Review `git diff constraints.txt`, then commit it with the suite's result in the message.
# Extra arguments go to pytest (e.g. -x).
set -uo pipefail
cd "$(dirname "$0")/.."

venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
echo "fresh environment without pins: $venv" >&2
CORE_VENV="$venv" CORE_CONSTRAINTS=none ./scripts/setup.sh nvidia amd tensorflow zoo data report dev || exit $?
"$venv/bin/python" -m pytest "$@"
status=$?
if [ "$status" -ne 0 ]; then
    echo "the suite failed against the newest releases (exit $status); constraints.txt is unchanged" >&2
    exit "$status"
fi
{
    sed -n '/^#/p' constraints.txt
    # torch is chosen by TORCH_SPEC, core is this checkout.
    "$venv/bin/python" -m pip freeze --all --exclude-editable | grep -viE '^(torch|core)==' | sort -f
} > constraints.txt.new && mv constraints.txt.new constraints.txt
echo "constraints.txt now pins the newest releases the suite passed with; review git diff constraints.txt" >&2
