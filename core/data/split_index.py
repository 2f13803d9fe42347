"""The samples of a run to a target's splits in WebDataset shards and TFRecord files, found from the
files' framing (a tar's member headers, a record file's length fields) without reading a sample.

A run to a target reads its training split in :class:`core.data.epoch_order.EpochOrder`'s order,
the same for every format and every replica count: each epoch one seeded permutation of the whole
split. Shards and record files are streams, but an uncompressed tar holds each member at a fixed
offset, and a record file each record: indexed once at set-up, sample ``i`` of the split is read
by its offset, so a split of shards or records is read in exactly the order an image folder or
the in-memory split is (see docs/to-target.md for what that costs against WebDataset's streaming).

The indexes are cached per file (its path, modification time and size), as core.data.listing
caches its listings: planning counts the training split, and setup in the same process reuses it.
Nothing here imports a framework.
"""

from __future__ import annotations

import functools
import os
import tarfile
from array import array
from dataclasses import dataclass
from pathlib import Path

from core.base.errors import ConfigError, DataError
from core.data.files import MAX_SAMPLE_BYTES, MAX_SAMPLE_MEMBERS, MAX_SHARD_MEMBER_BYTES
from core.data.listing import image_folder, record_files, record_frames, shard_files
from core.data.tar_headers import BoundedTarInfo, ExtendedHeaderError, check_archive_end

#: a sample's image member, by extension, the first of these present (as the shard reader picks it)
IMAGE_MEMBER_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
#: a sample's class label member: the label as decimal text
LABEL_MEMBER_EXTENSION = "cls"


@dataclass(frozen=True)
class ShardSamples:
    """The samples of one shard, in member order: where each one's image and label members lie in the
    file (byte offset and size, as tar's headers give them). Samples group consecutive members by key
    (``000017.png`` and ``000017.cls``), as the streaming reader groups them."""

    shard: Path
    image_offsets: array[int]
    image_sizes: array[int]
    label_offsets: array[int]
    label_sizes: array[int]

    def __len__(self) -> int:
        return len(self.image_offsets)


@dataclass(frozen=True)
class RecordSamples:
    """The records of one TFRecord file: each one's data offset and length."""

    file: Path
    offsets: array[int]
    lengths: array[int]

    def __len__(self) -> int:
        return len(self.offsets)


def _refuse(file: Path | str, problem: str) -> ConfigError:
    return ConfigError("data", str(file), problem)


def shard_samples(shard: Path) -> ShardSamples:
    """The samples of an uncompressed tar shard, from its member headers alone; ConfigError naming
    ``data`` and the shard where it is compressed (its members have no offsets in the file), damaged,
    holds a sample without an image or a ``.cls`` label, or one over the bounds the reader keeps
    (:data:`core.data.files.MAX_SHARD_MEMBER_BYTES`, ``MAX_SAMPLE_MEMBERS``, ``MAX_SAMPLE_BYTES``)."""
    info = os.stat(shard)
    return _shard_samples(str(shard), info.st_mtime_ns, info.st_size)


