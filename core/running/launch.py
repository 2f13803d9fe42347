"""Runs as several processes: one launch for every launcher (torchrun here, poprun in the Graphcore
plugin), and one run in a child process (a time limit, a sweep's repeat; the child's side is
core.running.child). Either way the processes receive the validated plan (a
:class:`core.running.planning.PlannedRun` document) and run it as it is: nothing is planned twice.

The workers write the main process's result after every phase; the launch reads it while the
launcher runs and tells its observer of each new phase (:meth:`core.running.observe.Observer.phase_ended`),
so a launch that is killed, times out or is interrupted later still leaves what was measured. The
launchers stop the remaining workers when one dies.

Supervision (see core.running.processes): the launcher runs in a session of its own under
``python -m core.running.processes``, which ends it when core dies (``kill -9`` included) and then
removes the launch's work directory; the workers end with the launcher. On every way out of
:func:`launch` (a result, an exception, Ctrl-C, SIGTERM, the time limit) the launcher's group is
stopped and the work directory removed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from core.base.config import RunConfig
from core.base.distributed import SINGLE_PROCESS, ProcessContext
from core.base.results import RunResult, RunState
from core.contract.context import RunContext
from core.contract.launcher import Launcher, launcher_path
from core.running import processes
from core.running.node_plan import PLAN_ON_NODE_KEY
from core.running.observe import Observer, tell_phase
from core.running.planning import PlannedRun, RunPlan
from core.running.runner import execute, new_result
from core.running.slurm import SlurmAllocation
from core.running.step_progress import STEPS_PROGRESS_KEY, ProgressFile, progress_path

_POLL_SECONDS = 0.2  # how often the launch looks for the launcher's end and the main process's progress
_WORK_DIRECTORY_PREFIX = "core-launch-"


class TorchrunLauncher(Launcher):
    """``torch.distributed.run``: one worker process per device on this node (a replica's
    ``devices_per_replica`` processes each), or, for several nodes, one torchrun agent per node
    meeting at a c10d rendezvous.

    Inside a Slurm allocation ``srun`` starts the agents, one per node, and the first node is the
    rendezvous (unless the run names one); the launch's files must then be on a filesystem every
    node sees (the working directory, see :meth:`work_parent`). Outside Slurm this node's agent joins
    the run's ``rendezvous``, where the other nodes' ``core run`` join too; each node's local rank 0
    writes that node's result, the complete one being global rank 0's.
    """

    name: ClassVar[str] = "torchrun"

    def command(self, context: RunContext, worker: Sequence[str], work: Path) -> list[str]:
        config = context.config
        if config.nodes == 1:
            return [
                sys.executable,
                *torchrun_arguments(processes_per_node(config), list(worker[1:]), work / "torchelastic"),
            ]
        allocation = SlurmAllocation.from_environment()
        rendezvous = config.rendezvous or (allocation.rendezvous() if allocation is not None else None)
        if rendezvous is None:
            raise ValueError("a multi-node run outside Slurm needs its rendezvous (planning checks this)")
        agent = [
            sys.executable,
            *multinode_torchrun_arguments(
                config.nodes,
                processes_per_node(config),
                rendezvous,
                run_id=f"core-{allocation.job_id}" if allocation is not None else f"core-{rendezvous}",
                worker_module=list(worker[1:]),
                log_dir=work / "torchelastic",
            ),
        ]
        if allocation is None:
            return ["env", f"{NODE_RESULTS_VARIABLE}=1", *agent]
        srun = [
            "srun",
            f"--nodes={config.nodes}",
            f"--ntasks={config.nodes}",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=1",  # one agent failing ends the others: no node waits forever
            "--export=ALL",
        ]
        return [*srun, *agent]

    def work_parent(self, context: RunContext) -> Path | None:
        """Under Slurm, several nodes read the launch's files: the working directory, shared on a cluster."""
        if context.config.nodes > 1 and SlurmAllocation.from_environment() is not None:
            return Path.cwd()
        return None

    def process_context(self, environ: Mapping[str, str]) -> ProcessContext:
        return ProcessContext.from_environment(environ)

    def killed_inside(self, output: str) -> bool:
        """torchrun exits with code 1 when a worker dies; its report names a SIGKILL."""
        return "Signal 9" in output or "SIGKILL" in output or "exitcode  : -9" in output


