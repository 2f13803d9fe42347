"""Dense peak TFLOP/s of NVIDIA data-centre GPUs, from NVIDIA's datasheets.

Datasheets quote tensor-core figures "with sparsity" (2:4 structured) beside or instead of dense
ones; every figure here is dense, i.e. half the sparse one where only that is printed. tf32,
bf16 and fp16 are tensor-core rates; fp32 is the non-tensor (CUDA core) rate.
"""

from __future__ import annotations

from core.plugin import PeakEntry, PeakTable, Precision

FP32, TF32, BF16, FP16 = Precision.fp32, Precision.tf32, Precision.bf16, Precision.fp16

_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021), table 'Specifications'; dense = sparse / 2"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2023), table 'Technical Specifications'; dense = sparse / 2"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024), table 'Technical Specifications'; dense = sparse / 2"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (2023), GPU figures; dense = sparse / 2"

NVIDIA_PEAKS = PeakTable(
    (
        PeakEntry("GH200", r"GH200", {FP32: 67.0, TF32: 494.0, BF16: 990.0, FP16: 990.0}, _GH200),
        PeakEntry("H200 NVL", r"H200 NVL", {FP32: 60.0, TF32: 417.5, BF16: 835.5, FP16: 835.5}, _H200),
        PeakEntry("H200 SXM", r"H200", {FP32: 67.0, TF32: 494.5, BF16: 989.5, FP16: 989.5}, _H200),
        PeakEntry("H100 NVL", r"H100 NVL", {FP32: 60.0, TF32: 417.5, BF16: 835.5, FP16: 835.5}, _H100),
        PeakEntry("H100 PCIe", r"H100.*PCIe", {FP32: 51.0, TF32: 378.0, BF16: 756.5, FP16: 756.5}, _H100),
        PeakEntry(
            "H100 SXM",
            r"H100",
            {FP32: 67.0, TF32: 494.5, BF16: 989.5, FP16: 989.5},
            _H100,
            notes="NVML names the SXM part e.g. 'NVIDIA H100 80GB HBM3'",
        ),
        # A100 PCIe and SXM share the same peak rates; they differ in power and memory bandwidth.
        PeakEntry("A100 PCIe", r"A100.*PCIE", {FP32: 19.5, TF32: 156.0, BF16: 312.0, FP16: 312.0}, _A100),
        PeakEntry("A100 SXM", r"A100", {FP32: 19.5, TF32: 156.0, BF16: 312.0, FP16: 312.0}, _A100),
        PeakEntry(
            "V100 SXM2",
            r"V100.*SXM2",
            {FP32: 15.7, FP16: 125.0},
            "NVIDIA Tesla V100 GPU datasheet (2020): SXM2 single precision 15.7, tensor 125 TFLOPS",
            notes="Volta has no TF32 or BF16",
        ),
        # Before the plain V100 pattern: NVML names it "Tesla V100S-PCIE-32GB", and its clocks are higher.
        PeakEntry(
            "V100S PCIe",
            r"V100S",
            {FP32: 16.4, FP16: 130.0},
            "NVIDIA V100S datasheet (2019): single precision 16.4, tensor 130 TFLOPS",
        ),
        PeakEntry(
            "V100 PCIe",
            r"V100",
            {FP32: 14.0, FP16: 112.0},
            "NVIDIA Tesla V100 GPU datasheet (2020): PCIe single precision 14, tensor 112 TFLOPS",
        ),
        PeakEntry(
            "T4",
            r"\bT4\b",
            {FP32: 8.1, FP16: 65.0},
            "NVIDIA T4 Tensor Core GPU datasheet (2019): single precision 8.1, mixed FP16/FP32 65 TFLOPS",
            notes="Turing has no TF32 or BF16",
        ),
    )
)
