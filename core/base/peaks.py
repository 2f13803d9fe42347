"""Peak tables: datasheet FLOP/s per device model and precision, and memory bandwidth, each
with its source.

A vendor plugin keeps its own table (it alone knows its device names); this module gives the
tables one shape, so every result's MFU, and every report's roofline, is computed the same way.
The bandwidth is the roofline's slanted roof: attainable FLOP/s = min(peak, bandwidth x
arithmetic intensity).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.base.config import Precision

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class MemoryBandwidth:
    """A device's peak memory bandwidth, in bytes/s, with its source.

    ``memory`` says what the figure is of (``"HBM3"``, ``"DDR5, 12 channels"``; an IPU's is its
    on-chip SRAM, which holds the model: it has no off-chip memory the roofline could use).
    ``caches_bytes_per_second``: the datasheet's cache bandwidths where it gives them (``"L2"``,
    ``"Infinity Cache"``), which a roofline draws as further, higher roofs.
    """

    bytes_per_second: float
    source: str
    memory: str
    caches_bytes_per_second: Mapping[str, float] = field(default_factory=dict)

    def scaled(self, factor: float, note: str) -> MemoryBandwidth:
        """The same figures times ``factor`` (one GCD of a two-GCD package: 0.5), the source saying so."""
        return MemoryBandwidth(
            self.bytes_per_second * factor,
            f"{self.source}; {note}",
            self.memory,
            {name: value * factor for name, value in self.caches_bytes_per_second.items()},
        )


@dataclass(frozen=True)
class PeakEntry:
    """Dense (no structured sparsity) peak of one device model, in TFLOP/s per precision."""

    model: str  # human name, e.g. "H100 SXM"
    name_pattern: str  # regular expression matched (case-insensitively) against the reported device name
    tflops: Mapping[Precision, float]
    source: str  # datasheet or document the figures come from
    notes: str = ""
    bandwidth: MemoryBandwidth | None = None  # None where no datasheet figure is known

    def matches(self, device_name: str) -> bool:
        return re.search(self.name_pattern, device_name, flags=re.IGNORECASE) is not None


@dataclass(frozen=True)
class PeakTable:
    """Entries tried in order: put specific patterns (``H100 NVL``) before general ones (``H100``)."""

    entries: tuple[PeakEntry, ...] = field(default_factory=tuple)

    def entry_for(self, device_name: str) -> PeakEntry | None:
        return next((entry for entry in self.entries if entry.matches(device_name)), None)

    def flops_per_second(self, device_name: str, precision: Precision) -> float | None:
        """Peak FLOP/s of one device, or None where the model or the precision is not in the table."""
        entry = self.entry_for(device_name)
        if entry is None or precision not in entry.tflops:
            return None
        return entry.tflops[precision] * TERA

    def memory_bandwidth(self, device_name: str) -> MemoryBandwidth | None:
        """Peak memory bandwidth of one device, or None where the model or its bandwidth is not known."""
        entry = self.entry_for(device_name)
        return None if entry is None else entry.bandwidth
