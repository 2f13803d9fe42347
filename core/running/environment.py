"""What the result records about the machine and software a run used."""

from __future__ import annotations

import platform
import socket
import sys
from collections.abc import Sequence
from importlib import metadata

from core.base.results import EnvironmentInfo

# What core itself runs on, recorded when present; a vendor's packages come from its plugin
# (core_register_packages). None is imported to find its version.
CORE_PACKAGES = ("torch", "tensorflow", "tensorflow-cpu", "keras", "numpy", "pydantic", "pluggy")


# What a fork server read before it forked its runs (read_before_forking, one of its preloads):
# every run forked from it runs with the modules that server imported, on its machine. Reading a
# package's version parses its METADATA file (about 1.5 ms each here) and platform.platform()
# reads the interpreter's binary for its C library's version: together a tenth of a tiny forked
# run. Any other process reads them afresh for each run.
_versions_before_fork: dict[str, str | None] = {}
_processor_before_fork: list[str | None] = []


def _read_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _version(distribution: str) -> str | None:
    if distribution in _versions_before_fork:
        return _versions_before_fork[distribution]
    return _read_version(distribution)


def read_before_forking() -> None:
    """Read now what each run records of its software and machine (core's packages and its own
    version, the plugins' packages, the platform, the processor), so that this process and the
    runs it forks answer from what was read: for a fork server, whose runs are forks of it."""
    from core.contract.manager import get_plugin_manager

    names = dict.fromkeys([*CORE_PACKAGES, "core", *get_plugin_manager().package_names()])
    _versions_before_fork.update({name: _read_version(name) for name in names})
    platform.platform()  # the platform module keeps its answer for the process (and its forks)
    _processor_before_fork[:] = [_read_processor_name()]


def processor_name() -> str | None:
    if _processor_before_fork:
        return _processor_before_fork[0]
    return _read_processor_name()


def _read_processor_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect_environment(
    framework_version: str | None,
    driver_versions: dict[str, str],
    host_threads: dict[str, int],
    packages: Sequence[str] = (),
) -> EnvironmentInfo:
    """:param packages: the plugins' packages (core_register_packages), recorded beside core's own
    where installed."""
    names = dict.fromkeys([*CORE_PACKAGES, *packages])
    libraries = {name: version for name in names if (version := _version(name)) is not None}
    return EnvironmentInfo(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        python_version=sys.version.split()[0],
        core_version=_version("core") or "unknown",
        framework_version=framework_version,
        library_versions=libraries,
        driver_versions=driver_versions,
        processor=processor_name(),
        host_threads=host_threads,
    )
