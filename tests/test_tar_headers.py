"""A shard's extended tar headers (pax ``x``/``g``, GNU long names ``L``/``K``) are bounded from
their raw 512-byte header before tarfile reads or parses them: tarfile reads one whole, and its pax
parser is quadratic on a run of digits on Pythons before 3.11.10 (CVE-2024-6232), so a 200 kB
header kept a loader worker busy for hours (issue 26)."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from core.base.errors import DataError
from core.data.tar_headers import MAX_EXTENDED_HEADER_BYTES, pax_records_problem
from core.data.torch_datasets import _shard_members


@pytest.fixture
def tarfile_never_parses_extended_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal must come before tarfile's own reading: its parsers fail the test if called (and
    so a test cannot hang on the quadratic parse even where the bound is missing)."""

    def parsed(self: Any, archive: Any) -> Any:
        raise AssertionError(f"tarfile parsed the {self.type!r} header itself")

    monkeypatch.setattr(tarfile.TarInfo, "_proc_pax", parsed)
    monkeypatch.setattr(tarfile.TarInfo, "_proc_gnulong", parsed)


def extended_header(kind: bytes, payload: bytes, declared: int | None = None) -> bytes:
    info = tarfile.TarInfo("././@PaxHeader" if kind in (tarfile.XHDTYPE, tarfile.XGLTYPE) else "././@LongLink")
    info.type, info.size = kind, len(payload) if declared is None else declared
    header = info._create_header(info.get_info(), tarfile.GNU_FORMAT, "utf-8", "surrogateescape")  # type: ignore[attr-defined]
    return header + payload + b"\0" * (-len(payload) % tarfile.BLOCKSIZE)


def member(name: str, payload: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    return info.tobuf() + payload + b"\0" * (-len(payload) % tarfile.BLOCKSIZE)


END = b"\0" * 2 * tarfile.BLOCKSIZE


def record(keyword: bytes, value: bytes) -> bytes:
    """One pax record, its length counting its own digits."""
    body = b" %s=%s\n" % (keyword, value)
    length = len(body) + 1
    while len(b"%d" % length) + len(body) != length:
        length += 1
    return b"%d%s" % (length, body)


def written(tmp_path: Path, contents: bytes, compressed: bool) -> Path:
    shard = tmp_path / ("train-0000.tar.gz" if compressed else "train-0000.tar")
    shard.write_bytes(gzip.compress(contents, compresslevel=1) if compressed else contents)
    return shard


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK])
@pytest.mark.usefixtures("tarfile_never_parses_extended_headers")
def test_an_oversized_extended_header_is_refused_from_its_raw_header(
    kind: bytes, compressed: bool, tmp_path: Path
) -> None:
    size = MAX_EXTENDED_HEADER_BYTES + 1
    contents = member("0.cls", b"1") + extended_header(kind, b"9" * size) + member("1.cls", b"2") + END
    shard = written(tmp_path, contents, compressed)
    with pytest.raises(DataError) as refused:
        list(_shard_members(shard))
    message = str(refused.value)
    assert message.startswith(f"{shard}: after member '0.cls': ")
    assert f"header of {size:,} bytes, more than the {MAX_EXTENDED_HEADER_BYTES:,} allowed" in message


@pytest.mark.usefixtures("tarfile_never_parses_extended_headers")
def test_a_header_declaring_hundreds_of_megabytes_is_refused_unread(tmp_path: Path) -> None:
    # The adversary's gzip bomb: 300 MB of digits declared, only the header present; nothing is read.
    shard = written(tmp_path, extended_header(tarfile.XHDTYPE, b"", declared=300_000_000) + END, compressed=True)
    with pytest.raises(DataError, match="pax header of 300,000,000 bytes") as refused:
        list(_shard_members(shard))
    assert str(refused.value).startswith(f"{shard}: a pax header")


@pytest.mark.parametrize(
    "payload,problem",
    [
        (b"9" * 20_000, "no record length at byte 0"),  # the CVE-2024-6232 pattern, under the size bound
        (b"10 pathab\n", "not 'keyword=value'"),
        (b"99999 path=x\n", "record length 99,999 at byte 0 does not fit"),
        (record(b"path", b"a") + record(b"path", b"7" * 65), "a run of more than 64 digits"),
    ],
)
@pytest.mark.usefixtures("tarfile_never_parses_extended_headers")
def test_a_malformed_pax_header_is_refused_before_tarfile_parses_it(
    payload: bytes, problem: str, tmp_path: Path
) -> None:
    shard = written(tmp_path, extended_header(tarfile.XHDTYPE, payload) + member("0.cls", b"1") + END, False)
    with pytest.raises(DataError, match="a pax header that is malformed") as refused:
        list(_shard_members(shard))
    assert problem in str(refused.value)
    assert str(refused.value).startswith(f"{shard}: ")


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_real_pax_and_gnu_shards_still_read(compressed: bool, tmp_path: Path) -> None:
    """Long and non-ASCII names (pax and GNU formats), global headers: what tar writes is read whole."""
    for form in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=form) as archive:
            if form == tarfile.PAX_FORMAT:
                archive.pax_headers = {"comment": "written by a test"}
            for index in range(3):
                info = tarfile.TarInfo(f"{'é' * 150}/{index:06d}.cls")
                info.size = 1
                if form == tarfile.PAX_FORMAT:
                    info.pax_headers = {"comment": "c" * 5_000, "mtime": "1700000000.123456789"}
                archive.addfile(info, io.BytesIO(b"%d" % index))
        shard = written(tmp_path, buffer.getvalue(), compressed)
        members = list(_shard_members(shard))
        assert [(name[-10:], data) for name, data in members] == [
            (f"{index:06d}.cls", b"%d" % index) for index in range(3)
        ]
        assert members[0][0].startswith("é" * 150)


def test_pax_records_problem_accepts_what_posix_frames() -> None:
    assert pax_records_problem(record(b"path", b"abcd") + record(b"mtime", b"12345.678") + b"\0" * 30) is None
    assert pax_records_problem(b"5 x=\n") is None
    assert pax_records_problem(b"") is None
