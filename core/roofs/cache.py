"""Measured roofs cached per host, so the probe runs once per host, device and software, not per report.

One JSON file per key under the user's cache directory (``$XDG_CACHE_HOME/core/roofs``, else
``~/.cache/core/roofs``). The key is what changes the figures: the host name, the device model, the
torch device, and the core and torch versions. A file is read back only if it parses as a measured
record whose key is the one asked for: a corrupt file, one of another layout, or one written for
another key (copied from another host, a hash collision) is ignored with a warning and measured anew.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from core.base.files import OutputError, write_atomically
from core.base.roofs import MeasuredRoofs, read_measured_roofs

CACHE_FILE_BYTES = 1 << 16  # a record is a few hundred bytes: a larger file is not one


@dataclass(frozen=True)
class HostKey:
    """What measured roofs are valid for."""

    host: str
    device: str
    torch_device: str
    core_version: str
    torch_version: str

    def matches(self, roofs: MeasuredRoofs) -> bool:
        return (roofs.host, roofs.device, roofs.torch_device, roofs.core_version, roofs.torch_version) == (
            self.host,
            self.device,
            self.torch_device,
            self.core_version,
            self.torch_version,
        )

    @property
    def file_name(self) -> str:
        text = "\n".join((self.host, self.device, self.torch_device, self.core_version, self.torch_version))
        return f"roofs-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:24]}.json"


def cache_directory() -> Path:
    """The user's cache directory for core's measured roofs (XDG base directories)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "core" / "roofs"


def cache_path(key: HostKey) -> Path:
    return cache_directory() / key.file_name


def load_cached(key: HostKey) -> tuple[MeasuredRoofs | None, list[str]]:
    """The cached roofs for ``key`` and the warnings about a file that was found but not trusted."""
    path = cache_path(key)
    try:
        if path.stat().st_size > CACHE_FILE_BYTES:
            return None, [f"ignored the measured-roofs cache {path}: {path.stat().st_size:,} bytes, not a record"]
        text = path.read_bytes()
    except FileNotFoundError:
        return None, []
    except OSError as error:
        return None, [f"ignored the measured-roofs cache {path}: {error.strerror or error}"]
    try:
        roofs = read_measured_roofs(text)
    except ValueError as error:
        return None, [f"ignored the measured-roofs cache {path}: {error}"]
    if not key.matches(roofs):
        return None, [
            f"ignored the measured-roofs cache {path}: it was measured for host {roofs.host!r}, device "
            f"{roofs.device!r}, core {roofs.core_version}, torch {roofs.torch_version}, not for this one"
        ]
    return roofs, []


def store_cached(roofs: MeasuredRoofs, key: HostKey) -> Path:
    """Write ``roofs`` whole (or not at all) as the cache file of ``key``; OutputError if it cannot."""
    if not key.matches(roofs):
        raise ValueError(f"the roofs measured on {roofs.host!r} are not those of key {key}")
    path = cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot make the roofs cache folder {path.parent}: {error.strerror or error}") from None
    write_atomically(path, roofs.model_dump_json(indent=1) + "\n", "measured-roofs cache")
    return path
