"""Peak FLOP/s and memory bandwidth of Graphcore IPUs, per IPU, from Graphcore's own figures.

An IPU keeps the model in its In-Processor-Memory, on-chip SRAM spread over its tiles; it has no
HBM. Its roofline's slanted roof is therefore the SRAM's bandwidth, which Graphcore quotes per
IPU (Streaming Memory, the DRAM of an IPU-Machine, is reached over the IPU-Fabric at a far lower
rate and is not what a model that fits on chip reads). ``fp16`` is Graphcore's FP16.16 and
FP16.SR (AI-Float) rate, ``fp32`` its FP32 rate; the IPU offers no bf16 or tf32.

The device names are core's: gcipuinfo's "board type" and "ipu architecture" ("M2000 ipu2").
A board whose figures Graphcore publishes in another form (the C600 PCIe card) is not listed:
no MFU rather than a wrong one.
"""

from __future__ import annotations

from core.plugin import TERA, MemoryBandwidth, PeakEntry, PeakTable, Precision

FP32, FP16 = Precision.fp32, Precision.fp16

_GC200 = (
    "Graphcore IPU-M2000 datasheet (2020) and Colossus MK2 GC200 IPU product page: per IPU 250 TFLOPS "
    "FP16.16/FP16.SR, 62.5 TFLOPS FP32"
)
_GC200_SRAM = MemoryBandwidth(
    47.5 * TERA,
    "Graphcore Colossus MK2 GC200 IPU product page: 900 MB In-Processor-Memory, 47.5 TB/s memory bandwidth per IPU",
    "on-chip SRAM (In-Processor-Memory)",
)
_BOW = "Graphcore Bow-2000 IPU-Machine datasheet (2022): per Bow IPU 350 TFLOPS FP16.16, 87.5 TFLOPS FP32"
_BOW_SRAM = MemoryBandwidth(
    65.4 * TERA,
    "Graphcore Bow IPU product page (2022): 900 MB In-Processor-Memory, 65.4 TB/s memory bandwidth per IPU",
    "on-chip SRAM (In-Processor-Memory)",
)

GRAPHCORE_PEAKS = PeakTable(
    (
        PeakEntry("Bow IPU", r"\bBow", {FP32: 87.5, FP16: 350.0}, _BOW, bandwidth=_BOW_SRAM),
        PeakEntry(
            "GC200 (Colossus MK2)",
            r"\bM2000\b|\bGC200\b|\bipu2\b",
            {FP32: 62.5, FP16: 250.0},
            _GC200,
            notes="IPU-M2000 and IPU-POD systems: four GC200 IPUs per IPU-Machine",
            bandwidth=_GC200_SRAM,
        ),
    )
)


def peak(device_name: str, precision: Precision) -> tuple[float, str] | None:
    """(peak FLOP/s, source) of one IPU, or None where the board or the precision is not listed."""
    entry = GRAPHCORE_PEAKS.entry_for(device_name)
    flops = GRAPHCORE_PEAKS.flops_per_second(device_name, precision)
    return (flops, entry.source) if entry is not None and flops is not None else None
