"""The papers' AMD machine, as a profile for ``--dry-run --machine NAME`` (core_register_machines).

Device counts are what core places replicas on: ROCm shows an MI250 as two GCDs, so 4 MI250 are
8 devices. Source: CARAML, John, SC24 slides, "ACCELERATORS" table (JURECA's MI250 node), in
../shared/reference/ in the project's workspace.
"""

from __future__ import annotations

from core.plugin import MachineProfile

from .accelerator import PRECISIONS


def amd_machines() -> list[MachineProfile]:
    """The profiles the plugin registers."""
    return [
        MachineProfile(
            name="mi250-x4",
            description="4x AMD MI250 (8 GCDs of 64 GB), 2x 48-core EPYC 7413 (CARAML, JURECA)",
            source="CARAML, ACCELERATORS table (4 x 128 GB HBM2e; two GCDs per MI250)",
            accelerator="amd",
            device="AMD Instinct MI250 GCD",
            devices=8,
            memory_gib_per_device=64.0,
            precisions=PRECISIONS,  # CDNA2: no TF32 mode
            host_cores=96,
            numa_nodes=2,
            details={"gcds_per_package": 2},
        )
    ]
