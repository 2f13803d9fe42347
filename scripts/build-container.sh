#!/usr/bin/env bash
# Builds core's container image (containers/Dockerfile, or containers/core.def for Apptainer) for
# one vendor and architecture, and with --sweep runs containers/toy-sweep.toml (6 cells) inside it,
# the database on a bind mount, then `core results` outside reading that database.
#
#   scripts/build-container.sh [--vendor cpu|nvidia|amd|graphcore] [--arch amd64|arm64]
#       [--engine buildah|podman|docker|apptainer] [--tag NAME] [--base IMAGE]
#       [--debian-base] [--wheels DIR] [--torch-index URL|pypi] [--sweep] [--clean]
#
# --debian-base  builds the CPU base over a Debian made here by debootstrap from the Debian mirror
#                (CORE_DEBIAN_MIRROR), for machines that reach no container registry.
# --wheels DIR   mounts a folder of local wheels into the build for pip (e.g. a PyTorch wheel).
# --torch-index  where pip finds PyTorch (default: the vendor's index; `pypi` with --wheels takes
#                a local wheel of the pinned release, e.g. 2.13.0+cpu, before PyPI's).
# PIP_CERT=FILE  mounts that CA bundle into the build for pip (behind a TLS-inspecting proxy).
# --clean        removes the image (and a --debian-base base and its rootfs) at the end.
# STORAGE_DRIVER=vfs and buildah's chroot isolation (the default here) build where overlay mounts,
# user namespaces or cgroups are not allowed. The base image of each vendor is containers/bases.env's.
set -euo pipefail
cd "$(dirname "$0")/.."

VENDOR=cpu
ARCH=""
ENGINE=""
TAG=""
BASE=""
DEBIAN_BASE=0
WHEELS=""
TORCH_INDEX=""
SWEEP=0
CLEAN=0
SUITE="${CORE_DEBIAN_SUITE:-bookworm}"
MIRROR="${CORE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HOST_CORE="${CORE_HOST_COMMAND:-.venv/bin/core}"

fail() {
    echo "build-container: $*" >&2
    exit 2
}
say() { echo "build-container: $*" >&2; }
needs_value() { [ "$#" -ge 2 ] && [ -n "$2" ] || fail "$1 needs a value"; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --vendor) needs_value "$@"; VENDOR="$2"; shift 2 ;;
        --arch) needs_value "$@"; ARCH="$2"; shift 2 ;;
        --engine) needs_value "$@"; ENGINE="$2"; shift 2 ;;
        --tag) needs_value "$@"; TAG="$2"; shift 2 ;;
        --base) needs_value "$@"; BASE="$2"; shift 2 ;;
        --wheels) needs_value "$@"; WHEELS="$2"; shift 2 ;;
        --torch-index) needs_value "$@"; TORCH_INDEX="$2"; shift 2 ;;
        --debian-base) DEBIAN_BASE=1; shift ;;
        --sweep) SWEEP=1; shift ;;
        --clean) CLEAN=1; shift ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) fail "unknown argument '$1' (see --help)" ;;
    esac
done

case "$(uname -m)" in x86_64) HOST_ARCH=amd64 ;; aarch64 | arm64) HOST_ARCH=arm64 ;; *) HOST_ARCH="$(uname -m)" ;; esac
ARCH="${ARCH:-$HOST_ARCH}"
case "$ARCH" in amd64 | arm64) ;; *) fail "invalid --arch '$ARCH': allowed are amd64, arm64" ;; esac
# The vendor and architecture are checked by the install step itself, before anything is built.
CORE_SOURCE=. CORE_VENDOR="$VENDOR" TARGETARCH="$ARCH" containers/install-core.sh --plan >/dev/null
if [ -z "$ENGINE" ]; then
    for candidate in buildah podman docker apptainer; do
        if command -v "$candidate" >/dev/null 2>&1; then ENGINE="$candidate"; break; fi
    done
    [ -n "$ENGINE" ] || fail "no container engine found (buildah, podman, docker or apptainer)"
fi
case "$ENGINE" in buildah | podman | docker | apptainer) ;; *) fail "invalid --engine '$ENGINE': allowed are buildah, podman, docker, apptainer" ;; esac
command -v "$ENGINE" >/dev/null 2>&1 || fail "--engine $ENGINE: not installed"
if [ "$ENGINE" = apptainer ] && [ "$ARCH" != "$HOST_ARCH" ]; then
    fail "invalid --arch '$ARCH' with --engine apptainer: Apptainer builds for this machine's architecture ($HOST_ARCH)"
