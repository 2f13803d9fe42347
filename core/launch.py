"""Replicas as processes: torch.distributed.run (torchrun) starts one worker per replica.

The workers write rank 0's result after every phase, so a worker killed mid-run still leaves
what was measured; torchrun stops the remaining workers when one dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from core.planning import RunPlan
from core.results import RunResult, RunState, Status
from core.runner import new_result

_STDERR_TAIL_CHARS = 4000


def torchrun_command(replicas: int, config_path: Path, result_path: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes=1", f"--nproc-per-node={replicas}", "--max-restarts=0",
        "-m", "core.worker", str(config_path), str(result_path),
    ]


def failure_status(returncode: int, stderr: str, phase: str | None) -> Status:
    """How a failed torchrun is reported: killed workers apart from errors, with stderr's tail."""
    killed = returncode < 0 or "Signal 9" in stderr or "SIGKILL" in stderr or "exitcode  : -9" in stderr
    if returncode < 0:
        what = f"torchrun was killed by signal {signal.Signals(-returncode).name}"
    else:
        what = f"torchrun exited with code {returncode}"
    return Status(
        state=RunState.killed if killed else RunState.error,
        phase=phase,
        error_type="WorkerFailure",
        message=f"{what}; a worker process failed. stderr tail:\n{stderr[-_STDERR_TAIL_CHARS:]}",
    )


def _last_phase(result: RunResult) -> str:
    for name, value in (("window", result.window_seconds), ("warmup", result.warmup_seconds),
                        ("first_step", result.first_step_seconds), ("setup", result.setup_seconds)):
        if value is not None:
            return {"setup": "first_step", "first_step": "warmup", "warmup": "window", "window": "teardown"}[name]
    return "setup"


def launch_with_torchrun(plan: RunPlan) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="core-torchrun-") as tmp:
        config_path, result_path = Path(tmp, "config.json"), Path(tmp, "result.json")
        config_path.write_text(plan.config.model_dump_json(), encoding="utf-8")
        environment = dict(os.environ, PYTHONUNBUFFERED="1")
        completed = subprocess.run(torchrun_command(plan.config.replicas, config_path, result_path),
                                   capture_output=True, text=True, env=environment)
        if result_path.exists():
            result = RunResult.model_validate_json(result_path.read_text(encoding="utf-8"))
        else:
            result = new_result(plan, world_size=plan.config.replicas)
    if completed.returncode != 0:
        failure = failure_status(completed.returncode, completed.stderr, result.status.phase or _last_phase(result))
        # A killed peer shows on rank 0 as a broken connection: name the cause, keep what rank 0 saw.
        if result.status.ok or failure.state is RunState.killed:
            if not result.status.ok:
                failure.message = (f"{failure.message}\nrank 0 saw: {result.status.error_type}: "
                                   f"{result.status.message}")
            result.status = failure
    return result
