"""What the result records about the machine and software a run used."""

from __future__ import annotations

import platform
import socket
import sys
from importlib import metadata

from core.storage.results import EnvironmentInfo

# Versions worth recording when the package is present; none is imported to find them.
_LIBRARIES = (
    "torch",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "numpy",
    "pydantic",
    "pluggy",
    "nvidia-ml-py",
    "amdsmi",
    "poptorch",
    "torch-xla",
)


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
    framework_version: str | None, driver_versions: dict[str, str], host_threads: dict[str, int]
) -> EnvironmentInfo:
    libraries = {name: version for name in _LIBRARIES if (version := _version(name)) is not None}
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