def processes_per_node(config: RunConfig) -> int:
    """One process per device of the node: its replicas' ``devices_per_replica`` each, or its share
    of a replica that spans several nodes."""
    return config.devices_per_node


def torchrun_arguments(replicas: int, worker_module: Sequence[str], log_dir: Path | None = None) -> list[str]:
    """``-m torch.distributed.run ... -m MODULE ARGS``: torchrun running ``worker_module`` per replica."""
    # torchrun makes a log directory in /tmp on every launch and never removes it: keep it in ours.
    logs = [f"--log-dir={log_dir}"] if log_dir is not None else []
    return [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={replicas}",
        "--max-restarts=0",
        *logs,
        *worker_module,
    ]


#: set for each node's workers when each node's core writes its own result (outside Slurm)
NODE_RESULTS_VARIABLE = "CORE_NODE_RESULTS"


def multinode_torchrun_arguments(
    nodes: int,
    processes_per_node: int,
    rendezvous: str,
    *,
    run_id: str,
    worker_module: Sequence[str],
    log_dir: Path | None = None,
) -> list[str]:
    """``-m torch.distributed.run`` as one node's agent of ``nodes``, meeting at ``rendezvous`` (c10d)."""
    logs = [f"--log-dir={log_dir}"] if log_dir is not None else []
    return [
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={processes_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous}",
        f"--rdzv-id={run_id}",
        "--max-restarts=0",
        *logs,
        *worker_module,
    ]


def worker_command(plan_path: Path, result_path: Path, launcher: Launcher | None = None) -> list[str]:
    """One worker process: ``python -m core.running.worker PLAN RESULT [--launcher module:Class]``."""
    command = [sys.executable, "-m", "core.running.worker", str(plan_path), str(result_path)]
    return command + (["--launcher", launcher_path(launcher)] if launcher is not None else [])


