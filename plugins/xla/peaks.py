"""Dense peak TFLOP/s per TPU chip, from Google Cloud's TPU documentation.

Each generation's page ("System architecture", the key specifications table) gives the peak
compute per chip in bf16, which the matrix units (MXUs) multiply in; no float32 peak is published.
An fp32 matmul on a TPU runs as several bf16 passes (torch-xla's mat-mul precision "highest" is six,
``torch_xla/backends``), so fp32 runs get no MFU rather than one against a made-up figure.

A device's name is its generation as this plugin records it ("TPU v5e"); the patterns also match
the PJRT runtime's device kinds ("TPU v5 lite", "TPU v6 lite", "TPU v5").
"""

from __future__ import annotations

from core.plugin import PeakEntry, PeakTable, Precision

BF16 = Precision.bf16


def _source(generation: str, page: str, figure: str) -> str:
    return f"Google Cloud TPU documentation, 'TPU {generation}' ({page}), key specifications: {figure}"


TPU_PEAKS = PeakTable(
    (
        # v5e before v5p: "TPU v5 lite" is the runtime's name for v5e, "TPU v5" (or v5p) for v5p.
        PeakEntry(
            "TPU v5e",
            r"v5\s*e|v5\s*lite",
            {BF16: 197.0},
            _source("v5e", "cloud.google.com/tpu/docs/v5e", "peak compute per chip (bf16) 197 TFLOPs; HBM 16 GB"),
        ),
        PeakEntry(
            "TPU v5p",
            r"v5\s*p|TPU v5$",
            {BF16: 459.0},
            _source("v5p", "cloud.google.com/tpu/docs/v5p", "peak compute per chip (bf16) 459 TFLOPs; HBM2e 95 GB"),
        ),
        PeakEntry(
            "TPU v6e (Trillium)",
            r"v6\s*e|v6\s*lite|trillium",
            {BF16: 918.0},
            _source("v6e", "cloud.google.com/tpu/docs/v6e", "peak compute per chip (bf16) 918 TFLOPs; HBM 32 GB"),
        ),
        PeakEntry(
            "TPU v4",
            r"v4",
            {BF16: 275.0},
            _source(
                "v4", "cloud.google.com/tpu/docs/v4", "peak compute per chip 275 teraflops (bf16 or int8); HBM2 32 GiB"
            ),
        ),
        PeakEntry(
            "TPU v3",
            r"^(?!.*v2).*v3",
            {BF16: 123.0},
            _source("v3", "cloud.google.com/tpu/docs/v3", "peak compute per chip 123 teraflops (bf16); HBM2 32 GiB"),
            notes="two TensorCores (XLA devices) per chip: each device gets half (peak_per_device)",
        ),
        PeakEntry(
            "TPU v2",
            r"^(?!.*v3).*v2",
            {BF16: 45.0},
            _source("v2", "cloud.google.com/tpu/docs/v2", "peak compute per chip 45 teraflops (bf16); HBM2 16 GiB"),
            notes="two TensorCores (XLA devices) per chip: each device gets half (peak_per_device)",
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