class _Sample:
    """The members of the sample being listed: extension -> (offset, size)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.members: dict[str, tuple[int, int]] = {}
        self.bytes = 0

    def add(self, shard: Path, member: tarfile.TarInfo, extension: str) -> None:
        """One more member, within the bounds the shard reader keeps."""
        if len(self.members) >= MAX_SAMPLE_MEMBERS:
            raise _refuse(shard, f"sample {self.key!r} has more than the {MAX_SAMPLE_MEMBERS} members allowed")
        self.bytes += member.size
        if self.bytes > MAX_SAMPLE_BYTES:
            raise _refuse(
                shard,
                f"sample {self.key!r} would hold {self.bytes:,} bytes with member {member.name!r}, more than the "
                f"{MAX_SAMPLE_BYTES:,} allowed for one sample",
            )
        self.members[extension.lower()] = (member.offset_data, member.size)

    def append_to(self, samples: ShardSamples) -> None:
        image = next((self.members[e] for e in IMAGE_MEMBER_EXTENSIONS if e in self.members), None)
        label = self.members.get(LABEL_MEMBER_EXTENSION)
        if image is None or label is None:
            raise _refuse(
                samples.shard,
                f"sample {self.key!r} needs an image (.{'/.'.join(IMAGE_MEMBER_EXTENSIONS)}) and a "
                f".{LABEL_MEMBER_EXTENSION} label; found {sorted(self.members)}",
            )
        samples.image_offsets.append(image[0])
        samples.image_sizes.append(image[1])
        samples.label_offsets.append(label[0])
        samples.label_sizes.append(label[1])


def _check_member(shard: Path, member: tarfile.TarInfo) -> None:
    if member.issparse():
        raise _refuse(shard, f"member {member.name!r} is a sparse file: its data is not stored whole")
    if member.size > MAX_SHARD_MEMBER_BYTES:
        raise _refuse(
            shard,
            f"member {member.name!r} is {member.size:,} bytes, more than the {MAX_SHARD_MEMBER_BYTES:,} "
            "allowed for one (a tar bomb?)",
        )


@functools.lru_cache(maxsize=8192)
def _shard_samples(shard_text: str, modified: int, size: int) -> ShardSamples:
    shard = Path(shard_text)
    samples = ShardSamples(shard, array("q"), array("q"), array("q"), array("q"))
    current: _Sample | None = None
    last = "(its first member)"
    try:
        descriptor = os.open(shard, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise _refuse(shard, f"cannot open it: {error.strerror or error}") from None
    try:
        with open(descriptor, "rb") as stream:
            # "r:": uncompressed only. A member's data lies at its offset in the file, which is what
            # lets a sample be read alone; tarfile seeks past each member's data, reading headers only.
            with tarfile.open(fileobj=stream, mode="r:", tarinfo=BoundedTarInfo) as archive:
                for member in archive:
                    archive.members = []  # type: ignore[attr-defined]  # tarfile's own list, not in its stubs
                    last = member.name
                    _check_member(shard, member)
                    if not member.isfile():
                        continue
                    key, _, extension = member.name.partition(".")
                    if current is None or key != current.key:
                        if current is not None:
                            current.append_to(samples)
                        current = _Sample(key)
                    current.add(shard, member, extension)
                check_archive_end(shard, archive, last)
    except ConfigError:
        raise
    except DataError as error:
        raise _refuse(shard, str(error).removeprefix(f"{shard}: ")) from None
    except ExtendedHeaderError as error:
        raise _refuse(shard, str(error)) from None
    except tarfile.ReadError as error:
        problem = (
            "not an uncompressed tar file: a run to a target reads a shard's samples by their offsets in "
            "the file, which a compressed one (gzip, ...) does not have"
            if last == "(its first member)"
            else f"not a readable tar file after member {last!r}: {error}"
        )
        raise _refuse(shard, problem) from None
    except OSError as error:
        raise _refuse(shard, f"cannot read it: {error.strerror or error}") from None
    if current is not None:
        current.append_to(samples)
    if not len(samples):
        raise _refuse(shard, "no samples (an image and a .cls label grouped by key)")
    return samples


def record_samples(file: Path) -> RecordSamples:
    """The records of a TFRecord file, from its framing (:func:`core.data.listing.record_frames`)."""
    offsets, lengths = record_frames(file)
    if not len(offsets):
        raise _refuse(file, "no records")
    return RecordSamples(file, offsets, lengths)


def split_shards(split: Path) -> tuple[ShardSamples, ...]:
    """Every shard of a split (its ``*.tar`` in name order), indexed."""
    return tuple(shard_samples(shard) for shard in shard_files(split))


def split_records(split: Path) -> tuple[RecordSamples, ...]:
    """Every record file of a split (its ``*.tfrecord``/``*.tfrecords`` in name order), indexed."""
    return tuple(record_samples(file) for file in record_files(split))


def split_samples(split: Path, data_format: str) -> int:
    """Samples in one split of a run to a target (core.data.listing.TARGET_SPLIT_FORMATS), counted
    without decoding one: an image folder's images, a split's shard samples or records."""
    if data_format == "image-folder":
        return len(image_folder(split)[1])
    if data_format == "webdataset":
        return sum(len(shard) for shard in split_shards(split))
    if data_format == "tfrecord":
        return sum(len(records) for records in split_records(split))
    raise ValueError(f"no split of {data_format!r} data is read by a run to a target")
