"""One repeat of one cell, in its own process (``core.running.child``) with a time limit: a crash,
an out-of-memory error or a hang becomes a recorded result.

The process is forked from the sweep's warm parent (core.running.forkserver: core and PyTorch
already imported, no device touched) where that is safe, else a fresh interpreter; either way it
is supervised the same, and the result's ``process_start`` says which it was and why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Literal

from core.base.config import Framework
from core.base.results import ProcessStart, RunResult
from core.running import processes
from core.running.forkserver import (
    ANSWER_TIMEOUT_SECONDS,
    READY_TIMEOUT_SECONDS,
    SERVER_EXIT_GRACE_SECONDS,
    ForkedProcess,
    ForkServer,
    ForkServerError,
    StartingForkServer,
    forkable_command,
    spawn_fork_server,
)
from core.running.launch import RESULT_FILE, child_command, run_in_child
from core.sweep.plan import Cell

STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a cell is stopped

WorkerStart = Literal["warm", "fresh"]
WORKER_STARTS: tuple[WorkerStart, ...] = ("warm", "fresh")
DEFAULT_WORKER_START: WorkerStart = "warm"

# What the fork server imports ("module", or "module:function" to call too) before it forks: what
# every forked run would import first. Nothing here may initialise a device or start a thread pool
# (see core.running.forkserver, which refuses to serve if CUDA was initialised).
WARM_IMPORTS = (
    "torch",
    "torch.nn",
    "torch.optim",
    "torch._dynamo",  # torch.optim.Optimizer imports it on first use: a second of every run
    "core.api",
    "core.running.child",
    "core.running.runner",
    "core.executors.pytorch",
    "core.workloads",
    "core.data.listing",  # planning's dataset checks, which a run's plan rebuilds
    # The plugins, loaded as the run would load them (their vendor SDKs stay unimported until used).
    "core.contract.manager:get_plugin_manager",
    # What each result records of the software and machine: read once here, not in every forked run.
    "core.running.environment:read_before_forking",
)

_log = logging.getLogger(__name__)

# The command that runs one repeat (see core/running/child.py); a name of its own, so tests can swap it.
worker_command = child_command


class _WarmParent:
    """A fork server (starting, or ready) with the folder that holds its log: they end together."""

    def __init__(self, key: tuple[object, ...]) -> None:
        self.key = key  # what the server's imports depended on: reused only where this is unchanged
        self._folder = contextlib.ExitStack()
        directory = self._folder.enter_context(processes.work_directory("core-forkserver-"))
        self.starting: StartingForkServer | None = None
        self.server: ForkServer | None = None
        try:
            self.starting = spawn_fork_server(WARM_IMPORTS, directory / "fork-server.log")
        except OSError as error:  # not even a process: the first run that may be forked says why
            self.spawn_error: str | None = f"{type(error).__name__}: {error}"
        else:
            self.spawn_error = None

    def ready(self, ready_timeout: float) -> ForkServer:
        """:raises ForkServerError: it did not start, or was not ready in ``ready_timeout`` s."""
        if self.server is None:
            if self.starting is None:
                raise ForkServerError(self.spawn_error or "the fork server is closed")
            # Kept until ready: a wait that Ctrl-C ends leaves it for close() to stop.
            self.server = self.starting.ready(ready_timeout)
            self.starting = None
        return self.server

    @property
    def usable(self) -> bool:
        """Whether another sweep may use it: its process runs, and nothing made it fail."""
        if self.server is not None:
            return self.server.failure is None and self.server.process.poll() is None
        return self.starting is not None and self.starting.process.poll() is None

    def close(self, grace_seconds: float = SERVER_EXIT_GRACE_SECONDS) -> None:
        """Stop the server (its runs still going are killed), waiting ``grace_seconds`` at most for it."""
        try:
            if self.server is not None:
                self.server.close(grace_seconds=grace_seconds)
            elif self.starting is not None:
                self.starting.close(grace_seconds=0.0)  # only importing: nothing of its own to finish
        finally:
            self.server = self.starting = None
            self._folder.close()


def _warm_parent_key() -> tuple[object, ...]:
    """What a fork server's imports read when it starts: its preload, the environment (variables
    such as ``OMP_NUM_THREADS`` or the plugin allowlist are read at import) and the directory it
    imports from. A server kept between sweeps serves a sweep only where all three are unchanged."""
    return (tuple(WARM_IMPORTS), sorted(processes.child_environment().items()), os.getcwd(), sys.executable)


class _KeptWarmParent:
    """The fork server kept between the sweeps of a :func:`keep_warm_workers` block."""

    def __init__(self) -> None:
        self.parent: _WarmParent | None = None

    def take(self, key: tuple[object, ...]) -> _WarmParent | None:
        parent, self.parent = self.parent, None
        if parent is not None and parent.key == key and parent.usable:
            return parent
        if parent is not None:
            parent.close(grace_seconds=0.0)
        return None


_kept: _KeptWarmParent | None = None  # set inside a keep_warm_workers() block


@contextlib.contextmanager
def keep_warm_workers() -> Iterator[None]:
    """Sweeps run (``run_sweep``, local, warm) within the block share one fork server: the first
    starts it, each later one finds it ready, so only the first waits for its imports. It is kept
    only where that is safe: a sweep that ended normally hands it on, one that raised (Ctrl-C, an
    error) stops it; one that failed or died is not reused; a sweep whose environment, directory
    or preload differ from those it started with starts its own. It ends with the block (and, as
    every fork server, with this process)."""
    global _kept
    if _kept is not None:  # nested: the outer block keeps it
        yield
        return
    _kept = _KeptWarmParent()
    try:
        yield
    finally:
        kept, _kept = _kept, None
        if kept.parent is not None:
            kept.parent.close()


class WarmWorkers:
    """A sweep's choice between forked and fresh processes, and its fork server: started by
    :meth:`begin` (while the sweep plans, so its imports overlap that work) or else when the first
    run that may be forked needs it, and closed with the sweep (:func:`warm_workers`), or kept for
    the next one inside :func:`keep_warm_workers`.

    A server that could not start, died or stopped answering is a fault of the sweep's machinery,
    not of a cell: it is reported once (a warning), stopped, and every later run starts fresh."""

    def __init__(self, requested: WorkerStart, scratch: Path | None = None) -> None:
        del scratch  # the server keeps its log in a folder of its own, which may outlive the sweep
        self.requested = requested
        self._parent: _WarmParent | None = None
        self._server_failure: str | None = None

    def begin(self) -> None:
        """Start the fork server now without waiting for it (a kept one is taken as it is), where a
        run may be forked at all: warm workers asked for, on Linux."""
        if self.requested != "warm" or not sys.platform.startswith("linux"):
            return
        if self._parent is None and self._server_failure is None:
            key = _warm_parent_key()
            self._parent = (_kept.take(key) if _kept is not None else None) or _WarmParent(key)

    def drop_unless_needed(self, cells: Sequence[Cell]) -> None:
        """After planning: stop the server :meth:`begin` started when none of ``cells`` may be forked
        (a TensorFlow sweep), so that its imports take no CPU from the runs."""
        if self._parent is not None and all(self.refusal(cell) is not None for cell in cells):
            self._close_parent(keep=True)

    def refusal(self, cell: Cell) -> str | None:
        """Why ``cell``'s run must start as a fresh interpreter; None when it may be forked."""
        config = cell.config
        assert config is not None, "only validated cells run"
        if self.requested == "fresh":
            return "fresh interpreters were asked for (--workers fresh)"
        if not sys.platform.startswith("linux"):
            return f"forked runs need Linux (the parent-death signal, a safe fork); this is {sys.platform}"
        if config.framework is not Framework.torch:
            return (
                f"{config.framework.value} is not forked: importing TensorFlow starts a thread, and its runtime "
                "does not survive a fork (docs/sweeps.md#tensorflow-runs-are-not-forked)"
            )
        if config.replicas > 1 or config.nodes > 1:
            return "replicas > 1 run under a launcher (torchrun, poprun) that starts processes of its own"
        accelerator_refusal = _accelerator_refusal(config.accelerator)
        if accelerator_refusal is not None:
            return accelerator_refusal
        return self.server_failure

    @property
    def server_failure(self) -> str | None:
        """Why the fork server cannot be used (it failed to start, died or stopped answering); None
        while it can. The first time a failure is seen it is reported, and the server stopped."""
        parent = self._parent
        if self._server_failure is None and parent is not None and parent.server is not None:
            if parent.server.failure is not None:
                self._server_failure = f"the fork server failed: {parent.server.failure}"
                _log.warning("core: warning: %s; the next runs start as fresh interpreters", self._server_failure)
                self._parent = None
                parent.close(grace_seconds=0.0)  # nothing of its own to finish: its runs are over or lost
        return self._server_failure

    def start_for(self, cell: Cell, timeout_seconds: float | None = None) -> CellStart:
        """How ``cell``'s next run starts: its :class:`CellStart` records what happened.

        :param timeout_seconds: the run's time limit, which also bounds the wait for the fork server.
        """
        return CellStart(self, self.refusal(cell), timeout_seconds)

    def server(self, ready_timeout: float = READY_TIMEOUT_SECONDS) -> ForkServer:
        """The fork server, started on first use unless :meth:`begin` started it.

        :param ready_timeout: the longest wait, from now, for its imports.
        :raises ForkServerError: it could not be started (then never tried again in this sweep).
        """
        failure = self.server_failure
        if failure is not None:
            raise ForkServerError(failure)
        if self._parent is None:
            self._parent = _WarmParent(_warm_parent_key())
        try:
            return self._parent.ready(ready_timeout)
        except ForkServerError as error:
            parent, self._parent = self._parent, None
            parent.close(grace_seconds=0.0)
            self._server_failure = f"the fork server could not start: {error}"
            _log.warning("core: warning: %s; runs start as fresh interpreters", self._server_failure)
            raise ForkServerError(self._server_failure) from None

    def close(self, keep: bool = False) -> None:
        """Stop the fork server; with ``keep``, inside :func:`keep_warm_workers`, hand it on instead."""
        self._close_parent(keep)

    def _close_parent(self, keep: bool) -> None:
        parent, self._parent = self._parent, None
        if parent is None:
            return
        if keep and _kept is not None and parent.usable:
            if _kept.parent is not None and _kept.parent is not parent:
                _kept.parent.close(grace_seconds=0.0)
            _kept.parent = parent
        else:
            parent.close()


