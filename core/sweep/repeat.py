"""One repeat of one cell, in its own process (``core.sweep_worker``) with a time limit: a crash,
an out-of-memory error or a hang becomes a recorded result."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from core import processes
from core.results import RunResult
from core.sweep.plan import Cell

STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a cell is stopped
_POLL_SECONDS = 0.5
_OUTPUT_TAIL_CHARS = 4000


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


def worker_command(request: Path, result_path: Path) -> list[str]:
    """The command that runs one repeat (see core/sweep_worker.py)."""
    return [sys.executable, "-m", "core.sweep_worker", str(request), str(result_path)]


def run_in_process(
    cell: Cell, *, timeout_seconds: float, work_dir: Path, on_wait: Callable[[float], None] | None = None
) -> tuple[RunResult, float]:
    """Run one repeat of ``cell`` in a fresh process; returns its result and the process's seconds.

    Never raises for what happens inside the process: a crash, a kill or a timeout comes back as
    the result's status, keeping the phases measured before it. KeyboardInterrupt (and SIGTERM,
    which the CLI turns into one) stops the process and propagates.
    """

    assert cell.config is not None, "only validated cells run"
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path, log_path = (work_dir / "request.json", work_dir / "result.json", work_dir / "output.log")
    partial_path = result_path.with_name(result_path.name + ".partial")
    for stale in (result_path, partial_path):
        stale.unlink(missing_ok=True)
    request.write_text(json.dumps({"options": cell.options, "parent_pid": os.getpid()}), encoding="utf-8")
    command = worker_command(request, result_path)
    # A session of its own: the whole cell (torchrun included) can be stopped as one group, and a
    # Ctrl-C at the terminal reaches the sweep, which then stops the cell itself. The cell's
    # process ends with the sweep if the sweep is killed (core.processes).
    ended = processes.supervise(
        command,
        log_path,
        timeout_seconds=timeout_seconds,
        on_wait=on_wait,
        poll_seconds=_POLL_SECONDS,
        grace_seconds=STOP_GRACE_SECONDS,
        clock=time.monotonic,
    )
    timed_out, process_seconds = ended.timed_out, ended.seconds

    result = None if timed_out else _read_result(result_path)
    if result is not None:
        return result, process_seconds
    partial = _read_result(partial_path)
    if partial is not None and not partial.status.ok and not timed_out:
        return partial, process_seconds  # the run recorded its own fault, then the process died
    result = partial if partial is not None else RunResult.of_config(cell.config, world_size=cell.config.replicas)
    phase = processes.phase_after(result)
    if timed_out:
        result.status = processes.timeout_status(
            timeout_seconds, phase=phase, output=_tail(log_path), limit="the per-repeat time limit"
        )
    else:
        result.status = processes.exit_status(
            ended.returncode, process="the cell's process", phase=phase, output=_tail(log_path)
        )
    return result, process_seconds
