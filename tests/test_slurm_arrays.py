"""Job arrays of a cluster sweep (core/sweep/slurm_arrays.py) and the job logs kept after it
(core/sweep/slurm_logs.py): with the simulated Slurm of tests/slurm_support.py, Slurm's answers
faked where they are parsed, and the array's script run by bash. tests/test_slurm_sweep.py runs
the backend's other guarantees with arrays on and off."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from slurm_support import SimulatedSlurm, simulated_sweep_file
from test_slurm_sweep import _rows, _sweep_file, needs_slurm

import core.sweep.cluster
import core.sweep.slurm_jobs
from core.cli import main
from core.storage.store import ResultStore
from core.sweep.cluster import LEDGER_NAME
from core.sweep.slurm_arrays import (
    DEFAULT_MAX_ARRAY_SIZE,
    abridged,
    array_option,
    arrays_refused,
    expand_job_ids,
    in_arrays,
    read_max_array_size,
    write_array_folder,
)
from core.sweep.slurm_jobs import JobStates, find, pending_reasons
from core.sweep.slurm_logs import LOGS_FOLDER, SECONDS_PER_DAY, keep_log, prune_logs
from core.sweep.slurm_settings import SlurmSettings

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


_sweep = simulated_sweep_file


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> SimulatedSlurm:
    simulated = SimulatedSlurm(max_array_size=4)
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: simulated)
    return simulated


def _recorded(database: Path) -> dict[tuple[int, int], Any]:
    """(cell, repeat), both 1-based -> the result; fails on a repeat recorded twice."""
    with ResultStore(database, create=False) as store:
        runs = store.runs(sweep="sim")
    keys = [(run.result.config.steps - 1, (run.repeat or 0) + 1) for run in runs]
    assert len(keys) == len(set(keys)), f"a repeat recorded twice: {keys}"
    return {key: run.result for key, run in zip(keys, runs)}


def _end_pending(slurm: SimulatedSlurm, poll: int) -> None:
    for job_id, job in list(slurm.jobs.items()):
        if job["state"] == "PENDING":
            slurm.end(job_id, "COMPLETED", result="ok", exit_code=0)


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = json.loads((tmp_path / "results.db.jobs" / "sim" / LEDGER_NAME).read_text())["jobs"]
    return jobs


# --- Slurm's spellings ---------------------------------------------------------------------------


def test_squeue_and_sacct_ids_of_array_tasks_are_expanded() -> None:
    assert expand_job_ids("123") == ["123"]
    assert expand_job_ids(" 123_4 ") == ["123_4"]
    assert expand_job_ids("123_[0-2,7%4]") == ["123_0", "123_1", "123_2", "123_7"]
    assert expand_job_ids("123_[5]") == ["123_5"]
    for other in ("123.batch", "123_4.extern", "", "abc", "123_[1-]", "123_[-3]"):
        assert expand_job_ids(other) == [], other


def _answer(stdout: str, returncode: int = 0, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], returncode, stdout, stderr)


def test_the_state_of_each_task_is_read_from_squeue_started_or_pending(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def run(command: list[str], environment: Any = None) -> subprocess.CompletedProcess[str]:
        asked.append(command)
        return _answer("7_0|RUNNING\n7_[1-3%2]|PENDING\n8|COMPLETED\n")

    monkeypatch.setattr(core.sweep.slurm_jobs, "_run", run)
    monkeypatch.setattr(core.sweep.slurm_jobs.shutil, "which", lambda name: None)  # no sacct: squeue answers
    states = JobStates().query(["7_0", "7_2", "7_3", "7_9", "8"])
    assert states == {"7_0": "RUNNING", "7_2": "PENDING", "7_3": "PENDING", "7_9": None, "8": "COMPLETED"}
    assert asked[0][-1] == "--jobs=7_0,7_2,7_3,7_9,8"


def test_the_state_of_each_task_is_read_from_sacct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core.sweep.slurm_jobs.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        core.sweep.slurm_jobs, "_run", lambda command, environment=None: _answer("7_0|COMPLETED\n7_[1-2]|PENDING\n")
    )
    assert JobStates().query(["7_0", "7_1", "7_2"]) == {"7_0": "COMPLETED", "7_1": "PENDING", "7_2": "PENDING"}


def test_the_pending_reason_of_array_tasks_is_each_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        core.sweep.slurm_jobs,
        "_run",
        lambda command, environment=None: _answer("7_[1-3%2]|JobArrayTaskLimit|debug|1\n9|Priority|debug|1\n"),
    )
    assert pending_reasons(["7_1", "7_3", "9"]) == {
        "7_1": "JobArrayTaskLimit",
        "7_3": "JobArrayTaskLimit",
        "9": "Priority",
    }


def test_an_arrays_lost_answer_is_found_by_its_array_id(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # squeue %F: an array's id on each of its tasks' lines, once in the answer.
    listed = f"7|core-sim-a1|{tmp_path}\n7|core-sim-a1|{tmp_path}\n8|core-sim-a1|/elsewhere\n"
    asked: list[list[str]] = []
    monkeypatch.setattr(
        core.sweep.slurm_jobs, "_run", lambda command, environment=None: asked.append(command) or _answer(listed)
    )
    assert find("core-sim-a1", tmp_path) == ["7"]
    assert "--format=%F|%j|%Z" in asked[0]


def test_a_stopped_sweep_names_each_arrays_tasks_together() -> None:
    described = ["9", "123_0", "123_1", "123_2", "123_7", "124_3", "core-sim-a1 (sbatch gave no id)"] * 2
    assert abridged(described) == ["9", "123_[0-2,7]", "124_3", "core-sim-a1 (sbatch gave no id)"]


def test_max_array_size_is_read_from_scontrol_else_a_safe_default() -> None:
    config = "Configuration data as of 2026-11-27\nMaxArraySize            = 1001\nMaxJobCount = 10000\n"
    assert read_max_array_size(lambda command: _answer(config)) == 1001
    assert read_max_array_size(lambda command: _answer("MaxArraySize = 0\n")) == 0
    assert read_max_array_size(lambda command: _answer("", 1, "slurm_load_ctl_conf error")) == DEFAULT_MAX_ARRAY_SIZE
    assert read_max_array_size(lambda command: _answer("nothing of it\n")) == DEFAULT_MAX_ARRAY_SIZE

    def missing(command: list[str]) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("scontrol")

    assert read_max_array_size(missing) == DEFAULT_MAX_ARRAY_SIZE


def test_repeats_are_grouped_by_their_job_and_chunked_by_max_array_size() -> None:
    items = [("a", n) for n in range(2500)] + [("b", n) for n in range(3)]
    arrays = in_arrays(items, lambda item: item[0], 1000)
    assert [len(array) for array in arrays] == [1000, 1000, 500, 3]
    assert arrays[3] == [("b", 0), ("b", 1), ("b", 2)] and arrays[1][0] == ("a", 1000)
    assert array_option(5, None) == "--array=0-4" and array_option(5, 2) == "--array=0-4%2"
    assert arrays_refused("sbatch: error: Batch job submission failed: Invalid job array specification")
    assert not arrays_refused("sbatch: error: invalid partition specified: nope")


def test_each_task_of_the_array_script_runs_its_repeat_in_its_folder(tmp_path: Path) -> None:
    sweep = tmp_path / "jobs dir 'quoted'" / "sim"
    folders = [sweep / f"cell1-repeat{n}-abc" for n in (1, 2)]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "job.sh").write_text('echo "ran in $(pwd)"; echo oops >&2; exit 3\n')
    (sweep / "array-abc").mkdir()
    script = write_array_folder(sweep / "array-abc", folders)

    environment = {**os.environ, "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "1"}
    ran = subprocess.run(["bash", str(script)], env=environment, capture_output=True, text=True, check=False)

    assert ran.returncode == 3 and ran.stdout == ""
    assert (folders[1] / "slurm-77_1.out").read_text() == f"ran in {folders[1]}\noops\n"
    assert not (folders[0] / "slurm-77_1.out").exists()
    missing = subprocess.run(
        ["bash", str(script)], env={**environment, "SLURM_ARRAY_TASK_ID": "2"}, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "task 2 is not in the array's index" in missing.stderr


# --- a sweep submitted as arrays -----------------------------------------------------------------


def test_a_sweep_is_submitted_as_throttled_arrays_and_each_task_recorded_once(
    tmp_path: Path, slurm: SimulatedSlurm
) -> None:
    slurm.on_poll = _end_pending
    sweep, database = _sweep(tmp_path, cells=5, repeats=2, slurm_table="array_throttle = 2"), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    # 10 repeats, MaxArraySize 4: three sbatch calls of 4, 4 and 2 tasks, at most 2 of each at once.
    arrays = [next(option for option in call["options"] if option.startswith("--array=")) for call in slurm.submissions]
    assert arrays == ["--array=0-3%2", "--array=0-3%2", "--array=0-1%2"]
    recorded = _recorded(database)
    assert len(recorded) == 10 and all(result.status.ok for result in recorded.values())
    assert recorded[(1, 1)].setup_seconds == float("100_0")  # each task's own figures (100_0: 1000.0)
    assert _ledger(tmp_path) == []
    assert [path.name for path in (tmp_path / "results.db.jobs" / "sim").iterdir()] == [LEDGER_NAME]


def test_arrays_turned_off_are_a_job_per_repeat(tmp_path: Path, slurm: SimulatedSlurm) -> None:
    slurm.on_poll = _end_pending
    sweep, database = _sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main([*command, "--slurm-job-arrays", "no"]) == 0

    assert len(slurm.submissions) == 4 and not any("--array" in str(call["options"]) for call in slurm.submissions)
    assert len(_recorded(database)) == 4


def test_a_cluster_refusing_arrays_gets_single_jobs(
    tmp_path: Path, slurm: SimulatedSlurm, caplog: pytest.LogCaptureFixture
) -> None:
    slurm.refuse_arrays = True
    slurm.on_poll = _end_pending
    sweep, database = _sweep(tmp_path, cells=3, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    # The first array was refused (and left nothing), then every repeat went alone: 6 jobs.
    assert len(slurm.submissions) == 6 and len(slurm.jobs) == 6 and all("_" not in job_id for job_id in slurm.jobs)
    assert "Invalid job array specification; submitting each repeat as a job of its own" in caplog.text
    assert len(_recorded(database)) == 6 and _ledger(tmp_path) == []


def test_a_refused_array_for_another_reason_leaves_no_half_made_sweep(
    tmp_path: Path, slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm.refuse_submission = 2
    sweep, database = _sweep(tmp_path, cells=3, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 2

    error = capsys.readouterr().err
    assert "sweep sim not submitted: a job array of 2 repeats, the first repeat " in error
    assert "the 4 job(s) submitted before it were cancelled" in error
    assert slurm.cancelled == ["100_0", "100_1", "100_2", "100_3"]
    assert not (tmp_path / "results.db.jobs").exists()


def test_a_resume_adopts_an_array_whose_tasks_are_partly_done(tmp_path: Path, slurm: SimulatedSlurm) -> None:
    # Poll 1: two tasks end and are recorded; poll 2: the submitter is stopped (as by a kill, the
    # jobs stay). The resume records the others as they end, submits nothing, records none twice.
    def poll(simulated: SimulatedSlurm, number: int) -> None:
        if number == 1:
            simulated.end(simulated.job(1, 1), "COMPLETED", result="ok", exit_code=0)
            simulated.end(simulated.job(2, 1), "COMPLETED", result="ok", exit_code=0)
        elif number == 2:
            raise KeyboardInterrupt

    slurm.on_poll = poll
    sweep, database = _sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main(command) == 130

    assert len(_recorded(database)) == 2
    assert sorted(job["job_id"] for job in _ledger(tmp_path)) == sorted([slurm.job(1, 2), slurm.job(2, 2)])
    slurm.on_poll = _end_pending
    assert main([*command, "--resume"]) == 0

    recorded = _recorded(database)
    assert len(recorded) == 4 and len(slurm.submissions) == 1
    assert all(result.status.ok for result in recorded.values())
    assert recorded[(2, 2)].setup_seconds == float(slurm.job(2, 2))  # the task's own figures
    assert _ledger(tmp_path) == [] and not list((tmp_path / "results.db.jobs" / "sim").glob("array-*"))


@pytest.mark.parametrize("squeue_answers", [True, False])
def test_an_array_whose_sbatch_answer_was_lost_is_listed_and_waited_for(
    tmp_path: Path, slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str], squeue_answers: bool
) -> None:
    slurm.lose_answer = {1: KeyboardInterrupt()}
    slurm.find_fails = not squeue_answers
    sweep, database = _sweep(tmp_path, cells=1, repeats=3), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main(command) == 130

    ids = [job["job_id"] for job in _ledger(tmp_path)]
    assert ids == (["100_0", "100_1", "100_2"] if squeue_answers else [None, None, None])
    listed = "100_[0-2]" if squeue_answers else "core-sim-a"
    assert f"3 job(s) of sweep sim stay in Slurm ({listed}" in capsys.readouterr().err and slurm.cancelled == []
    slurm.lose_answer, slurm.find_fails = {}, False
    slurm.on_poll = _end_pending
    assert main([*command, "--resume"]) == 0

    assert len(_recorded(database)) == 3 and len(slurm.submissions) == 1  # none submitted twice
    assert _recorded(database)[(1, 3)].setup_seconds == float("100_2")


def test_a_task_slurm_forgets_is_lost_after_two_polls_the_others_recorded(
    tmp_path: Path, slurm: SimulatedSlurm
) -> None:
    answers: list[int] = []

    def poll(simulated: SimulatedSlurm, number: int) -> None:
        answers.append(number)
        simulated.jobs["100_0"]["state"] = None  # squeue forgot it, and it wrote no end
        if number == 1:
            simulated.end("100_1", "COMPLETED", result="ok", exit_code=0)

    slurm.on_poll = poll
    sweep, database = _sweep(tmp_path, cells=1, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    recorded = _recorded(database)
    assert recorded[(1, 2)].status.ok
    assert "Slurm no longer knows it" in (recorded[(1, 1)].status.message or "")
    assert answers == [1, 2, 3]


# --- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"array_throttle": 0}, "array_throttle"),
        ({"array_throttle": "4"}, "array_throttle"),
        ({"log_retention_days": -1}, "log_retention_days"),
        ({"job_arrays": "yes"}, "job_arrays"),
    ],
)
def test_bad_array_and_log_settings_are_refused_naming_the_field(table: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        SlurmSettings(**table)
    assert refused.value.errors()[0]["loc"] == (field,)


def test_a_bad_throttle_flag_is_refused_before_anything_is_submitted(
    tmp_path: Path, slurm: SimulatedSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep, database = _sweep(tmp_path, cells=1, repeats=2), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]

    assert main([*command, "--slurm-array-throttle", "0"]) == 2

    assert "--slurm-array-throttle" in capsys.readouterr().err and slurm.submissions == []
    with pytest.raises(SystemExit):
        main([*command, "--slurm-job-arrays", "maybe"])


# --- the job logs kept ---------------------------------------------------------------------------


def test_a_recorded_jobs_log_is_kept_beside_the_database(tmp_path: Path, slurm: SimulatedSlurm) -> None:
    slurm.on_poll = _end_pending
    sweep, database = _sweep(tmp_path, cells=1, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    logs = tmp_path / "results.db.jobs" / LOGS_FOLDER / "sim"
    kept = sorted(path.name for path in logs.iterdir())
    assert [name.split("-cell")[0] for name in kept] == ["slurm-100_0", "slurm-100_1"]
    assert (logs / kept[0]).read_text() == "job 100_0's output\n"


def test_no_log_is_kept_where_retention_is_zero(tmp_path: Path, slurm: SimulatedSlurm) -> None:
    slurm.on_poll = _end_pending
    sweep, database = (
        _sweep(tmp_path, cells=1, repeats=2, slurm_table="log_retention_days = 0"),
        tmp_path / "results.db",
    )

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    assert not (tmp_path / "results.db.jobs" / LOGS_FOLDER).exists()


def test_old_logs_are_pruned_by_age_but_never_a_job_still_in_the_ledger(tmp_path: Path) -> None:
    now = 1_000_000_000.0
    folders = {job_id: tmp_path / f"cell1-repeat{n}-abc" for n, job_id in enumerate(["7_0", "7_1", "8", "9"])}
    logs = tmp_path / "logs"
    kept = {}
    for job_id, folder in folders.items():
        folder.mkdir()
        (folder / f"slurm-{job_id}.out").write_text(job_id)
        kept[job_id] = keep_log(folder, job_id, logs)
    assert all(path is not None and path.parent == logs for path in kept.values())
    assert keep_log(folders["8"], "8", logs) is None  # moved already
    ages_days = {"7_0": 20, "7_1": 13, "8": 15, "9": 30}
    for job_id, path in kept.items():
        assert path is not None
        os.utime(path, (now - ages_days[job_id] * SECONDS_PER_DAY,) * 2)
    (logs / "notes.txt").write_text("not a log core kept")
    os.utime(logs / "notes.txt", (0, 0))

    removed = prune_logs(logs, now=now, retention_days=14, in_flight={"9"})

    assert sorted(path.name.split("-cell")[0] for path in removed) == ["slurm-7_0", "slurm-8"]
    assert sorted(path.name.split("-cell")[0] for path in logs.iterdir()) == ["notes.txt", "slurm-7_1", "slurm-9"]
    assert prune_logs(tmp_path / "none", now=now, retention_days=14, in_flight=()) == []


def test_a_sweep_prunes_its_old_logs_by_the_schedulers_clock(tmp_path: Path, slurm: SimulatedSlurm) -> None:
    slurm.on_poll = _end_pending
    sweep, database = _sweep(tmp_path, cells=1, repeats=2), tmp_path / "results.db"
    command = ["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]
    assert main(command) == 0
    logs = tmp_path / "results.db.jobs" / LOGS_FOLDER / "sim"
    first, second = sorted(logs.iterdir())
    os.utime(first, (slurm.clock - 15 * SECONDS_PER_DAY,) * 2)
    os.utime(second, (slurm.clock - 13 * SECONDS_PER_DAY,) * 2)

    assert main([*command, "--resume"]) == 0

    assert list(logs.iterdir()) == [second]


def test_the_submit_benchmark_runs_against_counting_fakes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # benchmarks/slurm_submit.py's code path at a toy size (its figures mean nothing here).
    spec = importlib.util.spec_from_file_location("benchmark_slurm_submit", BENCHMARKS / "slurm_submit.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    figures_path = tmp_path / "figures.json"

    assert script.main(["--cells", "5", "--slurm", "fake", "--max-array-size", "3", "--json", str(figures_path)]) == 0

    figures = {each["mode"]: each for each in json.loads(figures_path.read_text())}
    assert figures["arrays"]["sbatch_calls"] == 2 and figures["single"]["sbatch_calls"] == 5
    assert figures["arrays"]["jobs_in_ledger"] == figures["single"]["jobs_in_ledger"] == 5


@pytest.mark.slow
@needs_slurm
def test_a_real_slurm_runs_a_throttled_array_and_records_each_task_once(tmp_path: Path) -> None:
    # Three cells in one array of three tasks, at most two at once: squeue lists the third as
    # pending with the others (ARRAYID_[2%2]) until it starts; each is recorded once, its log kept.
    name = f"arrays-{os.getpid()}"
    sweep = _sweep_file(tmp_path, name, steps="[2, 3, 4]", slurm="array_throttle = 2")
    database = tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    assert sorted(status for _, _, status in _rows(database, name)) == ["ok", "ok", "ok"]
    jobs = tmp_path / "results.db.jobs"
    assert [path.name for path in (jobs / name).iterdir()] == [LEDGER_NAME]
    kept = sorted(path.name for path in (jobs / LOGS_FOLDER / name).iterdir())
    assert len(kept) == 3 and len({name.split("_")[0] for name in kept}) == 1, kept  # one array's tasks


def test_the_ledger_is_written_once_for_every_job_a_poll_found_ended(
    tmp_path: Path, slurm: SimulatedSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large grid's ledger is megabytes: written per recorded job, 19,440 jobs would write it
    # 19,440 times. Each entry still goes after its repeat is recorded (a resume drops the others).
    writes: list[int] = []
    save = core.sweep.cluster.JobLedger.save

    def counted(ledger: core.sweep.cluster.JobLedger) -> None:
        writes.append(slurm.polls)
        save(ledger)

    monkeypatch.setattr(core.sweep.cluster.JobLedger, "save", counted)
    slurm.on_poll = _end_pending
    sweep, database = _sweep(tmp_path, cells=2, repeats=2), tmp_path / "results.db"

    assert main(["sweep", str(sweep), "--executor", "slurm", "--database", str(database)]) == 0

    assert len(_recorded(database)) == 4 and _ledger(tmp_path) == []
    assert writes.count(1) == 1  # after the poll that found the four ended: once, as the sweep ends
