"""The papers' NVIDIA machines, as profiles for ``--dry-run --machine NAME`` (core_register_machines).

Each figure cites where it comes from; what a paper leaves out is None (unknown), not a guess. The
precisions follow from each GPU's compute capability (:func:`precisions_for_compute_capability`).

Sources (../shared/reference/ in the project's workspace):
- GH200 paper: Hurt et al., "GH200 vs A100 for computer vision", section I (GP-ENGINE nodes:
  "4x 80GB NVIDIA A100 ... 2x AMD 7713 with 128 Cores"; GH200 "ARM CPU (72 cores) and H100 GPU").
- CARAML: John, SC24 slides, "ACCELERATORS" table (JURECA, JEDI, WestAI platforms).
- ACES: Nasari et al., PEARC '22, section 2.3 (A100 40GB PCIe and RTX GPUs on "dual-socket 48-core
  Intel Cascade Lake compute nodes, with one GPU on each socket"; T4s on Grace; V100s on NSF
  Expanse), section 3.1 ("DGX-A100 servers equipped with 40 GB of memory") and 3.3.2 ("RTX 6000").
  Where ACES names only the site, the node is its site's or vendor's own description, named in the
  profile's source: SDSC's Expanse system page (GPU nodes: "NVIDIA V100s SMX2 with 4 GPUs per node;
  40 6248 Xeon CPU cores per node; ... 32 GB memory per GPU; ... connected via NVLINK") and NVIDIA's
  DGX A100 datasheet, which ACES cites (footnote 2: 8x A100 40GB, dual AMD Rome 7742, 128 cores).
- AI4NP: Mei et al., poster, Table 1 (T4 "15110 MB", A100 80GB PCIe).
"""

from __future__ import annotations

from core.plugin import MachineProfile, Precision, ProfileRoofs

from .accelerator import precisions_for_compute_capability

_GH200_PAPER = "GH200 paper, section I (GP-ENGINE node)"
_AMPERE = "8.0"
_HOPPER = "9.0"
_TURING = "7.5"  # the T4 and the Quadro RTX 6000
_VOLTA = "7.0"  # the V100
_ACES = "ACES, section 2.3"
_AI4NP_TABLE_1 = "AI4NP, Table 1"
# The poster's own roofs (its Fig. 1), not the datasheets': the T4's ridge point is 8.1 TFLOP/s /
# 245.2 GB/s = 33.0 FLOP/B at fp32 (25.3 against the datasheet's 320 GB/s). FP16 is its Tensor Core
# column; the poster gives no bf16 figure, so none is set.
_T4_ROOFS = ProfileRoofs(
    source=_AI4NP_TABLE_1 + " (Peak BW 245.2 GB/s, FP32 8.1 TFLOPS, FP16 Tensor Core 65 TFLOPS)",
    memory="GDDR6",
    memory_bandwidth_bytes_per_second=245.2e9,
    peak_flops_per_second={Precision.fp32: 8.1e12, Precision.fp16: 65e12},
)
_A100_80GB_PCIE_ROOFS = ProfileRoofs(
    source=_AI4NP_TABLE_1 + " (Peak BW 1607.3 GB/s, FP32 19.4 TFLOPS, FP16 Tensor Core 312 TFLOPS)",
    memory="HBM2e",
    memory_bandwidth_bytes_per_second=1607.3e9,
    peak_flops_per_second={Precision.fp32: 19.4e12, Precision.fp16: 312e12},
)


def _profile(name: str, device: str, devices: int, capability: str, **facts: object) -> MachineProfile:
    return MachineProfile.model_validate(
        {
            "name": name,
            "accelerator": "nvidia",
            "device": device,
            "devices": devices,
            "precisions": precisions_for_compute_capability(capability),
            "details": {"compute_capability": capability},
            **facts,
        }
    )


def _a100_80gb(devices: int) -> MachineProfile:
    return _profile(
        f"a100-80gb-x{devices}",
        "NVIDIA A100 80GB",
        devices,
        _AMPERE,
        description=f"{devices}x NVIDIA A100 80GB, 2x AMD EPYC 7713 (the GH200 paper's A100 node)",
        source=_GH200_PAPER,
        memory_gib_per_device=80.0,
        host_cores=128,
        numa_nodes=2,  # two sockets; the paper gives no NPS setting
    )


def _caraml_node(
    name: str, description: str, device: str, devices: int, memory_gib: float, capability: str, **host: int
) -> MachineProfile:
    return _profile(
        name,
        device,
        devices,
        capability,
        description=description,
        source="CARAML, ACCELERATORS table",
        memory_gib_per_device=memory_gib,
        **host,
    )


def _t4(devices: int, source: str, description: str) -> MachineProfile:
    return _profile(
        "t4" if devices == 1 else f"t4-x{devices}",
        "NVIDIA Tesla T4",
        devices,
        _TURING,
        description=description,
        source=source,
        memory_gib_per_device=15110 / 1024,
        roofs=_T4_ROOFS,
    )


