"""Sweeps on a Slurm cluster (``core sweep FILE --executor slurm``), against a real Slurm.

The tests that submit jobs need one that answers (``sinfo``); ``scripts/test.sh`` reaches or starts
a single-host one with ``scripts/local-slurm.sh``. Without it they skip, and the run's header says
why (tests/conftest.py). The commands are those of docs/cluster.md#sweeps-on-a-cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.cli import main
from core.config import RunConfig
from core.storage.results import RunResult, RunState
from core.storage.store import ResultStore
from core.sweep.cluster import ENDED_NAME, LEDGER_NAME, job_result
from core.sweep.slurm_jobs import cancel, unavailable_reason

SLURM_MISSING = unavailable_reason()
needs_slurm = pytest.mark.skipif(
    SLURM_MISSING is not None,
    reason=f"no Slurm to submit to ({SLURM_MISSING}); scripts/local-slurm.sh starts a single-host one as root",
)

TINY_SWEEP = """\
name = "{name}"
repeats = 1
timeout_seconds = {timeout_seconds}

[grid]
workload = "fcnn"
accelerator = "cpu"
steps = {steps}
warmup_steps = 1
micro_batch_size = 4
workload_options = {{layers = 1, hidden_width = 8}}

[slurm]
poll_seconds = 1
exclusive = false  # the test node has 2 CPUs: let two repeats run at once
{slurm}
"""


def _sweep_file(tmp_path: Path, name: str, *, steps: str, timeout_seconds: int = 120, slurm: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY_SWEEP.format(name=name, steps=steps, timeout_seconds=timeout_seconds, slurm=slurm))
    return path


def _rows(database: Path, sweep: str) -> list[tuple[str, int, str]]:
    with ResultStore(database, create=False) as store:
        return [(run["cell_key"], run["repeat"], run["status"]) for run in store.records(sweep=sweep)]


@pytest.mark.slow
@needs_slurm
def test_a_sweep_on_slurm_records_every_result_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep_file(tmp_path, "tiny", steps="[2, 3, 4]")
    database = tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    rows = _rows(database, "tiny")
    assert len(rows) == 3 and len({(key, repeat) for key, repeat, _ in rows}) == 3
    assert {status for _, _, status in rows} == {"ok"}
    assert "3 runs now" in capsys.readouterr().out
    ledger = json.loads((tmp_path / "results.db.jobs" / "tiny" / LEDGER_NAME).read_text())
    assert ledger["jobs"] == []  # every job recorded, its folder removed
    assert [path.name for path in (tmp_path / "results.db.jobs" / "tiny").iterdir()] == [LEDGER_NAME]

    # Resuming a finished sweep submits nothing.
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database), "--resume"]) == 0
    assert "0 runs now, 3 before" in capsys.readouterr().out
    assert len(_rows(database, "tiny")) == 3


@pytest.mark.slow
@needs_slurm
def test_a_job_past_its_slurm_time_limit_is_recorded_as_timeout(tmp_path: Path) -> None:
    # 2^24 steps run far past the job's one-minute limit; Slurm ends it (TIMEOUT) within about 90 s.
    sweep = _sweep_file(tmp_path, "slow", steps="16777216", timeout_seconds=60, slurm="time_limit_minutes = 1")
    database = tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    with ResultStore(database, create=False) as store:
        (result,) = store.results(sweep="slow")
    assert result.status.state is RunState.timeout
    assert "reached its time limit, --time=1 (minutes)" in (result.status.message or "")
    # What the job measured before Slurm stopped it (its .partial file) is kept.
    assert result.status.phase == "window" and result.warmup_seconds is not None


@pytest.mark.slow
@needs_slurm
def test_a_killed_submitter_resumes_waiting_for_its_jobs_without_duplicates(tmp_path: Path) -> None:
    sweep = _sweep_file(tmp_path, "killed", steps="[2, 3, 4]")
    database = tmp_path / "results.db"
    ledger_path = tmp_path / "results.db.jobs" / "killed" / LEDGER_NAME
    command = [sys.executable, "-m", "core.cli", "sweep", str(sweep), "--executor", "slurm", "--database"]
    submitter = subprocess.Popen([*command, str(database)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240  # a hang guard: another user's jobs may hold the queue
    while time.monotonic() < deadline:
        if ledger_path.exists() and len(json.loads(ledger_path.read_text())["jobs"]) == 3:
            break
        time.sleep(0.1)
    else:
        submitter.kill()
        pytest.fail(f"the sweep did not submit three jobs: {submitter.communicate()[1].decode()}")
    os.kill(submitter.pid, signal.SIGKILL)  # every job submitted, none recorded yet
    submitter.wait()

    ledger = json.loads(ledger_path.read_text())
    cancelled, lost, waited_for = ledger["jobs"]
    # One job is cancelled from outside (recorded as killed); one the ledger never listed, as if
    # the sweep had died before writing it down (submitted again); the third is waited for.
    cancel([cancelled["job_id"], lost["job_id"]])
    ledger["jobs"] = [cancelled, waited_for]
    ledger_path.write_text(json.dumps(ledger))

    resumed = subprocess.run(
        [*command, str(database), "--resume"], capture_output=True, text=True, timeout=180, check=False
    )
    assert resumed.returncode == 0, resumed.stderr

    statuses = {(key, repeat): status for key, repeat, status in _rows(database, "killed")}
    assert len(_rows(database, "killed")) == 3 == len(statuses)
    assert statuses[(cancelled["cell_key"], 0)] == "killed"
    assert statuses[(lost["cell_key"], 0)] == "ok"
    assert statuses[(waited_for["cell_key"], 0)] == "ok"
    assert json.loads(ledger_path.read_text())["jobs"] == []


def test_a_bad_slurm_value_is_refused_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = _sweep_file(tmp_path, "bad", steps="2", slurm='partition = "debug"\ncpus_per_task = 0')
    database = tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 2
    assert "invalid slurm.cpus_per_task = 0" in capsys.readouterr().err

    plain = _sweep_file(tmp_path, "flags", steps="2")
    assert main(["sweep", str(plain), "--executor", "slurm", "--slurm-option=--output=x", "--database", "x.db"]) == 2
    assert "invalid slurm.extra_options" in capsys.readouterr().err
    assert not database.exists()


# --- how an ended job is recorded, without Slurm ----------------------------------------------


def _job_folder(tmp_path: Path, *, partial: bool, exit_code: int | None) -> tuple[Path, RunConfig]:
    config = RunConfig(workload="fcnn", accelerator="cpu", micro_batch_size=4)
    if partial:
        measured = RunResult.of_config(config, world_size=1)
        measured.setup_seconds = 1.5
        (tmp_path / "result.json.partial").write_text(measured.model_dump_json())
    if exit_code is not None:
        (tmp_path / ENDED_NAME).write_text(json.dumps({"exit_code": exit_code, "seconds": 4.25}))
    (tmp_path / "slurm-7.out").write_text("the worker's last words\n")
    return tmp_path, config


@pytest.mark.parametrize(
    ("state", "expected"),
    [("OUT_OF_MEMORY", RunState.oom), ("CANCELLED", RunState.killed), ("NODE_FAIL", RunState.killed)],
)
def test_a_job_slurm_ended_keeps_its_partial_result(tmp_path: Path, state: str, expected: RunState) -> None:
    folder, config = _job_folder(tmp_path, partial=True, exit_code=None)

    result, seconds = job_result(folder, "7", state, config, time_limit_minutes=5)

    assert result.status.state is expected and result.setup_seconds == 1.5
    assert f"Slurm job 7, state {state}" in (result.status.message or "")
    assert "the worker's last words" in (result.status.message or "") and seconds is None


def test_a_worker_killed_inside_its_job_is_recorded_as_killed(tmp_path: Path) -> None:
    folder, config = _job_folder(tmp_path, partial=False, exit_code=128 + 9)

    result, seconds = job_result(folder, "7", "FAILED", config, time_limit_minutes=5)

    assert result.status.state is RunState.killed and "SIGKILL" in (result.status.message or "")
    assert seconds == 4.25


def test_a_job_slurm_forgot_without_an_end_is_an_error(tmp_path: Path) -> None:
    folder, config = _job_folder(tmp_path, partial=False, exit_code=None)

    result, _ = job_result(folder, "7", None, config, time_limit_minutes=5)

    assert result.status.state is RunState.error and "Slurm no longer knows it" in (result.status.message or "")
