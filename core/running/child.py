"""One run in a process of its own: ``python -m core.running.child REQUEST RESULT``. A sweep runs each
repeat of a cell this way (locally, or as a Slurm job), and ``core.run`` a run with a time limit; the
parent's side is :func:`core.running.launch.run_in_child`.

REQUEST is a JSON file ``{"plan": {...}, "options": {...}, "parent_pid": N}``: ``plan`` is the run's
validated plan (:class:`core.running.planning.PlannedRun`), which this process rebuilds and runs as
it is, planning nothing again; ``options`` repeats its configuration for readers (this process does
not read it, except in a request without a plan, written by an older core). N is the process that
wrote the request, this process's parent unless a fork server (core.running.forkserver) forked it,
which ``$CORE_PARENT_PID`` then names; ``null`` in a Slurm job, which has no parent to outlive.

The run's observers are the parent's: this process tells none of them (no plugin hook fires here).
It writes the result to RESULT atomically when the run is over; after each phase it writes what it
has to RESULT.partial (for replicas as processes too: the launch passes rank 0's phases on), so a
run that later crashes or hangs still leaves its earlier figures. The parent, not this process,
decides what a missing RESULT means.

It must not outlive its parent (the sweep, or the run with a time limit): if the parent dies
(``kill -9``), the kernel sends this process SIGTERM (core.running.processes.die_with_parent); a
torchrun launch in progress stops its processes on it, so a resumed sweep never measures next to an
orphan.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.base.errors import ConfigError, PluginError
from core.base.files import parse_json, write_atomically
from core.base.results import RunResult, RunState, Status
from core.running import processes
from core.running.node_plan import RefusedOnNode
from core.running.observe import ResultWriter

if TYPE_CHECKING:
    from core.running.planning import RunPlan

PARTIAL_SUFFIX = ".partial"


def _plan_of(request: dict[str, Any]) -> RunPlan:
    """The request's plan, rebuilt in this process; planned here for a request without one (a Slurm
    job submitted by an older core and run by this one), and for a plan made for a machine profile
    whose request asks for it (core.running.node_plan: a Slurm job submitted from a login node)."""
    from core.contract.manager import get_plugin_manager
    from core.running.node_plan import PLAN_ON_NODE_KEY, plan_on_node
    from core.running.planning import PlannedRun, plan_run

    manager = get_plugin_manager()
    if request.get("plan") is not None:
        # Validated as JSON: the configuration's enums and tuples are JSON values there.
        planned = PlannedRun.read(json.dumps(request["plan"]))
        if planned.machine is not None and request.get(PLAN_ON_NODE_KEY) is not None:
            return plan_on_node(manager, planned, request[PLAN_ON_NODE_KEY])  # a Slurm job planned for its profile
        return planned.rebuild(manager)
    options = dict(request["options"])
    return plan_run(manager, options.pop("workload"), options.pop("accelerator"), options)


class _PartialWriter(ResultWriter):
    """RESULT.partial after each phase, and the latest partial result kept for an interrupted run."""

    def __init__(self, result_path: Path, steps_progress: bool = True) -> None:
        super().__init__(result_path.with_name(result_path.name + PARTIAL_SUFFIX), "the partial result", steps_progress)
        self.latest: RunResult | None = None

    def phase_ended(self, partial: RunResult) -> None:
        self.latest = partial
        super().phase_ended(partial)


def _interrupted(latest: RunResult) -> RunResult:
    latest.status = Status(
        state=RunState.error,
        phase=processes.phase_after(latest),
        error_type="Interrupted",
        message="the run was interrupted (SIGINT to its process) before it finished; the phases "
        "measured before are kept",
    )
    return latest


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    try:
        request = parse_json(request_path.read_text(encoding="utf-8"))
        if not isinstance(request, dict):
            raise ValueError(f"a JSON {type(request).__name__}, not an object")
    except (OSError, ValueError) as error:  # a damaged request in a Slurm job's folder, say
        print(f"core: error: cannot read the run's request {request_path}: {error}", file=sys.stderr)
        return 2
    # A Slurm job's request names no parent (core.sweep.cluster): the sweep that submitted it may
    # be killed and resumed while the job runs on, and Slurm, not a parent, ends it (its time limit, scancel).
    # Otherwise the parent is the sweep (or the run with a time limit) that wrote the request, or the
    # fork server it forks runs from, which $CORE_PARENT_PID then names.
    requested_parent = request.get("parent_pid")
    if requested_parent is not None:
        parent_pid = os.getppid()
        if parent_pid not in (int(requested_parent), processes.expected_parent()):
            return 3  # the parent died before this process started
        processes.die_with_parent(parent_pid, signal.SIGTERM)

    from core.running.launch import run_here
    from core.running.step_progress import STEPS_PROGRESS_KEY

    # A request of an older core has no such key: its parent may read the steps.
    partial = _PartialWriter(result_path, steps_progress=request.get(STEPS_PROGRESS_KEY) is not False)
    try:
        result = run_here(_plan_of(request), partial)
    except RefusedOnNode as refusal:  # planned for a machine profile, and this node is not one such
        print(f"core: error: the run was refused on this node: {refusal}", file=sys.stderr)
        write_atomically(result_path, refusal.result.model_dump_json(), "the result")
        return 1
    except ConfigError as error:
        # Validated before; refused here only if the machine or its plugins changed since.
        print(f"core: error: the run was refused: {error}", file=sys.stderr)
        return 2
    except PluginError as error:
        # A plugin's code raised while an old request was planned: the parent records this process's
        # exit with the message below, which names the plugin and where it raised.
        print(f"core: error: a plugin failed while the run was planned: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # SIGINT sent to this process itself (the sweep stops a cell with SIGTERM, and a Ctrl-C at
        # the sweep's terminal does not reach this session): a failed repeat, with what was measured.
        print("core: the run was interrupted (SIGINT)", file=sys.stderr)
        if partial.latest is not None:
            write_atomically(result_path, _interrupted(partial.latest).model_dump_json(), "the result")
        return 128 + signal.SIGINT
    write_atomically(result_path, result.model_dump_json(), "the result")
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
