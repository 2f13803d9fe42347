"""The XLA devices core records: each device's kind, and its memory where torch-xla's runtime reports it.

A TPU is listed per XLA device (a TensorCore: two per v2/v3 chip, one from v4 on), named by its
generation ("TPU v4") from the runtime's device kind, else the PCI device id. XLA's CPU device
reports no memory (its client does not implement allocator statistics), so none is stated.

``core devices`` asks the runtime in a child process (``python -m core_plugins.xla.probe``): a
process that starts torch-xla's TPU runtime holds the chips until it exits, and the process that
lists devices may go on to launch a run whose own processes need them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from core.plugin import DeviceRecord, processor_name

from . import discovery

#: the PJRT runtime's TPU device kinds (as JAX and torch-xla report them) and the generation each is
_RUNTIME_GENERATIONS = (
    (r"v5\s*lite|v5e", "v5e"),
    (r"v6\s*lite|v6e", "v6e"),
    (r"v5p|^TPU v5$", "v5p"),
    (r"v4", "v4"),
    (r"v3", "v3"),
    (r"v2", "v2"),
)
#: Cloud TPU accelerator types ("v4-8", "v5litepod-8", "v6e-8") and the generation each names
_ACCELERATOR_TYPES = (
    (r"^v5lite|^v5e", "v5e"),
    (r"^v5p", "v5p"),
    (r"^v6e", "v6e"),
    (r"^v4", "v4"),
    (r"^v3", "v3"),
    (r"^v2", "v2"),
)
PROBE_TIMEOUT_SECONDS = 300.0


def tpu_generation(
    runtime_kind: str | None, chip: discovery.TpuChip | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The generation ("v4"): from the runtime's device kind, else the TPU VM's accelerator type, else
    the PCI device id where it names one generation (v2 and v3 share theirs)."""
    env = os.environ if environ is None else environ
    if runtime_kind:
        for pattern, generation in _RUNTIME_GENERATIONS:
            if re.search(pattern, runtime_kind, flags=re.IGNORECASE):
                return generation
    accelerator_type = env.get("TPU_ACCELERATOR_TYPE") or env.get("ACCELERATOR_TYPE") or ""
    for pattern, generation in _ACCELERATOR_TYPES:
        if re.search(pattern, accelerator_type, flags=re.IGNORECASE):
            return generation
    if chip is not None and chip.generation and "/" not in chip.generation:
        return chip.generation
    return None


def device_records(
    device_type: str, count: int, runtime_kind: str | None, memory_bytes: int | None, **details: Any
) -> list[DeviceRecord]:
    """``count`` XLA devices of one type as core records them."""
    common = {"pjrt_device": device_type, "runtime_device_kind": runtime_kind, **details}
    if device_type == "TPU":
        return _tpu_records(count, runtime_kind, memory_bytes, common)
    if device_type == "CPU":
        name = f"XLA CPU device ({processor_name() or 'host CPU'})"
        common["memory"] = "not reported: torch-xla's CPU client has no allocator statistics"
    else:
        name = runtime_kind or f"{device_type} device"
    return [
        DeviceRecord(index=index, name=name, kind="xla", memory_bytes=memory_bytes, details=dict(common))
        for index in range(count)
    ]


def _tpu_records(
    count: int, runtime_kind: str | None, memory_bytes: int | None, common: dict[str, Any]
) -> list[DeviceRecord]:
    chips = discovery.tpu_chips()
    records = []
    for index in range(count):
        per_chip = discovery.CORES_PER_CHIP.get(chips[0].generation or "", 1) if chips else 1
        chip = chips[index // per_chip] if index // per_chip < len(chips) else None
        generation = tpu_generation(runtime_kind, chip)
        if generation is not None:
            per_chip = discovery.CORES_PER_CHIP.get(generation, 1)
        name = (
            f"TPU {generation}"
            if generation
            else f"TPU (generation unknown: PCI device {chip.device_id if chip else '?'})"
        )
        chip_facts = {"pci_address": chip.pci_address, "pci_device_id": chip.device_id} if chip else {}
        records.append(
            DeviceRecord(
                index=index,
                name=name,
                kind="xla",
                memory_bytes=memory_bytes,
                details={**common, **chip_facts, "devices_per_chip": per_chip},
            )
        )
    return records


def runtime_facts() -> dict[str, Any]:
    """This process's XLA device as torch-xla's runtime (already started here) reports it."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    facts: dict[str, Any] = {"devices": xr.global_runtime_device_count(), "device_kind": None, "memory_bytes": None}
    if xr.is_spmd():
        return facts  # SPMD's one virtual device has no kind or memory of its own
    device = torch_xla.device()
    facts["device_kind"] = xm.xla_device_kind(device)
    try:
        facts["memory_bytes"] = int(xm.get_memory_info(device)["bytes_limit"])
    except (RuntimeError, KeyError, TypeError, ValueError):
        pass  # XLA's CPU client: "GetAllocatorStats is not supported"
    return facts


def run_devices(replicas: int, parallelism: str | None) -> list[DeviceRecord]:
    """The devices a run uses, one per replica (the run's MFU divides by their summed peaks), as the
    runtime this process started describes its own (a host's XLA devices are of one kind)."""
    device_type = discovery.pjrt_device() or "CPU"
    facts = runtime_facts()
    return device_records(device_type, replicas, facts["device_kind"], facts["memory_bytes"], parallelism=parallelism)


def probed_devices() -> list[DeviceRecord]:
    """Every XLA device of this host, asked of torch-xla's runtime in a child process."""
    device_type = discovery.pjrt_device()
    if device_type is None:
        return []
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "core_plugins.xla.probe"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            check=True,
        )
        facts = json.loads(completed.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        stderr = getattr(exc, "stderr", None) or ""
        why = f"{type(exc).__name__}: {exc} {stderr.strip()[-500:]}".strip()
        count = discovery.device_count(device_type) if device_type != "CPU" else 1
        return device_records(device_type, count, None, None, runtime=f"not reached: {why}")
    return device_records(device_type, int(facts["devices"]), facts["device_kind"], facts["memory_bytes"])
