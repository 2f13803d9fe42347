"""This host's roofs, measured: the probe (:mod:`core.roofs.probe`) run once per host, device and
software, its figures cached (:mod:`core.roofs.cache`) and, with ``core roofs``, recorded in a
results database, so a report built on another machine still has them.

The device model is the accelerator's own name for its first device, the name every result of a
run on it records, and the host is the host name every result records: the report matches a cell to
measured roofs by both.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from core.base.roofs import MEASURED_ROOFS_FORMAT, MeasuredRoofs
from core.roofs.cache import HostKey, load_cached, store_cached
from core.roofs.names import dtypes_for
from core.roofs.probe import probe


def _versions() -> tuple[str, str]:
    from importlib import metadata

    import torch

    try:
        core_version = metadata.version("core")
    except metadata.PackageNotFoundError:
        core_version = "unknown"
    return core_version, str(torch.__version__)


def host_key(device: str, torch_device: str = "cpu") -> HostKey:
    """The cache key of ``device`` on this host with this core and torch."""
    core_version, torch_version = _versions()
    return HostKey(socket.gethostname(), device, torch_device, core_version, torch_version)


@dataclass(frozen=True)
class HostRoofs:
    roofs: MeasuredRoofs
    cached: bool  # read from the cache, not measured now
    warnings: list[str]


def measure(key: HostKey, accelerator: str, precisions: Sequence[str], **sizes: int | float) -> MeasuredRoofs:
    """Run the probe for ``key`` now (a few seconds), at the compute dtypes of ``precisions``."""
    figures = probe(key.torch_device, dtypes_for(precisions), **sizes)  # type: ignore[arg-type]
    return MeasuredRoofs(
        format=MEASURED_ROOFS_FORMAT,
        host=key.host,
        device=key.device,
        accelerator=accelerator,
        torch_device=key.torch_device,
        core_version=key.core_version,
        torch_version=key.torch_version,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        probe_seconds=round(figures.seconds, 3),
        memory_bandwidth_bytes_per_second=figures.bandwidth_bytes_per_second,
        peak_flops_per_second=figures.peak_flops_per_second,
        method=figures.method,
    )


def host_roofs(
    accelerator: str, device: str, precisions: Sequence[str], torch_device: str = "cpu", fresh: bool = False
) -> HostRoofs:
    """This host's measured roofs: from the cache where it holds them for this host, device and
    software (unless ``fresh``), else measured now and cached. A cache that cannot be written is a
    warning: the figures are still good for this report."""
    key = host_key(device, torch_device)
    warnings: list[str] = []
    if not fresh:
        cached, warnings = load_cached(key)
        if cached is not None:
            return HostRoofs(cached, True, warnings)
    roofs = measure(key, accelerator, precisions)
    from core.base.files import OutputError

    try:
        store_cached(roofs, key)
    except OutputError as error:
        warnings.append(f"measured roofs not cached: {error}")
    return HostRoofs(roofs, False, warnings)
