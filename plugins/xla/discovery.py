"""What this host offers torch-xla, found without importing it: ``core plugins`` must stay light.

torch-xla runs on one PJRT device type per process, named by ``PJRT_DEVICE`` (TPU, CUDA, CPU);
without it torch-xla picks a TPU where one is attached and falls back to the CPU. This plugin
does not fall back silently: a host with no TPU and no ``PJRT_DEVICE`` is unavailable, with the
reason, so a run on XLA's CPU device is always one somebody asked for.

TPU chips are found the way torch-xla finds them before its runtime starts
(``torch_xla/_internal/tpu.py``, ``num_available_chips``): Google's PCI vendor id on the PCI bus,
and the device id that names the generation. Versions come from the installed distributions'
metadata, so a torch that torch-xla was not built for is named before anything is imported.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_PCI_VENDOR = "0x1ae0"
#: TPU PCI device ids and the generation each names (torch-xla's list; v2 and v3 share one id)
TPU_PCI_GENERATIONS = {"0x0027": "v2/v3", "0x005e": "v4", "0x0063": "v5e", "0x006f": "v6e"}
#: XLA devices (TensorCores the runtime addresses) per chip: two on v2 and v3, one from v4 on (megacore)
CORES_PER_CHIP = {"v2/v3": 2, "v2": 2, "v3": 2}

PJRT_DEVICES = ("TPU", "CUDA", "CPU")
NOT_INSTALLED = (
    "torch-xla is not installed: pip install 'core[xla]', which brings torch-xla with the PyTorch release it "
    "is built for (on a TPU VM also 'torch-xla[tpu]', for libtpu; see docs/xla.md)"
)


@dataclass(frozen=True)
class TpuChip:
    """One TPU chip on the PCI bus."""

    pci_address: str  # "0000:00:04.0"
    device_id: str  # "0x005e"

    @property
    def generation(self) -> str | None:
        return TPU_PCI_GENERATIONS.get(self.device_id)


def tpu_chips(root: Path = PCI_DEVICES) -> list[TpuChip]:
    """The TPU chips attached to this host, in PCI order."""
    chips = []
    for vendor_file in sorted(root.glob("*/vendor")):
        try:
            if vendor_file.read_text().strip() != GOOGLE_PCI_VENDOR:
                continue
            device_id = (vendor_file.parent / "device").read_text().strip()
        except OSError:
            continue
        # Google has other PCI functions (gVNIC, ...): only the TPU device ids are chips.
        if device_id in TPU_PCI_GENERATIONS or device_id in _OTHER_TPU_PCI_IDS:
            chips.append(TpuChip(vendor_file.parent.name, device_id))
    return chips


# TPU ids torch-xla counts as chips without naming the generation (test parts, v5p, 7x).
_OTHER_TPU_PCI_IDS = {"0x0056", "0x0062", "0x0076"}


def nvidia_gpus() -> int:
    """NVIDIA GPUs whose driver nodes exist (/dev/nvidia0, /dev/nvidia1, ...)."""
    return len(glob.glob("/dev/nvidia[0-9]*"))


def pjrt_device(environ: Mapping[str, str] | None = None, chips: list[TpuChip] | None = None) -> str | None:
    """The PJRT device type a run here would use: ``PJRT_DEVICE`` (upper case, as torch-xla reads
    its first part), else TPU where a chip is attached, else None (this plugin picks no fallback)."""
    env = os.environ if environ is None else environ
    named = env.get("PJRT_DEVICE", "").strip()
    if named:
        return named.split("_")[0].upper()
    return "TPU" if (tpu_chips() if chips is None else chips) else None


def release_line(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as "2.9.0+cu128" or "2.9.0rc1"; None if unreadable."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def torch_mismatch(torch_version: str | None, torch_xla_version: str | None) -> str | None:
    """Why this torch cannot load this torch-xla, or None where it can.

    torch-xla's C++ extension is built against one PyTorch release line and declares no torch
    requirement in its metadata (pip will not stop a mismatch); importing it under another torch
    fails with undefined symbols. Each release is installed beside ``torch==X.Y.0`` for its own X.Y.
    """
    if torch_version is None or torch_xla_version is None:
        return None
    wanted, found = release_line(torch_xla_version), release_line(torch_version)
    if wanted is None or found is None or wanted == found:
        return None
    line = f"{wanted[0]}.{wanted[1]}"
    return (
        f"torch-xla {torch_xla_version} is built for PyTorch {line} and this environment has torch {torch_version}: "
        f"install torch=={line}.0 beside it (pip install 'torch=={line}.0' 'torch-xla=={torch_xla_version}'), "
        "or the torch-xla release built for this torch (scripts/setup-xla.sh builds such an environment)"
    )


def cuda_plugin_installed() -> bool:
    """Whether a PJRT plugin for CUDA is registered for torch-xla (its ``torch_xla.plugins`` entry point)."""
    return any(entry.name.upper() == "CUDA" for entry in metadata.entry_points(group="torch_xla.plugins"))


def missing(environ: Mapping[str, str] | None = None, chips: list[TpuChip] | None = None) -> list[str]:
    """Everything that stops a run here, each with what to do; empty when nothing does."""
    env = os.environ if environ is None else environ
    reasons: list[str] = []
    if importlib.util.find_spec("torch_xla") is None:
        reasons.append(NOT_INSTALLED)
    else:
        mismatch = torch_mismatch(installed_version("torch"), installed_version("torch-xla"))
        if mismatch:
            reasons.append(mismatch)
    chips = tpu_chips() if chips is None else chips
    device = pjrt_device(env, chips)
    if device is None:
        reasons.append(
            "no TPU found (no Google TPU chip on the PCI bus) and PJRT_DEVICE is not set: on a Cloud TPU VM the "
            "chips are found by themselves; elsewhere set PJRT_DEVICE=CPU to run on the host's CPU through XLA "
            "(NVIDIA GPUs: the nvidia accelerator; torch-xla's CUDA ended with 2.8)"
        )
    elif device not in PJRT_DEVICES:
        reasons.append(f"PJRT_DEVICE={env.get('PJRT_DEVICE')}: this plugin places {', '.join(PJRT_DEVICES)} devices")
    elif device == "TPU" and not chips:
        reasons.append("PJRT_DEVICE=TPU but no TPU chip is on the PCI bus (not a Cloud TPU VM?)")
    elif device == "TPU" and importlib.util.find_spec("libtpu") is None:
        reasons.append("libtpu is not installed: pip install 'torch-xla[tpu]' (the TPU runtime torch-xla loads)")
    elif device == "CUDA" and not nvidia_gpus():
        reasons.append("PJRT_DEVICE=CUDA but no NVIDIA GPU or driver found (no /dev/nvidia* device nodes)")
    elif device == "CUDA" and not cuda_plugin_installed():
        reasons.append(cuda_unavailable(installed_version("torch-xla")))
    return reasons


#: the first torch-xla release line without CUDA: deprecated in 2.8, its PJRT CUDA plugin gone, and
#: the 2.9.0 wheel holds no CUDA code (../shared/notes/vendor-fidelity.md)
NO_CUDA_FROM = (2, 9)


def cuda_unavailable(torch_xla_version: str | None) -> str:
    """Why PJRT_DEVICE=CUDA cannot run with this torch-xla (no CUDA plugin is registered), and what to do."""
    line = release_line(torch_xla_version) if torch_xla_version is not None else None
    if line is not None and line >= NO_CUDA_FROM:
        return (
            f"PJRT_DEVICE=CUDA: torch-xla {torch_xla_version} has no CUDA support (deprecated in 2.8, its CUDA "
            "plugin no longer built); run NVIDIA GPUs with the nvidia accelerator (--accelerator nvidia, with "
            "--compile for a compiled graph), or install torch-xla 2.8 or older with its CUDA PJRT plugin"
        )
    return "PJRT_DEVICE=CUDA needs torch-xla's CUDA PJRT plugin (a 'torch_xla.plugins' entry point 'cuda')"


def device_count(device: str, environ: Mapping[str, str] | None = None) -> int:
    """XLA devices a host of this type offers to one program: TPU cores, GPUs, or host CPU cores
    (each of XLA's virtual CPU devices runs on the host's thread pool; more than cores is no gain)."""
    if device == "TPU":
        return sum(CORES_PER_CHIP.get(chip.generation or "", 1) for chip in tpu_chips())
    if device == "CUDA":
        return nvidia_gpus()
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def processes_possible(device: str) -> int:
    """Processes of one device each this host can run: TPU chips from v4 on (one TensorCore
    device each), GPUs; none on XLA's CPU client, which has no collectives between processes."""
    if device == "TPU":
        return len([chip for chip in tpu_chips() if CORES_PER_CHIP.get(chip.generation or "", 1) == 1])
    if device == "CUDA":
        return nvidia_gpus()
    return 0
