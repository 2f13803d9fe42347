"""Real file systems for fault tests: a small tmpfs, so "disk full" is the kernel's, not a mock."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(tmp_path: Path, kilobytes: int = 4096) -> Iterator[Path]:
    """A tmpfs of ``kilobytes`` of its own under ``tmp_path``, unmounted afterwards.

    Needs root (as CI and this machine are); skips the test where mounting is refused.
    """
    mount_point = tmp_path / "mounted"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until its file system is full (the kernel's ENOSPC)."""
    with open(path, "wb", buffering=0) as stream:
        try:
            while True:
                stream.write(b"x" * 1024)
        except OSError:
            pass
