"""The papers' IPU machines, as profiles for ``--dry-run --machine NAME`` (core_register_machines).

Sources (../shared/reference/ in the project's workspace):
- CARAML: John, SC24 slides, "ACCELERATORS" table (the IPU-M2000 of JURECA).
- ACES: Nasari et al., PEARC '22, section 2.3 ("IPU-POD16 ... with 8 NUMA nodes").
- IPU-POD64: ACES, Table 3 (its last row: 32 instances, 64 replicas on 64 IPUs) and Graphcore's
  IPU-POD64 reference design (16 IPU-M2000 machines of 4 GC200 IPUs each). Its host is not
  described there: Graphcore's PopRun guide says an IPU-POD64 is "typically configured with one,
  two or four host servers", so its cores and NUMA nodes are unknown.
"""

from __future__ import annotations

from core.plugin import Framework, MachineProfile

from .accelerator import PRECISIONS


def _ipu_pod(name: str, ipus: int, numa_nodes: int | None, host_cores: int | None, source: str) -> MachineProfile:
    return MachineProfile(
        name=name,
        description=f"Graphcore IPU-POD{ipus}: {ipus}x GC200 IPU"
        + (f", host with {numa_nodes} NUMA nodes" if numa_nodes else ""),
        source=source,
        accelerator="graphcore",
        device="GC200 IPU",
        devices=ipus,
        memory_gib_per_device=None,  # 900 MB of In-Processor Memory plus streaming memory: no single figure
        precisions=PRECISIONS[Framework.torch],  # a GC200 computes in fp32 and fp16
        host_cores=host_cores,
        numa_nodes=numa_nodes,
    )


def graphcore_machines() -> list[MachineProfile]:
    """The profiles the plugin registers."""
    return [
        _ipu_pod("ipu-pod4", 4, numa_nodes=2, host_cores=96, source="CARAML, ACCELERATORS table (IPU-M2000, JURECA)"),
        _ipu_pod("ipu-pod16", 16, numa_nodes=8, host_cores=None, source="ACES, section 2.3 ('with 8 NUMA nodes')"),
        _ipu_pod(
            "ipu-pod64",
            64,
            numa_nodes=None,
            host_cores=None,
            source="ACES, Table 3 (64 IPUs: 32 instances x 2 replicas); Graphcore IPU-POD64 datasheet (16x IPU-M2000)",
        ),
    ]
