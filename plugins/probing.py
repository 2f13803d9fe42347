"""Availability probes shared by the vendor plugins.

``core plugins`` must not import any vendor SDK, so a probe only asks whether the SDK's module
can be found and whether the device nodes the driver creates exist.
"""

from __future__ import annotations

import glob
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class SdkProbe:
    module: str  # importable name of the vendor SDK, e.g. "pynvml"
    install_hint: str  # what to do when it is missing
    device_globs: tuple[str, ...]  # driver device nodes; any match means hardware is present
    device_hint: str  # what a missing device means

    def missing(self) -> list[str]:
        """Reasons this host cannot run the vendor's devices; empty when it can."""
        reasons = []
        if not any(glob.glob(pattern) for pattern in self.device_globs):
            reasons.append(self.device_hint)
        if importlib.util.find_spec(self.module) is None:
            reasons.append(self.install_hint)
        return reasons
