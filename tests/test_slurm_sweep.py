"""Sweeps on a Slurm cluster (``core sweep FILE --executor slurm``), against a real Slurm.

The tests that submit jobs need one that answers (``sinfo``); ``scripts/test.sh`` reaches or starts
a single-host one with ``scripts/local-slurm.sh``. Without it they skip, and the run's header says
why (tests/conftest.py). The commands are those of docs/cluster.md#sweeps-on-a-cluster.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from slurm_support import SimulatedSlurm, simulated_sweep_file

import core.sweep.cluster
import core.sweep.slurm_jobs
from core.base.config import RunConfig
from core.base.files import OutputError
from core.base.results import RunResult, RunState
from core.cli import main
from core.storage.store import ResultStore
from core.sweep import SweepError, run_sweep
from core.sweep.cluster import ENDED_NAME, LEDGER_NAME, job_result
from core.sweep.slurm_jobs import SlurmError, cancel, log_path_pattern, never_starts, unavailable_reason
from core.sweep.slurm_settings import SlurmSettings

# One worker runs this file's tests one after another (scripts/test.sh: --dist loadfile): the local
# cluster is one node of two CPUs, and jobs of two tests at once would wait on each other past the
# tests' time limits.
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
def test_a_job_asking_more_nodes_than_the_cluster_has_ends_as_an_error(tmp_path: Path) -> None:
    # sbatch accepts it where EnforcePartLimits=NO (the default); it would pend forever.
    listed = subprocess.run(["sinfo", "--noheader", "--format=%D"], capture_output=True, text=True, check=True)
    nodes = sum(int(count) for count in listed.stdout.split()) + 1
    sweep = tmp_path / "many.toml"
    sweep.write_text(
        f'name = "many"\nrepeats = 1\n[grid]\nworkload = "fcnn"\nnodes = {nodes}\nreplicas = {nodes}\n'
        "steps = 2\nwarmup_steps = 1\nworkload_options = {layers = 1, hidden_width = 8}\n"
        "[slurm]\npoll_seconds = 1\nexclusive = false\n"
    )
    database = tmp_path / "results.db"
    command = [sys.executable, "-m", "core.cli", "sweep", str(sweep), "--executor", "slurm", "--database"]

    try:
        ended = subprocess.run([*command, str(database)], capture_output=True, text=True, timeout=180, check=False)
    finally:  # a sweep that waited past the hang guard leaves no job pending in the shared Slurm
        for folder in (tmp_path / "results.db.jobs" / "many").glob("cell1-repeat1-*"):
            cancel(core.sweep.slurm_jobs.find("core-many-c1r1", folder))

    assert ended.returncode == 0, ended.stderr
    with ResultStore(database, create=False) as store:
        (result,) = store.results(sweep="many")
    assert result.status.state is RunState.error and "can never start" in (result.status.message or "")
    listed = subprocess.run(["squeue", "--noheader", "--name=core-many-c1r1"], capture_output=True, text=True)
    assert "core-many" not in listed.stdout  # cancelled, not left pending


def _answered_jobs(ledger_path: Path) -> list[dict[str, Any]]:
    """The ledger's jobs once sbatch has answered for each (a job is listed by name before sbatch
    is asked, with no id until it answers); none while one is still unanswered."""
    if not ledger_path.exists():
        return []
    jobs: list[dict[str, Any]] = json.loads(ledger_path.read_text())["jobs"]
    return jobs if all(job["job_id"] is not None for job in jobs) else []


@pytest.mark.slow
@needs_slurm
def test_a_killed_submitter_resumes_waiting_for_its_jobs_without_duplicates(tmp_path: Path) -> None:
    # Single jobs: squeue forgets an array task cancelled while pending at once (no CANCELLED line),
    # so without accounting it is recorded as lost, an error, not killed (docs/cluster.md#job-arrays).
    sweep = _sweep_file(tmp_path, "killed", steps="[2, 3, 4]", slurm="job_arrays = false")
    database = tmp_path / "results.db"
    ledger_path = tmp_path / "results.db.jobs" / "killed" / LEDGER_NAME
    command = [sys.executable, "-m", "core.cli", "sweep", str(sweep), "--executor", "slurm", "--database"]
    submitter = subprocess.Popen([*command, str(database)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240  # a hang guard: another user's jobs may hold the queue
    while time.monotonic() < deadline:
        if len(_answered_jobs(ledger_path)) == 3:
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


@pytest.mark.slow
@needs_slurm
def test_repeats_of_one_cell_cancelled_together_are_each_recorded_once(tmp_path: Path) -> None:
    # Three repeats of one cell (runs far longer than the test) are cancelled by one scancel while
    # the sweep sleeps between polls: its next poll finds them all ended, the first a failure that
    # stops the cell. Each is recorded once, as killed; the sweep ends normally.
    sweep = _sweep_file(tmp_path, "together", steps="16777216", slurm="poll_seconds = 5\njob_arrays = false")
    sweep.write_text(sweep.read_text().replace("repeats = 1", "repeats = 3").replace("poll_seconds = 1\n", ""))
    database = tmp_path / "results.db"
    ledger_path = tmp_path / "results.db.jobs" / "together" / LEDGER_NAME
    command = [sys.executable, "-m", "core.cli", "sweep", str(sweep), "--executor", "slurm", "--database"]
    submitter = subprocess.Popen([*command, str(database)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and submitter.poll() is None:
            if len(_answered_jobs(ledger_path)) == 3:
                break
            time.sleep(0.05)
        cancel([job["job_id"] for job in json.loads(ledger_path.read_text())["jobs"]])
        out, err = submitter.communicate(timeout=120)
    finally:
        if submitter.poll() is None:
            submitter.kill()
            submitter.wait()
            cancel([job["job_id"] for job in json.loads(ledger_path.read_text())["jobs"]])  # leave none running
    assert submitter.returncode == 0, err
    rows = _rows(database, "together")
    assert sorted((repeat, status) for _, repeat, status in rows) == [(0, "killed"), (1, "killed"), (2, "killed")], (
        out,
        err,
    )
    assert "3 runs now" in out and json.loads(ledger_path.read_text())["jobs"] == []


@pytest.mark.slow
@needs_slurm
def test_a_sweep_interrupted_while_sbatch_answers_leaves_no_job_unlisted(tmp_path: Path) -> None:
    # The second sbatch submits its job, then takes its time to answer; SIGINT lands meanwhile.
    # The job is in Slurm: the ledger lists it with its id (found by squeue), and the way out names it.
    shim = tmp_path / "shim" / "sbatch"
    shim.parent.mkdir()
    shim.write_text(
        "#!/bin/bash\n"
        f"count={tmp_path}/sbatch-calls\n"
        'n=$(( $(cat "$count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$count"\n'
        f'if [ "$n" -eq 2 ]; then answer=$({shutil.which("sbatch")} "$@") || exit $?; '
        f'touch {tmp_path}/submitted; sleep 120; echo "$answer"; exit 0; fi\n'
        f'exec {shutil.which("sbatch")} "$@"\n'
    )
    shim.chmod(0o755)
    name = f"answering-{os.getpid()}-{time.monotonic_ns()}"  # no job of an earlier run has its jobs' names
    # job_arrays off: the two repeats are two sbatch calls (tests/test_slurm_arrays.py has an array's)
    sweep = _sweep_file(tmp_path, name, steps="[16777215, 16777216]", slurm="job_arrays = false")
    database = tmp_path / "results.db"
    environment = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}"}
    command = [sys.executable, "-m", "core.cli", "sweep", str(sweep), "--executor", "slurm", "--database"]
    submitter = subprocess.Popen([*command, str(database)], env=environment, stderr=subprocess.PIPE, text=True)
    ledger_path = tmp_path / "results.db.jobs" / name / LEDGER_NAME
    try:
        deadline = time.monotonic() + 120  # a hang guard
        while time.monotonic() < deadline and submitter.poll() is None and not (tmp_path / "submitted").exists():
            time.sleep(0.05)
        submitter.send_signal(signal.SIGINT)
        _, err = submitter.communicate(timeout=120)
    finally:
        if submitter.poll() is None:
            submitter.kill()
        listed = subprocess.run(
            ["squeue", "--noheader", "--states=all", f"--name=core-{name}-c1r1,core-{name}-c2r1", "--format=%i"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        cancel(listed)  # leave none running
    assert submitter.returncode == 130, err
    in_ledger = [job["job_id"] for job in json.loads(ledger_path.read_text())["jobs"]]
    assert len(listed) == 2 and sorted(in_ledger) == sorted(listed), (listed, in_ledger, err)
    # the line names the jobs in the ledger's order, the order they were submitted in (sorted as
    # strings, "100" came before "99" and failed CI once the test cluster passed job 99)
    assert f"2 job(s) of sweep {name} stay in Slurm ({', '.join(in_ledger)})" in err


@pytest.mark.slow
@needs_slurm
def test_a_jobs_directory_with_sbatch_patterns_in_its_name_keeps_the_logs(tmp_path: Path) -> None:
    # sbatch expands %j, %u... anywhere in --output: this directory's own must stay as they are.
    jobs = tmp_path / "100%j-%u jobs"
    sweep = _sweep_file(tmp_path, "patterns", steps="2", slurm=f"jobs_directory = {json.dumps(str(jobs))}")
    database = tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    assert [status for _, _, status in _rows(database, "patterns")] == ["ok"]
    assert [path for path in tmp_path.iterdir() if path.name.startswith("100")] == [jobs]  # none expanded
    assert [path.name for path in (jobs / "patterns").iterdir()] == [LEDGER_NAME]


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


# --- the bookkeeping, against a simulated Slurm (tests/slurm_support.py) --------------------------


_simulated_sweep = simulated_sweep_file


@pytest.fixture(params=[0, 1001], ids=["single-jobs", "arrays"])
def simulated_slurm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SimulatedSlurm:
    """A simulated Slurm, each test run twice: with arrays turned off (MaxArraySize 0: a job per
    repeat) and on (the repeats in job arrays, each task a job of the ledger)."""
    slurm = SimulatedSlurm(max_array_size=request.param)
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)
    return slurm


#: for a test that counts sbatch calls or names job ids: each repeat a job of its own
#: (tests/test_slurm_arrays.py has the same guarantees for arrays)
single_jobs = pytest.mark.parametrize("simulated_slurm", [0], indirect=True, ids=["single-jobs"])


def _recorded(database: Path) -> dict[tuple[int, int], RunResult]:
    """(cell, repeat), both 1-based, -> the recorded result; fails on a repeat recorded twice."""
    with ResultStore(database, create=False) as store:
        runs = store.runs(sweep="sim")
    keys = [(run.result.config.steps - 1, (run.repeat or 0) + 1) for run in runs]  # steps = 1 + the cell's number
    assert len(keys) == len(set(keys)), f"a repeat recorded twice: {keys}"
    return {key: run.result for key, run in zip(keys, runs)}


#: how a job that ended in each Slurm state, its worker's result not written, is recorded
_FINAL_STATES = {
    "TIMEOUT": RunState.timeout,
    "DEADLINE": RunState.timeout,
    "OUT_OF_MEMORY": RunState.oom,
    "CANCELLED": RunState.killed,
    "NODE_FAIL": RunState.killed,
    "BOOT_FAIL": RunState.killed,
    "PREEMPTED": RunState.killed,
    "FAILED": RunState.error,  # the worker exited 1 without a result
    "REVOKED": RunState.error,
    "SPECIAL_EXIT": RunState.error,
}


@pytest.mark.parametrize("state", sorted(_FINAL_STATES))
def test_every_repeat_of_a_cell_ending_in_one_poll_is_recorded_once_with_its_phases(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, state: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Four repeats of one cell end in the same poll: the first failed (which stops the cell), then
    # one in `state` with only its phases written, one that completed, one whose worker wrote its
    # result before Slurm ended the job in `state` (the result is whole: it is what is kept).
    def poll(slurm: SimulatedSlurm, number: int) -> None:
        if number == 1:
            slurm.end(slurm.job(1, 1), "FAILED", result="error", exit_code=1)
            slurm.end(slurm.job(1, 2), state, exit_code=1 if state == "FAILED" else None)
            slurm.end(slurm.job(1, 3), "COMPLETED", result="ok", exit_code=0)
            slurm.end(slurm.job(1, 4), state, result="ok")

    simulated_slurm.on_poll = poll
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=4), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0, capsys.readouterr()

    recorded = _recorded(database)
    assert {key: result.status.state for key, result in recorded.items()} == {
        (1, 1): RunState.error,
        (1, 2): _FINAL_STATES[state],
        (1, 3): RunState.ok,
        (1, 4): RunState.ok,
    }
    for repeat in range(1, 5):  # each with the phases its own job measured
        assert recorded[(1, repeat)].setup_seconds == float(simulated_slurm.job(1, repeat))
    if state not in ("FAILED", "REVOKED", "SPECIAL_EXIT"):
        assert f"state {state}" in (recorded[(1, 2)].status.message or "")
    assert simulated_slurm.cancelled == [] and simulated_slurm.polls == 1
    assert json.loads((tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME).read_text())["jobs"] == []
    assert "4 runs now" in capsys.readouterr().out


@single_jobs
def test_the_line_of_each_ended_job_says_how_it_ended_without_a_dangling_label(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    # A job Slurm cancelled leaves no end record (its seconds are unknown, not 0.0); a failed
    # worker's message ends its first line with the label of its output, which the line leaves out.
    def poll(slurm: SimulatedSlurm, number: int) -> None:
        slurm.end(slurm.job(1, 1), "CANCELLED")
        slurm.end(slurm.job(2, 1), "FAILED", exit_code=1)

    simulated_slurm.on_poll = poll
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=1), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    lines = [line for line in capsys.readouterr().out.splitlines() if " repeat 1: " in line]
    assert lines == [
        "steps=2 repeat 1: killed in first_step: the job was cancelled (scancel, or the cluster's administrator) "
        "(Slurm job 100, state CANCELLED).",
        "steps=3 repeat 1: error in first_step: the worker of Slurm job 101 exited with code 1 without a result."
        " (2.5 s)",
    ]
    assert "job 100's output" in (_recorded(database)[(1, 1)].status.message or "")  # the tail stays recorded


def test_a_failed_repeat_stops_only_the_jobs_of_its_cell_that_had_not_ended(
    tmp_path: Path, simulated_slurm: SimulatedSlurm
) -> None:
    # Cells 1 and 2 each fail in the first poll; cell 1's third job is still running (cancelled,
    # not recorded), its second has written its result and is finishing (left to end, recorded);
    # cell 3 is untouched and completes in the second poll.
    def poll(slurm: SimulatedSlurm, number: int) -> None:
        if number == 1:
            slurm.end(slurm.job(1, 1), "OUT_OF_MEMORY")
            slurm.end(slurm.job(2, 1), "TIMEOUT")
            slurm.end(slurm.job(2, 2), "NODE_FAIL")
            slurm.end(slurm.job(1, 2), "RUNNING", result="ok")
            slurm.jobs[slurm.job(1, 3)]["state"] = slurm.jobs[slurm.job(3, 1)]["state"] = "RUNNING"
        if number == 2:
            slurm.end(slurm.job(1, 2), "COMPLETED", result="ok", exit_code=0)
            for repeat in (1, 2, 3):
                slurm.end(slurm.job(3, repeat), "COMPLETED", result="ok", exit_code=0)

    simulated_slurm.on_poll = poll
    sweep, database = _simulated_sweep(tmp_path, cells=3, repeats=3), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    states = {key: result.status.state for key, result in _recorded(database).items()}
    assert states == {
        (1, 1): RunState.oom,
        (1, 2): RunState.ok,
        (2, 1): RunState.timeout,
        (2, 2): RunState.killed,
        (3, 1): RunState.ok,
        (3, 2): RunState.ok,
        (3, 3): RunState.ok,
    }
    assert sorted(simulated_slurm.cancelled) == sorted([simulated_slurm.job(1, 3), simulated_slurm.job(2, 3)])
    assert [path.name for path in (tmp_path / "results.db.jobs" / "sim").iterdir()] == [LEDGER_NAME]


def test_a_job_slurm_forgets_is_lost_after_two_polls_by_the_injected_clock(
    tmp_path: Path, simulated_slurm: SimulatedSlurm
) -> None:
    answers: list[int] = []

    def poll(slurm: SimulatedSlurm, number: int) -> None:
        answers.append(number)
        slurm.jobs[slurm.job(1, 1)]["state"] = None  # squeue forgot it, and it wrote no end

    simulated_slurm.on_poll = poll
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=1), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    (result,) = _recorded(database).values()
    assert result.status.state is RunState.error and "Slurm no longer knows it" in (result.status.message or "")
    assert answers == [1, 2, 3]  # submitted at t, lost at t + 2 polls of 5 s on the sweep's clock


# --- a job that can never start, and one that waits its turn -------------------------------------

#: Slurm's reasons (squeue %r) for a pending job that never starts as it is: the sweep cancels it
_NEVER_STARTS = [
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "BadConstraints",
    "DependencyNeverSatisfied",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "ReservationDeleted",
    "AssocMaxNodePerJobLimit",
    "AssocMaxWallDurationPerJobLimit",
    "QOSMaxCpuPerNode",
    "QOSMinGRES",
]
#: reasons that clear without changing the job (other jobs end, a hold is released, a node comes back)
_WAITS_ITS_TURN = [
    "Priority",
    "Resources",
    "None",
    "JobHeldUser",
    "JobHeldAdmin",
    "PartitionDown",
    "NodeDown",
    "ReqNodeNotAvail, UnavailableNodes:node1",
    "AssocGrpNodeLimit",
    "QOSMaxNodePerUserLimit",
    "AssocMaxJobsLimit",
    "MaxJobsPerAccount",
    "BeginTime",
]


@pytest.mark.parametrize("reason", _NEVER_STARTS)
def test_a_job_slurm_says_can_never_start_ends_its_repeat_and_the_sweep_goes_on(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], reason: str
) -> None:
    # Cell 1's two jobs pend for `reason` (a 2-node job on a 1-node partition, accepted where
    # EnforcePartLimits=NO): each is cancelled and recorded as an error naming the job and the
    # reason; cell 2, which waited its turn, completes. Without this the sweep polled forever.
    def poll(slurm: SimulatedSlurm, number: int) -> None:
        for repeat in (1, 2):
            slurm.jobs[slurm.job(1, repeat)]["reason"] = reason
        if number == 2:
            for repeat in (1, 2):
                slurm.end(slurm.job(2, repeat), "COMPLETED", result="ok", exit_code=0)

    simulated_slurm.on_poll = poll
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    recorded = _recorded(database)
    assert {key: result.status.state for key, result in recorded.items()} == {
        (1, 1): RunState.error,
        (1, 2): RunState.error,
        (2, 1): RunState.ok,
        (2, 2): RunState.ok,
    }
    first, second = simulated_slurm.job(1, 1), simulated_slurm.job(1, 2)
    message = recorded[(1, 1)].status.message or ""
    assert f"Slurm job {first} can never start: it is pending with reason {reason}: " in message, message
    assert "core cancelled it" in message and recorded[(1, 1)].status.error_type == "JobCannotStart"
    assert f"Slurm job {second} can never start" in (recorded[(1, 2)].status.message or "")
    assert sorted(simulated_slurm.cancelled) == sorted([first, second])
    assert simulated_slurm.jobs[first]["state"] == "CANCELLED"  # nothing left pending in Slurm
    assert json.loads((tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME).read_text())["jobs"] == []
    out = capsys.readouterr().out
    assert f"steps=2 repeat 1: error in setup: Slurm job {first} can never start" in out and "4 runs now" in out


@pytest.mark.parametrize("reason", _WAITS_ITS_TURN)
def test_a_job_waiting_its_turn_is_waited_for_and_its_reason_is_shown(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], reason: str
) -> None:
    def poll(slurm: SimulatedSlurm, number: int) -> None:
        slurm.jobs[slurm.job(1, 1)]["reason"] = reason
        if number == 4:
            slurm.end(slurm.job(1, 1), "COMPLETED", result="ok", exit_code=0)

    simulated_slurm.on_poll = poll
    told: list[tuple[str, int, str, str]] = []

    class Watcher(core.sweep.SweepObserver):
        def queued(self, cell: Any, repeat: int, job: str, why: str) -> None:
            told.append((cell.label, repeat, job, why))

    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=1), tmp_path / "results.db"
    run_sweep(sweep, database=database, executor="slurm", observer=Watcher())

    assert {key: result.status.state for key, result in _recorded(database).items()} == {(1, 1): RunState.ok}
    assert simulated_slurm.cancelled == []
    assert told == [("steps=2", 0, simulated_slurm.job(1, 1), reason)] * 3  # each poll while it waited

    # The command's display says it too: a hold, a partition or node down... once per job on stderr
    # (a sweep off a terminal is never silent while it waits on one), the ordinary queue not at all.
    simulated_slurm.jobs.clear()
    simulated_slurm.polls = 0
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "cli.db")]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "pending" in line]
    if reason.split(",")[0] in ("Priority", "Resources", "None", "BeginTime"):
        assert said == []
    else:
        job = simulated_slurm.job(1, 1)
        assert len(said) == 1, said  # once, not at every poll
        assert said[0].startswith(f"core: steps=2 repeat 1: Slurm job {job} pending: {reason}")
        assert said[0].endswith(f"; the sweep waits for it (scancel {job} stops it)")


def test_the_progress_line_says_a_job_is_pending_and_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.cli.sweep_display import SweepDisplay
    from core.running.progress import ProgressLine

    monkeypatch.setenv("COLUMNS", "200")  # the line is cut to the terminal's width, whatever runs the test

    display = SweepDisplay()
    display.line = ProgressLine(sys.stderr, enabled=True)
    plan = core.sweep.plan_sweep(
        core.sweep.make_sweep_spec(
            {"name": "p", "repeats": 1, "grid": {"workload": "fcnn", "steps": 2, "accelerator": "cpu"}}
        )
    )
    display.started(plan, 1, 0)
    display.queued(plan.cells[0], 0, "123", "Resources")
    assert "Slurm job 123 pending: Resources (the nodes it needs are busy)" in capsys.readouterr().err


def test_only_reasons_that_never_clear_end_a_job() -> None:
    from core.sweep.slurm_jobs import never_starts

    assert all(never_starts(reason) for reason in _NEVER_STARTS)
    assert not any(never_starts(reason) for reason in [*_WAITS_ITS_TURN, "", None, "(null)", "Dependency"])


#: ``scontrol show partition gpu --oneliner`` of a partition of 4 nodes, at most 4 a job (abridged)
_GPU_PARTITION = "PartitionName=gpu AllowGroups=ALL MaxNodes=4 MaxTime=UNLIMITED MinNodes=0 Nodes=g[1-4] TotalNodes=4"


def test_the_pending_reasons_are_asked_of_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def slurm(command: list[str], environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        asked.append(command)
        if command[0] == "scontrol":
            return subprocess.CompletedProcess(command, 0, stdout=_GPU_PARTITION + "\n", stderr="")
        return subprocess.CompletedProcess(
            command,
            0,
            stdout="7|PartitionNodeLimit|gpu|8\n8|ReqNodeNotAvail, UnavailableNodes:n1|gpu|1\n"
            "10|PartitionNodeLimit|gpu|2\n11|PartitionNodeLimit|gpu|4\n",
            stderr="",
        )

    monkeypatch.setattr(core.sweep.slurm_jobs, "_run", slurm)

    reasons = core.sweep.slurm_jobs.pending_reasons(["7", "8", "9", "10", "11"])

    # 8 nodes on a partition of 4 never start; 2 or 4 fit its limits, so its nodes are down or
    # drained (Slurm gives PartitionNodeLimit then too): those jobs wait for them to come back.
    down = (
        "PartitionNodeLimit, nodes down or drained in partition gpu (its {} node(s) are within the partition's limits)"
    )
    assert reasons == {
        "7": "PartitionNodeLimit",
        "8": "ReqNodeNotAvail, UnavailableNodes:n1",
        "10": down.format(2),
        "11": down.format(4),
    }
    assert [never_starts(reasons[job]) is not None for job in ("7", "8", "10", "11")] == [True, False, False, False]
    assert asked == [
        ["squeue", "--noheader", "--states=PENDING", "--format=%i|%r|%P|%D", "--jobs=7,8,9,10,11"],
        ["scontrol", "show", "partition", "gpu", "--oneliner"],  # once for the partition's jobs
    ]


@pytest.mark.parametrize(
    ("listed", "settings"),
    [
        ("gpu|2", ""),
        ("gpu|2", "PartitionName=gpu MaxNodes=UNLIMITED MinNodes=0"),
        ("gpu|2", None),
        ("|2", _GPU_PARTITION),
        ("gpu|", _GPU_PARTITION),
    ],
)
def test_a_partition_node_limit_whose_partition_cannot_be_read_is_waited_for(
    monkeypatch: pytest.MonkeyPatch, listed: str, settings: str | None
) -> None:
    # No TotalNodes, scontrol refused, or squeue gave no partition or node count: whether nodes are
    # down (Slurm's other meaning of PartitionNodeLimit) cannot be ruled out, so the job is not
    # cancelled (it could start once they return), and the reason on the progress line says why.
    def slurm(command: list[str], environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        if command[0] == "scontrol":
            return subprocess.CompletedProcess(command, 1 if settings is None else 0, stdout=settings or "", stderr="")
        return subprocess.CompletedProcess(command, 0, stdout=f"7|PartitionNodeLimit|{listed}\n", stderr="")

    monkeypatch.setattr(core.sweep.slurm_jobs, "_run", slurm)
    reason = core.sweep.slurm_jobs.pending_reasons(["7"])["7"]
    assert reason.startswith("PartitionNodeLimit, nodes down or drained perhaps (the limits of partition ")
    assert never_starts(reason) is None


# --- a refused submission, a bad jobs directory ---------------------------------------------------


@single_jobs
def test_a_refused_sbatch_leaves_no_half_made_sweep(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    simulated_slurm.refuse_submission = 3
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 2

    error = capsys.readouterr().err
    assert "sweep sim not submitted: repeat 2 of cell" in error and "invalid partition specified: nope" in error
    assert "the 2 job(s) submitted before it were cancelled" in error
    assert simulated_slurm.cancelled == ["100", "101"]
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == [] and store.count() == 0
    assert not (tmp_path / "results.db.jobs").exists()
    # Nothing to resume; fixed, the sweep starts afresh.
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database), "--resume"]) == 2
    assert "no sweep 'sim'" in capsys.readouterr().err
    simulated_slurm.refuse_submission = None
    simulated_slurm.on_poll = lambda slurm, number: [
        slurm.end(job_id, "COMPLETED", result="ok", exit_code=0) for job_id in slurm.jobs if int(job_id) > 101
    ]
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0
    assert len(_recorded(database)) == 4


@single_jobs
@pytest.mark.parametrize("left", ["result", "partial", "ended"])
def test_a_refused_sbatch_keeps_the_jobs_that_already_measured(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], left: str
) -> None:
    # Job 1 ended (its result, or only its end) or is measuring (its phases so far) when sbatch
    # refuses job 3: what it measured is not thrown away. It stays in Slurm and in the ledger, the
    # sweep stays in the database, and --resume records it; job 2, still pending, is withdrawn.
    def first_job_runs(slurm: SimulatedSlurm, number: int) -> None:
        if number == 3:
            first = slurm.job(1, 1)
            if left == "result":
                slurm.end(first, "COMPLETED", result="ok", exit_code=0)
            elif left == "ended":
                slurm.end(first, "FAILED", exit_code=1)
                (Path(slurm.jobs[first]["folder"]) / "result.json.partial").unlink()
            else:
                slurm.end(first, "RUNNING")

    simulated_slurm.on_submit = first_job_runs
    simulated_slurm.refuse_submission = 3
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main(command) == 2

    err = capsys.readouterr().err
    assert "sweep sim stopped submitting: repeat 2 of cell" in err and "invalid partition specified: nope" in err
    assert "the 1 job(s) submitted before it were cancelled" in err and "the 1 job(s) that had begun measuring" in err
    assert "1 job(s) of sweep sim stay in Slurm (100)" in err
    assert simulated_slurm.cancelled == ["101"]
    ledger = json.loads((tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME).read_text())
    assert [job["job_id"] for job in ledger["jobs"]] == ["100"] and Path(ledger["jobs"][0]["folder"]).is_dir()
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == ["sim"]  # resumable: not taken out as a sweep that never began
    assert main([*command, "--dry-run", "--resume"]) == 0

    simulated_slurm.refuse_submission = None
    simulated_slurm.on_submit = lambda slurm, number: None
    simulated_slurm.on_poll = _complete_pending
    if left == "partial":
        simulated_slurm.end("100", "COMPLETED", result="ok", exit_code=0)
    assert main([*command, "--resume"]) == 0

    recorded = _recorded(database)
    assert len(recorded) == 4 and len(simulated_slurm.jobs) == 5  # job 100 waited for, not submitted again
    if left == "ended":
        assert recorded[(1, 1)].status.state is RunState.error and "Slurm job 100" in (
            recorded[(1, 1)].status.message or ""
        )
    else:
        assert recorded[(1, 1)].status.state is RunState.ok and recorded[(1, 1)].setup_seconds == 100.0


# --- a job whose sbatch answer was lost: found by its name and folder, never left unlisted ---------


def _ledger_jobs(tmp_path: Path) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = json.loads((tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME).read_text())["jobs"]
    return jobs


@single_jobs
@pytest.mark.parametrize("squeue_answers", [True, False])
def test_a_sweep_stopped_while_sbatch_answered_lists_the_job_it_submitted(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], squeue_answers: bool
) -> None:
    # Ctrl-C (SIGTERM is the same KeyboardInterrupt) while the second sbatch runs: Slurm has the
    # job, the sweep never read its id. It is listed all the same (found by squeue, or by its name
    # until Slurm answers), the way out names it, and --resume waits for it rather than run the
    # repeat twice.
    simulated_slurm.lose_answer = {2: KeyboardInterrupt()}
    simulated_slurm.find_fails = not squeue_answers
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main(command) == 130

    err = capsys.readouterr().err
    assert [job["job_id"] for job in _ledger_jobs(tmp_path)] == ["100", "101" if squeue_answers else None]
    assert _ledger_jobs(tmp_path)[1]["job_name"] == "core-sim-c2r1"
    listed = "100, 101" if squeue_answers else "100, core-sim-c2r1 (sbatch gave no id)"
    assert f"2 job(s) of sweep sim stay in Slurm ({listed})" in err and "Continue with: " in err
    assert simulated_slurm.cancelled == [] and Path(_ledger_jobs(tmp_path)[1]["folder"]).is_dir()

    simulated_slurm.lose_answer, simulated_slurm.find_fails = {}, False
    simulated_slurm.on_poll = _complete_pending
    assert main([*command, "--resume"]) == 0

    assert len(_recorded(database)) == 4 and len(simulated_slurm.jobs) == 4  # none submitted twice
    assert _recorded(database)[(2, 1)].setup_seconds == 101.0
    assert _ledger_jobs(tmp_path) == []


@single_jobs
def test_the_job_found_for_a_lost_answer_is_the_latest_of_its_folder(
    tmp_path: Path, simulated_slurm: SimulatedSlurm
) -> None:
    # A refusal withdrew job 100 of cell 1's folder; Slurm still lists it (squeue keeps ended jobs a
    # while) when the next sweep's sbatch for the same folder loses its answer: 101 is that job.
    simulated_slurm.refuse_submission = 2
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=1), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]
    assert main(command) == 2
    assert simulated_slurm.cancelled == ["100"]
    simulated_slurm.refuse_submission, simulated_slurm.lose_answer = None, {2: KeyboardInterrupt()}

    assert main(command) == 130

    assert [job["job_id"] for job in _ledger_jobs(tmp_path)] == ["101"]
    assert simulated_slurm.cancelled == ["100"] and simulated_slurm.jobs["101"]["state"] == "PENDING"


@single_jobs
def test_a_job_whose_sbatch_timed_out_but_was_submitted_is_the_repeats_job(
    tmp_path: Path, simulated_slurm: SimulatedSlurm
) -> None:
    # sbatch gave no answer in time (or printed no id), yet Slurm has the job: it is not submitted again.
    simulated_slurm.lose_answer = {1: SlurmError("sbatch gave no answer in 60 s")}
    simulated_slurm.on_poll = _complete_pending
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=1), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    assert len(simulated_slurm.jobs) == 2 and _recorded(database)[(1, 1)].setup_seconds == 100.0


@single_jobs
def test_a_submission_stopped_before_slurm_had_the_job_is_submitted_again(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ctrl-C before sbatch reached Slurm: nothing of that repeat stays (entry, folder), and a sweep
    # killed outright (kill -9) in the same place leaves an entry without an id that --resume drops.
    def ctrl_c_before_slurm(slurm: SimulatedSlurm, number: int) -> None:
        if number == 2:
            listed = _ledger_jobs(tmp_path)  # written before sbatch was asked
            assert [job["job_id"] for job in listed] == ["100", None] and listed[1]["job_name"] == "core-sim-c2r1"
            raise KeyboardInterrupt

    simulated_slurm.on_submit = ctrl_c_before_slurm
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=1), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main(command) == 130

    assert "1 job(s) of sweep sim stay in Slurm (100)" in capsys.readouterr().err
    assert [job["job_id"] for job in _ledger_jobs(tmp_path)] == ["100"]
    assert sorted(
        re.sub("-[0-9a-f]{6}$", "", path.name) for path in (tmp_path / "results.db.jobs" / "sim").iterdir()
    ) == [
        "cell1-repeat1",
        LEDGER_NAME,
    ]
    ledger_path = tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME
    ledger = json.loads(ledger_path.read_text())
    lost_folder = tmp_path / "results.db.jobs" / "sim" / "cell2-repeat1"
    lost_folder.mkdir()
    second_cell = ledger["jobs"][0]["cell_key"].replace('"steps":2', '"steps":3')
    unanswered = {"cell_key": second_cell, "job_id": None, "job_name": "core-sim-c2r1", "folder": str(lost_folder)}
    ledger["jobs"].append({**ledger["jobs"][0], **unanswered})
    ledger_path.write_text(json.dumps(ledger))  # as kill -9 while sbatch was asked would leave it

    simulated_slurm.on_submit = lambda slurm, number: None
    simulated_slurm.on_poll = _complete_pending
    assert main([*command, "--resume"]) == 0

    assert len(_recorded(database)) == 2 and len(simulated_slurm.jobs) == 2 and _ledger_jobs(tmp_path) == []


@single_jobs
def test_a_refused_sbatch_on_resume_keeps_the_jobs_already_in_flight(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep, database = _simulated_sweep(tmp_path, cells=3, repeats=1), tmp_path / "results.db"
    ledger_path = tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME

    def interrupt(slurm: SimulatedSlurm, number: int) -> None:
        raise KeyboardInterrupt

    simulated_slurm.on_poll = interrupt
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 130
    ledger = json.loads(ledger_path.read_text())
    lost = [ledger["jobs"].pop(), ledger["jobs"].pop()]
    ledger_path.write_text(json.dumps(ledger))  # as if the sweep died before listing two of its jobs
    simulated_slurm.refuse_submission = 5  # the second of the two submitted again

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database), "--resume"]) == 2

    assert "the 1 job(s) submitted before it were cancelled" in capsys.readouterr().err
    assert simulated_slurm.cancelled == ["103"]
    assert json.loads(ledger_path.read_text())["jobs"] == ledger["jobs"]  # the job in flight is still waited for
    assert Path(ledger["jobs"][0]["folder"]).is_dir() and not any(Path(job["folder"]).exists() for job in lost)
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == ["sim"]


def _complete_pending(slurm: SimulatedSlurm, poll: int) -> None:
    for job_id, job in list(slurm.jobs.items()):
        if job["state"] == "PENDING":
            slurm.end(job_id, "COMPLETED", result="ok", exit_code=0)


def _sweep_rows(database: Path) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return connection.execute("SELECT * FROM sweeps").fetchall()
    finally:
        connection.close()


@single_jobs
@pytest.mark.parametrize("changed", [["--repeats", "2"], ["--repeats", "2", "--timeout-seconds", "90"], []])
def test_a_refused_resume_leaves_the_sweeps_record_as_it_was(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], changed: list[str]
) -> None:
    simulated_slurm.on_poll = _complete_pending
    sweep, database = _simulated_sweep(tmp_path, cells=2, repeats=1), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]
    assert main(command) == 0
    before = _sweep_rows(database)
    simulated_slurm.refuse_submission = 3  # the first job the resume submits
    if not changed:  # nothing new to run: a job lost from the ledger is what is submitted again
        with sqlite3.connect(database) as connection:
            connection.execute("DELETE FROM runs WHERE repeat = 0 AND id = (SELECT MAX(id) FROM runs)")

    assert main([*command, "--resume", *changed]) == 2

    assert "invalid partition specified: nope" in capsys.readouterr().err
    assert _sweep_rows(database) == before  # neither its repeats, its resumes nor its updated_at changed
    simulated_slurm.refuse_submission = None
    assert main([*command, "--resume", *changed]) == 0
    (row,) = _sweep_rows(database)
    spec = json.loads(row[2])
    assert spec["repeats"] == (2 if changed else 1) and ("resumed" in spec) == bool(changed)


@pytest.mark.parametrize(
    ("jobs_directory", "expected"),
    [
        ("{tmp}/a-file", "a-file is a file, not a folder"),
        ("{tmp}/a-file/jobs", "a-file is a file, not a folder"),
        ("{tmp}/missing/jobs", "its folder {tmp}/missing does not exist"),
        ("{tmp}/back\\\\slash", "a backslash"),
    ],
)
def test_a_bad_jobs_directory_is_refused_before_anything_is_written(
    tmp_path: Path,
    simulated_slurm: SimulatedSlurm,
    capsys: pytest.CaptureFixture[str],
    jobs_directory: str,
    expected: str,
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1)
    database = tmp_path / "db" / "results.db"
    directory = jobs_directory.format(tmp=tmp_path)
    for extra in (["--dry-run"], []):
        command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database), *extra]
        assert main([*command, "--slurm-jobs-directory", directory]) == 2
        assert expected.format(tmp=tmp_path) in capsys.readouterr().err
    assert simulated_slurm.jobs == {} and not database.parent.exists()
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("in_sweeps_folder", "target", "expected"),
    [
        (False, "/nonexistent", "{link} is a link to /nonexistent, which leads nowhere"),
        (False, "{self}", "{link} is a link to {self}, which leads nowhere (a dangling link, or a loop of links)"),
        (False, "a-file", "{link} is a file, not a folder"),
        (True, "/nonexistent", "the sweep's folder: {link} is a link to /nonexistent, which leads nowhere"),
        (True, "../a-file", "the sweep's folder: {link} is a file, not a folder"),
    ],
)
@pytest.mark.parametrize("default_directory", [False, True])
def test_a_jobs_directory_that_is_a_link_leading_nowhere_is_refused(
    tmp_path: Path,
    simulated_slurm: SimulatedSlurm,
    capsys: pytest.CaptureFixture[str],
    in_sweeps_folder: bool,
    target: str,
    expected: str,
    default_directory: bool,
) -> None:
    # A dangling or looping link (or a file) where the jobs directory or the sweep's folder in it
    # would be: --dry-run and the sweep refuse it alike, naming it, and tidy nothing they did not make.
    (tmp_path / "a-file").write_text("not a folder")
    jobs = tmp_path / ("r.db.jobs" if default_directory else "jobs")
    link = jobs / "sim" if in_sweeps_folder else jobs
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target.format(self=link.name))
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1)
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "r.db")]
    command += [] if default_directory else ["--slurm-jobs-directory", str(jobs)]
    for extra in (["--dry-run"], []):
        assert main([*command, *extra]) == 2
        err = capsys.readouterr().err
        assert expected.format(link=link, self=link.name) in err and "cannot tidy" not in err
    assert simulated_slurm.jobs == {} and link.is_symlink() and not (tmp_path / "r.db").exists()


def test_a_jobs_directory_linked_to_a_folder_is_used(tmp_path: Path, simulated_slurm: SimulatedSlurm) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "jobs").symlink_to(tmp_path / "elsewhere")
    simulated_slurm.on_poll = _complete_pending
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1, slurm_table=f'jobs_directory = "{tmp_path / "jobs"}"')

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "r.db")]) == 0

    assert [path.name for path in (tmp_path / "elsewhere" / "sim").iterdir()] == [LEDGER_NAME]


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        # root passes os.access on sysfs and procfs, where mkdir fails: only trying tells
        ("/sys", "slurm.jobs_directory /sys: cannot make a folder in /sys: "),
        ("/proc", "slurm.jobs_directory /proc: cannot make a folder in /proc: "),
        ("{tmp}/read-only", "cannot make a folder in {tmp}/read-only: "),
        ("{tmp}/read-only/jobs", "cannot make a folder in {tmp}/read-only: "),
    ],
)
def test_a_jobs_directory_where_no_folder_can_be_made_is_refused_by_the_dry_run_too(
    tmp_path: Path,
    simulated_slurm: SimulatedSlurm,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    jobs: str,
    expected: str,
) -> None:
    # A folder whose filesystem refuses new entries, whatever its permission bits say to root (a
    # chmod'ed one stands for a read-only filesystem where these tests run as a user).
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    if jobs.startswith("{tmp}") and os.geteuid() == 0:
        pytest.skip("root writes to a folder whatever its mode")
    read_only.chmod(0o555)
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1)
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "r.db")]
    directory = jobs.format(tmp=tmp_path)
    try:
        for extra in (["--dry-run"], []):
            assert main([*command, f"--slurm-jobs-directory={directory}", *extra]) == 2
            err = capsys.readouterr().err
            assert expected.format(tmp=tmp_path) in err and "cannot tidy" not in err + caplog.text, err
    finally:
        read_only.chmod(0o755)
    assert simulated_slurm.jobs == {} and not (tmp_path / "r.db").exists()
    assert list(read_only.iterdir()) == []  # the probe left nothing


def test_a_refused_sweep_tidies_only_the_folders_it_made(
    tmp_path: Path,
    simulated_slurm: SimulatedSlurm,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Past the checks, mkdir of the sweep's folder fails (another process took the place, a quota
    # reached in between): the folder was never made, so nothing is said about tidying it.
    monkeypatch.setattr(core.sweep.cluster, "check_jobs_directory", lambda *args, **kwargs: None)
    real_mkdir = Path.mkdir

    def refuse(path: Path, *args: Any, **kwargs: Any) -> None:
        if path.name == "sim":
            raise PermissionError(1, "Operation not permitted", str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    (tmp_path / "jobs").mkdir()
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1, slurm_table=f'jobs_directory = "{tmp_path / "jobs"}"')

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "r.db")]) == 2

    assert "cannot make its folder" in capsys.readouterr().err
    assert "cannot tidy" not in caplog.text, caplog.text  # warnings go through logging
    assert (tmp_path / "jobs").is_dir() and list((tmp_path / "jobs").iterdir()) == []


def test_two_databases_cannot_share_one_sweeps_jobs(tmp_path: Path, simulated_slurm: SimulatedSlurm) -> None:
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1, slurm_table=f'jobs_directory = "{tmp_path}"')
    simulated_slurm.on_poll = lambda slurm, number: (_ for _ in ()).throw(KeyboardInterrupt)
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(tmp_path / "a.db")]) == 130

    with pytest.raises(SweepError, match=f"belongs to sweep 'sim' of another database, {tmp_path / 'a.db'}"):
        run_sweep(sweep, database=tmp_path / "b.db", executor="slurm")
    with ResultStore(tmp_path / "b.db", create=False) as store:
        assert store.sweep_names() == []  # refused before anything was submitted: no half-made sweep


# --- a multi-node cell is a Slurm job of its nodes ------------------------------------------------


def test_a_multi_node_cell_is_planned_for_its_own_slurm_job(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Planned here (outside any allocation), a cell of 2 nodes would need a rendezvous; as a Slurm
    # job of 2 nodes it meets inside that job's allocation (docs/cluster.md): valid, submitted so.
    for variable in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(variable, raising=False)
    sweep = tmp_path / "sim.toml"
    sweep.write_text(
        'name = "sim"\nrepeats = 1\n[grid]\nworkload = "fcnn"\naccelerator = "cpu"\nnodes = [1, 2]\n'
        "replicas = 2\nsteps = 2\nmicro_batch_size = 4\nworkload_options = {layers = 1, hidden_width = 8}\n"
    )
    database = tmp_path / "results.db"
    command = ["sweep", str(sweep), "--database", str(database)]

    assert main([*command, "--executor", "slurm", "--dry-run"]) == 0
    assert "2 cells (2 valid, 0 invalid)" in capsys.readouterr().out
    assert main([*command, "--dry-run"]) == 2  # run here, the cell still needs its rendezvous
    assert "rendezvous = None: HOST:PORT is required" in capsys.readouterr().out

    simulated_slurm.on_poll = _complete_pending
    assert main([*command, "--executor", "slurm"]) == 0

    submitted = {job["name"]: job["options"] for job in simulated_slurm.jobs.values()}
    assert "--nodes=1" in submitted["core-sim-c1r1"] and "--nodes=2" in submitted["core-sim-c2r1"]
    with ResultStore(database, create=False) as store:
        assert sorted(result.config.nodes for result in store.results(sweep="sim")) == [1, 2]
    planned_for_slurm = core.sweep.plan_sweep(core.sweep.load_sweep(sweep), executor="slurm")
    with pytest.raises(SweepError, match="cells 'nodes=2' were planned as Slurm jobs of several nodes"):
        run_sweep(planned_for_slurm, database=tmp_path / "other.db", executor="local")


# --- sbatch's options: none of core's own, in any spelling; logs inside the jobs directory ---------


@pytest.mark.parametrize(
    ("option", "named"),
    [
        ("--output=/tmp/x", "--output"),
        ("--outp=/tmp/x", "--outp abbreviates --output"),
        ("--ou=../x", "--ou abbreviates --output"),
        ("--output", "--output"),
        ("--err=/tmp/x", "--err abbreviates --error"),
        ("--chd=/", "--chd abbreviates --chdir"),
        ("--job=x", "--job abbreviates --job-name"),
        ("--arr=1-3", "--arr abbreviates --array"),
        ("--wra=true", "--wra abbreviates --wrap"),
        ("--par", "--par abbreviates --parsable, --partition"),
        ("--nodes=2", "--nodes"),
        ("--ntasks=4", "--ntasks"),
        ("--time=5", "time_limit_minutes"),
        ("--partition=gpu", "--slurm-partition"),
        ("--mem=1G", "memory_megabytes"),
        ("--exclusive=user", "exclusive"),
        ("--wait", "sbatch must return at once"),
        ("--test-only", "nothing would be submitted"),
        ("--clu=other", "--clu abbreviates --clusters"),
        ("--hold", "the sweep would wait for it forever"),
        ("--ho", "--ho abbreviates --hold"),
        ("--begin=now+1hour", "start the sweep itself later instead"),
        ("--beg=16:00", "--beg abbreviates --begin"),
        ("-H", "short for --hold"),
        ("-bnow+60", "short for --begin"),
        # sbatch prints these, exits 0 and submits nothing: no id, which was taken for a fault
        ("--help", "sbatch would print its help and submit nothing"),
        ("--hel", "--hel abbreviates --help"),
        ("--usage", "sbatch would print its usage"),
        ("--version", "sbatch would print its version"),
        ("--vers", "--vers abbreviates --version"),
        ("-h", "short for --help"),
        ("-V", "short for --version"),
        ("-o", "'-o' is sbatch's -o, short for --output"),
        ("-o/tmp/x", "short for --output"),
        ("-e", "short for --error"),
        ("-D", "short for --chdir"),
        ("-J", "short for --job-name"),
        ("-N2", "short for --nodes"),
        ("-q", "one sbatch long option with its value after '='"),
        ("--", "one sbatch long option"),
        ("--qos high", "one sbatch long option"),
    ],
)
def test_sbatch_options_core_sets_are_refused_in_every_spelling(
    tmp_path: Path, option: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValidationError, match=re.escape(named)):
        SlurmSettings(extra_options=["--qos=high", option])
    sweep = _simulated_sweep(tmp_path, cells=1, repeats=1)
    assert main(["sweep", str(sweep), "--executor", "slurm", f"--slurm-option={option}", "--dry-run"]) == 2
    # named by the flag the user typed, not as a field of the file, which holds no such option
    said = capsys.readouterr().err
    assert re.search(r"core: error: invalid slurm\.extra_options(\.0)? \(--slurm-option\) = ", said), said
    assert str(sweep) not in said


@pytest.mark.parametrize(
    "option",
    [
        "--qos=high",
        "--gpus=2",
        "--constraint=a100",
        "--mem-per-cpu=100",
        "--time-min=5",
        "--gres=gpu:1",
        "--verbose",
        "--hint=nomultithread",
        "--use-min-nodes",
        "--uid=1000",
    ],
)
def test_other_sbatch_options_pass(option: str) -> None:
    assert SlurmSettings(extra_options=[option]).sbatch_options(nodes=1, timeout_seconds=60)[-1] == option


def test_every_log_of_a_job_stays_in_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # sbatch expands %-patterns anywhere in --output's path: a jobs directory with a % of its own
    # must not send the log elsewhere, and SBATCH_ERROR in the environment must not split it off.
    calls: list[tuple[list[str], dict[str, str]]] = []

    def sbatch(command: list[str], environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        calls.append((command, environment or {}))
        return subprocess.CompletedProcess(command, 0, stdout="42;cluster\n", stderr="")

    monkeypatch.setattr(core.sweep.slurm_jobs, "_run_to_its_end", sbatch)
    monkeypatch.setenv("SBATCH_ERROR", "/tmp/elsewhere.err")
    folder = tmp_path / "100%j-%u" / "cell1-repeat1"
    log = log_path_pattern(folder, "slurm-%j.out")

    assert core.sweep.slurm_jobs.submit(folder / "job.sh", [], job_name="x", log=log, directory=folder) == "42"

    ((command, environment),) = calls
    assert f"--output={tmp_path}/100%%j-%%u/cell1-repeat1/slurm-%j.out" in command
    assert f"--error={tmp_path}/100%%j-%%u/cell1-repeat1/slurm-%j.out" in command
    assert "SBATCH_ERROR" not in environment and environment["PATH"] == os.environ["PATH"]


def test_a_sweep_with_jobs_in_flight_does_not_resume_on_this_machine(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Resumed with the local executor, its repeats would run here beside their own Slurm jobs.
    import core.sweep.run

    simulated_slurm.on_poll = lambda slurm, number: (_ for _ in ()).throw(KeyboardInterrupt)
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=2), tmp_path / "results.db"
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 130
    monkeypatch.setattr(core.sweep.run, "run_in_process", lambda *args, **kwargs: pytest.fail("ran locally"))

    assert main(["sweep", str(sweep), "--database", str(database), "--resume"]) == 2

    ledger = tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME
    assert f"sweep 'sim' has 2 Slurm job(s) in flight (listed in {ledger}); resume it with --executor slurm" in (
        capsys.readouterr().err
    )


def test_a_jobs_directory_that_cannot_be_made_leaves_no_sweep(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Past the checks (as /proc would be for root), the folder still cannot be made.
    real_mkdir = Path.mkdir

    def refuse(path: Path, *args: Any, **kwargs: Any) -> None:
        if path.name == "sim":
            raise PermissionError(13, "Permission denied", str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=1), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 2

    assert "cannot make its folder" in capsys.readouterr().err
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == []
    assert simulated_slurm.jobs == {} and not (tmp_path / "results.db.jobs").exists()


def test_a_job_sacct_does_not_list_yet_is_asked_of_squeue(monkeypatch: pytest.MonkeyPatch) -> None:
    # slurmdbd writes a job's record late on a busy cluster: until then only squeue knows it, and
    # a job taken for forgotten would be recorded as lost while it waits in the queue.
    asked: list[str] = []

    def slurm(command: list[str], environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        asked.append(command[0])
        listed = "7|COMPLETED\n" if command[0] == "sacct" else "8|PENDING\n"
        return subprocess.CompletedProcess(command, 0, stdout=listed, stderr="")

    monkeypatch.setattr(core.sweep.slurm_jobs, "_run", slurm)
    monkeypatch.setattr(core.sweep.slurm_jobs.shutil, "which", lambda name: f"/usr/bin/{name}")

    assert core.sweep.slurm_jobs.JobStates().query(["7", "8"]) == {"7": "COMPLETED", "8": "PENDING"}
    assert asked == ["sacct", "squeue"]


def test_a_jobs_directory_too_full_for_the_ledger_leaves_no_sweep(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The check's probe passed, but the disk filled before the ledger was written: a fault, and no
    # record of the sweep left behind (a second try was told "already has 0 run(s); pass --resume").
    def full(path: Path, text: str, what: str) -> None:
        raise OutputError(f"cannot write {what} {path}: no space left on the device (ENOSPC)")

    monkeypatch.setattr(core.sweep.cluster, "write_atomically", full)
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=1), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 1

    said = capsys.readouterr().err
    assert "sweep sim not submitted: cannot write the sweep's job ledger" in said and "ENOSPC" in said, said
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == []
    assert simulated_slurm.jobs == {} and not (tmp_path / "results.db.jobs").exists()


def test_the_jobs_directory_check_writes_as_a_job_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty file takes no block of a full disk: the probe writes some bytes, so a full jobs
    # directory is refused before the sweep is recorded.
    written: list[int] = []
    real_write = Path.write_bytes

    def write_bytes(path: Path, data: bytes) -> int:
        written.append(len(data))
        if path.name == "probe" and data:
            raise OSError(28, "No space left on device", str(path))
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    with pytest.raises(SweepError, match="cannot write a file in .*no space left"):
        core.sweep.cluster.check_jobs_directory(tmp_path / "results.db", SlurmSettings())
    assert written and written[0] >= 4096
    assert list(tmp_path.iterdir()) == []  # the probe's folder went


def test_a_running_job_one_answer_leaves_out_is_not_taken_for_lost(
    tmp_path: Path, simulated_slurm: SimulatedSlurm
) -> None:
    # One poll's answer without the job (a controller restarting, a garbled listing) while it runs:
    # taken for lost, it was recorded as an error and its folder removed under the running job.
    def poll(slurm: SimulatedSlurm, number: int) -> None:
        job = slurm.job(1, 1)
        if number in (1, 2, 4):
            slurm.jobs[job]["state"] = "RUNNING"
        elif number == 3:
            slurm.jobs[job]["state"] = None
        else:
            slurm.end(job, "COMPLETED", result="ok", exit_code=0)

    simulated_slurm.on_poll = poll
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=1), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    (result,) = _recorded(database).values()
    assert result.status.state is RunState.ok and simulated_slurm.polls == 5


def test_sbatch_is_heard_out_when_the_sweep_is_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C while sbatch answers: killed half-way, sbatch left a job slurmctld made after the sweep
    # had looked for it (squeue), running unlisted, its folder removed. sbatch now runs to its end,
    # in a session of its own (a terminal's Ctrl-C reaches only the sweep), then the sweep stops.
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    sbatch = bin_folder / "sbatch"
    sbatch.write_text(
        "#!/bin/sh\n"
        f'[ "$(ps -o sid= -p $$)" != "$(ps -o sid= -p $PPID)" ] && touch {tmp_path}/own-session\n'
        "kill -INT $PPID\n"  # the sweep is interrupted while this sbatch is submitting
        "sleep 2\n"  # past the 0.25 s subprocess gives a child before killing it
        f"touch {tmp_path}/submitted\n"
        "echo 42\n"
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_folder}{os.pathsep}{os.environ['PATH']}")
    folder = tmp_path / "job"

    with pytest.raises(KeyboardInterrupt):
        core.sweep.slurm_jobs.submit(folder / "job.sh", [], job_name="x", log=f"{folder}/out", directory=folder)

    assert (tmp_path / "submitted").exists() and (tmp_path / "own-session").exists()


def test_a_lost_answer_never_adopts_an_earlier_job_of_the_same_name(
    tmp_path: Path, simulated_slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    # A sweep of this name ran before and its jobs directory was removed: squeue still lists its
    # jobs (MinJobAge), same name, and the same folder where each repeat had one fixed folder. Ctrl-C
    # before sbatch had the new job then took the earlier job for it, and left the repeat unrun.
    sweep, database = _simulated_sweep(tmp_path, cells=1, repeats=1), tmp_path / "results.db"
    simulated_slurm.on_poll = lambda slurm, number: slurm.end(slurm.job(1, 1), "COMPLETED", result="ok", exit_code=0)
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0
    database.unlink()
    shutil.rmtree(tmp_path / "results.db.jobs")

    def ctrl_c_before_slurm(slurm: SimulatedSlurm, number: int) -> None:
        raise KeyboardInterrupt

    simulated_slurm.on_submit = ctrl_c_before_slurm
    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) in (130, 143)

    assert "stay in Slurm" not in capsys.readouterr().err  # the earlier job is not this sweep's
    assert _ledger_jobs(tmp_path) == []


def test_a_stop_while_sbatch_starts_waits_for_its_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C as sbatch is being started: raised inside Popen (or before the wait), it left an sbatch
    # running that the sweep knew nothing of, whose job slurmctld made after the sweep had looked.
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(f"#!/bin/sh\nsleep 1\ntouch {tmp_path}/submitted\necho 42\n")
    sbatch.chmod(0o755)
    real_popen = subprocess.Popen

    def interrupted_popen(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C lands here, before sbatch is started
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(core.sweep.slurm_jobs.subprocess, "Popen", interrupted_popen)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    folder = tmp_path / "job"

    with pytest.raises(KeyboardInterrupt):
        core.sweep.slurm_jobs.submit(folder / "job.sh", [], job_name="x", log=f"{folder}/out", directory=folder)

    assert (tmp_path / "submitted").exists()  # sbatch ran and was heard out before the sweep stopped


@pytest.mark.parametrize("command", ["sacct", "squeue"])
def test_a_garbled_state_is_not_taken_for_an_ended_job(monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    # An empty or garbled state was a final one: the running job was recorded as ended without a
    # result and its folder removed under it. It is now as a job the answer left out (see
    # test_a_running_job_one_answer_leaves_out_is_not_taken_for_lost).
    def slurm(asked: list[str], environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        if asked[0] == "sacct" and command == "squeue":
            return subprocess.CompletedProcess(asked, 1, stdout="", stderr="Slurm accounting storage is disabled")
        listed = "7|\n8|running\n9|R\xfcN\n10|CANCELLED by 0\n11|COMPLETED\n12|RUNNING\n"
        return subprocess.CompletedProcess(asked, 0, stdout=listed, stderr="")

    monkeypatch.setattr(core.sweep.slurm_jobs, "_run", slurm)
    monkeypatch.setattr(core.sweep.slurm_jobs.shutil, "which", lambda name: f"/usr/bin/{name}")

    assert core.sweep.slurm_jobs.JobStates().query(["7", "8", "9", "10", "11", "12"]) == {
        "7": None,
        "8": None,
        "9": None,
        "10": "CANCELLED",
        "11": "COMPLETED",
        "12": "RUNNING",
    }
