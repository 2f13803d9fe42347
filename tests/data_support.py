"""Small real datasets written by the tests: an image folder and WebDataset shards of PNGs
(fixtures ``image_folder`` and ``shards``, registered in conftest.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest


def png(color: tuple[int, int, int], size: int = 20) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="PNG")
    return buffer.getvalue()


def write_image_folder(root: Path) -> Path:
    """Three classes of four 20x20 PNGs each."""
    for label, name in enumerate(["cat", "dog", "eel"]):
        (root / name).mkdir(parents=True)
        for i in range(4):
            (root / name / f"{i}.png").write_bytes(png((80 * label, 10 * i, 200)))
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images")


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    return write_shards(tmp_path / "shards")


def write_shards(folder: Path) -> Path:
    """Two WebDataset shards of six labelled PNGs each."""
    folder.mkdir()
    for shard in range(2):
        with tarfile.open(folder / f"train-{shard:04d}.tar", "w") as archive:
            for i in range(6):
                key = f"{shard:02d}{i:04d}"
                for extension, payload in (("png", png((i * 30, 0, 0))), ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(payload)
                    archive.addfile(info, io.BytesIO(payload))
    return folder
