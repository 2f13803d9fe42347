"""A dataset's files, read with limits.

A data path is the user's input, and so is every file under it. A link to ``/dev/zero`` named like
an image, a FIFO among the shards, a PNG whose header claims 100,000 x 100,000 pixels or a shard
member of 50 GB would otherwise hang a loader worker or exhaust the host's memory, and the run would
be recorded as the model's out-of-memory. So each file is checked to be a regular file after its
links are followed, read only up to a bound, and an image's size is read from its header and
checked before a pixel is decoded. A problem raises :class:`core.base.errors.DataError` naming the file.

Nothing here imports a framework; Pillow is imported where an image is decoded.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from core.base.errors import DataError

#: The most pixels an image may have: Pillow's own default bound (``PIL.Image.MAX_IMAGE_PIXELS``,
#: 1024**3 // 4 // 3, an RGB bitmap of 256 MiB), applied here whatever Pillow's setting, since a
#: program may raise or disable Pillow's. Every dataset core reads has images far below it.
MAX_IMAGE_PIXELS = 89_478_485
_OVER_THE_BOUND = f"more than the {MAX_IMAGE_PIXELS:,} an image may have (a decompression bomb?)"
#: The largest image file read: an uncompressed 4-channel bitmap at the pixel bound; no encoding of
#: an image within the bound is larger, so a bigger file is not one.
MAX_IMAGE_FILE_BYTES = 4 * MAX_IMAGE_PIXELS
#: The largest member of a shard (an image, a label, anything grouped into a sample).
MAX_SHARD_MEMBER_BYTES = MAX_IMAGE_FILE_BYTES
#: The formats an image may be in (Pillow's names; JPEG opens MPO too): the raster formats datasets hold. Pillow would
#: also open PostScript (EPS, which it renders by running Ghostscript on the file), PDF, PSD, ICNS
#: and dozens more from a file merely named ``.jpg``.
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM")
_FORMATS_READ = "PNG, JPEG, GIF, BMP, TIFF, WebP or PPM"

#: Members one sample of a shard may group (``000017.jpg``, ``000017.cls``, ...).
MAX_SAMPLE_MEMBERS = 16
#: The bytes one sample's members may hold together: one image at the bound, and room for its label
#: and metadata. Sixteen members each under the member bound made a 16 MB gzip shard hold 5 GB.
MAX_SAMPLE_BYTES = MAX_SHARD_MEMBER_BYTES + (1 << 20)

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a character device", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a data file, after its links are followed; None for a regular
    file. Nothing is opened: opening a FIFO would block, and a device may act on being opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken link" if os.path.islink(path) else "no such file"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    target = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return f"{kind_of(mode)}{target}, not a regular file"


@contextlib.contextmanager
def opened_data_file(path: Path, what: str) -> Iterator[tuple[BinaryIO, int]]:
    """(stream, size in bytes) of a regular file, after its links are followed; DataError naming
    ``path`` when it is something else (a device, a FIFO, a folder) or cannot be opened.

    :param what: what the file should be, for the message ("an image", "a shard")."""
    problem = file_problem(path)
    if problem is not None:
        raise DataError(f"{path}: {problem}; {what} must be a regular file")
    # O_NONBLOCK: should the file have become a FIFO since, opening it does not wait for a writer.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        raise DataError(f"{path}: cannot open it: {error.strerror or error}") from None
    with open(descriptor, "rb") as stream:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"{path}: {kind_of(info.st_mode)}; {what} must be a regular file")
        yield stream, info.st_size


def read_data_file(path: Path, limit: int, what: str) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; DataError naming ``path`` otherwise.

    :param what: what the file should be, for the message ("an image", "a label map")."""
    with opened_data_file(path, what) as (stream, size):
        if size > limit:
            raise DataError(f"{path}: {size:,} bytes, more than the {limit:,} allowed for {what}")
        try:
            data = stream.read(limit + 1)
        except MemoryError:
            raise DataError(f"{path}: out of memory reading its {size:,} bytes") from None
        except OSError as error:
            raise DataError(f"{path}: cannot read it: {error.strerror or error}") from None
    if len(data) > limit:
        raise DataError(f"{path}: grew past the {limit:,} bytes allowed for {what} while it was read")
    return data


def check_image_size(width: int, height: int, source: str) -> None:
    """Refuse an image whose header declares more than :data:`MAX_IMAGE_PIXELS`, before decoding it."""
    if width * height > MAX_IMAGE_PIXELS:
        declared = f"{width} x {height} = {width * height:,} pixels"
        raise DataError(f"{source}: its header declares {declared}, {_OVER_THE_BOUND}")


def open_image(data: bytes, source: str) -> Any:
    """The image encoded in ``data``, decoded (a loaded ``PIL.Image.Image``); ``source`` names where
    the bytes came from in every error. Its size is checked from the header first, so a
    decompression bomb is refused without decoding it."""
    image = image_header(data, source)
    try:
        image.load()
    except MemoryError:
        raise DataError(f"{source}: out of memory decoding this {image.width} x {image.height} image") from None
    except Exception as error:
        raise DataError(
            f"{source}: a damaged or truncated {image.format or ''} image ({type(error).__name__}: {error})"
        ) from None
    return image


def image_header(data: bytes, source: str) -> Any:
    """The image encoded in ``data`` with only its header read (a lazy ``PIL.Image.Image``), its
    declared size checked against :data:`MAX_IMAGE_PIXELS`: what any decoder (Pillow's, TensorFlow's)
    may be given. ``source`` names where the bytes came from in every error."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise DataError(f"{source}: an empty file, not an image")
    try:
        with warnings.catch_warnings():
            # Pillow warns above its bound and raises above twice it; both are refused here.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        declared = re.search(r"\((\d+) pixels\)", str(error))  # "Image size (N pixels) exceeds limit ..."
        size = f"{int(declared.group(1)):,} pixels" if declared else "more pixels than Pillow allows"
        raise DataError(f"{source}: its header declares {size}, {_OVER_THE_BOUND}") from None
    except UnidentifiedImageError:
        raise DataError(
            f"{source}: not an image Pillow can read as {_FORMATS_READ} (it begins {data[:16]!r})"
        ) from None
    except MemoryError:
        raise DataError(f"{source}: out of memory reading the image's header") from None
    except Exception as error:  # Pillow's plugins raise many types on a damaged header
        raise DataError(f"{source}: a damaged or truncated image header ({type(error).__name__}: {error})") from None
    check_image_size(*image.size, source)
    return image
