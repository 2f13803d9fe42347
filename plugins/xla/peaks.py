"""Dense peak TFLOP/s and HBM bandwidth per TPU chip, from Google Cloud's TPU documentation.

Each generation's page ("System architecture", the key specifications table) gives the peak
compute per chip in bf16, which the matrix units (MXUs) multiply in; no float32 peak is published.
An fp32 matmul on a TPU runs as several bf16 passes (torch-xla's mat-mul precision "highest" is six,
``torch_xla/backends``), so fp32 runs get no MFU rather than one against a made-up figure.

Memory bandwidths are the same tables' HBM rows (decimal: 1 GBps = 1e9 B/s); the pages give no
cache bandwidths. TPU v2's page lost its table: its figures come from Google's launch and papers.
A device's name is its generation as this plugin records it ("TPU v5e"); the patterns also match
the PJRT runtime's device kinds ("TPU v5 lite", "TPU v6 lite", "TPU v5").
"""

from __future__ import annotations

from core.plugin import GIGA, MemoryBandwidth, PeakEntry, PeakTable, Precision

BF16 = Precision.bf16


def _page(generation: str) -> str:
    page = f"cloud.google.com/tpu/docs/{generation}"
    return f"Google Cloud TPU documentation, 'TPU {generation}' ({page}), key specifications"


def _hbm(generation: str, gb_per_second: float, memory: str) -> MemoryBandwidth:
    return MemoryBandwidth(gb_per_second * GIGA, f"{_page(generation)}: HBM bandwidth {gb_per_second:g} GBps", memory)


TPU_PEAKS = PeakTable(
    (
        # v5e before v5p: "TPU v5 lite" is the runtime's name for v5e, "TPU v5" (or v5p) for v5p.
        PeakEntry(
            "TPU v5e",
            r"v5\s*e|v5\s*lite",
            {BF16: 197.0},
            f"{_page('v5e')}: peak compute per chip (bf16) 197 TFLOPs",
            # The page's newer table says "800 GiBps"; its chip table, "16 GB, 819 GBps": the figure taken.
            bandwidth=_hbm("v5e", 819, "HBM2, 16 GB"),
        ),
        PeakEntry(
            "TPU v5p",
            r"v5\s*p|TPU v5$",
            {BF16: 459.0},
            f"{_page('v5p')}: peak compute per chip (bf16) 459 TFLOPs",
            bandwidth=_hbm("v5p", 2765, "HBM2e, 95 GB"),
        ),
        PeakEntry(
            "TPU v6e (Trillium)",
            r"v6\s*e|v6\s*lite|trillium",
            {BF16: 918.0},
            f"{_page('v6e')}: peak compute per chip (bf16) 918 TFLOPs",
            bandwidth=_hbm("v6e", 1638, "HBM, 32 GB"),
        ),
        PeakEntry(
            "TPU v4",
            r"v4",
            {BF16: 275.0},
            f"{_page('v4')}: peak compute per chip 275 teraflops (bf16 or int8)",
            bandwidth=_hbm("v4", 1200, "HBM2, 32 GiB"),
        ),
        PeakEntry(
            "TPU v3",
            r"^(?!.*v2).*v3",
            {BF16: 123.0},
            f"{_page('v3')}: peak compute per chip 123 teraflops (bf16)",
            notes="two TensorCores (XLA devices) per chip: each device gets half (peak_per_device)",
            bandwidth=_hbm("v3", 900, "HBM2, 32 GiB"),
        ),
        PeakEntry(
            "TPU v2",
            r"^(?!.*v3).*v2",
            {BF16: 45.0},
            # The v2 page no longer carries the table; it defers to Google's papers on the chip.
            "Google Cloud TPU v2 (cloud.google.com/tpu/docs/v2 and its 2018 launch): 180 teraflops "
            "(bf16) per Cloud TPU of four chips, 45 per chip",
            notes="two TensorCores (XLA devices) per chip: each device gets half (peak_per_device)",
            bandwidth=MemoryBandwidth(
                700 * GIGA,
                "Norrie et al., 'The Design Process for Google's Training Chips: TPUv2 and TPUv3', "
                "IEEE Micro 41(2), 2021: HBM 700 GB/s per chip (v3: +30%, the 900 GBps above)",
                "HBM, 16 GiB",
            ),
        ),
    )
)


def peak_per_device(device_name: str, devices_per_chip: int, precision: Precision) -> tuple[float, str] | None:
    """One XLA device's peak FLOP/s with its source: the chip's, shared by the chip's devices
    (v2 and v3 chips hold two TensorCores, each its own XLA device); None where unknown."""
    entry = TPU_PEAKS.entry_for(device_name)
    flops = TPU_PEAKS.flops_per_second(device_name, precision)
    if entry is None or flops is None:
        return None
    if devices_per_chip > 1:
        return flops / devices_per_chip, f"{entry.source}; per device: the chip's / {devices_per_chip} TensorCores"
    return flops, entry.source


def bandwidth_per_device(device_name: str, devices_per_chip: int) -> MemoryBandwidth | None:
    """One XLA device's HBM bandwidth: the chip's, shared by its devices (two on v2 and v3)."""
    bandwidth = TPU_PEAKS.memory_bandwidth(device_name)
    if bandwidth is None or devices_per_chip <= 1:
        return bandwidth
    return bandwidth.scaled(1 / devices_per_chip, f"per device: the chip's / {devices_per_chip} TensorCores")
