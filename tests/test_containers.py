"""The container recipes (containers/): the Dockerfile and the Apptainer definition parse, share one
install step pinned by constraints.txt, and their build arguments cover every vendor and
architecture. The image build itself, with a 6-cell sweep inside it, runs only where
CORE_CONTAINER_TESTS=1 and an engine works (tests below say why they skip)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_install import _canonical, _pins, _requirement_name, tomllib

ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = ROOT / "containers"
INSTALL = CONTAINERS / "install-core.sh"
BUILD = ROOT / "scripts" / "build-container.sh"
VENDORS = ("cpu", "nvidia", "amd", "graphcore")
ARCHITECTURES = ("amd64", "arm64")
# ROCm PyTorch and the Poplar SDK are built for x86-64 only.
X86_ONLY = {"amd", "graphcore"}
DOCKERFILE_INSTRUCTIONS = {"FROM", "ARG", "ENV", "LABEL", "COPY", "RUN", "ENTRYPOINT", "CMD", "WORKDIR"}
DEFINITION_SECTIONS = {"arguments", "files", "post", "environment", "runscript", "labels", "help"}


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (CONTAINERS / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        instructions.append((keyword, arguments.strip()))
        pending = ""
    assert not pending, "containers/Dockerfile ends inside a continued line"
    return instructions


def _definition() -> tuple[dict[str, str], dict[str, list[str]]]:
    """The Apptainer definition's header keywords and its sections' lines."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (CONTAINERS / "core.def").read_text().splitlines():
        if line.startswith("%"):
            name = line[1:].strip()
            assert name not in sections, f"core.def: section %{name} twice"
            current = sections.setdefault(name, [])
        elif current is not None:
            if line.strip():
                current.append(line.strip())
        elif line.strip() and not line.startswith("#"):
            keyword, _, value = line.partition(":")
            header[keyword.strip()] = value.strip()
    return header, sections


