"""Dense peak TFLOP/s of NVIDIA data-centre GPUs, from NVIDIA's datasheets.

Datasheets quote tensor-core figures "with sparsity" (2:4 structured) beside or instead of dense
ones; every figure here is dense, i.e. half the sparse one where only that is printed. tf32,
bf16 and fp16 are tensor-core rates; fp32 is the non-tensor (CUDA core) rate.

Memory bandwidths are the same datasheets' "GPU Memory Bandwidth" rows (decimal: 1 TB/s =
1e12 B/s). They depend on the memory fitted, so the A100's 40 GB and 80 GB parts are entries of
their own. NVIDIA's datasheets give no cache bandwidth, so no cache roof is drawn for these GPUs.
"""

from __future__ import annotations

from core.plugin import GIGA, MemoryBandwidth, PeakEntry, PeakTable, Precision

FP32, TF32, BF16, FP16 = Precision.fp32, Precision.tf32, Precision.bf16, Precision.fp16

_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), table 'Specifications'; dense = sparse / 2"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), table 'Technical Specifications'; dense = sparse / 2"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), table 'Technical Specifications'; dense = sparse / 2"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (2023), GPU figures; dense = sparse / 2"


def _bandwidth(gb_per_second: float, memory: str, datasheet: str) -> MemoryBandwidth:
    return MemoryBandwidth(gb_per_second * GIGA, f"{datasheet}: GPU memory bandwidth {gb_per_second:g} GB/s", memory)


_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (2021)"
_A100_40GB = _bandwidth(1555, "HBM2", _A100_DATASHEET)
_H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (2023)"
_H200_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (2024)"
_FP32_A100 = {FP32: 19.5, TF32: 156.0, BF16: 312.0, FP16: 312.0}

