"""Shared fixtures: vendor SDK fakes under their real module names, the real pynvml over a simulated
NVML library, and the GPU marker."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The Graphcore SDK fakes' fixtures, shared by every Graphcore test module.
from graphcore_support import fake_sdk, fake_tf_ipu  # noqa: F401 - fixtures registered here

# The real pynvml over a simulated libnvidia-ml.so.1, built from C at test time.
from simnvml import pynvml_folder, sim_nvml, simnvml_libraries  # noqa: F401 - fixtures registered here

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


def _forget_amdsmi() -> None:
    for name in [name for name in sys.modules if name == "amdsmi" or name.startswith("amdsmi.")]:
        del sys.modules[name]


@pytest.fixture
def fake_amdsmi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[object]:
    """The fake amdsmi package importable as `amdsmi`, its libamd_smi.so found under $ROCM_PATH (a
    test that wants it missing points ROCM_PATH elsewhere and imports again); the real one, if any,
    is hidden. Tests install a node with ``amdsmi.fake.install(...)``."""
    rocm = tmp_path / "rocm"
    (rocm / "lib").mkdir(parents=True)
    (rocm / "lib" / "libamd_smi.so").write_bytes(b"")
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    monkeypatch.delenv("ROCM_HOME", raising=False)
    monkeypatch.syspath_prepend(str(FAKES))
    _forget_amdsmi()
    import amdsmi
    import amdsmi.fake  # noqa: F401 - the test-only control module

    yield amdsmi
    _forget_amdsmi()


def pytest_report_header(config: pytest.Config) -> str:
    """Say at the top of every run whether the cluster-sweep tests can reach Slurm, and why not."""
    from core.sweep.slurm_jobs import unavailable_reason

    why = unavailable_reason()
    if why is None:
        return f"slurm: available (SLURM_CONF={os.environ.get('SLURM_CONF', 'the default')})"
    return (
        f"slurm: UNAVAILABLE, tests/test_slurm_sweep.py's job tests will SKIP: {why} "
        "(scripts/local-slurm.sh starts a single-host Slurm as root; scripts/test.sh runs it)"
    )
