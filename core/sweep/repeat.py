"""One repeat of one cell, in its own process (``core.sweep_worker``) with a time limit: a crash,
an out-of-memory error or a hang becomes a recorded result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from core.config import RunConfig
from core.results import RunResult
from core.sweep.plan import Cell

STOP_GRACE_SECONDS = 10.0  # between SIGTERM and SIGKILL when a cell is stopped
_POLL_SECONDS = 0.5
_OUTPUT_TAIL_CHARS = 4000


def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the cell's process group (torchrun stops its workers on it), SIGKILL what remains."""
    from core import processes

    processes.stop_process_group(process, STOP_GRACE_SECONDS)


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


def _bare_result(config: RunConfig) -> RunResult:
    return RunResult(
        workload=config.workload,
        accelerator=config.accelerator,
        framework=config.framework.value,
        config=config,
        samples_per_update=config.samples_per_update,
        samples_per_host_call=config.samples_per_host_call,
        world_size=config.replicas,
    )


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
    from core import processes

    assert cell.config is not None, "only validated cells run"
    work_dir.mkdir(parents=True, exist_ok=True)
    request, result_path, log_path = (work_dir / "request.json", work_dir / "result.json", work_dir / "output.log")
    partial_path = result_path.with_name(result_path.name + ".partial")
    for stale in (result_path, partial_path):
        stale.unlink(missing_ok=True)
    request.write_text(json.dumps({"options": cell.options, "parent_pid": os.getpid()}), encoding="utf-8")
    command = worker_command(request, result_path)
    started = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        # A session of its own: the whole cell (torchrun included) can be stopped as one group,
        # and a Ctrl-C at the terminal reaches the sweep, which then stops the cell itself. The
        # cell's process ends with the sweep if the sweep is killed (core.processes).
        process = processes.start(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    process.wait(timeout=_POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > timeout_seconds:
                        timed_out = True
                        break
                    if on_wait is not None:
                        on_wait(elapsed)
        finally:
            _stop_process_group(process)
    process_seconds = time.monotonic() - started

    result = None if timed_out else _read_result(result_path)
    if result is not None:
        return result, process_seconds
    partial = _read_result(partial_path)
    if partial is not None and not partial.status.ok and not timed_out:
        return partial, process_seconds  # the run recorded its own fault, then the process died
    result = partial if partial is not None else _bare_result(cell.config)
    phase = processes.phase_after(result)
    if timed_out:
        result.status = processes.timeout_status(
            timeout_seconds, phase=phase, output=_tail(log_path), limit="the per-repeat time limit"
        )
    else:
        result.status = processes.exit_status(
            process.returncode, process="the cell's process", phase=phase, output=_tail(log_path)
        )
    return result, process_seconds
