"""A run planned for a machine profile, planned again on the node it runs on.

A Slurm sweep submitted from a login node plans each cell for the compute nodes' profile
(``--machine``, core.sweep.remote_plan): everything the profile says is checked there, but no
device is probed and no power meter chosen. The job's request then carries, beside that plan, the
cell's options under :data:`PLAN_ON_NODE_KEY`; the job plans the run again from them on its node,
where the devices are. A node that cannot run it (the accelerator not available there, fewer
devices than the profile said) is not a crash: the run is recorded as refused on that node, with
the node's reason (:func:`refused_on_node`).
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from core.base.errors import ConfigError
from core.base.results import RunResult, RunState, Status

if TYPE_CHECKING:
    from core.contract.manager import PluginManager
    from core.running.planning import PlannedRun, RunPlan

#: the request's key holding the cell's options, to plan again on the node (core/running/child.py)
PLAN_ON_NODE_KEY = "plan_on_node"
#: a run's ``status.error_type`` when the node it ran on refused the plan made for its profile
REFUSED_ON_NODE = "RefusedOnNode"


class RefusedOnNode(Exception):  # noqa: N818 - it carries the result to record, not an error to raise further
    """The node refused a run planned for a machine profile; ``result`` records it."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(result.status.message)
        self.result = result


def plan_on_node(manager: PluginManager, planned: PlannedRun, options: dict[str, Any]) -> RunPlan:
    """The run of ``planned`` (made for machine profile ``planned.machine``) planned again here,
    from the cell's ``options`` (its workload and accelerator among them), as a run on this host.

    :raises RefusedOnNode: this node cannot run it; its result says why.
    """
    from core.running.planning import plan_run

    options = dict(options)
    try:
        return plan_run(manager, options.pop("workload"), options.pop("accelerator"), options)
    except ConfigError as error:
        raise RefusedOnNode(refused_on_node(planned, error)) from None


def refused_on_node(planned: PlannedRun, error: ConfigError, host: str | None = None) -> RunResult:
    """How a run the node refused is recorded: an error in setup, naming the node, the profile it
    was planned for and the node's reason (``invalid accelerator = 'nvidia': not available here: ...``)."""
    config = planned.config
    result = RunResult.of_config(config, world_size=config.replicas)
    node = host or socket.gethostname()
    result.status = Status(
        state=RunState.error,
        phase="setup",
        error_type=REFUSED_ON_NODE,
        message=f"planned for machine {planned.machine!r}, refused on node {node}: {error}",
    )
    return result
