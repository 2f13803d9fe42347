"""Tar extended headers (pax ``x``/``g``/``X``, GNU long names ``L``/``K``) read with limits.

tarfile reads and parses an extended header itself, whole and before the member it describes is
seen, so the per-member size bound never applies to it: a header declaring gigabytes is read whole,
and the pax parser of Pythons before 3.11.10/3.12.6 is quadratic on a long run of digits
(CVE-2024-6232), so 200 kB of ``9`` keeps a loader worker busy for hours. Here the declared size is
checked from the raw 512-byte header, and a pax header's records are checked in one linear pass,
before tarfile's parser sees a byte.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path
from typing import IO, Any

from core.base.errors import DataError

# Real extended headers hold a path or link of at most a few KiB, times and ids, perhaps a few
# extended attributes: 64 KiB is ample, and small enough that nothing in it is slow to parse.
MAX_EXTENDED_HEADER_BYTES = 64 * 1024
# The longest run of digits a pax header may hold: its lengths, times, ids and sizes are at most
# 30 digits, a name a few dozen. Bounded because tarfile's search for ``hdrcharset`` costs the
# square of the longest run on the Pythons named above.
MAX_PAX_DIGIT_RUN = 64

_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_EXTENDED_TYPES = (*_PAX_TYPES, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_RECORD_LENGTH = re.compile(rb"([0-9]{1,20}) ")
_LONG_DIGIT_RUN = re.compile(rb"[0-9]{%d}" % (MAX_PAX_DIGIT_RUN + 1))


class ExtendedHeaderError(Exception):
    """An extended header refused before tarfile parsed it; the reader adds the shard's name.

    Not an OSError nor a tarfile.ReadError: tarfile.open would take those for "not this
    compression" and try the next one, losing the reason."""


class BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo whose extended headers are bounded (pass it as ``tarfile.open(tarinfo=...)``).

    ``_proc_member`` is the hook tarfile documents for subclasses that process members their way."""

    def _proc_member(self, archive: Any) -> Any:
        if self.type not in _EXTENDED_TYPES:
            return self._tarfiles_own(archive)
        kind = "pax" if self.type in _PAX_TYPES else "GNU long-name"
        if self.size > MAX_EXTENDED_HEADER_BYTES:
            raise ExtendedHeaderError(
                f"a {kind} header of {self.size:,} bytes, more than the {MAX_EXTENDED_HEADER_BYTES:,} "
                f"allowed for one (at byte {self.offset:,})"
            )
        if self.type not in _PAX_TYPES:
            return self._tarfiles_own(archive)
        stream = archive.fileobj
        buffer = stream.read(-(-self.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE)
        problem = pax_records_problem(buffer[: self.size])
        if problem is not None:
            raise ExtendedHeaderError(f"a pax header that is malformed (at byte {self.offset:,}): {problem}")
        # tarfile reads the header again: hand it back what was read, so that a compressed stream is
        # not rewound (gzip rewinds from the start of the file).
        archive.fileobj = _Replayed(buffer, stream)
        try:
            return self._tarfiles_own(archive)
        finally:
            archive.fileobj = stream

    def _tarfiles_own(self, archive: Any) -> Any:
        return super()._proc_member(archive)  # type: ignore[misc]  # documented for subclasses, not in typeshed


def pax_records_problem(buffer: bytes) -> str | None:
    """Why ``buffer`` is no sequence of pax records ``"<length> <keyword>=<value>\\n"``, or None.

    POSIX's framing, checked in one pass: the length counts the whole record, the keyword is not
    empty, the record ends in a newline; trailing NULs are padding."""
    position = 0
    while position < len(buffer) and buffer[position] != 0:
        match = _RECORD_LENGTH.match(buffer, position)
        if match is None:
            return f"no record length at byte {position:,}"
        length = int(match.group(1))
        end = position + length
        if length < 5 or end > len(buffer):  # "5 x=\n" is the shortest record
            return f"record length {length:,} at byte {position:,} does not fit the header"
        keyword, equals, _ = buffer[match.end() : end - 1].partition(b"=")
        if not keyword or not equals or buffer[end - 1] != ord("\n"):
            return f"the record at byte {position:,} is not 'keyword=value' ending in a newline"
        position = end
    if _LONG_DIGIT_RUN.search(buffer) is not None:
        return f"a run of more than {MAX_PAX_DIGIT_RUN} digits"
    return None


class _Replayed:
    """A read-only stream that yields ``replay`` and then carries on with ``stream``."""

    def __init__(self, replay: bytes, stream: IO[bytes]) -> None:
        self._replay, self._stream = replay, stream

    def read(self, size: int = -1) -> bytes:
        if not self._replay:
            return self._stream.read(size)
        if size < 0:
            head, self._replay = self._replay, b""
            return head + self._stream.read()
        head, self._replay = self._replay[:size], self._replay[size:]
        return head + (self._stream.read(size - len(head)) if len(head) < size else b"")

    def tell(self) -> int:
        return self._stream.tell() - len(self._replay)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset, whence = self.tell() + offset, 0
        self._replay = b""
        return self._stream.seek(offset, whence)


def check_archive_end(shard: Path, archive: tarfile.TarFile, last: str) -> None:
    """tarfile ends an archive quietly at a damaged or cut-off header after the first: where the next
    header would be, there must be the end-of-archive marker (zeros) or the end of the file."""
    fileobj = archive.fileobj
    assert fileobj is not None
    fileobj.seek(archive.offset)
    if fileobj.read(tarfile.BLOCKSIZE).strip(b"\0"):
        raise DataError(f"{shard}: damaged or cut off after member {last!r} (no tar header at byte {archive.offset:,})")