fi
if [ "$DEBIAN_BASE" = 1 ] && { [ "$VENDOR" != cpu ] || [ "$ARCH" != "$HOST_ARCH" ]; }; then
    fail "--debian-base makes the CPU base for this machine's architecture ($HOST_ARCH), not --vendor $VENDOR --arch $ARCH"
fi
if [ -n "$WHEELS" ]; then [ -d "$WHEELS" ] || fail "invalid --wheels '$WHEELS': not a folder"; WHEELS="$(cd "$WHEELS" && pwd)"; fi

# The vendor's base image, from the one table both recipes use.
bases_value() { sed -n "s/^$1=//p" containers/bases.env; }
if [ -z "$BASE" ]; then BASE="$(bases_value "$(echo "$VENDOR" | tr '[:lower:]' '[:upper:]')_BASE")"; fi
[ -n "$BASE" ] || fail "containers/bases.env names no base image for $VENDOR"
TAG="${TAG:-localhost/core:$VENDOR-$ARCH}"

# buildah reads no STORAGE_DRIVER from the environment (podman does): pass it to both, or the base
# one imports is not where the other builds.
STORE=()
if [ -n "${STORAGE_DRIVER:-}" ] && [ "$ENGINE" != docker ] && [ "$ENGINE" != apptainer ]; then
    STORE=(--storage-driver "$STORAGE_DRIVER")
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/core-container.XXXXXX")"
DEBIAN_IMAGE="localhost/core-debian-base:$SUITE"
cleanup() {
    if [ "$CLEAN" = 1 ]; then
        case "$ENGINE" in
            apptainer) rm -f "$TAG" ;;
            *) "$ENGINE" "${STORE[@]}" rmi -f "$TAG" >/dev/null 2>&1 || true ;;
        esac
        if [ "$DEBIAN_BASE" = 1 ]; then "$ENGINE" "${STORE[@]}" rmi -f "$DEBIAN_IMAGE" >/dev/null 2>&1 || true; fi
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f", end - start }'; }

make_debian_base() {
    command -v debootstrap >/dev/null 2>&1 || fail "--debian-base needs debootstrap (apt-get install debootstrap)"
    [ "$ENGINE" != apptainer ] || fail "--debian-base is for the OCI engines; Apptainer can bootstrap Debian itself (Bootstrap: debootstrap)"
    local started
    started="$(now)"
    say "debootstrap $SUITE from $MIRROR"
    debootstrap --variant=minbase "$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
        { tail -20 "$WORK/debootstrap.log" >&2; fail "debootstrap failed (log above)"; }
    say "rootfs: $(du -sh "$WORK/rootfs" | cut -f1)"
    local importer="$ENGINE"
    [ "$ENGINE" != buildah ] || importer=podman
    command -v "$importer" >/dev/null 2>&1 || fail "--debian-base with --engine buildah imports the rootfs with podman, which is not installed"
    tar -C "$WORK/rootfs" -c . | "$importer" "${STORE[@]}" import - "$DEBIAN_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
    BASE="$DEBIAN_IMAGE"
    say "base $DEBIAN_IMAGE made in $(seconds_since "$started") s"
}