def nvidia_machines() -> list[MachineProfile]:
    """The profiles the plugin registers."""
    return [
        _a100_80gb(1),
        _a100_80gb(4),
        _profile(
            "gh200",
            "NVIDIA GH200 (H100 96GB HBM3)",
            1,
            _HOPPER,
            description="NVIDIA GH200: 72-core Grace CPU and one H100 GPU (the GH200 paper's node)",
            source=_GH200_PAPER + "; 96 GB HBM3 from CARAML's GH200 (JURECA) row",
            memory_gib_per_device=96.0,
            host_cores=72,
            numa_nodes=None,
        ),
        _caraml_node(
            "gh200-x4",
            "4x NVIDIA GH200 120GB (CARAML's JEDI node)",
            "NVIDIA GH200 (H100 96GB HBM3)",
            4,
            96.0,
            _HOPPER,
            host_cores=288,
        ),
        _caraml_node(
            "h100-pcie-x4",
            "4x NVIDIA H100 PCIe 80GB, 2x 72-core Xeon 8452Y (CARAML, JURECA)",
            "NVIDIA H100 PCIe",
            4,
            80.0,
            _HOPPER,
            host_cores=144,
            numa_nodes=2,
        ),
        _caraml_node(
            "h100-sxm-x4",
            "4x NVIDIA H100 SXM5 94GB, 2x 32-core Xeon 8462Y (CARAML, WestAI)",
            "NVIDIA H100 SXM5",
            4,
            94.0,
            _HOPPER,
            host_cores=64,
            numa_nodes=2,
        ),
        _caraml_node(
            "a100-40gb-x4",
            "4x NVIDIA A100 SXM4 40GB, 2x 64-core EPYC 7742 (CARAML, JURECA)",
            "NVIDIA A100-SXM4-40GB",
            4,
            40.0,
            _AMPERE,
            host_cores=128,
            numa_nodes=2,
        ),
        _t4(1, "AI4NP, Table 1 (15110 MB)", "one NVIDIA T4 16GB (AI4NP's Table 1)"),
        _t4(2, "AI4NP, Tables 1 and 3", "two NVIDIA T4 16GB (AI4NP's Hydra runs, Table 3)"),
        _profile(
            "a100-80gb-pcie-x2",
            "NVIDIA A100 80GB PCIe",
            2,
            _AMPERE,
            description="two NVIDIA A100 80GB PCIe (AI4NP's Tables 1 and 3)",
            source="AI4NP, Tables 1 and 3",
            memory_gib_per_device=80.0,
            roofs=_A100_80GB_PCIE_ROOFS,
        ),
        _profile(
            "dgx-a100-40gb",
            "NVIDIA A100-SXM4-40GB",
            8,
            _AMPERE,
            description="NVIDIA DGX A100: 8x A100 SXM4 40GB, 2x 64-core AMD EPYC 7742 (ACES's DGX-A100 servers)",
            source="ACES, sections 2.3 and 3.1 (DGX-A100 with 40 GB); node from the NVIDIA DGX A100 datasheet "
            "(ACES's footnote 2): 8x A100 40GB, dual AMD Rome 7742, 128 cores",
            memory_gib_per_device=40.0,
            host_cores=128,
            numa_nodes=2,  # two sockets; neither ACES nor the datasheet gives the NPS setting
        ),
        _profile(
            "v100-sxm2-32gb-x4",
            "Tesla V100-SXM2-32GB",
            4,
            _VOLTA,
            description="4x NVIDIA V100 SXM2 32GB (NVLink), 2x 20-core Xeon Gold 6248 (ACES's V100s, SDSC Expanse)",
            source="ACES, sections 2.3 and 3 (V100s on NSF Expanse); node from SDSC's Expanse system page: "
            "4x V100 SXM2 32 GB per node over NVLink, 40 Xeon 6248 cores",
            memory_gib_per_device=32.0,
            host_cores=40,
            numa_nodes=2,  # two sockets ("dual 20-core"); no sub-NUMA setting is published
        ),
        _profile(
            "rtx6000-x2",
            "Quadro RTX 6000",
            2,
            _TURING,
            description="two NVIDIA Quadro RTX 6000 24GB on a dual-socket 48-core Cascade Lake node (ACES, Grace)",
            source=_ACES + " (one GPU per socket) and 3.3.2 (RTX 6000); 24 GB GDDR6 from the NVIDIA Quadro RTX "
            "6000 datasheet",
            memory_gib_per_device=24.0,
            host_cores=48,
            numa_nodes=2,
        ),
        _profile(
            "a100-40gb-pcie-x2",
            "NVIDIA A100 40GB PCIe",
            2,
            _AMPERE,
            description="two NVIDIA A100 40GB PCIe on a dual-socket 48-core Cascade Lake node (ACES, Grace)",
            source=_ACES,
            memory_gib_per_device=40.0,
            host_cores=48,
            numa_nodes=2,
        ),
    ]
