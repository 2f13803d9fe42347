"""``core.run``: the one call that validates, places, times and measures a run."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.contract.accelerator import Accelerator
    from core.contract.workload import Workload
    from core.running.observe import ProgressCallback
    from core.storage.results import RunResult


def run(
    workload: str | Workload,
    accelerator: str | Accelerator,
    *,
    on_progress: ProgressCallback | None = None,
    timeout_seconds: float | None = None,
    **options: Any,
) -> RunResult:
    """Run ``workload`` on ``accelerator`` and return its result.

    :param workload: a registered workload name (``"fcnn"``) or a Workload object.
    :param accelerator: a registered accelerator name (``"cpu"``) or an Accelerator object.
    :param on_progress: called with the partial result after each phase.
    :param timeout_seconds: stop the run after this long; its result then has a ``timeout`` status
        and keeps the phases measured before. A run with a limit runs in a child process (replicas
        under torchrun do anyway), which the limit stops with its whole process group.
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
    _check_timeout(timeout_seconds)
    from core.contract.manager import get_plugin_manager
    from core.running import processes
    from core.running.launch import run_here, run_in_child
    from core.running.observe import ObserverGroup, PluginHooks, ProgressCallbackObserver
    from core.running.planning import check_findable_by_workers, plan_run

    manager = get_plugin_manager()
    plan = plan_run(manager, workload, accelerator, options)
    in_child = timeout_seconds is not None and not plan.launches_processes
    if in_child:
        check_findable_by_workers(
            manager,
            plan.workload,
            plan.accelerator,
            plan.config,
            "timeout_seconds",
            timeout_seconds,
            "a run with a time limit runs in a child process",
        )
    # This process tells the observers, once, wherever the run runs: a child process or a rank
    # only writes what it measured, read back here.
    observer = ObserverGroup([PluginHooks(manager), ProgressCallbackObserver(on_progress) if on_progress else None])
    observer.run_starting(plan.config)
    if in_child:
        with processes.work_directory("core-run-") as work:
            result, _ = run_in_child(plan.document(), timeout_seconds=timeout_seconds, work_dir=work, observer=observer)
    else:
        result = run_here(plan, observer, timeout_seconds=timeout_seconds)
    observer.result_ready(result)
    return result


def _check_timeout(timeout_seconds: object) -> None:
    from core.errors import ConfigError

    if timeout_seconds is None:
        return
    if (
        isinstance(timeout_seconds, bool)
        or not isinstance(timeout_seconds, (int, float))
        or not math.isfinite(timeout_seconds)
        or timeout_seconds <= 0
    ):
        raise ConfigError("timeout_seconds", timeout_seconds, "a positive number of seconds, or None for no limit")
