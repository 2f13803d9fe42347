"""Shared fixtures: vendor SDK fakes under their real module names, and the GPU marker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

FAKES = Path(__file__).parent / "fakes"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` run only where PyTorch sees a CUDA device."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The fake pynvml importable as `pynvml`, with a fresh machine; the real one (if any) is hidden."""
    monkeypatch.syspath_prepend(str(FAKES / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    pynvml.machine = pynvml.FakeMachine()
    pynvml._initialized = 0
    yield pynvml
    sys.modules.pop("pynvml", None)