class CellStart:
    """Starts one run (a :class:`core.running.processes.ChildStarter`): forked when nothing refused
    it and the command is this interpreter's, else a fresh interpreter; ``process_start`` says which.

    :param timeout_seconds: the run's time limit: a fork server that does not start or answer
        within it (or within its own bounds, whichever is shorter) is given up for a fresh start.
    """

    def __init__(self, workers: WarmWorkers, refusal: str | None, timeout_seconds: float | None = None) -> None:
        self._workers = workers
        self._timeout_seconds = timeout_seconds
        self.process_start = ProcessStart(method="fresh", reason=refusal)
        self.forked: ForkedProcess | None = None

    def start(self, command: Sequence[str], output: IO[bytes]) -> processes.ChildProcess:
        why = self.process_start.reason
        if why is None and not forkable_command(command):
            why = "the worker command is not this interpreter's -m or -c"
        if why is None:
            try:
                server = self._workers.server(self._bounded(READY_TIMEOUT_SECONDS))
                self.forked = server.start(command, output, answer_timeout=self._bounded(ANSWER_TIMEOUT_SECONDS))
                self.process_start = ProcessStart(method="forked")
                return self.forked
            except ForkServerError as error:
                why = self._workers.server_failure or str(error)
        self.process_start = ProcessStart(method="fresh", reason=why)
        return processes.start(command, stdout=output, stderr=subprocess.STDOUT)

    def _bounded(self, seconds: float) -> float:
        return seconds if self._timeout_seconds is None else min(seconds, self._timeout_seconds)

    @property
    def lost_to_the_server(self) -> bool:
        """The run was forked and its fork server died while it was going (which ends the run)."""
        return self.forked is not None and self.forked.lost