class ResultFile:
    """A result another process writes, read again whenever it changes (the writer replaces it whole)."""

    def __init__(self, path: Path, initial: RunResult) -> None:
        self.path = path
        self.result = initial
        self.seen = False
        self._version: tuple[int, int, int] | None = None

    def refresh(self) -> bool:
        """Read the file if it changed; True when a new result was read."""
        try:
            stat = self.path.stat()
            version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if version == self._version:
                return False
            result = RunResult.model_validate_json(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        self._version, self.result, self.seen = version, result, True
        return True


def _tell_steps(observer: Observer | None, steps: ProgressFile) -> None:
    """Tell ``observer`` of the step progress another process wrote since the last look, if any."""
    if observer is None:
        return
    progress = steps.refresh()
    if progress is not None:
        observer.steps_progress(progress)


def run_here(plan: RunPlan, observer: Observer | None = None, *, timeout_seconds: float | None = None) -> RunResult:
    """Run a validated plan from this process: in it, or as the processes of its launcher.

    The observer is told of each phase; telling it that the run starts and ends is the caller's
    (the process that owns the run), so that it is told once however the run is placed.

    :param timeout_seconds: a launched run's time limit (a run in this process has none: give it a
        child process, :func:`run_in_child`).
    """
    if plan.launcher is not None:
        return launch(plan.launcher, plan, observer, timeout_seconds=timeout_seconds)
    return execute(plan, SINGLE_PROCESS, observer)


def launch(
    launcher: Launcher,
    plan: RunPlan,
    observer: Observer | None = None,
    *,
    timeout_seconds: float | None = None,
) -> RunResult:
    """Run ``plan`` as the processes ``launcher`` starts; the main process's (rank 0's) result is the run's.

    Every process receives the plan as a document (``plan.json``) and rebuilds it: none plans again.

    :param observer: told of the main process's result after each phase, as it writes it.
    :param timeout_seconds: stop the launch after this long; the result then has a ``timeout``
        status and keeps the phases measured before it.
    :raises KeyboardInterrupt: on Ctrl-C, after the launcher and its workers were stopped.
    """
    parent = launcher.work_parent(plan.context(SINGLE_PROCESS))
    with processes.sigterm_exits(), processes.work_directory(_WORK_DIRECTORY_PREFIX, parent=parent) as work:
        plan_path, result_path, log_path = work / "plan.json", work / "result.json", work / "launcher.log"
        plan_path.write_text(plan.document().model_dump_json(), encoding="utf-8")
        main = ResultFile(result_path, new_result(plan, world_size=plan.config.replicas))
        launcher_work = work / "launcher"
        launcher_work.mkdir()
        command = launcher.command(
            plan.context(SINGLE_PROCESS), worker_command(plan_path, result_path, launcher), launcher_work
        )
        callback_warnings: list[str] = []
        steps = ProgressFile(progress_path(result_path))

        def watch(_elapsed: float) -> None:
            if main.refresh() and observer is not None:
                # The warnings are kept apart: the next read of the main result replaces it.
                tell_phase(observer, main.result, callback_warnings)
            _tell_steps(observer, steps)

        ended = processes.supervise(
            processes.guarded_command(command, remove_when_orphaned=work),
            log_path,
            timeout_seconds=timeout_seconds,
            on_wait=watch,
            poll_seconds=_POLL_SECONDS,
        )
        main.refresh()
        output = log_path.read_text(encoding="utf-8", errors="replace")
    result = main.result
    result.warnings.extend(w for w in callback_warnings if w not in result.warnings)
    if ended.timed_out:
        result.status = processes.timeout_status(
            timeout_seconds or 0.0, phase=processes.phase_after(result), output=output, limit="the launch's time limit"
        )
    elif ended.returncode != 0:
        phase = result.status.phase or processes.phase_after(result)
        failure = processes.exit_status(
            ended.returncode,
            process=launcher.name,
            phase=phase,
            output=output,
            killed_inside=launcher.killed_inside(output),
            ended="(a worker process failed)" if main.seen else "without a result",
        )
        # A killed peer shows on rank 0 as a broken connection: name the cause, keep what rank 0 saw.
        if result.status.ok or failure.state is RunState.killed:
            if not result.status.ok:
                failure.message = f"{failure.message}\nrank 0 saw: {result.status.error_type}: {result.status.message}"
            result.status = failure
    result.explain_missing_energy()
    return result


# --- one run in a child process -------------------------------------------------------------

_CHILD_POLL_SECONDS = 0.5
_OUTPUT_TAIL_CHARS = 4000


#: the file in ``run_in_child``'s ``work_dir`` where the child writes its result, once it has one
RESULT_FILE = "result.json"


def child_command(request: Path, result_path: Path) -> list[str]:
    """The command that runs one run in a child process (see core/running/child.py)."""
    return [sys.executable, "-m", "core.running.child", str(request), str(result_path)]


def write_request(
    path: Path,
    planned: PlannedRun,
    parent_pid: int | None,
    plan_on_node: Mapping[str, Any] | None = None,
    steps_progress: bool = True,
) -> None:
    """The child's request (core/running/child.py): the validated plan, and the process it must not outlive.

    ``options`` repeats the plan's configuration as RunConfig fields, for whoever reads a request
    without rebuilding its plan (a person looking into a job's folder, a test's stand-in worker).

    :param plan_on_node: for a plan made for a machine profile, the cell's options, from which the
        child plans the run again on its node (core.running.node_plan).
    :param steps_progress: whether the child writes its steps' progress for this process to read:
        only where something here listens (a sweep's runs count no steps; on a tiny model counting
        costs a few tenths of a microsecond a step). A request without the key (an older core's) does.
    """
    document = {
        "plan": planned.model_dump(mode="json"),
        "options": planned.config.model_dump(mode="json"),
        "parent_pid": parent_pid,
        STEPS_PROGRESS_KEY: steps_progress,
        **({PLAN_ON_NODE_KEY: dict(plan_on_node)} if plan_on_node is not None else {}),
    }
    path.write_text(json.dumps(document), encoding="utf-8")


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace").strip()


def _read_result(path: Path) -> RunResult | None:
    try:
        return RunResult.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_in_child(
    planned: PlannedRun,
    *,
    timeout_seconds: float | None,
    work_dir: Path,
    on_wait: Callable[[float], None] | None = None,
    observer: Observer | None = None,
    command: Callable[[Path, Path], list[str]] = child_command,
    grace_seconds: float = processes.STOP_GRACE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    names: tuple[str, str] = ("the run's process", "the run's time limit"),
    starter: processes.ChildStarter | None = None,
) -> tuple[RunResult, float]:
    """Run a validated plan in a process of its own under ``core.running.processes`` supervision;
    returns its result and the process's seconds.

    A sweep runs each repeat this way, and ``core.run`` a single-process run with a time limit. The
    child receives ``planned`` and runs it as it is (core.running.child): it plans nothing again.
    Never raises for what happens inside the process: a crash, a kill or a timeout comes back as
    the result's status, keeping the phases measured before it (the child writes them to
    RESULT.partial after each phase, and ``observer`` is told of them as they come). KeyboardInterrupt
    stops the process and propagates.

    :param starter: starts the process some other way than as a fresh interpreter (a sweep's fork
        server, core.running.forkserver); supervision, the time limit and the result are the same.
    """
    config = planned.config
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path, log_path = (work_dir / "request.json", work_dir / RESULT_FILE, work_dir / "output.log")
    partial_path = result_path.with_name(result_path.name + ".partial")
    for stale in (result_path, partial_path):
        stale.unlink(missing_ok=True)
    listens = observer is not None and observer.wants_steps_progress()
    write_request(request, planned, parent_pid=os.getpid(), steps_progress=listens)
    partial = ResultFile(partial_path, RunResult.of_config(config, world_size=config.replicas))
    steps = ProgressFile(progress_path(partial_path))
    steps.path.unlink(missing_ok=True)
    callback_warnings: list[str] = []

    def wait(elapsed: float) -> None:
        if observer is not None and partial.refresh():
            tell_phase(observer, partial.result, callback_warnings)
        _tell_steps(observer, steps)
        if on_wait is not None:
            on_wait(elapsed)

    # A session of its own: the whole run (torchrun included) can be stopped as one group; it
    # ends with this process if this process is killed (core.running.processes).
    ended = processes.supervise(
        command(request, result_path),
        log_path,
        timeout_seconds=timeout_seconds,
        on_wait=wait,
        poll_seconds=_CHILD_POLL_SECONDS,
        grace_seconds=grace_seconds,
        clock=clock,
        starter=starter,
    )
    # A child that died without cleaning up (a native crash, SIGKILL) left its work directories
    # behind: they go now, not at the next run's start.
    processes.remove_abandoned(processes.WORK_DIRECTORY_PREFIX)
    result = None if ended.timed_out else _read_result(result_path)
    if result is None:
        result = _read_result(partial_path)
        if result is None or result.status.ok or ended.timed_out:
            # No result of its own making: the phases measured before, and how the process ended.
            result = result or RunResult.of_config(config, world_size=config.replicas)
            process, limit = names
            phase = processes.phase_after(result)
            output = _tail(log_path)
            result.status = (
                processes.timeout_status(timeout_seconds or 0.0, phase=phase, output=output, limit=limit)
                if ended.timed_out
                else processes.exit_status(ended.returncode, process=process, phase=phase, output=output)
            )
    result.warnings.extend(w for w in callback_warnings if w not in result.warnings)
    result.explain_missing_energy()
    return result, ended.seconds
