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


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def processor_name() -> str | None:
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
