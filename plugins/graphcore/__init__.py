"""Graphcore plugin. Its PopTorch placement and gcipuinfo energy code is being written (see the
Graphcore issue); until then the accelerator is listed as unavailable with the exact reason."""

from __future__ import annotations

from typing import Callable, ClassVar

from core import Accelerator, hookimpl
from plugins.probing import PendingAccelerator, SdkProbe

POPLAR_SDK_INSTRUCTIONS = (
    "PopTorch is not installed: it ships only inside Graphcore's Poplar SDK, not on a package index. "
    "Install the SDK, `source <sdk>/enable`, then `pip install <sdk>/poptorch-*.whl` "
    "(and <sdk>/gcipuinfo-*.whl for power) on Python 3.10 with torch 2.0.1"
)


class GraphcoreAccelerator(PendingAccelerator):
    name: ClassVar[str] = "graphcore"
    description: ClassVar[str] = "Graphcore IPUs through PopTorch / TensorFlow-IPU, gcipuinfo power"
    probe: ClassVar[SdkProbe] = SdkProbe(
        module="poptorch",
        install_hint=POPLAR_SDK_INSTRUCTIONS,
        device_globs=("/dev/ipu[0-9]*",),
        device_hint="no IPU found (no /dev/ipu* device nodes; an IPU-Model simulator run needs the SDK too)",
    )
    pending_reason: ClassVar[str] = "the Graphcore placement is not implemented in this version of core"


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(GraphcoreAccelerator())