def _bases() -> dict[str, str]:
    bases: dict[str, str] = {}
    for line in (CONTAINERS / "bases.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            bases[name] = value
    return bases


def _plan(vendor: str, arch: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORE_SOURCE": str(ROOT), "CORE_VENDOR": vendor, "TARGETARCH": arch, **environment}
    for name in ("TORCH_SPEC", "TORCH_VERSION", "TORCH_INDEX_URL", "CORE_CONSTRAINTS"):
        if name not in environment:
            env.pop(name, None)
    return subprocess.run(["bash", str(INSTALL), "--plan"], env=env, capture_output=True, text=True, timeout=30)


def _setup_torch_pin() -> str:
    match = re.search(r'TORCH_SPEC="\$\{TORCH_SPEC:-torch==([0-9.]+)\}"', (ROOT / "scripts" / "setup.sh").read_text())
    assert match, "scripts/setup.sh no longer pins PyTorch in TORCH_SPEC"
    return match.group(1)


def test_the_dockerfile_parses_and_takes_its_base_and_vendor_as_build_arguments() -> None:
    instructions = _dockerfile_instructions()
    unknown = {keyword for keyword, _ in instructions} - DOCKERFILE_INSTRUCTIONS
    assert not unknown, f"containers/Dockerfile: unknown instructions {unknown}"
    keywords = [keyword for keyword, _ in instructions]
    assert keywords.count("FROM") == 1, "one recipe for every variant, no stage per vendor"
    before_from = instructions[: keywords.index("FROM")]
    assert before_from == [("ARG", "BASE_IMAGE=debian:bookworm-slim")]
    assert dict(instructions)["FROM"] == "${BASE_IMAGE}"
    arguments = {arguments.split("=")[0] for keyword, arguments in instructions if keyword == "ARG"}
    assert {"CORE_VENDOR", "TARGETARCH", "TORCH_VERSION", "TORCH_INDEX_URL", "TORCH_SPEC"} <= arguments
    assert {"CORE_WHEELS", "CORE_PIP_CERT", "CORE_CONSTRAINTS"} <= arguments
    assert dict(instructions)["ENTRYPOINT"] == '["core"]'


def test_the_dockerfile_copies_files_that_exist_and_runs_the_shared_install() -> None:
    instructions = _dockerfile_instructions()
    copied = [source for keyword, arguments in instructions if keyword == "COPY" for source in arguments.split()[:-1]]
    assert {"constraints.txt", "scripts/setup.sh", "containers/install-core.sh"} <= set(copied)
    missing = [source for source in copied if not (ROOT / source).exists()]
    assert not missing, f"containers/Dockerfile copies what the repository lacks: {missing}"
    runs = [arguments for keyword, arguments in instructions if keyword == "RUN"]
    assert runs == ["/opt/core/src/containers/install-core.sh"]


def test_the_apptainer_definition_parses_and_shares_the_dockerfiles_install() -> None:
    header, sections = _definition()
    assert header == {"Bootstrap": "docker", "From": "{{ BASE_IMAGE }}"}
    assert set(sections) <= DEFINITION_SECTIONS, f"core.def: unknown sections {set(sections) - DEFINITION_SECTIONS}"
    declared = {line.split("=")[0] for line in sections["arguments"]}
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", (CONTAINERS / "core.def").read_text()))
    assert used <= declared, f"core.def uses undeclared build arguments {used - declared}"
    assert {"BASE_IMAGE", "CORE_VENDOR", "CORE_CONSTRAINTS"} <= declared
    docker_arguments = {
        arguments.split("=")[0] for keyword, arguments in _dockerfile_instructions() if keyword == "ARG"
    }
    assert declared <= docker_arguments, f"build arguments only core.def takes: {declared - docker_arguments}"
    files = {line.split()[0]: line.split()[1] for line in sections["files"]}
    docker_copied = {
        source
        for keyword, arguments in _dockerfile_instructions()
        if keyword == "COPY"
        for source in arguments.split()[:-1]
    }
    assert set(files) == docker_copied, "the two recipes must put the same files in the image"
    assert all(destination.startswith("/opt/core/src/") for destination in files.values())
    assert "/opt/core/src/containers/install-core.sh" in sections["post"]
    assert sections["runscript"] == ['exec core "$@"']


def test_every_vendor_has_a_base_image_and_the_default_is_the_dockerfiles() -> None:
    bases = _bases()
    assert set(bases) == {f"{vendor.upper()}_BASE" for vendor in VENDORS}
    assert bases["CPU_BASE"] == "debian:bookworm-slim"
    header, sections = _definition()
    assert "BASE_IMAGE=debian:bookworm-slim" in sections["arguments"]
    assert bases["GRAPHCORE_BASE"].startswith("graphcore/pytorch:")
    assert bases["NVIDIA_BASE"].startswith("nvidia/cuda:") and bases["AMD_BASE"].startswith("rocm/")


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_install_plan_covers_each_vendor_and_architecture(vendor: str, arch: str) -> None:
    planned = _plan(vendor, arch)
    if vendor in X86_ONLY and arch == "arm64":
        assert planned.returncode == 2
        assert f"invalid CORE_VENDOR = '{vendor}' with TARGETARCH = 'arm64'" in planned.stderr
        assert "amd64 only" in planned.stderr
        return
    assert planned.returncode == 0, planned.stderr
    plan = dict(line.split("=", 1) for line in planned.stdout.splitlines())
    assert (plan["vendor"], plan["arch"]) == (vendor, arch)
    assert plan["extra"] == ("" if vendor == "cpu" else vendor)
    if vendor == "graphcore":
        # The SDK image's own torch; its stack predates the pins.
        assert (plan["torch"], plan["constraints"]) == ("torch==2.0.1", "none")
    else:
        assert plan["torch"].startswith(f"torch=={_setup_torch_pin()}")
        assert plan["constraints"] == "constraints.txt"
    # A CPU image must not take PyPI's several-GB CUDA build of x86-64.
    if (vendor, arch) == ("cpu", "amd64"):
        assert plan["torch"].endswith("--index-url https://download.pytorch.org/whl/cpu")


def test_each_vendors_extra_is_pinned_in_constraints_txt() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = _pins()
    for vendor in ("nvidia", "amd"):
        names = {_requirement_name(requirement) for requirement in extras[vendor]}
        assert names and names <= set(pins), f"{vendor}: unpinned {names - set(pins)}"
    assert _canonical("nvidia-ml-py") in pins and "amdsmi" in pins


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"CORE_VENDOR": "intel"}, "invalid CORE_VENDOR = 'intel': allowed are cpu, nvidia, amd, graphcore"),
        ({"TARGETARCH": "riscv64"}, "invalid TARGETARCH = 'riscv64': allowed are amd64 (x86-64) and arm64"),
    ],
)
def test_a_bad_vendor_or_architecture_is_refused_naming_it(environment: dict[str, str], message: str) -> None:
    planned = _plan("cpu", "amd64", **environment)
    assert planned.returncode == 2
    assert message in planned.stderr


