"""Dense peak TFLOP/s of AMD Instinct accelerators, per physical package, with their sources.

Precisions map to the units PyTorch's kernels use on CDNA: ``fp32`` is the matrix (MFMA) FP32
rate, since rocBLAS/hipBLASLt run fp32 GEMMs on the matrix cores; ``bf16`` and ``fp16`` are the
matrix rates. ``tf32`` exists on MI300X only. MI250 and MI250X figures are per OAM package of two
GCDs; a GCD has half (``peak(..., per_gcd=True)``).

ROCm's architecture pages give each figure as FLOPS/clock/CU x CUs x peak engine clock; the
MI210 and MI250X rows, which those pages do not print, are computed the same way from the gfx90a
FLOPS/clock/CU of the MI250 page, the CU counts of ROCm's hardware specification table and the
1.7 GHz peak engine clock of both parts, and equal AMD's published 45.3/181.0 and 95.7/383.0.

Memory bandwidths are AMD's "peak theoretical memory bandwidth" per package (decimal units),
halved for one GCD like the FLOP/s; the MI300X's 256 MB Infinity Cache has its own peak
bandwidth in AMD's CDNA 3 white paper, drawn as a second, higher roof.
"""

from __future__ import annotations

from core.plugin import GIGA, TERA, MemoryBandwidth, PeakEntry, PeakTable, Precision

FP32, TF32, BF16, FP16 = Precision.fp32, Precision.tf32, Precision.bf16, Precision.fp16

_DOCS = "ROCm documentation (github.com/ROCm/ROCm, docs/conceptual/gpu-arch/"
_MI300X = _DOCS + "mi300.md), table 'Peak-performance capabilities of the MI300X': matrix FP32, TF32, FP16, BF16"
_MI250 = _DOCS + "mi250.md), table 'Peak-performance capabilities of the MI250 OAM': matrix FP32, FP16, BF16"
_MI100 = _DOCS + "mi100.md), table 'Peak-performance capabilities of MI100': matrix FP32, FP16, BF16"
_GFX90A = (
    _DOCS + "mi250.md) FLOPS/clock/CU (matrix FP32 256, FP16/BF16 1024) x {cus} CUs (docs/reference/"
    "gpu-arch-specs.rst) x 1.7 GHz peak engine clock"
)

_DATASHEET = "AMD Instinct {model} accelerator datasheet: peak theoretical memory bandwidth {gb:g} GB/s"


def _bandwidth(model: str, gb_per_second: float, memory: str) -> MemoryBandwidth:
    return MemoryBandwidth(gb_per_second * GIGA, _DATASHEET.format(model=model, gb=gb_per_second), memory)


_MI300X_BANDWIDTH = MemoryBandwidth(
    5300 * GIGA,
    _DATASHEET.format(model="MI300X", gb=5300) + "; Infinity Cache peak 17.2 TB/s: AMD CDNA 3 architecture "
    "white paper (2023), 'AMD Infinity Cache'",
    "HBM3",
    {"Infinity Cache": 17200 * GIGA},
)

AMD_PEAKS = PeakTable(
    (
        PeakEntry(
            "MI300X",
            r"MI300X",
            {FP32: 163.4, TF32: 653.7, BF16: 1307.4, FP16: 1307.4},
            _MI300X,
            notes="amdsmi names it e.g. 'MI300X-O'; tf32 is listed for reference, the plugin does not offer it",
            bandwidth=_MI300X_BANDWIDTH,
        ),
        PeakEntry(
            "MI250X",
            r"MI250X",
            {FP32: 95.7, BF16: 383.0, FP16: 383.0},
            _GFX90A.format(cus=220),
            notes="per OAM package of two GCDs (110 CUs each)",
            bandwidth=_bandwidth("MI250X", 3276.8, "HBM2e"),
        ),
        PeakEntry(
            "MI250",
            r"MI250\b",
            {FP32: 90.5, BF16: 362.1, FP16: 362.1},
            _MI250,
            notes="per OAM package of two GCDs (104 CUs each)",
            bandwidth=_bandwidth("MI250", 3276.8, "HBM2e"),
        ),
        PeakEntry(
            "MI210",
            r"MI210",
            {FP32: 45.3, BF16: 181.0, FP16: 181.0},
            _GFX90A.format(cus=104),
            bandwidth=_bandwidth("MI210", 1638.4, "HBM2e"),
        ),
        PeakEntry(
            "MI100",
            r"MI100",
            {FP32: 46.1, BF16: 92.3, FP16: 184.6},
            _MI100,
            bandwidth=_bandwidth("MI100", 1228.8, "HBM2"),
        ),
    )
)

GCDS_PER_PACKAGE = {"MI250X": 2, "MI250": 2}


def peak(device_name: str, precision: Precision, *, per_gcd: bool = False) -> tuple[float, str] | None:
    """(peak FLOP/s, source) of one package, or of one GCD with ``per_gcd``; None where unknown.

    A name that covers several products ("AMD Instinct MI250X / MI250", as libdrm names PCI
    device 0x740c) matches nothing: the plugin names devices by product where it can tell.
    """
    if "/" in device_name:
        return None
    entry = AMD_PEAKS.entry_for(device_name)
    if entry is None or precision not in entry.tflops:
        return None
    divisor = GCDS_PER_PACKAGE.get(entry.model, 1) if per_gcd else 1
    source = entry.source + (f"; one GCD is 1/{divisor} of the package" if divisor > 1 else "")
    return entry.tflops[precision] * TERA / divisor, source


def peak_flops(device_name: str, precision: Precision, *, per_gcd: bool = False) -> float | None:
    """Peak FLOP/s of one package (or one GCD with ``per_gcd``), or None where unknown."""
    found = peak(device_name, precision, per_gcd=per_gcd)
    return found[0] if found else None


def memory_bandwidth(device_name: str, *, per_gcd: bool = False) -> MemoryBandwidth | None:
    """Peak memory bandwidth of one package, or of one GCD with ``per_gcd`` (half an MI250's: each
    GCD has four of the package's eight HBM stacks); None where unknown or the name is ambiguous."""
    if "/" in device_name:
        return None
    entry = AMD_PEAKS.entry_for(device_name)
    if entry is None or entry.bandwidth is None:
        return None
    divisor = GCDS_PER_PACKAGE.get(entry.model, 1) if per_gcd else 1
    return (
        entry.bandwidth.scaled(1 / divisor, f"one GCD is 1/{divisor} of the package")
        if divisor > 1
        else entry.bandwidth
    )
