"""The papers' machines, as profiles. Each figure cites where it comes from; what a paper leaves
out is None (unknown), not a guess. Device counts are what core places replicas on: an MI250
shows ROCm two GCDs, so 4 MI250 are 8 devices.

Sources (../shared/reference/ in the project's workspace):
- GH200 paper: Hurt et al., "GH200 vs A100 for computer vision", section I (GP-ENGINE nodes:
  "4x 80GB NVIDIA A100 ... 2x AMD 7713 with 128 Cores"; GH200 "ARM CPU (72 cores) and H100 GPU").
- CARAML: John, SC24 slides, "ACCELERATORS" table (JURECA, JEDI, WestAI platforms).
- ACES: Nasari et al., PEARC '22, section 2.3 ("IPU-POD16 ... with 8 NUMA nodes") and section 2.2
  (A100 40GB PCIe on "dual-socket 48-core Intel Cascade Lake compute nodes").
- AI4NP: Mei et al., poster, Table 1 (T4 "15110 MB", A100 80GB PCIe).
- IPU-POD64: ACES, Table 3 (its last row: 32 instances, 64 replicas on 64 IPUs) and Graphcore's
  IPU-POD64 reference design (16 IPU-M2000 machines of 4 GC200 IPUs each). Its host is not
  described there: Graphcore's PopRun guide says an IPU-POD64 is "typically configured with one,
  two or four host servers", so its cores and NUMA nodes are unknown.
"""

from __future__ import annotations

from core.config import Precision
from core.machines.profile import MachineProfile

_AMPERE_AND_LATER = (Precision.fp32, Precision.tf32, Precision.bf16, Precision.fp16)
_TURING = (Precision.fp32, Precision.fp16)  # compute capability 7.5: no TF32, no bf16
_CDNA2 = (Precision.fp32, Precision.bf16, Precision.fp16)  # MI250: no TF32 mode
_IPU = (Precision.fp32, Precision.fp16)  # GC200 computes in fp32 and fp16

_GH200_PAPER = "GH200 paper, section I (GP-ENGINE node)"


def _a100_80gb(devices: int) -> MachineProfile:
    return MachineProfile(
        name=f"a100-80gb-x{devices}",
        description=f"{devices}x NVIDIA A100 80GB, 2x AMD EPYC 7713 (the GH200 paper's A100 node)",
        source=_GH200_PAPER,
        accelerator="nvidia",
        device="NVIDIA A100 80GB",
        devices=devices,
        memory_gib_per_device=80.0,
        precisions=_AMPERE_AND_LATER,
        host_cores=128,
        numa_nodes=2,  # two sockets; the paper gives no NPS setting
        details={"compute_capability": "8.0"},
    )


def _caraml_node(
    name: str, description: str, device: str, devices: int, memory_gib: float, **host: int
) -> MachineProfile:
    return MachineProfile(
        name=name,
        description=description,
        source="CARAML, ACCELERATORS table",
        accelerator="nvidia",
        device=device,
        devices=devices,
        memory_gib_per_device=memory_gib,
        precisions=_AMPERE_AND_LATER,
        details={"compute_capability": "9.0" if "H100" in device or "GH200" in device else "8.0"},
        **host,
    )


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
        precisions=_IPU,
        host_cores=host_cores,
        numa_nodes=numa_nodes,
    )


def _t4(devices: int, source: str, description: str) -> MachineProfile:
    return MachineProfile(
        name="t4" if devices == 1 else f"t4-x{devices}",
        description=description,
        source=source,
        accelerator="nvidia",
        device="NVIDIA Tesla T4",
        devices=devices,
        memory_gib_per_device=15110 / 1024,
        precisions=_TURING,
        details={"compute_capability": "7.5"},
    )


