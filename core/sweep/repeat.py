"""One repeat of one cell, in its own process (``core.sweep.worker``) with a time limit: a crash,
an out-of-memory error or a hang becomes a recorded result."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from core.running.launch import child_command, run_in_child
from core.storage.results import RunResult
from core.sweep.plan import Cell

STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a cell is stopped


# The command that runs one repeat (see core/sweep/worker.py); a name of its own, so tests can swap it.
worker_command = child_command


def run_in_process(
    cell: Cell, *, timeout_seconds: float, work_dir: Path, on_wait: Callable[[float], None] | None = None
) -> tuple[RunResult, float]:
    """Run one repeat of ``cell`` in a fresh process; returns its result and the process's seconds.

    Never raises for what happens inside the process: a crash, a kill or a timeout comes back as
    the result's status, keeping the phases measured before it. KeyboardInterrupt (and SIGTERM,
    which the CLI turns into one) stops the process and propagates.
    """
    assert cell.config is not None, "only validated cells run"
    return run_in_child(
        cell.options,
        cell.config,
        timeout_seconds=timeout_seconds,
        work_dir=work_dir,
        on_wait=on_wait,
        command=worker_command,
        grace_seconds=STOP_GRACE_SECONDS,
        clock=time.monotonic,
        names=("the cell's process", "the per-repeat time limit"),
    )
