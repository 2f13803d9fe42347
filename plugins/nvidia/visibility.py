"""Which NVML devices a process sees: CUDA_VISIBLE_DEVICES applied to NVML's enumeration.

NVML lists every GPU of the node and ignores CUDA_VISIBLE_DEVICES, so the mapping is done here,
following the CUDA runtime's rules: entries are indices, (prefixes of) UUIDs or MIG identifiers,
and the list ends at the first entry that matches no device.

Sources for the forms: the CUDA C++ Programming Guide, "CUDA Environment Variables"
(CUDA_VISIBLE_DEVICES: indices, UUIDs as nvidia-smi prints them, abbreviated prefixes, the list
cut at the first invalid entry, and "MIG support: MIG-<GPU-UUID>/<GPU instance ID>/<compute
instance ID>"); NVIDIA's MIG User Guide, "CUDA Device Enumeration" (a MIG device is named by the
UUID nvidia-smi -L prints); and NVIDIA/gpu-operator's MIG docs, whose R450-era `nvidia-smi -L`
prints "MIG-GPU-<uuid>/7/0" where R470 and newer drivers print "MIG-<uuid>".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class MigDevice:
    """A MIG device as NVML lists it under its parent GPU."""

    uuid: str  # "MIG-<uuid>" (NVML R470 and newer)
    parent_index: int  # the parent GPU's NVML index
    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True)
class Placement:
    """One device CUDA shows this process: a whole GPU, or a MIG device on it."""

    nvml_index: int  # the GPU's (for a MIG device: its parent's) NVML index
    mig: MigDevice | None = None


def visible_nvml_indices(cuda_visible_devices: str | None, nvml_uuids: Sequence[str]) -> list[int]:
    """NVML indices in CUDA's order (cuda:0 first).

    :param cuda_visible_devices: the variable's value, None when unset.
    :param nvml_uuids: every device's UUID in NVML order ("GPU-8c1f...").

    Integer entries are taken as NVML (PCI bus) order, which is CUDA's order when
    CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are all of one model; UUID entries are exact.
    """
    return [p.nvml_index for p in visible_placements(cuda_visible_devices, nvml_uuids, ())]


def names_mig_devices(cuda_visible_devices: str | None) -> bool:
    """Whether the variable names MIG devices (so NVML's MIG devices need listing)."""
    return cuda_visible_devices is not None and "MIG-" in cuda_visible_devices


def visible_placements(
    cuda_visible_devices: str | None, nvml_uuids: Sequence[str], migs: Sequence[MigDevice]
) -> list[Placement]:
    """The devices CUDA shows, in its order: whole GPUs and MIG devices.

    :param cuda_visible_devices: the variable's value, None when unset.
    :param nvml_uuids: every GPU's UUID in NVML order ("GPU-8c1f...").
    :param migs: every MIG device NVML lists (empty where the variable names none).

    MIG entries take both forms CUDA accepts: ``MIG-<uuid>`` (R470 and newer) and
    ``MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`` (R450).
    """
    if cuda_visible_devices is None:
        return [Placement(i) for i in range(len(nvml_uuids))]
    placements: list[Placement] = []
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        placement = _resolve_mig(token, nvml_uuids, migs) if token.startswith("MIG-") else _resolve(token, nvml_uuids)
        if placement is None or placement in placements:
            break  # CUDA ignores this entry and every one after it
        placements.append(placement)
    return placements


def _resolve(token: str, nvml_uuids: Sequence[str]) -> Placement | None:
    if not token:
        return None
    if token.lstrip("-").isdigit():
        index = int(token)
        return Placement(index) if 0 <= index < len(nvml_uuids) else None
    wanted = token if token.startswith("GPU-") else f"GPU-{token}"
    matches = [i for i, uuid in enumerate(nvml_uuids) if uuid.startswith(wanted)]
    return Placement(matches[0]) if len(matches) == 1 else None  # an ambiguous prefix matches nothing


def _resolve_mig(token: str, nvml_uuids: Sequence[str], migs: Sequence[MigDevice]) -> Placement | None:
    if "/" in token:  # MIG-GPU-<uuid>/<gi>/<ci>
        parent, _, instances = token[len("MIG-") :].partition("/")
        gi, _, ci = instances.partition("/")
        if not (gi.isdigit() and ci.isdigit()):
            return None
        matches = [
            m
            for m in migs
            if nvml_uuids[m.parent_index] == parent and (m.gpu_instance, m.compute_instance) == (int(gi), int(ci))
        ]
    else:
        matches = [m for m in migs if m.uuid.startswith(token)]
    return Placement(matches[0].parent_index, matches[0]) if len(matches) == 1 else None
