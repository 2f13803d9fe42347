"""Energy over the timed window: the meter interface, counters with wrap handling, and sampled power.

``meter`` is the interface a plugin's meter implements; ``meters`` the device meter built on
energy counters or sampled power; ``sampling`` fixed-rate power sampling and the power timeline.
"""

from __future__ import annotations

import importlib
from typing import Any

from core.base.deprecation import REMOVED_IN, warn_deprecated


def __getattr__(name: str) -> Any:
    # ``core.energy`` was one module (now ``core.energy.meters``) until 0.2: its names stay
    # reachable here for a release. Plugins import them from core.plugin.
    meters = importlib.import_module("core.energy.meters")
    if not name.startswith("_") and hasattr(meters, name):
        warn_deprecated(
            f"core.energy.{name} moved to core.energy.meters.{name} (plugins: core.plugin.{name});"
            f" the old path goes in core {REMOVED_IN}",
            removed_in=REMOVED_IN,
        )
        return getattr(meters, name)
    raise AttributeError(f"module 'core.energy' has no attribute {name!r}")
