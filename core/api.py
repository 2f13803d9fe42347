"""``core.run``: the one call that validates, places, times and measures a run."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.base.results import RunResult
    from core.contract.accelerator import Accelerator
    from core.contract.manager import PluginManager
    from core.contract.workload import Workload
    from core.running.observe import ObserverGroup, ProgressCallback
    from core.running.planning import RunPlan


def run(
    workload: str | Workload,
    accelerator: str | Accelerator,
    *,
    on_progress: ProgressCallback | None = None,
    timeout_seconds: float | None = None,
    database: str | os.PathLike[str] | None = None,
    **options: Any,
) -> RunResult:
    """Run ``workload`` on ``accelerator`` and return its result.

    :param workload: a registered workload name (``"fcnn"``) or a Workload object.
    :param accelerator: a registered accelerator name (``"cpu"``) or an Accelerator object.
    :param on_progress: called with the partial result after each phase.
    :param timeout_seconds: stop the run after this long; its result then has a ``timeout`` status
        and keeps the phases measured before. A run with a limit runs in a child process (replicas
        under torchrun do anyway), which the limit stops with its whole process group.
    :param database: also store the result in this results database (the one sweeps write;
        ``core report`` shows it under "Single runs"), failed or not. It is opened and locked
        before the run (core.storage.single_runs): a sweep using it refuses the run.
    :param options: any RunConfig field: ``micro_batch_size``, ``precision``, ``replicas``, ...
    :raises ConfigError: before any device is touched, naming the field, value and what is allowed
        (``database`` too: a path that is no usable results database).
    :raises DatabaseInUseError: before any device is touched: a sweep or another run holds ``database``.
    :raises UnrecordedRunError: after the run, when ``database`` could not take its result; the
        error's ``result`` is the result.
    :raises KeyboardInterrupt: on Ctrl-C, after the executor, the meter and any worker
        processes were stopped; nothing is reported or stored.
    :returns: the result; a fault during the run is in ``result.status``, with every figure
        measured before it kept. A run under a LoadGen scenario runs in a child process too where
        its plugins load in every process: LoadGen is native code that a failure inside leaves
        crashing its process, and the child's crash is then the result's status (with the phases
        measured before it), not the end of this process.
    """
    if on_progress is not None and not callable(on_progress):
        from core.base.errors import ConfigError

        raise ConfigError("on_progress", on_progress, "a callable taking the partial RunResult, or None")
    _check_timeout(timeout_seconds)
    from core.base.config import check_duration_fits
    from core.contract.manager import get_plugin_manager
    from core.running.planning import plan_run
    from core.storage.single_runs import SingleRunDatabase, database_path, run_label

    if database is not None:
        database_path(database)  # its type, before planning
    manager = get_plugin_manager()
    plan = plan_run(manager, workload, accelerator, options)
    check_duration_fits(plan.config.duration_seconds, timeout_seconds, "the run's")
    if database is None:
        return _run_apart_or_here(manager, plan, on_progress, timeout_seconds)
    with SingleRunDatabase(database, run_label(plan.config.workload, plan.config.accelerator, options)) as stored:
        result = _run_apart_or_here(manager, plan, on_progress, timeout_seconds)
        stored.record(result)
    return result


def run_here(
    workload: str | Workload,
    accelerator: str | Accelerator,
    *,
    on_progress: ProgressCallback | None = None,
    **options: Any,
) -> RunResult:
    """:func:`run` in this process, whatever the scenario (a LoadGen scenario too): for a caller
    that patches this process and needs the run to see it, as tests do."""
    from core.contract.manager import get_plugin_manager
    from core.running.launch import run_here as run_plan_here
    from core.running.planning import plan_run

    manager = get_plugin_manager()
    plan = plan_run(manager, workload, accelerator, options)
    observer = _observers(manager, on_progress)
    observer.run_starting(plan.config)
    result = run_plan_here(plan, observer)
    observer.result_ready(result)
    return result


def _observers(manager: PluginManager, on_progress: ProgressCallback | None) -> ObserverGroup:
    from core.running.observe import ObserverGroup, PluginHooks, ProgressCallbackObserver

    return ObserverGroup([PluginHooks(manager), ProgressCallbackObserver(on_progress) if on_progress else None])


def _run_apart_or_here(
    manager: PluginManager, plan: RunPlan, on_progress: ProgressCallback | None, timeout_seconds: float | None
) -> RunResult:
    """The run as planned: in a child process where it has a time limit or measures under LoadGen
    (:func:`_loadgen_apart`), else here or under its launcher. This process tells the observers,
    once, wherever the run runs: a child process or a rank only writes what it measured, read back here."""
    from core.running import processes
    from core.running.launch import run_here as run_plan_here
    from core.running.launch import run_in_child
    from core.running.planning import check_findable_by_workers

    in_child = not plan.launches_processes and (timeout_seconds is not None or _loadgen_apart(manager, plan))
    if in_child and timeout_seconds is not None:
        check_findable_by_workers(
            manager,
            plan.workload,
            plan.accelerator,
            plan.config,
            "timeout_seconds",
            timeout_seconds,
            "a run with a time limit runs in a child process",
        )
    observer = _observers(manager, on_progress)
    observer.run_starting(plan.config)
    if in_child:
        with processes.work_directory("core-run-") as work:
            result, _ = run_in_child(plan.document(), timeout_seconds=timeout_seconds, work_dir=work, observer=observer)
    else:
        result = run_plan_here(plan, observer, timeout_seconds=timeout_seconds)
    observer.result_ready(result)
    return result


def _loadgen_apart(manager: PluginManager, plan: RunPlan) -> bool:
    """Whether the run measures under LoadGen in a process of its own: a LoadGen scenario whose
    workload, accelerator and plugins a fresh process finds again (else it runs here)."""
    from core.base.config import LOADGEN_SCENARIOS
    from core.base.errors import ConfigError
    from core.running.planning import check_findable_by_workers

    if plan.config.scenario not in LOADGEN_SCENARIOS or not manager.loads_in_every_process():
        return False
    try:
        check_findable_by_workers(manager, plan.workload, plan.accelerator, plan.config)
    except ConfigError:
        return False  # objects passed to run() exist in this process only
    return True


def _check_timeout(timeout_seconds: object) -> None:
    from core.base.errors import ConfigError

    if timeout_seconds is None:
        return
    if (
        isinstance(timeout_seconds, bool)
        or not isinstance(timeout_seconds, (int, float))
        or not math.isfinite(timeout_seconds)
        or timeout_seconds <= 0
    ):
        raise ConfigError("timeout_seconds", timeout_seconds, "a positive number of seconds, or None for no limit")