def _accelerator_refusal(name: str) -> str | None:
    from core.base.errors import ConfigError
    from core.contract.manager import get_plugin_manager

    try:
        accelerator = get_plugin_manager().accelerator(name)
    except ConfigError:
        return f"accelerator {name!r} is not registered in this process"
    if not accelerator.forks_from_warm_parent:
        return f"accelerator {name!r} does not say its runs may be forked (forks_from_warm_parent)"
    return None


@contextlib.contextmanager
def warm_workers(requested: WorkerStart, scratch: Path | None = None) -> Iterator[WarmWorkers]:
    """The sweep's :class:`WarmWorkers`; the fork server, if one started, ends with the block (or,
    inside :func:`keep_warm_workers`, is kept for the next sweep when the block ends normally)."""
    workers = WarmWorkers(requested, scratch)
    try:
        yield workers
    except BaseException:
        workers.close()
        raise
    workers.close(keep=True)


def run_in_process(
    cell: Cell,
    *,
    timeout_seconds: float,
    work_dir: Path,
    on_wait: Callable[[float], None] | None = None,
    workers: WarmWorkers | None = None,
) -> tuple[RunResult, float]:
    """Run one repeat of ``cell`` in a process of its own; returns its result and the process's seconds.

    Never raises for what happens inside the process: a crash, a kill or a timeout comes back as
    the result's status, keeping the phases measured before it. KeyboardInterrupt (and SIGTERM,
    which the CLI turns into one) stops the process and propagates.

    :param workers: the sweep's warm workers: the run is forked from its fork server where safe.
        None: a fresh interpreter. A forked run that its server's death ended before it wrote a
        result is the machinery's fault, not the cell's: it runs again, in a fresh interpreter,
        under the same time limit.
    """
    assert cell.planned is not None, "only validated cells run"
    starter = workers.start_for(cell, timeout_seconds) if workers is not None else None
    result, seconds = _run_once(cell, timeout_seconds, work_dir, on_wait, starter)
    if workers is not None and starter is not None:
        failure = workers.server_failure  # reported once, whichever run saw it
        if starter.lost_to_the_server and not (work_dir / RESULT_FILE).is_file():
            reason = f"run again in a fresh interpreter: {failure or 'the fork server died while the run was going'}"
            starter = CellStart(workers, reason, timeout_seconds)
            result, seconds = _run_once(cell, timeout_seconds, work_dir, on_wait, starter)
    result.process_start = (
        starter.process_start if starter is not None else ProcessStart(method="fresh", reason="no warm workers")
    )
    return result, seconds


def _run_once(
    cell: Cell,
    timeout_seconds: float,
    work_dir: Path,
    on_wait: Callable[[float], None] | None,
    starter: CellStart | None,
) -> tuple[RunResult, float]:
    assert cell.planned is not None, "only validated cells run"
    return run_in_child(
        cell.planned,
        timeout_seconds=timeout_seconds,
        work_dir=work_dir,
        on_wait=on_wait,
        command=worker_command,
        grace_seconds=STOP_GRACE_SECONDS,
        clock=time.monotonic,
        names=("the cell's process", "the per-repeat time limit"),
        starter=starter,
    )
