"""``core.run``: the one call that validates, places, times and measures a run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.distributed import SINGLE_PROCESS

if TYPE_CHECKING:
    from core.accelerator import Accelerator
    from core.results import RunResult
    from core.runner import ProgressCallback
    from core.workload import Workload


def run(
    workload: str | Workload,
    accelerator: str | Accelerator,
    *,
    on_progress: ProgressCallback | None = None,
    **options: Any,
) -> RunResult:
    """Run ``workload`` on ``accelerator`` and return its result.

    :param workload: a registered workload name (``"fcnn"``) or a Workload object.
    :param accelerator: a registered accelerator name (``"cpu"``) or an Accelerator object.
    :param on_progress: called with the partial result after each phase.
    :param options: any RunConfig field: ``micro_batch_size``, ``precision``, ``replicas``, ...
    :raises ConfigError: before any device is touched, naming the field, value and what is allowed.
    :raises KeyboardInterrupt: on Ctrl-C, after the executor, the meter and any worker
        processes were stopped; nothing is reported.
    :returns: the result; a fault during the run is in ``result.status``, with every figure
        measured before it kept.
    """
    if on_progress is not None and not callable(on_progress):
        from core.errors import ConfigError

        raise ConfigError("on_progress", on_progress, "a callable taking the partial RunResult, or None")
    from core.launch import launch_with_torchrun
    from core.planning import plan_run
    from core.plugins import call_observers, get_plugin_manager
    from core.runner import execute

    manager = get_plugin_manager()
    plan = plan_run(manager, workload, accelerator, options)
    call_observers(lambda: manager.hook.core_run_started(config=plan.config), "run-started")
    if plan.launches_processes:
        result = launch_with_torchrun(plan, on_progress)
    else:
        result = execute(plan, SINGLE_PROCESS, on_progress)
    call_observers(lambda: manager.hook.core_result_ready(result=result), "result-ready")
    return result
