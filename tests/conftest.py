"""Shared fixtures: vendor SDK fakes under their real module names, the real pynvml over a simulated
NVML library, and the GPU marker."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile

import pytest

# OpenMP's threads (PyTorch's intra-op pool) spin while they wait for work: two processes training
# a small convolution loop at once on the same two cores (two test workers, or a run beside its
# test) took 8.4 s each spinning and 2.2 s each waiting passively (one alone: 1.0 s, 1.1-1.2 s
# passively). Set before torch loads libgomp, which reads it once; the tests' processes inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# A test run started in the background of a non-interactive shell (`cmd &`) inherits SIGINT
# ignored, and so would every process a test starts, which then cannot be stopped with Ctrl-C: the
# tests that stop a run or a sweep with SIGINT need it delivered. A handled signal is reset to its
# default in a child it starts, an ignored one is not.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Under pytest-xdist (scripts/test.sh runs the tests so) each worker gets a temporary folder of its
# own, inherited by every process its tests start: the tests that look for what a run left in the
# temporary folder (core-run-*, core-sweep-<pid>-*, pymp-*) must not see another worker's runs.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _worker_temporary = os.path.join(
        tempfile.gettempdir(), f"core-tests-{os.environ['PYTEST_XDIST_WORKER']}-{os.getpid()}"
    )
    os.makedirs(_worker_temporary)
    os.environ["TMPDIR"] = tempfile.tempdir = _worker_temporary
    atexit.register(shutil.rmtree, _worker_temporary, ignore_errors=True)

# The AMD tests' probe (a stand-in /dev/kfd) and open-session check.
from amdsmi_native import amdsmi_session_closed, probe  # noqa: F401 - fixtures registered here

# Small real datasets (an image folder, WebDataset shards) for the data tests.
from data_support import image_folder, shards  # noqa: F401 - fixtures registered here

# The Graphcore SDK fakes' fixtures, shared by every Graphcore test module.
from graphcore_support import fake_sdk, fake_tf_ipu  # noqa: F401 - fixtures registered here

# The real pynvml over a simulated libnvidia-ml.so.1, built from C at test time.
from simnvml import pynvml_folder, sim_nvml, simnvml_libraries  # noqa: F401 - fixtures registered here


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


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say at the top of every run whether the cluster-sweep tests can reach Slurm and the XLA tests
    torch-xla, and why not."""
    from core.sweep.slurm_jobs import unavailable_reason

    why = unavailable_reason()
    if why is None:
        slurm = f"slurm: available (SLURM_CONF={os.environ.get('SLURM_CONF', 'the default')})"
    else:
        slurm = (
            f"slurm: UNAVAILABLE, tests/test_slurm_sweep.py's job tests will SKIP: {why} "
            "(scripts/local-slurm.sh starts a single-host Slurm as root; scripts/test.sh runs it)"
        )
    return [slurm, _xla_header()]


def _xla_header() -> str:
    import importlib.util
    from importlib import metadata

    if importlib.util.find_spec("torch_xla") is None:
        return (
            "xla: torch-xla is NOT in this environment, tests/test_xla.py's torch-xla tests will SKIP here; they run "
            "in .venv-xla (./scripts/test-xla.sh, which ./scripts/test.sh runs)"
        )
    return f"xla: torch-xla {metadata.version('torch-xla')} with torch {metadata.version('torch')}, " + (
        f"PJRT_DEVICE={os.environ.get('PJRT_DEVICE', 'unset')}"
    )
