"""Energy over the timed window: the meter interface, counters with wrap handling, and sampled power.

``meter`` is the interface a plugin's meter implements; ``meters`` the device meter built on
energy counters or sampled power; ``sampling`` fixed-rate power sampling and the power timeline.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    # ``core.energy`` was one module (now ``core.energy.meters``) until 0.2: its names stay
    # reachable here for a release. Plugins import them from core.plugin.
    meters = importlib.import_module("core.energy.meters")
    if not name.startswith("_") and hasattr(meters, name):
        warnings.warn(
            f"core.energy.{name} moved to core.energy.meters.{name} (plugins: core.plugin.{name});"
            " the old path goes in core 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(meters, name)
    raise AttributeError(f"module 'core.energy' has no attribute {name!r}")