def test_the_build_script_refuses_bad_choices_before_building() -> None:
    for arguments, message in [
        (["--vendor", "intel"], "invalid CORE_VENDOR = 'intel'"),
        (["--vendor", "amd", "--arch", "arm64"], "ROCm PyTorch is built for amd64 only"),
        (["--arch", "s390x"], "invalid --arch 's390x': allowed are amd64, arm64"),
        (["--engine", "lxc"], "invalid --engine 'lxc'"),
        (["--wheels", "/nonexistent-wheels"], "invalid --wheels '/nonexistent-wheels': not a folder"),
        (["--colour"], "unknown argument '--colour'"),
    ]:
        done = subprocess.run(
            ["bash", str(BUILD), "--engine", "docker", *arguments], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 2, (arguments, done.stderr)
        assert message in done.stderr, (arguments, done.stderr)


def _container_skip_reason() -> str | None:
    if os.environ.get("CORE_CONTAINER_TESTS") != "1":
        return "the image build takes minutes and downloads packages: set CORE_CONTAINER_TESTS=1 to run it"
    for tool in ("buildah", "podman", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y podman buildah debootstrap)"
    probe = subprocess.run(
        ["buildah", "--storage-driver", "vfs", "from", "--name", "core-probe", "scratch"],
        capture_output=True,
        text=True,
    )
    subprocess.run(["buildah", "--storage-driver", "vfs", "rm", "core-probe"], capture_output=True)
    if probe.returncode != 0:
        return f"buildah cannot make a container here: {probe.stderr.strip()}"
    if not (ROOT / ".venv" / "bin" / "core").exists():
        return "no .venv/bin/core to read the results outside the image (./scripts/setup.sh)"
    return None


CONTAINER_SKIP = _container_skip_reason()


@pytest.mark.slow
@pytest.mark.skipif(CONTAINER_SKIP is not None, reason=f"CONTAINER BUILD SKIPPED: {CONTAINER_SKIP}")
def test_the_cpu_image_builds_and_runs_a_sweep_whose_results_core_reads_outside(tmp_path: Path) -> None:
    # A machine's local PyTorch wheel (this project's CPU machines carry one) before PyPI's.
    wheels = (
        ["--wheels", "/opt/wheels", "--torch-index", "pypi"] if any(Path("/opt/wheels").glob("torch-*.whl")) else []
    )
    done = subprocess.run(
        ["bash", str(BUILD), "--engine", "buildah", "--debian-base", *wheels, "--sweep", "--clean", "--tag",
         "localhost/core:test-cpu"],
        env={**os.environ, "STORAGE_DRIVER": "vfs", "TMPDIR": str(tmp_path)},
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("container-toy ")]
    assert len(rows) == 6 and all(" ok " in row for row in rows), done.stdout
