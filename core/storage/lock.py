"""The lock of a results database: one sweep (or one run stored with ``core run --database``) at a
time, so a second is refused instead of measuring beside the first and disturbing both."""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path
from typing import Any

from core.base.files import describe_os_error, parse_json
from core.storage.database import EscapedText, StoreError, UndecodableText, now, quoted_name


class DatabaseInUseError(StoreError):
    """Another sweep holds the database's lock; ``holder`` is what it recorded (pid, host, sweep, since)."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


def lock_path(database: str | Path) -> Path:
    """The file a sweep locks beside its database: ``<database>.lock``."""
    return Path(f"{database}.lock")


class SweepLock:
    """An exclusive ``fcntl.flock`` on ``<database>.lock``, held by a sweep (or a single run stored
    with ``core run --database``) from start to end.

    A second sweep or run on the same database is refused at once (:class:`DatabaseInUseError`,
    naming the holder's pid, host and sweep or run) rather than measure beside the first and
    disturb both measurements. The kernel releases the lock when its holder ends in any way,
    ``kill -9`` included; the lock file stays (removing it would let two sweeps lock two
    different files).

    :param sweep: the sweep that holds it.
    :param run: a single run that holds it instead, described ("fcnn on cpu").
    """

    def __init__(self, database: str | Path, sweep: str | None = None, *, run: str | None = None) -> None:
        self.database = Path(database)
        self.path = lock_path(database)
        self.sweep = sweep
        self.run = run
        self._descriptor: int | None = None

    def acquire(self) -> None:
        import fcntl

        try:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise StoreError(
                f"cannot create the lock file {self.path} of results database {self.database}: {describe_os_error(exc)}"
            ) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(descriptor)
            os.close(descriptor)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreError(
                    f"cannot lock results database {self.database} ({self.path}): {describe_os_error(exc)}"
                ) from None
            refused = "this run" if self.run is not None else "a second sweep"
            raise DatabaseInUseError(_in_use_message(self.database, holder, refused), holder) from None
        self._descriptor = descriptor
        note = {"pid": os.getpid(), "host": socket.gethostname(), "sweep": self.sweep, "since": now()}
        if self.run is not None:
            note["run"] = self.run
        try:  # who holds it, for the message of the one refused; the lock holds without it
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (json.dumps(note) + "\n").encode("utf-8"), 0)
        except OSError:
            pass

    def release(self) -> None:
        if self._descriptor is None:
            return
        import fcntl

        descriptor, self._descriptor = self._descriptor, None
        try:
            os.ftruncate(descriptor, 0)
        except OSError:
            pass
        try:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)

    def __enter__(self) -> SweepLock:
        if self._descriptor is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(descriptor: int) -> dict[str, Any]:
    try:
        # surrogateescape: a byte that is not UTF-8 (a damaged note) survives parsing, to be shown
        # escaped below, not as U+FFFD, and the rest of the note is still read.
        note = parse_json(os.pread(descriptor, 4096, 0).decode("utf-8", errors="surrogateescape"))
    except (OSError, ValueError):
        return {}
    if not isinstance(note, dict):
        return {}
    return {key: _escaped(value) if isinstance(value, str) else value for key, value in note.items()}


def _escaped(text: str) -> str:
    """Text read with surrogateescape, each byte that was not UTF-8 written ``\\xNN``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a byte surrogateescape kept, or a lone surrogate the JSON spelt \\udNNN
        pass
    else:
        return text
    try:
        return UndecodableText(text.encode("utf-8", errors="surrogateescape")).shown
    except UnicodeEncodeError:
        return EscapedText(text.encode("utf-8", errors="backslashreplace").decode("utf-8"))


def _in_use_message(database: Path, holder: dict[str, Any], refused: str = "a second sweep") -> str:
    facts = [
        f"pid {holder['pid']}" if holder.get("pid") else "",
        f"on {holder['host']}" if holder.get("host") else "",
        f"since {holder['since']}" if holder.get("since") else "",
    ]
    if holder.get("sweep"):
        who = f"sweep {quoted_name(holder['sweep'], limit=200)}"
    elif holder.get("run"):
        who = f"a run of {str(holder['run'])[:200]}"
    else:
        who = "another sweep"
    details = " ".join(fact for fact in facts if fact)
    what = "sweep" if refused == "a second sweep" else "run"
    return (
        f"results database {database} is in use by {who}"
        + (f" ({details})" if details else "")
        + f"; {refused} would run beside it and disturb both measurements. Wait for it to end, "
        f"or give this {what} another --database"
    )
