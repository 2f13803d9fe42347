#!/usr/bin/env bash
# Installs everything the tests need into .venv, runs the lint gates (scripts/lint.sh), then the
# tests, then the XLA plugin's tests in .venv-xla (scripts/test-xla.sh; CORE_XLA_TESTS=0 leaves
# them out). Extra arguments go to pytest: `-m "not slow"` is the fast lane.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh dev || exit $?
# The binding tests need every release of amdsmi and nvidia-ml-py they cover (setup.sh fetched
# them as a best effort): here they are required, so the tests run rather than skip.
if ! PYTHON=.venv/bin/python ./scripts/fetch-bindings.sh; then
    echo "error: could not fetch the amdsmi / nvidia-ml-py releases the binding tests run on" >&2
    exit 1
fi

# The report test opens the HTML report in headless Chromium: Debian's `chromium` package.
# Where this script can install it (root, apt), the test is required: it fails, not skips,
# when Chromium is missing (CORE_REQUIRE_CHROMIUM, as CI=true does).
if ! command -v chromium >/dev/null 2>&1 && [ -x /usr/bin/apt-get ] && [ "$(id -u)" -eq 0 ]; then
    echo "installing Debian's chromium for the report test (apt-get, quietly)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; }; then
        echo "warning: could not install chromium; the report's browser test will fail" >&2
    fi
    export CORE_REQUIRE_CHROMIUM=1
fi

# The lint gates first (seconds); the tests run either way, so one report shows both.
./scripts/lint.sh
lint_status=$?

# The cluster-sweep tests submit to a real Slurm: reach one, or start a single-host one as root
# (scripts/local-slurm.sh), installing Debian's slurm-wlm and munge where this script can (root,
# apt). Best effort: where none can run, those tests skip and say why.
if ! command -v sinfo >/dev/null 2>&1 && [ -x /usr/bin/apt-get ] && [ "$(id -u)" -eq 0 ]; then
    echo "installing Debian's slurm-wlm and munge for the cluster tests (apt-get, quietly)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq >/dev/null && apt-get install -y -qq slurm-wlm munge >/dev/null; }; then
        echo "warning: could not install slurm-wlm; the Slurm tests will skip" >&2
    fi
fi
if slurm_environment="$(./scripts/local-slurm.sh)"; then
    eval "$slurm_environment"
fi

# The tests run in parallel, one pytest-xdist worker per core up to four (most tests wait on a
# process they started, a Slurm job or a sampled meter as often as they compute), unless the
# arguments choose (-n, --numprocesses, -p no:xdist). --dist loadfile runs each test file on one
# worker: the real-Slurm tests share one small cluster, and a seed's toy cell that another seed
# ran is not run again. (loadgroup would not do: pytest-xdist 3.8 cannot tag pytest 9's node ids.)
parallel=(-n auto --maxprocesses=4 --dist loadfile)
for argument in "$@"; do
    case "$argument" in
        -n | -n* | --numprocesses | --numprocesses=* | no:xdist) parallel=() ;;
    esac
done
.venv/bin/python -m pytest "${parallel[@]}" "$@"
status=$?
# pytest exits 5 when it collected no test (e.g. a -k filter that matches nothing): not a failure.
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    status=0
fi

# The XLA plugin's tests run on the real torch-xla, in an environment of its own with the PyTorch
# release torch-xla is built for: scripts/test-xla.sh builds .venv-xla and runs tests/test_xla.py
# there (skipping loudly if it cannot build it). It gets this run's options; test paths given
# here select the main run's tests, so it runs only when they include tests/test_xla.py or none.
xla_options=()
test_paths=0
xla_path=0
for argument in "$@"; do
    if [ -e "${argument%%::*}" ]; then
        test_paths=1
        case "$argument" in *test_xla.py*|tests|tests/|.|./) xla_path=1 ;; esac
    else
        xla_options+=("$argument")
    fi
done
if [ "${CORE_XLA_TESTS:-1}" = "0" ]; then
    echo "XLA tests not run: CORE_XLA_TESTS=0" >&2
elif [ "$test_paths" -eq 0 ] || [ "$xla_path" -eq 1 ]; then
    ./scripts/test-xla.sh "${xla_options[@]}"
    xla_status=$?
    [ "$xla_status" -eq 5 ] && xla_status=0
    [ "$status" -eq 0 ] && status=$xla_status
fi
if [ "$status" -eq 0 ] && [ "$lint_status" -ne 0 ]; then
    echo "the tests passed but the lint gates failed (./scripts/lint.sh)" >&2
    status=1
fi
exit "$status"
