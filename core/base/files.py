"""Files core writes for users: checked before the work that fills them, written whole or not at all.

Every file core hands to a user (a run's ``--output``, a report, an export, a worker's result)
goes through :func:`write_atomically`: the bytes go to a hidden temporary file beside the
target, are flushed to disk, and replace the target in one rename. A reader sees the old file
or the new one, never half of one; a full disk or a kill leaves no partial file behind.

:func:`check_writable` runs *before* a run or a report starts, so a bad output path costs
nothing that was measured.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from core.base.errors import CoreError


class OutputError(CoreError):
    """An output file cannot be written (a directory is in the way, no permission, disk full)."""


def finite_json(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None, for JSON that any reader parses:
    ``NaN`` and ``Infinity`` are not JSON (RFC 8259), and strict parsers (jq, JavaScript) refuse them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def json_text(value: Any, **dumps: Any) -> str:
    """``json.dumps`` of :func:`finite_json` (``value``) with ``allow_nan=False``, so that a
    non-finite number that slips past cannot be written as ``NaN`` (it raises instead)."""
    return json.dumps(finite_json(value), allow_nan=False, **dumps)


def describe_os_error(error: OSError) -> str:
    """``disk full (ENOSPC)`` style text for the errors users meet when writing files."""
    name = errno.errorcode.get(error.errno or 0, "")
    explanations = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EACCES: "permission denied",
        errno.EROFS: "read-only file system",
        errno.EISDIR: "it is a directory",
        errno.ENOENT: "no such file or directory",
        errno.ENOTDIR: "a parent is not a directory",
    }
    text = explanations.get(error.errno or 0, error.strerror or str(error))
    return f"{text} ({name})" if name else text


def check_writable(path: Path, what: str = "output") -> None:
    """Refuse, before any work, a path that cannot take a file; create missing parent folders.

    :raises OutputError: naming the path and the reason.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    # A file where a folder of the path should be: mkdir would only say "File exists".
    blocking = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise OutputError(f"cannot write {what} {path}: {blocking} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder of {what} {path}: {describe_os_error(exc)}") from None
    if not parent.is_dir():
        raise OutputError(f"cannot write {what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {what} {path}: no permission to write in {parent}")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"cannot write {what} {path}: the existing file is read-only")


def write_atomically(path: Path, data: str | bytes, what: str = "output") -> None:
    """Write ``data`` to ``path`` whole or not at all (see the module docstring).

    :raises OutputError: when the file cannot be written; no temporary file is left behind.
    """
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    directory = path.parent if str(path.parent) else Path(".")
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=directory)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {path}: {describe_os_error(exc)}") from None
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(payload)
            stream.flush()
            os.fsync(stream.fileno())
        if path.exists():
            # Keep the permissions the user gave the file it replaces.
            os.chmod(temporary, path.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {what} {path}: {describe_os_error(exc)}") from None
        raise
