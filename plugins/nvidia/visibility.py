"""Which NVML devices a process sees: CUDA_VISIBLE_DEVICES applied to NVML's enumeration.

NVML lists every GPU of the node and ignores CUDA_VISIBLE_DEVICES, so the mapping is done here,
following the CUDA runtime's rules: entries are indices or (prefixes of) UUIDs, and the list
ends at the first entry that matches no device.
"""

from __future__ import annotations

from collections.abc import Sequence


def visible_nvml_indices(cuda_visible_devices: str | None, nvml_uuids: Sequence[str]) -> list[int]:
    """NVML indices in CUDA's order (cuda:0 first).

    :param cuda_visible_devices: the variable's value, None when unset.
    :param nvml_uuids: every device's UUID in NVML order ("GPU-8c1f...").

    Integer entries are taken as NVML (PCI bus) order, which is CUDA's order when
    CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are all of one model; UUID entries are exact.
    """
    if cuda_visible_devices is None:
        return list(range(len(nvml_uuids)))
    indices: list[int] = []
    for token in (t.strip() for t in cuda_visible_devices.split(",")):
        index = _resolve(token, nvml_uuids)
        if index is None or index in indices:
            break  # CUDA ignores this entry and every one after it
        indices.append(index)
    return indices


def _resolve(token: str, nvml_uuids: Sequence[str]) -> int | None:
    if not token:
        return None
    if token.lstrip("-").isdigit():
        index = int(token)
        return index if 0 <= index < len(nvml_uuids) else None
    wanted = token if token.startswith("GPU-") else f"GPU-{token}"
    matches = [i for i, uuid in enumerate(nvml_uuids) if uuid.startswith(wanted)]
    return matches[0] if len(matches) == 1 else None  # an ambiguous prefix matches nothing
