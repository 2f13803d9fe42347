#!/usr/bin/env bash
# Installs core into a container image, the one step the Dockerfile, the Apptainer definition and
# scripts/build-container.sh's chroot fallback share: Python where the base image has none, then
# scripts/setup.sh (the same install as outside a container: a venv, PyTorch first, core and the
# vendor's extra, every package at the version constraints.txt pins).
#
# Settings, from the environment (build arguments of the same names):
#   CORE_VENDOR       cpu | nvidia | amd | graphcore (default cpu): the extra and PyTorch build
#   TARGETARCH        amd64 | arm64 (set by the image builder; default: this machine's)
#   TORCH_VERSION     PyTorch release (default: scripts/setup.sh's TORCH_SPEC pin)
#   TORCH_INDEX_URL   package index for PyTorch (default: the vendor's, see torch_index_url; `pypi`: PyPI)
#   TORCH_SPEC        the whole pip argument list for PyTorch; overrides the two above
#   CORE_WHEELS       a folder of local wheels pip may take (e.g. a torch wheel mounted at build)
#   CORE_PIP_CERT     a CA bundle pip trusts (a site's TLS-inspecting proxy), mounted at build
#   CORE_CONSTRAINTS  constraints file (default constraints.txt; for graphcore `none`: the SDK's
#                     older stack cannot meet the pins)
#
# `install-core.sh --plan` prints what it would install and changes nothing.
set -euo pipefail

SOURCE="${CORE_SOURCE:-/opt/core/src}"
export CORE_VENV="${CORE_VENV:-/opt/core/venv}"
VENDOR="${CORE_VENDOR:-cpu}"

fail() {
    echo "install-core: $*" >&2
    exit 2
}

machine_architecture() {
    case "$(uname -m)" in
        x86_64) echo amd64 ;;
        aarch64 | arm64) echo arm64 ;;
        *) uname -m ;;
    esac
}
ARCH="${TARGETARCH:-$(machine_architecture)}"

case "$ARCH" in
    amd64 | arm64) ;;
    *) fail "invalid TARGETARCH = '$ARCH': allowed are amd64 (x86-64) and arm64 (aarch64)" ;;
esac

# The extra each vendor installs (pyproject.toml's optional-dependencies); the CPU needs none.
case "$VENDOR" in
    cpu) EXTRA="" ;;
    nvidia | amd | graphcore) EXTRA="$VENDOR" ;;
    *) fail "invalid CORE_VENDOR = '$VENDOR': allowed are cpu, nvidia, amd, graphcore" ;;
esac
case "$VENDOR/$ARCH" in
    amd/arm64) fail "invalid CORE_VENDOR = 'amd' with TARGETARCH = 'arm64': ROCm PyTorch is built for amd64 only" ;;
    graphcore/arm64) fail "invalid CORE_VENDOR = 'graphcore' with TARGETARCH = 'arm64': the Poplar SDK is built for amd64 only" ;;
esac

# Where each vendor's PyTorch build lives. Empty: PyPI, whose Linux x86-64 wheel is the CUDA build
# and whose aarch64 wheel the CPU one. The CUDA and ROCm lines must match the base image's.
torch_index_url() {
    case "$VENDOR/$ARCH" in
        cpu/amd64) echo "https://download.pytorch.org/whl/cpu" ;;
        cpu/arm64 | nvidia/amd64) echo "" ;;
        nvidia/arm64) echo "https://download.pytorch.org/whl/cu128" ;;
        amd/amd64) echo "https://download.pytorch.org/whl/rocm6.4" ;;
    esac
}

# The release scripts/setup.sh pins, read from it so that the two cannot disagree.
setup_torch_version() {
    sed -n 's/^TORCH_SPEC="\${TORCH_SPEC:-torch==\([0-9][0-9.]*\)}"$/\1/p' "$SOURCE/scripts/setup.sh"
}

if [ -z "${TORCH_SPEC:-}" ]; then
    if [ "$VENDOR" = graphcore ]; then
        # The SDK image carries PopTorch's own torch (2.0.1), which the venv sees and setup.sh keeps.
        TORCH_SPEC="torch==2.0.1"
    else
        version="${TORCH_VERSION:-$(setup_torch_version)}"
        [ -n "$version" ] || fail "no PyTorch version: set TORCH_VERSION (scripts/setup.sh's pin was not found)"
        index="${TORCH_INDEX_URL:-$(torch_index_url)}"
        [ "$index" != pypi ] || index=""
        TORCH_SPEC="torch==$version${index:+ --index-url $index}"
    fi
fi
export TORCH_SPEC
# The Graphcore SDK's stack (torch 2.0.1, its NumPy, Python 3.10) predates the pins (NumPy 2.4
# needs Python 3.11): there core's own requirements take their newest releases that fit.
if [ "$VENDOR" = graphcore ]; then
    CONSTRAINTS="${CORE_CONSTRAINTS:-none}"
else
    CONSTRAINTS="${CORE_CONSTRAINTS:-constraints.txt}"
fi

if [ "${1:-}" = --plan ]; then
    printf 'vendor=%s\narch=%s\nextra=%s\ntorch=%s\nconstraints=%s\n' "$VENDOR" "$ARCH" "$EXTRA" "$TORCH_SPEC" "$CONSTRAINTS"
    exit 0
fi
if [ -n "${CORE_WHEELS:-}" ]; then
    [ -d "$CORE_WHEELS" ] || fail "invalid CORE_WHEELS = '$CORE_WHEELS': not a folder"
    export PIP_FIND_LINKS="$CORE_WHEELS"
fi
if [ -n "${CORE_PIP_CERT:-}" ]; then
    [ -f "$CORE_PIP_CERT" ] || fail "invalid CORE_PIP_CERT = '$CORE_PIP_CERT': not a file"
    export PIP_CERT="$CORE_PIP_CERT"
fi
export PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore

# Python 3.10 or newer with venv; Debian and Ubuntu bases get their own from apt.
python_is_usable() {
    command -v python3 >/dev/null 2>&1 &&
        python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1
}
if ! python_is_usable; then
    command -v apt-get >/dev/null 2>&1 || fail "the base image has no Python 3.10+ with venv and no apt-get to install one"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends python3 python3-venv ca-certificates
    rm -rf /var/lib/apt/lists/*
    python_is_usable || fail "python3 $(python3 -V 2>&1) is older than 3.10, which core needs"
fi

if [ "$VENDOR" = graphcore ]; then
    # PopTorch and gcipuinfo are installed in the SDK image's own Python: the venv must see them.
    python3 -m venv --system-site-packages "$CORE_VENV"
fi
PYTHON=python3 CORE_CONSTRAINTS="$CONSTRAINTS" "$SOURCE/scripts/setup.sh" $EXTRA
"$CORE_VENV/bin/core" plugins >/dev/null
echo "install-core: core for $VENDOR on $ARCH in $CORE_VENV (PyTorch: $TORCH_SPEC)"
