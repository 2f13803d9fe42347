"""One process of a launched run: ``python -m core.running.worker PLAN RESULT [--launcher PATH]``.

PLAN is the run's validated plan as a document (:class:`core.running.planning.PlannedRun`): every
process rebuilds it, none plans the run again. The launcher that started it (``module:Class``;
torchrun's environment without one) says where this process stands (rank, local rank, world
size). Rank 0 rewrites RESULT atomically after every phase, so nothing measured is lost if a
process dies later; the launch reads it as it changes.

A worker ends with its launcher (under ``python -m core.running.processes``): the kernel kills it
when the launcher dies, whatever killed it. It ends without interpreter finalization
(:func:`core.running.processes.exit_now`): gloo's threads may still be releasing the last collective.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import traceback
from pathlib import Path

from core.base.distributed import ProcessContext
from core.contract.launcher import load_launcher
from core.contract.manager import get_plugin_manager
from core.running import processes
from core.running.launch import NODE_RESULTS_VARIABLE
from core.running.observe import ResultWriter
from core.running.planning import PlannedRun
from core.running.runner import execute


def main(argv: list[str]) -> int:
    # A worker holds nothing to clean up: SIGKILL, so one stuck in a collective ends too.
    processes.die_with_parent(sig=signal.SIGKILL)
    plan_path, result_path = Path(argv[0]), Path(argv[1])
    launcher = load_launcher(argv[3]) if argv[2:3] == ["--launcher"] else None
    planned = PlannedRun.read(plan_path.read_text(encoding="utf-8"))
    plan = planned.rebuild(get_plugin_manager())
    config = plan.config
    writer = ResultWriter(result_path, "the worker's result")

    process = launcher.process_context(os.environ) if launcher else ProcessContext.from_environment()
    # The launch's work directory, seen by every process the launch started (one host, or shared).
    process = dataclasses.replace(process, exchange_dir=str(result_path.parent))
    result = execute(plan, process, writer)
    if not process.is_main and process.local_rank == 0 and os.environ.get(NODE_RESULTS_VARIABLE) == "1":
        # Outside Slurm each node's core reads its own node's files: it gets this node's copy of
        # the run's figures (throughput and energy are gathered over every node already).
        result.warnings.append(
            f"node {process.node_rank} of {config.nodes}: global rank 0 ran on another node, whose result is the "
            "run's; the figures here are the same, the devices this node's"
        )
        writer.save(result)
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except SystemExit as request:
        code = processes.exit_code(request)
    except BaseException:
        traceback.print_exc()
        code = 1
    processes.exit_now(code)
