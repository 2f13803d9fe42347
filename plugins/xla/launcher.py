"""One fresh process for an SPMD run: its device count and SPMD mode are fixed before torch-xla starts.

An SPMD program spans every device of its runtime, and the runtime is made once per process: the
CPU client's device count comes from ``CPU_NUM_DEVICES`` when it starts, and SPMD must be switched
on before any tensor reaches a device. So the run gets a process of its own, whatever the calling
process has done with torch-xla, started like any launch of core's (supervised, its result read
after every phase); it sees a world of one process holding every replica.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from core.plugin import Launcher, ProcessContext, RunContext

from . import discovery

#: tells the started process how many devices its SPMD mesh spans (checked against its runtime)
SPMD_DEVICES_VARIABLE = "CORE_XLA_SPMD_DEVICES"


class XlaSpmdLauncher(Launcher):
    """Starts the one process of an SPMD run, with the CPU device count set where XLA's CPU runs it."""

    name: ClassVar[str] = "xla-spmd"

    def command(self, context: RunContext, worker: Sequence[str], work: Path) -> list[str]:
        replicas = context.config.replicas
        settings = [f"{SPMD_DEVICES_VARIABLE}={replicas}"]
        if discovery.pjrt_device() == "CPU":
            settings.append(f"CPU_NUM_DEVICES={replicas}")  # XLA's CPU client: one virtual device per replica
        return ["env", *settings, *worker]

    def process_context(self, environ: Mapping[str, str]) -> ProcessContext:
        return ProcessContext()  # one process; its executor holds every replica
