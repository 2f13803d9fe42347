"""A Slurm sweep planned for its compute nodes, not for the host that submits it.

A login node has no GPUs: planned there, every NVIDIA cell would be "not available here". With a
machine profile (``--machine NAME``, or the sweep file's ``machine``), ``--executor slurm`` plans
each cell for that profile instead (core.running.planning.plan_run with ``machine``): its
accelerator, device count, memory per device, precisions and replicas are checked before anything
is submitted. What only the node can say (the devices there, their power meter) is left to the job,
which plans the run again from the cell's options (core.running.node_plan); a node that turns out
unable to run it records the run as refused there, with its reason, and the sweep goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from core.base.errors import ConfigError
from core.running.launch import write_request

if TYPE_CHECKING:
    from core.base.machine import MachineProfile
    from core.sweep.plan import Cell, SweepPlan
    from core.sweep.spec import SweepSpec

#: what a Slurm sweep planned for this host adds to a cell whose accelerator is not available here
PROFILE_HINT = (
    "; to plan for the compute nodes, name their machine profile: --machine NAME or the sweep file's `machine` "
    "key (see `core machines`)"
)


def profile_hint(error: ConfigError, executor: str, machine: MachineProfile | None) -> str:
    """:data:`PROFILE_HINT` for a cell of a Slurm sweep planned for this host and refused because
    its accelerator is not available here; "" otherwise."""
    unavailable = error.field == "accelerator" and str(error.allowed).startswith("not available here")
    return PROFILE_HINT if executor == "slurm" and machine is None and unavailable else ""


def machine_of_file(
    spec: SweepSpec, source: str | None, site_machines: Mapping[str, MachineProfile] | None = None
) -> MachineProfile | None:
    """The profile the sweep file's ``machine`` names (a site file's, a shipped one, or a path read
    from the file's folder), for a Slurm sweep run through the API; None where the file names none."""
    if spec.machine is None:
        return None
    from core.machines import load_machine, shipped_machines

    shipped = {**shipped_machines(), **site_machines} if site_machines else None
    relative_to = Path(source).parent if source is not None else None
    return load_machine(spec.machine, relative_to=relative_to, shipped=shipped)


def check_plan_runs_on(plan: SweepPlan, executor: str) -> None:
    """A plan made for a machine profile runs only as Slurm jobs, each planning its run again on its
    node; anywhere else (here, the local executor) it would run what was never checked here.

    :raises SweepError: naming the profile and what to do instead.
    """
    from core.sweep.spec import SweepError

    if executor == "slurm":
        return
    machine = next((cell.planned.machine for cell in plan.valid_cells if cell.planned is not None), None)
    if machine is not None:
        raise SweepError(
            f"this sweep's cells were planned for machine {machine!r}, not this host: such a plan is for --dry-run "
            "or for --executor slurm (whose jobs plan each run again on their node); plan it again without the "
            "machine to run it here"
        )


def write_job_request(path: Path, cell: Cell) -> None:
    """A Slurm job's request (core/running/child.py): the cell's plan, and where it was planned for a
    machine profile, the cell's options, for the job to plan the run again on its node."""
    planned = cell.planned
    assert planned is not None, "only validated cells run"
    plan_on_node = dict(cell.options) if planned.machine is not None else None
    # No one reads a Slurm job's progress: its run counts no steps.
    write_request(path, planned, parent_pid=None, plan_on_node=plan_on_node, steps_progress=False)
