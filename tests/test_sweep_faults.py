"""Sweeps and the results database under faults (issue 11): two sweeps on one database, loose
types in a sweep file, a database that is a directory, garbage, read-only or full, damaged rows
and pages, YAML alias bombs, lowered repeats on resume, and names in any script.

Each fault must end in a clear message and exit code, with no traceback, nothing measured lost
and no partial file. Most tests replace the run itself (``core.sweep.run.run_in_process``) with a
made-up result, so they exercise the sweep and its database without starting PyTorch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from resume_command import resume_words
from synthetic import synthetic_result

import core.storage.database
import core.storage.store
import core.sweep.run
from core import ConfigError
from core.base.results import RunResult
from core.cli import main
from core.storage.store import ResultStore, StoreError, SweepLock
from core.sweep import SweepError, load_sweep, make_sweep_spec, plan_sweep, run_sweep

TINY_GRID = """
repeats = {repeats}
timeout_seconds = 120
[grid]
workload = "fcnn"
micro_batch_size = {batches}
steps = 2
warmup_steps = 1
power_meter = "none"
threads_per_replica = 1
[grid.workload_options]
layers = 2
hidden_width = 32
input_width = 16
output_width = 8
"""


def grid(path: Path, batches: list[int] = [8, 16], repeats: int = 1) -> Path:  # noqa: B006 - read only
    path.write_text(TINY_GRID.format(batches=batches, repeats=repeats), encoding="utf-8")
    return path


class FakeRuns:
    """Stands in for run_in_process: a result made up from the cell's config, no process, no PyTorch."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(
        self, cell: Any, *, timeout_seconds: float, work_dir: Path, on_wait: Any = None, workers: Any = None
    ) -> tuple[RunResult, float]:
        config = cell.config
        self.calls.append((cell.label, len(self.calls)))
        result = RunResult(
            workload=config.workload,
            accelerator=config.accelerator,
            framework="torch",
            config=config,
            samples_per_update=config.samples_per_update,
            samples_per_host_call=config.samples_per_update,
            world_size=1,
            window_seconds=1.0,
            window_steps=2,
            throughput_per_second=1000.0 + 10 * config.micro_batch_size + len(self.calls),
        )
        return result, 0.5


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> FakeRuns:
    runs = FakeRuns()
    monkeypatch.setattr(core.sweep.run, "run_in_process", runs)
    return runs


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """For sweeps that must be refused before anything runs."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a run started although the sweep should have been refused")

    monkeypatch.setattr(core.sweep.run, "run_in_process", refuse)


def rows(database: Path) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return connection.execute(
            "SELECT id, sweep, cell_label, repeat, throughput_per_second FROM runs ORDER BY id"
        ).fetchall()
    finally:
        connection.close()


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text


# --- 1. one sweep at a time on a database ------------------------------------------------------------

HOLD_LOCK = """
import sys, time
from core.storage.store import SweepLock
lock = SweepLock(sys.argv[1], "first")
lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_sweep_on_a_database_is_refused_and_the_lock_dies_with_its_holder(
    tmp_path: Path, fake_runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    database, sweep_file = tmp_path / "r.db", grid(tmp_path / "s.toml")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(database)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert main(["sweep", str(sweep_file), "--database", str(database)]) == 2
        err = capsys.readouterr().err
        assert f"results database {database} is in use by sweep 'first' (pid {holder.pid} on " in err, err
        assert "another --database" in err
        no_traceback(err)
        assert fake_runs.calls == []  # refused at once: nothing ran, nothing was waited for
        with ResultStore(database) as store:
            assert store.count() == 0
        # kill -9: the kernel drops the lock with its holder, and the next sweep runs.
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert main(["sweep", str(sweep_file), "--database", str(database)]) == 0
    assert len(rows(database)) == 2 and len(fake_runs.calls) == 2
    # A finished sweep lets go of the lock too: another sweep can take it at once.
    with SweepLock(database, "next"):
        pass


def test_the_lock_is_held_for_the_whole_sweep_and_released_after_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "r.db"
    spec = make_sweep_spec({"name": "s", "repeats": 1, "grid": {"workload": "fcnn", "micro_batch_size": [8, 16]}})
    refusals: list[str] = []

    def run_and_try_a_second_sweep(cell: Any, **kwargs: Any) -> tuple[RunResult, float]:
        try:
            SweepLock(database, "second").acquire()
        except StoreError as error:
            refusals.append(str(error))
        if cell.config.micro_batch_size == 16:
            raise KeyboardInterrupt  # Ctrl-C during the second run
        return FakeRuns()(cell, **kwargs)

    monkeypatch.setattr(core.sweep.run, "run_in_process", run_and_try_a_second_sweep)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, database=database)
    assert len(refusals) == 2 and all("in use by sweep 's'" in text for text in refusals)
    with SweepLock(database, "after"):  # released on the way out
        pass
    assert [row[2] for row in rows(database)] == ["micro_batch_size=8"]