_PROFILES = [
    _a100_80gb(1),
    _a100_80gb(4),
    MachineProfile(
        name="gh200",
        description="NVIDIA GH200: 72-core Grace CPU and one H100 GPU (the GH200 paper's node)",
        source=_GH200_PAPER + "; 96 GB HBM3 from CARAML's GH200 (JURECA) row",
        accelerator="nvidia",
        device="NVIDIA GH200 (H100 96GB HBM3)",
        devices=1,
        memory_gib_per_device=96.0,
        precisions=_AMPERE_AND_LATER,
        host_cores=72,
        numa_nodes=None,
        details={"compute_capability": "9.0"},
    ),
    _caraml_node(
        "gh200-x4",
        "4x NVIDIA GH200 120GB (CARAML's JEDI node)",
        "NVIDIA GH200 (H100 96GB HBM3)",
        4,
        96.0,
        host_cores=288,
    ),
    _caraml_node(
        "h100-pcie-x4",
        "4x NVIDIA H100 PCIe 80GB, 2x 72-core Xeon 8452Y (CARAML, JURECA)",
        "NVIDIA H100 PCIe",
        4,
        80.0,
        host_cores=144,
        numa_nodes=2,
    ),
    _caraml_node(
        "h100-sxm-x4",
        "4x NVIDIA H100 SXM5 94GB, 2x 32-core Xeon 8462Y (CARAML, WestAI)",
        "NVIDIA H100 SXM5",
        4,
        94.0,
        host_cores=64,
        numa_nodes=2,
    ),
    _caraml_node(
        "a100-40gb-x4",
        "4x NVIDIA A100 SXM4 40GB, 2x 64-core EPYC 7742 (CARAML, JURECA)",
        "NVIDIA A100-SXM4-40GB",
        4,
        40.0,
        host_cores=128,
        numa_nodes=2,
    ),
    MachineProfile(
        name="mi250-x4",
        description="4x AMD MI250 (8 GCDs of 64 GB), 2x 48-core EPYC 7413 (CARAML, JURECA)",
        source="CARAML, ACCELERATORS table (4 x 128 GB HBM2e; two GCDs per MI250)",
        accelerator="amd",
        device="AMD Instinct MI250 GCD",
        devices=8,
        memory_gib_per_device=64.0,
        precisions=_CDNA2,
        host_cores=96,
        numa_nodes=2,
        details={"gcds_per_package": 2},
    ),
    _ipu_pod("ipu-pod4", 4, numa_nodes=2, host_cores=96, source="CARAML, ACCELERATORS table (IPU-M2000, JURECA)"),
    _ipu_pod("ipu-pod16", 16, numa_nodes=8, host_cores=None, source="ACES, section 2.3 ('with 8 NUMA nodes')"),
    _ipu_pod(
        "ipu-pod64",
        64,
        numa_nodes=None,
        host_cores=None,
        source="ACES, Table 3 (64 IPUs: 32 instances x 2 replicas); Graphcore IPU-POD64 datasheet (16x IPU-M2000)",
    ),
    _t4(1, "AI4NP, Table 1 (15110 MB)", "one NVIDIA T4 16GB (AI4NP's Table 1)"),
    _t4(2, "AI4NP, Tables 1 and 3", "two NVIDIA T4 16GB (AI4NP's Hydra runs, Table 3)"),
    MachineProfile(
        name="a100-80gb-pcie-x2",
        description="two NVIDIA A100 80GB PCIe (AI4NP's Tables 1 and 3)",
        source="AI4NP, Tables 1 and 3",
        accelerator="nvidia",
        device="NVIDIA A100 80GB PCIe",
        devices=2,
        memory_gib_per_device=80.0,
        precisions=_AMPERE_AND_LATER,
        details={"compute_capability": "8.0"},
    ),
    MachineProfile(
        name="a100-40gb-pcie-x2",
        description="two NVIDIA A100 40GB PCIe on a dual-socket 48-core Cascade Lake node (ACES, Grace)",
        source="ACES, section 2.2",
        accelerator="nvidia",
        device="NVIDIA A100 40GB PCIe",
        devices=2,
        memory_gib_per_device=40.0,
        precisions=_AMPERE_AND_LATER,
        host_cores=48,
        numa_nodes=2,
        details={"compute_capability": "8.0"},
    ),
]

MACHINES: dict[str, MachineProfile] = {profile.name: profile for profile in _PROFILES}
