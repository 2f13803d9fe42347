"""Unit conversions shared by the result, the CLI, the exports and the report.

Energy is measured in joules (what counters and power integrals give); the papers core is checked
against (CARAML among them) report watt-hours, so every energy figure is shown in both.
"""

from __future__ import annotations

JOULES_PER_WATT_HOUR = 3600.0


def watt_hours(joules: float | None) -> float | None:
    """``joules`` in Wh; None stays None (an unmeasured figure is never made up)."""
    return None if joules is None else joules / JOULES_PER_WATT_HOUR