@pytest.mark.slow
def test_two_real_sweeps_side_by_side_one_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    database, sweep_file = tmp_path / "r.db", grid(tmp_path / "s.toml", batches=[8, 16])
    command = [sys.executable, "-m", "core.cli", "sweep", str(sweep_file), "--database", str(database)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        lock = core.storage.store.lock_path(database)
        while time.monotonic() < deadline and first.poll() is None:
            if lock.exists() and f'"pid": {first.pid}' in lock.read_text(encoding="utf-8"):
                break
            time.sleep(0.05)
        # The same sweep resumed while the first runs (--resume: the first has recorded it by now).
        second = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=120)
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stderr
    assert f"is in use by sweep 's' (pid {first.pid}" in second.stderr
    no_traceback(second.stderr)
    assert first.returncode == 0, err
    assert [row[2:4] for row in rows(database)] == [("micro_batch_size=8", 0), ("micro_batch_size=16", 0)]


# --- 4. strict types in the sweep file -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("repeats", True, "a boolean is not a number"),
        ("repeats", "3", "write 3 without quotes"),
        ("repeats", 2.0, "a float is not an integer"),
        ("timeout_seconds", True, "a boolean is not a number"),
        ("timeout_seconds", "60", "a string is not a valid number"),
        ("name", 5, "not a string"),
        ("description", False, "string"),
    ],
)
def test_a_boolean_or_a_string_is_not_a_number(setting: str, value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_sweep_spec({"grid": {"workload": "fcnn"}, setting: value}, default_name="s")
    assert caught.value.field == setting and says in caught.value.allowed, caught.value.allowed


def test_an_integer_timeout_is_a_number(tmp_path: Path) -> None:
    spec = make_sweep_spec({"grid": {"workload": "fcnn"}, "timeout_seconds": 60, "repeats": 2}, default_name="s")
    assert spec.timeout_seconds == 60.0 and isinstance(spec.timeout_seconds, float) and spec.repeats == 2


def test_grid_values_keep_their_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="appears twice"):
        make_sweep_spec({"grid": {"workload": "fcnn", "micro_batch_size": [8, 8]}}, default_name="s")
    # A float option takes 8 and 8.0 alike: the same cell twice, refused like [8, 8].
    with pytest.raises(ConfigError, match=r"\(1 and 1.0 are the same number\)"):
        make_sweep_spec({"grid": {"workload": "fcnn", "power_sample_interval_seconds": [1, 1.0]}}, default_name="s")
    # Elsewhere 8.0, "8" and true are values of their own, cells that the strict RunConfig refuses.
    plan = plan_sweep(
        make_sweep_spec({"grid": {"workload": "fcnn", "micro_batch_size": [8, 8.0, "8", True]}}, default_name="s")
    )
    assert [cell.valid for cell in plan.cells] == [True, False, False, False]
    assert [cell.label for cell in plan.cells] == [
        "micro_batch_size=8",
        "micro_batch_size=8.0",
        'micro_batch_size="8"',
        "micro_batch_size=True",
    ]
    assert "a float is not an integer; write 8" in plan.cells[1].invalid_reason
    assert "write 8 without quotes" in plan.cells[2].invalid_reason
    assert "a boolean is not a number" in plan.cells[3].invalid_reason
    sweep_file = tmp_path / "b.toml"
    sweep_file.write_text('repeats = true\n[grid]\nworkload = "fcnn"\n', encoding="utf-8")
    assert main(["sweep", str(sweep_file), "--dry-run", "--database", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    assert "invalid repeats = True: an integer is required (a boolean is not a number)" in err
    no_traceback(err)


# --- 6. a database that cannot be written --------------------------------------------------------------


@contextlib.contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """Make ``paths`` unwritable, for root too: ``chattr +i`` as root (chmod does not stop root)."""
    if os.geteuid() == 0:
        done: list[Path] = []
        try:
            for path in paths:
                completed = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
                if completed.returncode != 0:
                    pytest.skip(f"cannot make {path} read-only for root: {completed.stderr.strip()}")
                done.append(path)
            yield
        finally:
            for path in reversed(done):
                subprocess.run(["chattr", "-i", str(path)], check=False)
    else:
        modes = {path: path.stat().st_mode for path in paths}
        try:
            for path in paths:
                path.chmod(modes[path] & ~0o222)
            yield
        finally:
            for path, mode in modes.items():
                path.chmod(mode)


def test_a_database_that_cannot_be_opened_is_refused_before_anything_runs(
    tmp_path: Path, no_runs: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_file = grid(tmp_path / "s.toml")
    (tmp_path / "folder.db").mkdir()
    (tmp_path / "garbage.db").write_bytes(b"this is not a database\n" * 100)
    (tmp_path / "plain-file").write_text("x", encoding="utf-8")
    cases = {
        tmp_path / "folder.db": "is a directory; give the path of a file",
        tmp_path / "garbage.db": "is not a SQLite database (file is not a database)",
        tmp_path / "plain-file" / "r.db": "plain-file is not a directory",
    }
    for database, says in cases.items():
        assert main(["sweep", str(sweep_file), "--database", str(database)]) == 2, database
        err = capsys.readouterr().err
        assert "core: error: " in err and says in err, err
        no_traceback(err)
    assert (tmp_path / "garbage.db").read_bytes() == b"this is not a database\n" * 100  # untouched
    # A disk without room: refused at open, not after the first run has been measured.
    monkeypatch.setattr(core.storage.database.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 4096})())
    assert main(["sweep", str(sweep_file), "--database", str(tmp_path / "full.db")]) == 2
    err = capsys.readouterr().err
    assert "its disk is full (4,096 bytes free)" in err
    no_traceback(err)


def test_a_read_only_database_is_refused_by_a_sweep(
    tmp_path: Path, no_runs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "r.db"
    ResultStore(database).close()
    with read_only(database):
        assert main(["sweep", str(grid(tmp_path / "s.toml")), "--database", str(database)]) == 2
    err = capsys.readouterr().err
    assert f"results database {database} is read-only" in err and "`core results`" in err, err
    no_traceback(err)


class FullDisk:
    """A sqlite3 connection whose inserts into runs fail as on a full disk, after ``succeed`` of them."""

    def __init__(self, connection: sqlite3.Connection, succeed: int) -> None:
        self._connection, self.succeed = connection, succeed

    def execute(self, statement: str, *parameters: Any) -> Any:
        if statement.startswith("INSERT INTO runs"):
            if self.succeed <= 0:
                raise sqlite3.OperationalError("database or disk is full")
            self.succeed -= 1
        return self._connection.execute(statement, *parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, succeed: int) -> None:
    opened = ResultStore._open_for_writing

    def open_then_fill(self: ResultStore) -> Any:
        return FullDisk(opened(self), succeed)

    monkeypatch.setattr(ResultStore, "_open_for_writing", open_then_fill)


def test_a_result_the_full_database_refuses_is_saved_beside_it_and_recorded_on_resume(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    database, sweep_file = tmp_path / "r.db", grid(tmp_path / "s.toml", batches=[8, 16, 32])
    with monkeypatch.context() as patch:
        fill_disk_after(patch, succeed=1)
        assert main(["sweep", str(sweep_file), "--database", str(database)]) == 1
    captured = capsys.readouterr()
    saved = database.parent / "r.db.unsaved" / "s-cell2-repeat1.json"
    assert "the sweep stopped: cannot record repeat 1 of cell 'micro_batch_size=16'" in captured.err
    assert "its disk is full (database or disk is full)" in captured.err
    assert f"its result is saved in {saved}" in captured.err
    printed = resume_words(captured.err, "Once the database can be written: ")
    assert printed[:4] == ["sweep", str(sweep_file), "--resume", "--database"]
    no_traceback(captured.err)
    # The measured figure is shown, and said not to be recorded (the error follows on stderr).
    (line,) = [line for line in captured.out.splitlines() if "micro_batch_size=16 repeat 1: ok" in line]
    assert line.endswith("; not recorded: the database refused it (see below)"), line
    assert len(fake_runs.calls) == 2  # the sweep stopped at the first result it could not record
    document = json.loads(saved.read_text(encoding="utf-8"))
    measured = document["result"]["throughput_per_second"]
    assert document["sweep"] == "s" and document["repeat"] == 0 and measured == 1000.0 + 160 + 2
    assert [path.name for path in saved.parent.iterdir()] == [saved.name]  # no partial file
    assert [row[2] for row in rows(database)] == ["micro_batch_size=8"]

    # Space again: the printed command records the saved result (not run again) and runs the rest.
    assert main(printed) == 0
    out = capsys.readouterr().out
    assert "recorded 1 result(s) that an earlier run of this sweep could not write" in out
    assert [call[0] for call in fake_runs.calls[2:]] == ["micro_batch_size=32"]
    assert [(row[2], row[4]) for row in rows(database)] == [
        ("micro_batch_size=8", 1081.0),
        ("micro_batch_size=16", measured),
        ("micro_batch_size=32", 1323.0),
    ]
    assert not saved.parent.exists()


def test_when_nothing_beside_the_database_can_be_written_the_result_is_printed_as_json(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from core.base.files import OutputError

    def no_space(path: Path, data: Any, what: str = "output") -> None:
        raise OutputError(f"cannot write {what} {path}: no space left on the device (ENOSPC)")

    database = tmp_path / "r.db"
    fill_disk_after(monkeypatch, succeed=0)
    monkeypatch.setattr("core.base.files.write_atomically", no_space)
    assert main(["sweep", str(grid(tmp_path / "s.toml")), "--database", str(database)]) == 1
    captured = capsys.readouterr()
    printed = json.loads(captured.out.strip().splitlines()[-1])
    assert printed["cell_label"] == "micro_batch_size=8" and printed["result"]["throughput_per_second"] == 1081.0
    RunResult.model_validate(printed["result"])
    assert "could not be saved beside the database either" in captured.err
    assert "no space left on the device (ENOSPC)), so it is printed as JSON on standard output" in captured.err
    no_traceback(captured.err)
    assert not (tmp_path / "r.db.unsaved").exists() and rows(database) == []


def test_a_failed_commit_leaves_no_transaction_open(tmp_path: Path) -> None:
    class FailingCommit(FullDisk):
        def execute(self, statement: str, *parameters: Any) -> Any:
            if statement == "COMMIT":
                raise sqlite3.OperationalError("database or disk is full")
            return self._connection.execute(statement, *parameters)

    store = ResultStore(tmp_path / "r.db")
    real = store._connection
    store._connection = FailingCommit(real, 0)  # type: ignore[assignment]
    with pytest.raises(core.storage.store.StoreWriteError, match="its disk is full"):
        store.add(synthetic_result(), sweep="s", cell_key="a", repeat=0)
    assert not real.in_transaction
    store._connection = real
    store.add(synthetic_result(), sweep="s", cell_key="a", repeat=0)  # the same row: nothing half-written before
    assert store.count() == 1
    store.close()


@pytest.mark.slow
def test_a_real_full_disk_is_refused_at_open(tmp_path: Path, no_runs: None, capsys: pytest.CaptureFixture[str]) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        ResultStore(mount / "r.db").close()
        with open(mount / "filler", "wb") as filler:
            with contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * 65536)
        assert main(["sweep", str(grid(tmp_path / "s.toml")), "--database", str(mount / "r.db")]) == 2
        err = capsys.readouterr().err
        assert "its disk is full" in err
        no_traceback(err)
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# --- 7. reading never writes -----------------------------------------------------------------------------


def recorded_database(path: Path) -> Path:
    with ResultStore(path) as store:
        store.save_sweep("s", {"name": "s", "repeats": 1}, [], None)
        store.add(
            synthetic_result(micro_batch_size=8, throughput=500.0),
            sweep="s",
            cell_key="a",
            cell_label="micro_batch_size=8",
            repeat=0,
        )
    return path


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_database_in_a_read_only_folder_is_read_without_root_powers(tmp_path: Path) -> None:
    # Root ignores file modes, so the reader runs without the capabilities that let it: as a user
    # would, in a folder it cannot write (SQLite then cannot make the -shm file beside the file).
    folder = tmp_path / "shared"
    folder.mkdir()
    database = recorded_database(folder / "r.db")
    database.chmod(0o444)
    folder.chmod(0o555)
    try:
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
        listed = subprocess.run(
            [*drop, sys.executable, "-m", "core.cli", "results", "--database", str(database), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        folder.chmod(0o755)
    if "setpriv" in listed.stderr and listed.returncode != 0 and "core" not in listed.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {listed.stderr.strip()}")
    assert listed.returncode == 0, listed.stderr
    assert [run["result"]["throughput_per_second"] for run in json.loads(listed.stdout)] == [500.0]
    assert sorted(p.name for p in folder.iterdir()) == ["r.db"]  # nothing written beside it


def test_a_store_opened_for_reading_writes_nothing(tmp_path: Path) -> None:
    database = recorded_database(tmp_path / "r.db")
    before = database.read_bytes()
    with ResultStore(database, create=False) as store:
        assert store.read_only and [run.result.throughput_per_second for run in store.runs()] == [500.0]
        with pytest.raises(core.storage.store.StoreWriteError, match="read-only"):
            store.add(synthetic_result(), sweep="s", cell_key="b", repeat=0)
    assert database.read_bytes() == before
    with pytest.raises(StoreError, match="no results database at"):
        ResultStore(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_results_and_report_read_a_read_only_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = recorded_database(tmp_path / "r.db")
    with read_only(database):
        assert main(["results", "--database", str(database)]) == 0
        assert "micro_batch_size=8" in capsys.readouterr().out
        assert main(["sweep", str(grid(tmp_path / "s.toml")), "--database", str(database), "--dry-run"]) == 0
        assert main(["report", "--database", str(database), "--output", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    no_traceback(captured.err)
    assert (tmp_path / "report" / "report.html").exists()


def test_results_read_a_database_in_a_read_only_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "archive"
    folder.mkdir()
    database = recorded_database(folder / "r.db")
    assert sorted(path.name for path in folder.iterdir()) == ["r.db"]
    with read_only(database, folder):  # no -shm can be made: SQLite's immutable mode reads the file alone
        assert main(["results", "--database", str(database), "--format", "csv"]) == 0
        captured = capsys.readouterr()
    assert "500.0" in captured.out, captured.err
    assert sorted(path.name for path in folder.iterdir()) == ["r.db"]


KILLED_WRITER = """
import os, sys
from core.storage.store import ResultStore
sys.path.insert(0, sys.argv[2])
from synthetic import synthetic_result
store = ResultStore(sys.argv[1])
store.add(synthetic_result(throughput=700.0), sweep="s", cell_key="b", repeat=0)
os._exit(0)  # killed: the write-ahead log keeps the run, not yet in the file
"""


def test_a_read_only_folder_with_an_unfinished_log_is_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "archive"
    folder.mkdir()
    database = recorded_database(folder / "r.db")
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(database), str(Path(__file__).parent)], check=True)
    (folder / "r.db-shm").unlink()
    assert (folder / "r.db-wal").stat().st_size > 0
    with read_only(database, folder / "r.db-wal", folder):
        assert main(["results", "--database", str(database)]) == 2
    err = capsys.readouterr().err
    assert "its folder is read-only and it has an unfinished write-ahead log (r.db-wal)" in err, err
    no_traceback(err)


# --- 8. damaged rows and pages --------------------------------------------------------------------------


def test_a_damaged_row_is_skipped_with_a_warning_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "r.db"
    with ResultStore(database) as store:
        store.save_sweep("s", {"name": "s", "repeats": 1}, [], None)
        store.save_sweep("t", {"name": "t"}, [], None)
        for index in range(4):
            store.add(
                synthetic_result(micro_batch_size=8 << index, throughput=100.0 * (index + 1)),
                sweep="s",
                cell_key=str(index),
                cell_label=f"micro_batch_size={8 << index}",
                repeat=0,
            )
    connection = sqlite3.connect(database)
    connection.execute('UPDATE runs SET result_json = \'{"workload": "fcnn", "acc\' WHERE id = 2')
    connection.execute("UPDATE runs SET result_json = '{\"workload\": 5}' WHERE id = 3")
    connection.execute("UPDATE sweeps SET spec_json = 'nonsense' WHERE name = 't'")
    connection.commit()
    connection.close()
    with ResultStore(database, create=False) as store:
        runs = store.runs(sweep="s")
        assert [run.run_id for run in runs] == [1, 4]
        assert [record.name for record in store.sweeps()] == ["s"]
        store.runs()  # read again: each damaged row is reported once
        skipped = [str(row) for row in store.skipped_rows]
    assert len(skipped) == 3, skipped
    assert skipped[0].startswith(f"skipped run 2 of sweep 's' in {database}: result_json is not valid JSON"), skipped
    assert skipped[1].startswith("skipped run 3 of sweep 's'") and "does not fit this core's RunResult" in skipped[1]
    assert "(and " in skipped[1]
    assert skipped[2].startswith("skipped the settings of sweep 't'") and "JSONDecodeError" in skipped[2]
    assert all(len(text) < 500 for text in skipped)

    assert main(["results", "--database", str(database)]) == 0
    captured = capsys.readouterr()
    assert "micro_batch_size=8 " in captured.out and "micro_batch_size=64" in captured.out
    assert "core: warning: skipped run 2 of sweep 's'" in captured.err, captured.err
    no_traceback(captured.err)
    assert main(["report", "--database", str(database), "--output", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    no_traceback(captured.err)
    assert "skipped run 2" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8") + captured.err


def damage_runs_table(database: Path) -> None:
    """Overwrite the runs table's first page with garbage: a damaged page, not a damaged row."""
    connection = sqlite3.connect(database)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    root = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
    connection.close()
    with open(database, "r+b") as stream:
        stream.seek((root - 1) * page_size)
        stream.write(b"\xa5" * page_size)


def test_a_damaged_page_is_an_error_message_not_a_traceback(
    tmp_path: Path, fake_runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "r.db"
    with ResultStore(database) as store:
        for index in range(20):
            store.add(synthetic_result(throughput=100.0 + index), sweep="s", cell_key=str(index), repeat=0)
    damage_runs_table(database)
    with pytest.raises(StoreError, match="is damaged"):  # found when opened, before any query meets it
        ResultStore(database, create=False)
    sweep_file = str(grid(tmp_path / "s.toml"))
    # Every command alike (issue 26): the report used to end with 0 and a note, the dry run with 0.
    for command in (
        ["results"],
        ["sweep", sweep_file, "--resume"],
        ["sweep", sweep_file, "--dry-run"],
        ["report", "--output", str(tmp_path / "report")],
    ):
        assert main([*command, "--database", str(database)]) == 2, command
        err = capsys.readouterr().err
        assert f"results database {database} is damaged (database disk image is malformed)" in err, (command, err)
        no_traceback(err)
    assert fake_runs.calls == [] and not (tmp_path / "report").exists()


# --- 12. YAML alias bombs and huge values --------------------------------------------------------------

ALIAS_BOMB = """grid:
  workload: fcnn
  a: &a [x, x, x, x, x, x, x, x, x, x]
  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
  micro_batch_size: [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
"""


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB, encoding="utf-8")
    assert len(ALIAS_BOMB) < 450
    started = time.monotonic()
    assert main(["sweep", str(bomb), "--dry-run", "--database", str(tmp_path / "r.db")]) == 2
    assert time.monotonic() - started < 60  # a hang guard: expanded, the bomb would take far longer
    err = capsys.readouterr().err
    assert "found the alias *a: a sweep file may not use YAML aliases" in err and "line 4" in err, err
    assert len(err) < 1000
    merge = tmp_path / "merge.yaml"
    merge.write_text("base: &base {steps: 2}\ngrid:\n  <<: *base\n  workload: fcnn\n", encoding="utf-8")
    with pytest.raises(SweepError, match="YAML aliases"):
        load_sweep(merge)
    anchors_only = tmp_path / "anchor.yaml"
    anchors_only.write_text("grid: &g {workload: fcnn}\n", encoding="utf-8")
    assert load_sweep(anchors_only).grid == {"workload": "fcnn"}


def test_a_huge_sweep_file_or_value_gives_a_short_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.toml"
    big.write_text('[grid]\nworkload = "fcnn"\n' + "#" * (2 << 20) + "\n", encoding="utf-8")
    with pytest.raises(SweepError, match="larger than 1 MiB"):
        load_sweep(big)
    not_text = tmp_path / "binary.toml"
    not_text.write_bytes(b"\xff\xfe\x00grid")
    with pytest.raises(SweepError, match="is not UTF-8 text"):
        load_sweep(not_text)
    many = list(range(50_000))
    for document in (
        {"grid": {"workload": "fcnn"}, "name": "x" * 300_000},
        {"grid": {"workload": "fcnn", "batch": many}},
        {"grid": {"workload": "fcnn"}, "repeats": many},
        {"grid": {"workload": "fcnn"}, "exclude": [5] * 50_000},
        {"grid": {"workload": "fcnn", "micro_batch_size": [*many, [1]]}},
    ):
        with pytest.raises(ConfigError) as caught:
            make_sweep_spec(document, default_name="s")
        assert len(str(caught.value)) < 3000, str(caught.value)[:300]
    # A huge value in a cell: its label and the reason it is refused stay short.
    huge = tmp_path / "huge.toml"
    huge.write_text(
        f'repeats = 1\n[grid]\nworkload = "fcnn"\nprecision = ["fp32", "{"y" * 200_000}"]\n', encoding="utf-8"
    )
    assert main(["sweep", str(huge), "--dry-run", "--database", str(tmp_path / "r.db")]) == 2
    captured = capsys.readouterr()
    assert len(captured.out) + len(captured.err) < 3000
    assert "precision=yyyy" in captured.out and "..." in captured.out


# --- 16. lowering --repeats on resume ------------------------------------------------------------------


def test_lowering_repeats_on_resume_counts_every_run_and_keeps_the_recorded_spec(
    tmp_path: Path, fake_runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    database, sweep_file = tmp_path / "r.db", grid(tmp_path / "s.toml", batches=[8, 16], repeats=3)
    assert main(["sweep", str(sweep_file), "--database", str(database)]) == 0
    assert len(rows(database)) == 6
    capsys.readouterr()
    assert main(["sweep", str(sweep_file), "--database", str(database), "--resume", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "resuming sweep s: 2 of 2 runs already recorded; 4 more, beyond the 1 repeat per cell asked now, "
        "stay in the database and count in its summaries"
    ) in out, out
    assert "sweep s: 0 runs now, 2 before" in out
    assert len(fake_runs.calls) == 6 and len(rows(database)) == 6
    with ResultStore(database, create=False) as store:
        record = store.sweep("s")
        summaries = __import__("core.storage.summary", fromlist=["summarise"]).summarise(store.runs(sweep="s"))
    assert record is not None and record.spec["repeats"] == 3  # not lowered: 3 repeats per cell are recorded
    assert [entry["repeats"] for entry in record.spec["resumed"]] == [1]
    assert [cell.repeats_recorded for cell in summaries] == [3, 3]
    assert main(["sweep", str(sweep_file), "--database", str(database), "--resume", "--repeats", "1", "--dry-run"]) == 0
    assert "[1/1 repeats recorded, 2 more recorded beyond 1]" in capsys.readouterr().out
    # Raising them runs what is missing, and the record follows.
    assert main(["sweep", str(sweep_file), "--database", str(database), "--resume", "--repeats", "4"]) == 0
    assert "resuming sweep s: 6 of 8 runs already recorded\n" in capsys.readouterr().out
    with ResultStore(database, create=False) as store:
        record = store.sweep("s")
    assert record is not None and record.spec["repeats"] == 4 and len(rows(database)) == 8


# --- 17. names in any script ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file_name", "name"),
    [
        ("größe.toml", "größe"),
        ("扫描.yaml", "扫描"),
        ("हिन्दी.toml", "हिन्दी"),
        (unicodedata.normalize("NFD", "größe") + ".json", "größe"),
        ("my grid (v2).toml", "my-grid--v2-"),
        (".hidden.toml", "hidden"),
        ("-.toml", "sweep"),
    ],
)
def test_a_sweep_file_named_in_any_script_runs_without_name(tmp_path: Path, file_name: str, name: str) -> None:
    path = tmp_path / file_name
    if path.suffix == ".json":
        path.write_text(json.dumps({"grid": {"workload": "fcnn"}}), encoding="utf-8")
    elif path.suffix == ".yaml":
        path.write_text("grid: {workload: fcnn}\n", encoding="utf-8")
    else:
        path.write_text('[grid]\nworkload = "fcnn"\n', encoding="utf-8")
    assert load_sweep(path).name == name


def test_a_sweep_with_a_unicode_name_runs_and_is_recorded(
    tmp_path: Path, fake_runs: FakeRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "r.db"
    assert main(["sweep", str(grid(tmp_path / "扫描.toml", batches=[8])), "--database", str(database)]) == 0
    assert "sweep 扫描: 1 run now" in capsys.readouterr().out
    assert [row[1] for row in rows(database)] == ["扫描"]


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "a b", "a\nb", "a\x00b", "-x", "x" * 201, "a\u202eb"])
def test_a_name_with_a_path_or_control_character_is_refused(
    tmp_path: Path, no_runs: None, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_file = grid(tmp_path / "s.toml")
    assert main(["sweep", str(sweep_file), f"--name={name}", "--database", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err
    # --name is the user's flag, not the file's field: the message names the flag (and not the file)
    assert (
        "invalid name (--name) = " in err
        and str(sweep_file) not in err
        and ("a sweep name is letters and digits" in err or "at least 1 character" in err or "at most 200" in err)
    ), err
    no_traceback(err)
    assert not (tmp_path / "r.db").exists()


# --- Issue 26, third pass: a boolean is not a number in [[exclude]] and [report] filters -------------


@pytest.mark.parametrize(
    ("grid", "entry", "says"),
    [
        # `compile = 1` excluded the `true` cells (1 == True in Python), in silence.
        ({"compile": [True, False]}, {"compile": 1}, "exclude.0.compile = 1: no cell has this value (a boolean is"),
        # `micro_batch_size = true` excluded nothing, in silence.
        ({"micro_batch_size": [2, 4]}, {"micro_batch_size": True}, "exclude.0.micro_batch_size = True: no cell"),
        ({"micro_batch_size": [2, 4]}, {"micro_batch_size": [2, 7]}, "exclude.0.micro_batch_size = 7: no cell"),
    ],
)
def test_an_exclude_value_the_grid_never_gives_is_refused(
    grid: dict[str, Any], entry: dict[str, Any], says: str
) -> None:
    document = {"name": "x", "grid": {"workload": "fcnn", **grid}, "exclude": [entry]}
    with pytest.raises(ConfigError) as refused:
        make_sweep_spec(document)
    assert says in str(refused.value) and "the grid gives: " in str(refused.value)


def test_an_exclude_matches_as_the_cells_compare() -> None:
    # 4.0 is the number 4; "samples:1_000" is the definition samples:1000.
    spec = make_sweep_spec(
        {
            "name": "x",
            "grid": {"workload": "fcnn", "micro_batch_size": [2, 4], "epoch_definition": ["samples:1000", "dataset"]},
            "exclude": [{"micro_batch_size": 4.0}, {"epoch_definition": "samples:1_000"}],
        }
    )
    assert [cell.options["micro_batch_size"] for cell in plan_sweep(spec).cells] == [2]
    assert [cell.options["epoch_definition"] for cell in plan_sweep(spec).cells] == ["dataset"]


@pytest.mark.parametrize(
    ("wanted", "says"), [(True, "(a boolean is not a number)"), (7, "= 7: no cell has this value")]
)
def test_a_report_filter_value_the_grid_never_gives_is_refused(wanted: Any, says: str) -> None:
    document = {
        "name": "x",
        "grid": {"workload": "fcnn", "micro_batch_size": [2, 4]},
        "report": {"figures": [{"x": "micro_batch_size", "filter": {"micro_batch_size": wanted}}]},
    }
    with pytest.raises(ConfigError) as refused:
        make_sweep_spec(document)
    assert refused.value.field == "report.figures.0.filter" and says in str(refused.value)
    assert "the grid gives: 2, 4" in str(refused.value)
    document["report"]["figures"][0]["filter"] = {"micro_batch_size": [4.0]}  # the number 4
    assert make_sweep_spec(document).report is not None


def test_an_unknown_key_of_a_table_lists_that_tables_keys() -> None:
    # Issue 26, third pass: "[slurm] nodes = true" listed the sweep file's own settings as allowed.
    with pytest.raises(ConfigError) as refused:
        make_sweep_spec({"name": "x", "grid": {"workload": "fcnn"}, "slurm": {"partiton": "gpu"}})
    assert refused.value.field == "slurm.partiton"
    assert "(did you mean 'partition'?); allowed: partition, account" in refused.value.allowed
    assert "repeats" not in refused.value.allowed


@pytest.mark.parametrize(
    ("document", "field"),
    [({"timeout_seconds": math.inf}, "timeout_seconds"), ({"slurm": {"poll_seconds": math.nan}}, "slurm.poll_seconds")],
)
def test_a_non_finite_sweep_setting_is_refused_as_one(document: dict[str, Any], field: str) -> None:
    # nan and inf read "less than or equal to 604800" (nan fails every comparison).
    with pytest.raises(ConfigError) as refused:
        make_sweep_spec({"name": "x", "grid": {"workload": "fcnn"}, **document})
    assert refused.value.field == field and refused.value.allowed == "Input should be a finite number"
