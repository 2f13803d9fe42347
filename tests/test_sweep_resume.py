"""Resuming a sweep: the command printed after Ctrl-C, SIGTERM or a result the database refused is
complete (database, executor, every option that shapes the sweep) and, run word for word in a shell,
resumes the same sweep; ``--resume`` of a sweep the database has never seen says so."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from resume_command import printed_command, resume_words
from slurm_support import SimulatedSlurm

import core.cli
import core.sweep.cluster
import core.sweep.run
import core.sweep.slurm_jobs
from core.base.results import RunResult
from core.cli import build_parser, main, resume_command
from core.storage.store import ResultStore
from core.sweep import SweepError, run_sweep

SWEEP = """\
name = "from-file"
repeats = 3
timeout_seconds = 300

[grid]
workload = "fcnn"
accelerator = "cpu"
micro_batch_size = [4, 8]
steps = 2
warmup_steps = 1
workload_options = {{layers = 1, hidden_width = 8}}
{extra}
"""


def _sweep_file(folder: Path, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "the grid.toml"
    path.write_text(SWEEP.format(extra=extra), encoding="utf-8")
    return path


def _runs(database: Path, sweep: str) -> list[tuple[str, int]]:
    with ResultStore(database, create=False) as store:
        return sorted((run["cell_label"], run["repeat"]) for run in store.records(sweep=sweep))


class InterruptedRuns:
    """Stands in for run_in_process: made-up results; Ctrl-C during the run numbered ``interrupt_at``."""

    def __init__(self, interrupt_at: int | None) -> None:
        self.calls: list[tuple[str, float, Any]] = []
        self.interrupt_at = interrupt_at

    def __call__(
        self, cell: Any, *, timeout_seconds: float, work_dir: Path, on_wait: Any = None, workers: Any = None
    ) -> tuple[RunResult, float]:
        self.calls.append((cell.label, timeout_seconds, workers.requested))
        if len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        config = cell.config
        result = RunResult.of_config(config, world_size=1, window_seconds=1.0, throughput_per_second=100.0)
        return result, 0.5


# --- the command names every option that shapes the sweep ---------------------------------------


def _sweep_parser() -> Any:
    commands = next(action for action in build_parser()._actions if action.dest == "command")
    return commands.choices["sweep"]


def test_every_sweep_option_is_either_resumed_or_deliberately_left_out() -> None:
    # A new `core sweep` option must be classified: repeated by the resume command, or not needed.
    classified = {"help", "file", "database", "executor", "machine", "slurm_extra_options"}
    classified |= set(core.cli._RESUMED_FLAGS) | core.cli._NOT_RESUMED
    classified |= {f"slurm_{name}" for name, _, _ in core.cli._SLURM_FLAGS}
    assert {action.dest for action in _sweep_parser()._actions} <= classified


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_the_resume_command_parses_back_to_the_same_sweep(tmp_path: Path, executor: str) -> None:
    sweep = _sweep_file(tmp_path / "it's a $HOME; folder")
    given = [
        "sweep", str(sweep), "--toy", "--skip-invalid", "--retry-failed", "--name", "other name?",
        "--repeats", "2", "--timeout-seconds", "12.5", "--executor", executor,
        "--slurm-partition", "gpu", "--slurm-poll-seconds", "0.5", "--slurm-jobs-directory", "jobs",
        "--slurm-option=--qos=high", "--slurm-option=--comment=a;b",
    ]  # fmt: skip
    if executor == "local":  # a Slurm sweep refuses --workers (test_workers_with_a_slurm_sweep_is_refused)
        given += ["--workers", "fresh"]
    args = build_parser().parse_args(given)
    spec = core.sweep.load_sweep(sweep)
    database = Path("relative.db")

    words = resume_words(f"Continue with: {resume_command(args, database, spec)}")
    again = build_parser().parse_args(words)

    for dest in ("toy", "skip_invalid", "retry_failed", "name", "repeats", "timeout_seconds", "executor"):
        assert getattr(again, dest) == getattr(args, dest), dest
    # A Slurm sweep's jobs start no fork server: --workers says nothing there, and is left out.
    assert (again.workers, "--workers=fresh" in words) == (("fresh", True) if executor == "local" else (None, False))
    assert again.resume and not again.dry_run
    assert again.file == sweep and again.database == Path.cwd() / "relative.db"
    assert again.slurm_partition == "gpu" and again.slurm_poll_seconds == 0.5
    assert again.slurm_extra_options == ["--qos=high", "--comment=a;b"]
    assert again.slurm_jobs_directory == (str(Path.cwd() / "jobs") if executor == "slurm" else "jobs")


def test_the_program_is_the_core_that_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "bin" / "core"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(script), "sweep"])
    monkeypatch.setenv("PATH", str(script.parent))
    assert core.cli._core_program() == ["core"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert core.cli._core_program() == [str(script)]
    monkeypatch.setattr(sys, "argv", ["-c"])
    assert core.cli._core_program() == [sys.executable, "-m", "core.cli"]


# --- the printed command, run: it resumes the same sweep -----------------------------------------


def test_a_sweep_interrupted_resumes_with_the_printed_command_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The database comes from $CORE_DATABASE, the file by a relative path; the name, repeats, time
    # limit and worker start from flags. The resume runs elsewhere, without the variable.
    runs = InterruptedRuns(interrupt_at=3)
    monkeypatch.setattr(core.sweep.run, "run_in_process", runs)
    sweep = _sweep_file(tmp_path / "here")
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setenv("CORE_DATABASE", str(tmp_path / "env.db"))
    given = ["sweep", sweep.name, "--name", "renamed", "--repeats", "2", "--timeout-seconds", "77"]

    assert main([*given, "--workers", "fresh"]) == 130

    err = capsys.readouterr().err
    assert "core: sweep renamed interrupted" in err
    monkeypatch.delenv("CORE_DATABASE")
    monkeypatch.chdir(tmp_path)
    runs.interrupt_at = None
    assert main(resume_words(err)) == 0
    assert _runs(tmp_path / "env.db", "renamed") == [
        ("micro_batch_size=4", 0),
        ("micro_batch_size=4", 1),
        ("micro_batch_size=8", 0),
        ("micro_batch_size=8", 1),
    ]
    assert {(timeout, workers) for _, timeout, workers in runs.calls} == {(77.0, "fresh")}
    assert not (tmp_path / "results").exists()  # not the default database


def test_a_slurm_sweep_interrupted_resumes_waiting_for_the_same_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = SimulatedSlurm()
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)

    def interrupt(slurm: SimulatedSlurm, number: int) -> None:
        raise KeyboardInterrupt

    slurm.on_poll = interrupt
    sweep = _sweep_file(tmp_path / "here", extra="[slurm]\npoll_seconds = 1\njobs_directory = 'jobs'")
    monkeypatch.chdir(tmp_path / "here")
    given = ["sweep", sweep.name, "--executor", "slurm", "--repeats", "1", "--database", "r.db"]

    assert main([*given, "--slurm-option=--qos=high"]) == 130

    err = capsys.readouterr().err
    assert "2 job(s) of sweep from-file stay in Slurm" in err
    monkeypatch.chdir(tmp_path)
    slurm.on_poll = lambda slurm, number: [slurm.end(job, "COMPLETED", result="ok", exit_code=0) for job in slurm.jobs]
    assert main(resume_words(err)) == 0
    assert len(slurm.jobs) == 2  # none submitted again: the jobs in the same jobs directory were waited for
    assert all("--qos=high" in job["options"] for job in slurm.jobs.values())
    assert _runs(tmp_path / "here" / "r.db", "from-file") == [("micro_batch_size=4", 0), ("micro_batch_size=8", 0)]


def test_a_slurm_sweep_stopped_by_sigterm_says_so_exits_143_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # SIGTERM (a batch system's limit, kill) stops the sweep as Ctrl-C does, but its status is 143,
    # as `core run`'s is, not the 130 of an interrupt.
    slurm = SimulatedSlurm()
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)
    slurm.on_poll = lambda slurm, number: os.kill(os.getpid(), signal.SIGTERM)
    sweep = _sweep_file(tmp_path / "a folder", extra="[slurm]\npoll_seconds = 1")
    given = ["sweep", str(sweep), "--executor", "slurm", "--repeats", "1", "--database", str(tmp_path / "r.db")]

    assert main(given) == 143

    err = capsys.readouterr().err
    assert "core: sweep from-file stopped by SIGTERM; finished runs are in" in err, err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler the sweep found, back
    slurm.on_poll = lambda slurm, number: [slurm.end(job, "COMPLETED", result="ok", exit_code=0) for job in slurm.jobs]
    assert main(resume_words(err)) == 0
    assert len(slurm.jobs) == 2
    assert _runs(tmp_path / "r.db", "from-file") == [("micro_batch_size=4", 0), ("micro_batch_size=8", 0)]


def _words_bash_reads(command: str) -> list[str]:
    """The words bash makes of ``command``, as the paths and strings Python gives them."""
    read = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, check=True, timeout=60)
    return [os.fsdecode(word) for word in read.stdout.split(b"\0")[:-1]]


def test_a_resume_command_with_control_characters_in_a_path_reads_back_in_bash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # core prints ESC as the four characters \x1b (so the terminal shows it, not obeys it); inside
    # single quotes bash would read those four characters, naming another file. Such a word is
    # printed as $'...', which bash reads back to the very bytes of the path.
    slurm = SimulatedSlurm()
    monkeypatch.setattr(core.sweep.slurm_jobs, "unavailable_reason", lambda: None)
    monkeypatch.setattr(core.sweep.cluster, "make_scheduler", lambda: slurm)
    slurm.on_poll = lambda slurm, number: (_ for _ in ()).throw(KeyboardInterrupt)
    folder = tmp_path / os.fsdecode(b"esc \x1b[31m red, tab\t, new\nline, \xff byte, it's $HOME")
    sweep = _sweep_file(folder, extra="[slurm]\npoll_seconds = 1")
    given = ["sweep", str(sweep), "--executor", "slurm", "--repeats", "1", "--database", str(folder / "r.db")]

    assert main(given) == 130

    printed = printed_command(capsys.readouterr().err)
    words = _words_bash_reads(printed)
    assert words[words.index("sweep") + 1] == str(sweep)
    assert words[words.index("--database") + 1] == str(folder / "r.db")
    # The default jobs directory is found from the database; repeated, it would be refused as a
    # --slurm-jobs-directory with control characters.
    assert not any(word.startswith("--slurm-jobs-directory") for word in words)
    slurm.on_poll = lambda slurm, number: [slurm.end(job, "COMPLETED", result="ok", exit_code=0) for job in slurm.jobs]
    assert main(words[words.index("sweep") :]) == 0
    assert len(slurm.jobs) == 2  # the same jobs, waited for: the same sweep, database and jobs directory
    assert _runs(folder / "r.db", "from-file") == [("micro_batch_size=4", 0), ("micro_batch_size=8", 0)]


@pytest.mark.parametrize("stopped_in", ["lock", "save_sweep", "check"])
def test_a_sweep_interrupted_before_it_was_recorded_prints_the_command_that_starts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stopped_in: str
) -> None:
    # Ctrl-C (or SIGTERM) lands after the database was made but before the sweep's record is
    # written: there is nothing to resume (--resume would say so). The command printed starts the
    # sweep, and run word for word, it does.
    runs = InterruptedRuns(interrupt_at=None)
    monkeypatch.setattr(core.sweep.run, "run_in_process", runs)
    sweep, database = _sweep_file(tmp_path), tmp_path / "r.db"

    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        if stopped_in == "check":
            patched.setattr(core.sweep.run, "_check_database", interrupt)
        else:
            patched.setattr(ResultStore, stopped_in, interrupt)
        given = ["sweep", str(sweep), "--database", str(database), "--repeats", "1", "--workers", "fresh"]
        assert main(given) == 130

    err = capsys.readouterr().err
    assert f"sweep from-file interrupted before it was recorded in {database}; start it with: " in err
    assert "Continue with" not in err
    words = resume_words(err, prefix="start it with: ")
    assert "--resume" not in words and words[words.index("--database") + 1] == str(database)
    assert main(words) == 0
    assert _runs(database, "from-file") == [("micro_batch_size=4", 0), ("micro_batch_size=8", 0)]


@pytest.mark.slow
def test_the_command_printed_after_sigterm_run_in_a_shell_resumes_the_sweep(tmp_path: Path) -> None:
    folder = tmp_path / "it's $HOME"
    sweep = _sweep_file(folder)
    # Runs of a few seconds: the SIGTERM, sent once the first run is recorded, must find the second
    # one going (a forked run of two steps takes a tenth of a second, less than this test's poll
    # and the signal's way: the second run could end first, and nothing would be left to resume).
    sweep.write_text(sweep.read_text(encoding="utf-8").replace("\nsteps = 2\n", "\nsteps = 5000\n"), encoding="utf-8")
    assert "steps = 5000" in sweep.read_text(encoding="utf-8")
    environment = {**os.environ, "CORE_DATABASE": str(folder / "env.db")}
    command = [sys.executable, "-m", "core.cli", "sweep", sweep.name, "--name", "real", "--repeats", "1"]
    started = subprocess.Popen(command, cwd=folder, env=environment, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and started.poll() is None and not _recorded(folder / "env.db"):
            time.sleep(0.1)
        started.send_signal(signal.SIGTERM)
        _, err = started.communicate(timeout=120)
    finally:
        if started.poll() is None:
            started.kill()
    assert started.returncode == 143, err  # 128 + SIGTERM, as a shell reports it
    assert "core: sweep real stopped by SIGTERM; finished runs are in" in err
    environment.pop("CORE_DATABASE")

    resumed = subprocess.run(
        ["bash", "-c", printed_command(err)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )

    assert resumed.returncode == 0, resumed.stderr
    assert "resuming sweep real: 1 of 2 runs already recorded" in resumed.stdout
    assert _runs(folder / "env.db", "real") == [("micro_batch_size=4", 0), ("micro_batch_size=8", 0)]


def _recorded(database: Path) -> int:
    try:
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            return int(connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        finally:
            connection.close()
    except sqlite3.Error:
        return 0


def test_a_resumes_summary_says_which_rows_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A result a newer core wrote is left out of the cells' summaries, as core results and core
    # report leave it out: with a warning naming it, never silently.
    monkeypatch.setattr(core.sweep.run, "run_in_process", InterruptedRuns(interrupt_at=None))
    sweep, database = _sweep_file(tmp_path), tmp_path / "r.db"
    assert main(["sweep", str(sweep), "--database", str(database), "--repeats", "1"]) == 0
    with sqlite3.connect(database) as connection:
        connection.execute(
            "UPDATE runs SET result_json = json_set(result_json, '$.schema_version', '9.0') WHERE id = 2"
        )

    resumed = subprocess.run(
        [sys.executable, "-m", "core.cli", "sweep", str(sweep), "--database", str(database), "--repeats", "1"]
        + ["--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert resumed.returncode == 0, resumed.stderr
    assert f"core: warning: skipped run 2 of sweep 'from-file' in {database}: written by a newer core" in (
        resumed.stderr
    )
    assert "0 runs now, 2 before" in resumed.stdout
    outcome = run_sweep(sweep, database=database, resume=True, repeats=1)
    assert [row.split(":")[0] for row in outcome.skipped_rows] == [f"skipped run 2 of sweep 'from-file' in {database}"]


@pytest.mark.parametrize("resume", [True, False])
def test_a_sweep_whose_record_cannot_be_read_is_refused_and_its_record_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], resume: bool
) -> None:
    # A record that cannot be parsed (a newer core's, a damaged one) used to be overwritten by this
    # core's: resumed or started again, the sweep would rewrite what it cannot read.
    monkeypatch.setattr(core.sweep.run, "run_in_process", InterruptedRuns(interrupt_at=None))
    sweep, database = _sweep_file(tmp_path), tmp_path / "r.db"
    assert main(["sweep", str(sweep), "--database", str(database), "--repeats", "1", "--workers", "fresh"]) == 0
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE sweeps SET cells_json = '{\"from\": \"a newer core\"' WHERE name = 'from-file'")
        before = connection.execute("SELECT * FROM sweeps").fetchall()
    capsys.readouterr()

    given = ["sweep", str(sweep), "--database", str(database), "--repeats", "1", *(["--resume"] if resume else [])]
    assert main(given) == 2

    error = " ".join(capsys.readouterr().err.split())
    assert f"sweep 'from-file' has a record in {database} that cannot be read" in error
    assert "it is left as it is" in error and "--name" in error
    with sqlite3.connect(database) as connection:
        assert connection.execute("SELECT * FROM sweeps").fetchall() == before
    assert _runs(database, "from-file") == [("micro_batch_size=4", 0), ("micro_batch_size=8", 0)]


# --- --resume of a sweep the database has never seen --------------------------------------------


def test_resume_of_an_unknown_sweep_says_so_instead_of_starting_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = InterruptedRuns(interrupt_at=None)
    monkeypatch.setattr(core.sweep.run, "run_in_process", runs)
    sweep, database = _sweep_file(tmp_path), tmp_path / "r.db"
    for dry_run in ([], ["--dry-run"]):
        assert main(["sweep", str(sweep), "--database", str(database), "--resume", *dry_run]) == 2
        assert f"--resume: no results database at {database}" in capsys.readouterr().err
    assert not database.exists()

    assert main(["sweep", str(sweep), "--database", str(database), "--repeats", "1"]) == 0
    for dry_run in ([], ["--dry-run"]):
        command = ["sweep", str(sweep), "--database", str(database), "--name", "typo", "--resume", *dry_run]
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"--resume: no sweep 'typo' in {database} (it has 'from-file')" in err
    with pytest.raises(SweepError, match="no sweep 'typo'"):
        run_sweep(core.sweep.make_sweep_spec({**core.sweep.load_sweep(sweep).model_dump(), "name": "typo"}),
                  database=database, resume=True)  # fmt: skip
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == ["from-file"]
    assert len(runs.calls) == 2


def test_the_resume_command_is_json_free_of_surprises() -> None:
    # The sweep's name and the paths are single words whatever they hold: shlex quotes them.
    args = build_parser().parse_args(["sweep", "a b.toml", "--name", "x'; rm -rf ~"])
    spec = core.sweep.make_sweep_spec(json.loads('{"name": "s", "grid": {"workload": "fcnn"}}'))
    words = resume_words(f"Continue with: {resume_command(args, Path('d b.db'), spec)}")
    assert words[1].endswith("/a b.toml") and "--name=x'; rm -rf ~" in words


@pytest.mark.parametrize("column", ["result_json", "cell_label", "recorded_at", "status", "cell_key"])
def test_a_resume_past_a_row_whose_text_is_not_utf8_measures_and_keeps_every_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    column: str,
) -> None:
    # Issue 26 (r3 A): sqlite3 decodes every TEXT value as UTF-8 and raised OperationalError for the
    # whole query, so a resume measured and stored its new run, then ended with exit 2 and no summary.
    runs = InterruptedRuns(interrupt_at=None)
    monkeypatch.setattr(core.sweep.run, "run_in_process", runs)
    sweep, database = _sweep_file(tmp_path), tmp_path / "r.db"
    assert main(["sweep", str(sweep), "--database", str(database), "--repeats", "1"]) == 0
    with sqlite3.connect(database) as connection:
        connection.execute(f"UPDATE runs SET {column} = CAST(x'7b22ff' AS TEXT) WHERE id = 1")
    capsys.readouterr()

    assert main(["sweep", str(sweep), "--database", str(database), "--repeats", "2", "--resume"]) == 0
    captured = capsys.readouterr()
    assert len(runs.calls) == 2 + 2 + (column == "cell_key"), runs.calls  # a key of no cell runs again
    with ResultStore(database, create=False) as store:
        assert store.count(sweep="from-file") == 4 + (column == "cell_key")
    warned = captured.err + caplog.text  # the closing summary's warning is logged (stderr in a shell)
    if column != "status":  # a status is only counted, never shown: the row is read whole
        assert f"core: warning: skipped run 1 of sweep 'from-file' in {database}: {column} is not UTF-8" in warned
        assert "\\xff" in warned
    assert "\ufffd" not in warned + captured.out


@pytest.mark.parametrize("workers", ["warm", "fresh"])
def test_workers_with_a_slurm_sweep_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: str
) -> None:
    """Each Slurm job runs its repeat in an interpreter of its own: a --workers choice there would be
    silently ignored, so it is refused, naming the flag, before anything is submitted."""
    sweep = _sweep_file(tmp_path)
    database = tmp_path / "results.db"
    code = main(["sweep", str(sweep), "--executor", "slurm", "--workers", workers, "--database", str(database)])
    error = " ".join(capsys.readouterr().err.split())
    assert code == 2 and f"--workers {workers}" in error and "--executor local" in error
    assert not database.exists()
