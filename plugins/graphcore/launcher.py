"""poprun as a core launcher: a run of several instances (host processes) is started by core.

poprun (Poplar SDK) starts ``--num-instances`` copies of a program through Open MPI's ``mpirun``
and splits ``--num-replicas`` among them; each copy learns its place from Open MPI's variables
(``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``), which PopTorch's
``Distributed`` options and PopDist read too. core runs the command under its supervisor and reads
instance 0's result, as it does torchrun's rank 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from core.plugin import Launcher, ProcessContext, RunContext

from .placement import PoprunProcess, poprun_command


class PoprunLauncher(Launcher):
    """Starts the run's instances with poprun; each runs its share of the replicas."""

    name: ClassVar[str] = "poprun"

    def command(self, context: RunContext, worker: Sequence[str], work: Path) -> list[str]:
        from .accelerator import GraphcoreAccelerator, GraphcoreOptions

        options = context.accelerator_options_as(GraphcoreOptions)
        placement = GraphcoreAccelerator().placement(context.config, options, context.pipeline_layout)
        return poprun_command(placement, worker, executable_cache_dir=options.executable_cache_dir or None)

    def process_context(self, environ: Mapping[str, str]) -> ProcessContext:
        process = PoprunProcess.from_environment(environ)
        if process is None:
            raise RuntimeError("started as a poprun instance, but Open MPI's OMPI_COMM_WORLD_* variables are not set")
        # Each instance's meter reads the IPUs it attached (plugins/graphcore/meter.py), so every
        # instance reads one, and the run's energy is their sum over the same IPUs as its samples.
        return ProcessContext(
            rank=process.instance_index,
            local_rank=process.local_index,
            world_size=process.instances,
            local_world_size=int(environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", process.instances)),
            node_rank=process.instance_index,
            meter_per_process=True,
        )

    def killed_inside(self, output: str) -> bool:
        # mpirun's report: "mpirun noticed that process rank 1 ... exited on signal 9 (Killed)."
        return "signal 9" in output or "SIGKILL" in output
