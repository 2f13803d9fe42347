"""One run in its own process: ``python -m core.sweep.worker REQUEST RESULT``. A sweep runs each
repeat of a cell this way, and ``core.run`` a run with a time limit or under LoadGen
(core.running.launch.run_in_child).

REQUEST is a JSON file ``{"options": {...RunConfig fields...}, "parent_pid": N}``: N is the
process that wrote it, this process's parent unless a fork server (core.running.forkserver) forked
it, which ``$CORE_PARENT_PID`` then names; ``null`` in a Slurm job, which has no parent to outlive.
The worker runs the run in this process (``core.api.run_here``) and writes the result to RESULT
atomically when the run is over; after each phase it writes what it has to RESULT.partial (for
replicas as processes too: the launcher passes rank 0's phases on), so a run that later crashes or
hangs still leaves its earlier figures. The parent, not this process, decides what a missing
RESULT means.

A worker must not outlive its parent (the sweep, or the run with a time limit): if the parent dies
(``kill -9``), the kernel sends this process SIGTERM (core.running.processes.die_with_parent); a torchrun
launch in progress stops its processes on it, so a resumed sweep never measures next to an orphan.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from core.errors import ConfigError, PluginError
from core.running import processes
from core.storage.files import write_atomically
from core.storage.results import RunResult, RunState, Status

PARTIAL_SUFFIX = ".partial"


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    request = json.loads(request_path.read_text(encoding="utf-8"))
    # A Slurm job's request names no parent (core.sweep.cluster): the sweep that submitted it may
    # be killed and resumed while the job runs on, and Slurm, not a parent, ends it (its time limit, scancel).
    # Otherwise the parent is the sweep (or the run with a time limit) that wrote the request, or the
    # fork server it forks runs from, which $CORE_PARENT_PID then names.
    requested_parent = request.get("parent_pid")
    if requested_parent is not None:
        parent_pid = os.getppid()
        if parent_pid not in (int(requested_parent), processes.expected_parent()):
            return 3  # the sweep died before this process started
        processes.die_with_parent(parent_pid, signal.SIGTERM)

    from core.api import run_here

    options = dict(request["options"])
    workload, accelerator = options.pop("workload"), options.pop("accelerator")
    partial_path = result_path.with_name(result_path.name + PARTIAL_SUFFIX)
    latest: list[RunResult] = []

    def save_partial(result: RunResult) -> None:
        latest[:] = [result]
        write_atomically(partial_path, result.model_dump_json(), "the partial result")

    try:
        # Here, whatever the scenario: this is the run's own process.
        result = run_here(workload, accelerator, on_progress=save_partial, **options)
    except ConfigError as error:
        # Validated before the sweep began; refused here only if the machine changed since.
        print(f"core: error: the run was refused: {error}", file=sys.stderr)
        return 2
    except PluginError as error:
        # A plugin's code raised while planning (it passed when the sweep began): the sweep records
        # this process's exit with the message below, which names the plugin and where it raised.
        print(f"core: error: a plugin failed while the run was planned: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # SIGINT sent to this process itself (the sweep stops a cell with SIGTERM, and a Ctrl-C at
        # the sweep's terminal does not reach this session): a failed repeat, with what was measured.
        print("core: the run was interrupted (SIGINT)", file=sys.stderr)
        if latest:
            interrupted = latest[0]
            interrupted.status = Status(
                state=RunState.error,
                phase=processes.phase_after(interrupted),
                error_type="Interrupted",
                message="the run was interrupted (SIGINT to its process) before it finished; the phases "
                "measured before are kept",
            )
            write_atomically(result_path, interrupted.model_dump_json(), "the result")
        return 128 + signal.SIGINT
    write_atomically(result_path, result.model_dump_json(), "the result")
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
