"""Peak FLOP/s tables: datasheet figures per device model and precision, each with its source.

A vendor plugin keeps its own table (it alone knows its device names); this module gives the
tables one shape, so every result's MFU is computed the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.config import Precision

TERA = 1e12


@dataclass(frozen=True)
class PeakEntry:
    """Dense (no structured sparsity) peak of one device model, in TFLOP/s per precision."""

    model: str  # human name, e.g. "H100 SXM"
    name_pattern: str  # regular expression matched (case-insensitively) against the reported device name
    tflops: Mapping[Precision, float]
    source: str  # datasheet or document the figures come from
    notes: str = ""

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