NVIDIA_PEAKS = PeakTable(
    (
        PeakEntry(
            "GH200 144GB HBM3e",
            r"GH200.*144",
            {FP32: 67.0, TF32: 494.0, BF16: 990.0, FP16: 990.0},
            _GH200,
            bandwidth=_bandwidth(4900, "HBM3e", "NVIDIA GH200 Grace Hopper Superchip datasheet (2023), 144GB HBM3e"),
        ),
        PeakEntry(
            "GH200 96GB HBM3",
            r"GH200",
            {FP32: 67.0, TF32: 494.0, BF16: 990.0, FP16: 990.0},
            _GH200,
            notes="NVML names it e.g. 'NVIDIA GH200 480GB' (480 GB of Grace's LPDDR5X; 96 GB HBM3 on the GPU)",
            bandwidth=_bandwidth(4000, "HBM3", "NVIDIA GH200 Grace Hopper Superchip datasheet (2023), 96GB HBM3"),
        ),
        PeakEntry(
            "H200 NVL",
            r"H200 NVL",
            {FP32: 60.0, TF32: 417.5, BF16: 835.5, FP16: 835.5},
            _H200,
            bandwidth=_bandwidth(4800, "HBM3e", _H200_DATASHEET),
        ),
        PeakEntry(
            "H200 SXM",
            r"H200",
            {FP32: 67.0, TF32: 494.5, BF16: 989.5, FP16: 989.5},
            _H200,
            bandwidth=_bandwidth(4800, "HBM3e", _H200_DATASHEET),
        ),
        PeakEntry(
            "H100 NVL",
            r"H100 NVL",
            {FP32: 60.0, TF32: 417.5, BF16: 835.5, FP16: 835.5},
            _H100,
            bandwidth=_bandwidth(3900, "HBM3", _H100_DATASHEET),
        ),
        PeakEntry(
            "H100 PCIe",
            r"H100.*PCIe",
            {FP32: 51.0, TF32: 378.0, BF16: 756.5, FP16: 756.5},
            _H100,
            bandwidth=_bandwidth(2000, "HBM2e", _H100_DATASHEET),
        ),
        PeakEntry(
            "H100 SXM",
            r"H100",
            {FP32: 67.0, TF32: 494.5, BF16: 989.5, FP16: 989.5},
            _H100,
            notes="NVML names the SXM part e.g. 'NVIDIA H100 80GB HBM3'",
            bandwidth=_bandwidth(3350, "HBM3", _H100_DATASHEET),
        ),
        # A100 PCIe and SXM share the same peak rates; they differ in power and memory bandwidth.
        # NVML: "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-80GB", "...-40GB".
        PeakEntry(
            "A100 80GB PCIe",
            r"A100.*80GB.*PCIE",
            _FP32_A100,
            _A100,
            bandwidth=_bandwidth(1935, "HBM2e", _A100_DATASHEET),
        ),
        PeakEntry("A100 40GB PCIe", r"A100.*PCIE", _FP32_A100, _A100, bandwidth=_A100_40GB),
        PeakEntry(
            "A100 80GB SXM", r"A100.*80GB", _FP32_A100, _A100, bandwidth=_bandwidth(2039, "HBM2e", _A100_DATASHEET)
        ),
        PeakEntry("A100 40GB SXM", r"A100", _FP32_A100, _A100, bandwidth=_A100_40GB),
        PeakEntry(
            "V100 SXM2",
            r"V100.*SXM2",
            {FP32: 15.7, FP16: 125.0},
            "NVIDIA Tesla V100 GPU datasheet (2020): SXM2 single precision 15.7, tensor 125 TFLOPS",
            notes="Volta has no TF32 or BF16",
            bandwidth=_bandwidth(900, "HBM2", "NVIDIA Tesla V100 GPU datasheet (2020)"),
        ),
        # Before the plain V100 pattern: NVML names it "Tesla V100S-PCIE-32GB", and its clocks are higher.
        PeakEntry(
            "V100S PCIe",
            r"V100S",
            {FP32: 16.4, FP16: 130.0},
            "NVIDIA V100S datasheet (2019): single precision 16.4, tensor 130 TFLOPS",
            bandwidth=_bandwidth(1134, "HBM2", "NVIDIA V100S datasheet (2019)"),
        ),
        PeakEntry(
            "V100 PCIe",
            r"V100",
            {FP32: 14.0, FP16: 112.0},
            "NVIDIA Tesla V100 GPU datasheet (2020): PCIe single precision 14, tensor 112 TFLOPS",
            bandwidth=_bandwidth(900, "HBM2", "NVIDIA Tesla V100 GPU datasheet (2020)"),
        ),
        # Turing's professional card (ACES's "RTX 6000" on Grace). NVML names it "Quadro RTX 6000"; the
        # pattern keeps "NVIDIA RTX 6000 Ada Generation", another GPU, out.
        PeakEntry(
            "Quadro RTX 6000",
            r"Quadro RTX 6000",
            {FP32: 16.3, FP16: 130.5},
            "NVIDIA Quadro RTX 6000 datasheet: single precision 16.3, tensor performance 130.5 TFLOPS",
            notes="Turing has no TF32 or BF16; NVIDIA's Turing architecture whitepaper (2018), appendix A, gives "
            "the Quadro RTX 6000 130.5 with FP32 accumulate too, the rate mixed precision uses",
            bandwidth=_bandwidth(672, "GDDR6", "NVIDIA Quadro RTX 6000 datasheet: up to 672 GB/s"),
        ),
        PeakEntry(
            "T4",
            r"\bT4\b",
            {FP32: 8.1, FP16: 65.0},
            "NVIDIA T4 Tensor Core GPU datasheet (2019): single precision 8.1, mixed FP16/FP32 65 TFLOPS",
            notes="Turing has no TF32 or BF16; AI4NP's Table 1 gives 245.2 GB/s, a measured figure, not this one",
            bandwidth=_bandwidth(320, "GDDR6", "NVIDIA T4 Tensor Core GPU datasheet (2019): 320+ GB/s"),
        ),
    )
)