build_image() {
    local arguments=(--build-arg "BASE_IMAGE=$BASE" --build-arg "CORE_VENDOR=$VENDOR")
    local mounts=()
    [ -z "$TORCH_INDEX" ] || arguments+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX")
    if [ -n "$WHEELS" ]; then
        arguments+=(--build-arg "CORE_WHEELS=/core-wheels")
        mounts+=(-v "$WHEELS:/core-wheels:ro")
    fi
    # Behind a TLS-inspecting proxy pip trusts PIP_CERT's bundle here; the build must trust it too.
    # Mounted for the build only: it is not in the image.
    if [ -n "${PIP_CERT:-}" ] && [ "$ENGINE" != docker ]; then
        [ -f "$PIP_CERT" ] || fail "invalid PIP_CERT '$PIP_CERT': not a file"
        arguments+=(--build-arg "CORE_PIP_CERT=/core-ca.crt")
        mounts+=(-v "$PIP_CERT:/core-ca.crt:ro")
    fi
    case "$ENGINE" in
        buildah) buildah "${STORE[@]}" bud --isolation "${BUILDAH_ISOLATION:-chroot}" --network host --platform "linux/$ARCH" \
            "${mounts[@]}" "${arguments[@]}" -f containers/Dockerfile -t "$TAG" . ;;
        podman) podman "${STORE[@]}" build --isolation "${BUILDAH_ISOLATION:-chroot}" --network host --platform "linux/$ARCH" \
            "${mounts[@]}" "${arguments[@]}" -f containers/Dockerfile -t "$TAG" . ;;
        docker)
            [ -z "$WHEELS" ] || fail "--wheels needs podman or buildah (docker build has no build-time mounts of host folders)"
            docker build --network host --platform "linux/$ARCH" "${arguments[@]}" -f containers/Dockerfile -t "$TAG" . ;;
        apptainer)
            # Apptainer binds with --bind; the same HOST:DIR:ro form as the others' -v.
            local binds=()
            for ((i = 1; i < ${#mounts[@]}; i += 2)); do binds+=(--bind "${mounts[i]}"); done
            apptainer build --force "${binds[@]}" "${arguments[@]}" "$TAG" containers/core.def ;;
    esac
}

image_size() {
    case "$ENGINE" in
        apptainer) du -h "$TAG" | cut -f1 ;;
        buildah) buildah "${STORE[@]}" images --format '{{.Size}}' "$TAG" | head -1 ;;
        *) "$ENGINE" "${STORE[@]}" image inspect --format '{{.Size}}' "$TAG" | awk '{ printf "%.0f MB", $1 / 1e6 }' ;;
    esac
}

# Runs `core ARGS` inside the image with HOST_FOLDER at /data. podman and docker run it as a
# container; where the sandbox refuses that (no rlimits, no cgroups), buildah runs it in the
# image's root filesystem with chroot isolation.
run_inside() {
    local folder="$1"
    shift
    case "$ENGINE" in
        apptainer) apptainer exec --bind "$folder:/data" "$TAG" core "$@" ;;
        docker) docker run --rm --network host -v "$folder:/data" "$TAG" "$@" ;;
        podman | buildah)
            if [ "$ENGINE" = podman ] && podman "${STORE[@]}" run --rm --network host "$TAG" --version >/dev/null 2>"$WORK/run-probe.log"; then
                podman "${STORE[@]}" run --rm --network host -v "$folder:/data" "$TAG" "$@"
                return
            fi
            [ "$ENGINE" = buildah ] || say "podman run refused here ($(tail -1 "$WORK/run-probe.log")); running with buildah --isolation chroot"
            local container
            container="$(buildah "${STORE[@]}" from "$TAG")"
            buildah "${STORE[@]}" run --isolation chroot --network host -v "$folder:/data" "$container" -- \
                /opt/core/venv/bin/core "$@" ||
                { local status=$?; buildah "${STORE[@]}" rm "$container" >/dev/null; return "$status"; }
            buildah "${STORE[@]}" rm "$container" >/dev/null ;;
    esac
}

run_toy_sweep() {
    [ "$VENDOR" = cpu ] || fail "--sweep runs the CPU toy sweep: build --vendor cpu"
    [ "$ARCH" = "$HOST_ARCH" ] || fail "--sweep runs the image here: build for this machine's architecture ($HOST_ARCH)"
    [ -x "$HOST_CORE" ] || command -v "$HOST_CORE" >/dev/null 2>&1 ||
        fail "no core outside the image to read the results ($HOST_CORE; set CORE_HOST_COMMAND)"
    local data="$WORK/data" started
    mkdir -p "$data"
    cp containers/toy-sweep.toml "$data/"
    started="$(now)"
    run_inside "$data" sweep /data/toy-sweep.toml --database /data/core.db
    say "sweep inside the image: $(seconds_since "$started") s"
    say "core results outside, reading the bind-mounted database:"
    "$HOST_CORE" results --database "$data/core.db"
}

started="$(now)"
if [ "$DEBIAN_BASE" = 1 ]; then make_debian_base; fi
build_started="$(now)"
build_image
say "built $TAG ($VENDOR, $ARCH, from $BASE) in $(seconds_since "$build_started") s; size $(image_size || echo unknown)"
if [ "$SWEEP" = 1 ]; then run_toy_sweep; fi
say "done in $(seconds_since "$started") s"
