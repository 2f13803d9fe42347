"""Single runs in the results database: `core run ... --database` and `core.run(..., database=...)`
store the run (failed ones too) where sweeps store theirs; a bad database is a ConfigError before
any device is touched; the sweep lock is respected both ways; `core report` and `core results`
show single runs beside sweeps."""

from __future__ import annotations

import csv
import io
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core import Accelerator, Availability, Precision, hookimpl
from core.api import run
from core.base.errors import ConfigError
from core.base.results import RunResult, RunState
from core.cli import main
from core.storage.store import DatabaseInUseError, ResultStore, StoreWriteError, SweepLock
from core.testing import SimulatedExecutor, registered_plugins

SPY = "spy-device"


class _Spy(Accelerator):
    """A device that trains nothing and counts how often core touched it; ``fail_at`` makes its
    n-th update raise, as a device fault half-way through a run."""

    name: ClassVar[str] = SPY
    touched: ClassVar[int] = 0
    fail_at: ClassVar[int | None] = None
    on_step: ClassVar[Callable[[], None] | None] = None

    def availability(self) -> Availability:
        return Availability.yes()

    def precisions(self, framework: Any) -> tuple[Precision, ...]:
        return (Precision.fp32,)

    def max_replicas(self, config: Any) -> int:
        return 1

    def devices(self) -> list[Any]:
        return []

    def create_executor(self, workload: Any, config: Any, process: Any) -> Any:
        type(self).touched += 1
        steps = [0]

        def step() -> None:
            steps[0] += 1
            if type(self).on_step is not None:
                type(self).on_step()  # type: ignore[misc]
            if type(self).fail_at is not None and steps[0] >= type(self).fail_at:  # type: ignore[operator]
                raise RuntimeError("the device fell over")

        return SimulatedExecutor(step)


class _Plugin:
    @hookimpl
    def core_register_accelerators(self, register: Callable[[Accelerator], None]) -> None:
        register(_Spy())


@pytest.fixture
def spy() -> Any:
    _Spy.touched, _Spy.fail_at, _Spy.on_step = 0, None, None
    with registered_plugins(_Plugin()):
        yield _Spy


OPTIONS: dict[str, Any] = {"steps": 3, "warmup_steps": 1, "micro_batch_size": 4, "power_meter": "none"}
CLI_RUN = ["run", "fcnn", "--accelerator", SPY, "--steps", "3", "--warmup-steps", "1", "--batch-size", "4"]


def stored(database: Path) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(database)
    try:
        return connection.execute("SELECT sweep, cell_key, cell_label, repeat, status FROM runs ORDER BY id").fetchall()
    finally:
        connection.close()


# --- core.run(database=...) ---------------------------------------------------------------------


def test_a_run_is_stored_as_a_single_run_with_no_sweep_cell_or_repeat(spy: Any, tmp_path: Path) -> None:
    database = tmp_path / "results" / "core.db"
    result = run("fcnn", SPY, database=database, **OPTIONS)
    assert result.status.ok
    assert stored(database) == [
        (None, None, "fcnn on spy-device: steps=3 warmup_steps=1 micro_batch_size=4 power_meter=none", None, "ok")
    ]
    with ResultStore(database, create=False) as store:
        [single] = store.runs(single=True)
        assert store.count_single_runs() == 1 and store.sweep_names() == []
    assert single.result.model_dump() == result.model_dump()
    # A path given as text works the same, and each run is a row of its own.
    run("fcnn", SPY, database=str(database), **OPTIONS)
    assert len(stored(database)) == 2


def test_a_failed_run_is_stored_with_its_status_and_what_it_measured(spy: Any, tmp_path: Path) -> None:
    spy.fail_at = 3  # the first step and the warm-up pass; the window's first update raises
    database = tmp_path / "core.db"
    result = run("fcnn", SPY, database=database, **OPTIONS)
    assert result.status.state is RunState.error and "the device fell over" in (result.status.message or "")
    with ResultStore(database, create=False) as store:
        [single] = store.runs(single=True)
    assert single.result.status.state is RunState.error
    assert (
        single.result.first_step_seconds is not None and single.result.first_step_seconds == result.first_step_seconds
    )


@pytest.mark.parametrize(
    "make_bad",
    [
        pytest.param(lambda tmp: tmp, id="a directory"),
        pytest.param(lambda tmp: _write(tmp / "notes.txt", "not a database"), id="a text file"),
        pytest.param(lambda tmp: _write(tmp / "plain", "x") / "core.db", id="a file in the way of its folder"),
        pytest.param(lambda tmp: _foreign(tmp / "other.db"), id="another application's database"),
        pytest.param(lambda tmp: _write(tmp / "half.db", "SQLite format 3\x00" + "x" * 50), id="a truncated one"),
    ],
)
def test_a_bad_database_is_a_config_error_before_any_device_is_touched(
    spy: Any, tmp_path: Path, make_bad: Callable[[Path], Path]
) -> None:
    database = make_bad(tmp_path)
    before = _contents(database)
    with pytest.raises(ConfigError) as caught:
        run("fcnn", SPY, database=database, **OPTIONS)
    assert caught.value.field == "database" and caught.value.value == str(database)
    assert str(database) in caught.value.allowed
    assert spy.touched == 0
    assert _contents(database) == before  # left exactly as it was


@pytest.mark.parametrize("value", [3, b"core.db", "", "   ", True, ["core.db"]])
def test_a_database_that_is_no_path_is_a_config_error(spy: Any, value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        run("fcnn", SPY, database=value, **OPTIONS)
    assert caught.value.field == "database" and "path of a results database" in caught.value.allowed
    assert spy.touched == 0


def test_a_read_only_database_is_refused_before_the_run(spy: Any, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes read-only files")
    database = tmp_path / "core.db"
    run("fcnn", SPY, database=database, **OPTIONS)
    database.chmod(0o444)
    with pytest.raises(ConfigError, match="read-only"):
        run("fcnn", SPY, database=database, **OPTIONS)
    assert spy.touched == 1


def test_a_sweep_holding_the_database_refuses_the_run_before_any_device_is_touched(spy: Any, tmp_path: Path) -> None:
    database = tmp_path / "core.db"
    with SweepLock(database, "long-sweep"):
        with pytest.raises(DatabaseInUseError) as caught:
            run("fcnn", SPY, database=database, **OPTIONS)
    assert "in use by sweep 'long-sweep'" in str(caught.value) and "this run would run beside it" in str(caught.value)
    assert spy.touched == 0
    assert stored(database) == []
    run("fcnn", SPY, database=database, **OPTIONS)  # the sweep gone, the run goes ahead
    assert len(stored(database)) == 1


def test_the_run_holds_the_lock_until_it_is_stored_so_a_sweep_started_meanwhile_is_refused(
    spy: Any, tmp_path: Path
) -> None:
    database = tmp_path / "core.db"
    refusals: list[str] = []

    def start_a_sweep() -> None:
        try:
            SweepLock(database, "meanwhile").acquire()
        except DatabaseInUseError as error:
            refusals.append(str(error))

    spy.on_step = start_a_sweep
    run("fcnn", SPY, database=database, **OPTIONS)
    assert refusals and all("in use by a run of fcnn on spy-device" in text for text in refusals)
    with SweepLock(database, "after"):  # released once the run is stored
        pass


def test_a_result_the_database_refuses_comes_back_in_the_error(
    spy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(self: ResultStore, result: RunResult, **kwargs: Any) -> int:
        raise StoreWriteError(f"cannot write results database {self.path}: its disk is full")

    from core.storage.single_runs import UnrecordedRunError

    monkeypatch.setattr(ResultStore, "add", full_disk)
    with pytest.raises(UnrecordedRunError) as caught:
        run("fcnn", SPY, database=tmp_path / "core.db", **OPTIONS)
    assert caught.value.result.status.ok and caught.value.result.throughput_per_second is not None
    assert "disk is full" in str(caught.value)
    with SweepLock(tmp_path / "core.db", "after"):  # the lock is released all the same
        pass


# --- the command line -------------------------------------------------------------------------


def test_core_run_database_stores_the_run_and_report_and_results_show_it(
    spy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    database = tmp_path / "core.db"
    assert main([*CLI_RUN, "--database", str(database)]) == 0
    spy.fail_at = 3
    assert main([*CLI_RUN, "--batch-size", "8", "--database", str(database)]) == 1
    capsys.readouterr()
    assert [row[4] for row in stored(database)] == ["ok", "error"]

    assert main(["results", "--database", str(database), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(row["sweep"], row["cell_key"], row["repeat"], row["status"]) for row in rows] == [
        ("", "", "", "ok"),
        ("", "", "", "error"),
    ]
    assert main(["results", "--database", str(database)]) == 0
    assert "fcnn on spy-device" in capsys.readouterr().out

    output = tmp_path / "report"
    assert main(["report", str(database), "--output", str(output)]) == 0, capsys.readouterr().err
    markdown = (output / "report.md").read_text()
    assert "## Single runs" in markdown and "and 2 single runs" in markdown
    assert "2 runs stored by `core run --database` (1 error, 1 ok)" in markdown
    assert "the device fell over" in markdown  # the failed run among the failures
    html = (output / "report.html").read_text()
    assert 'data-value="' in html and "single-runs" in html


def test_core_report_shows_single_runs_beside_sweeps_and_sweep_selects_sweeps_only(
    spy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    database = tmp_path / "core.db"
    result = run("fcnn", SPY, **OPTIONS)
    with ResultStore(database) as store:
        for repeat in range(2):
            store.add(result, sweep="grid", cell_key="a", cell_label="micro_batch_size=4", repeat=repeat)
    run("fcnn", SPY, database=database, **OPTIONS)
    assert main(["report", str(database), "--output", str(tmp_path / "both")]) == 0, capsys.readouterr().err
    both = (tmp_path / "both" / "report.md").read_text()
    assert "## Sweep grid" in both and "## Single runs" in both
    assert "1 run stored by `core run --database` (1 ok)" in both  # one run, not "1 runs"
    assert main(["report", str(database), "--sweep", "grid", "--output", str(tmp_path / "one")]) == 0
    assert "Single runs" not in (tmp_path / "one" / "report.md").read_text()


def test_core_report_of_an_empty_database_names_both_ways_to_fill_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    ResultStore(tmp_path / "core.db").close()
    assert main(["report", str(tmp_path / "core.db"), "--output", str(tmp_path / "r")]) == 2
    assert "no sweeps or single runs to report" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_core_run_with_a_bad_database_exits_2_before_the_run(
    spy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    _write(tmp_path / "notes.txt", "not a database")
    assert main([*CLI_RUN, *extra, "--database", str(tmp_path / "notes.txt")]) == 2
    captured = capsys.readouterr()
    assert f"invalid database (--database) = '{tmp_path / 'notes.txt'}'" in captured.err
    assert "is not a SQLite database" in captured.err and "Traceback" not in captured.err
    assert spy.touched == 0 and (tmp_path / "notes.txt").read_text() == "not a database"


def test_core_run_dry_run_writes_no_database(spy: Any, tmp_path: Path) -> None:
    assert main([*CLI_RUN, "--dry-run", "--database", str(tmp_path / "new" / "core.db")]) == 0
    assert not (tmp_path / "new").exists()


def test_core_run_while_a_sweep_holds_the_database_exits_2(
    spy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SweepLock(tmp_path / "core.db", "long-sweep"):
        assert main([*CLI_RUN, "--database", str(tmp_path / "core.db")]) == 2
    captured = capsys.readouterr()
    assert "in use by sweep 'long-sweep'" in captured.err and captured.out == ""
    assert spy.touched == 0


def test_core_run_prints_the_result_when_the_database_refuses_it(
    spy: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(self: ResultStore, result: RunResult, **kwargs: Any) -> int:
        raise StoreWriteError(f"cannot write results database {self.path}: its disk is full")

    monkeypatch.setattr(ResultStore, "add", full_disk)
    output = tmp_path / "result.json"
    code = main([*CLI_RUN, "--database", str(tmp_path / "core.db"), "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 1
    assert "fcnn on spy-device" in captured.out and "throughput" in captured.out
    assert "its disk is full" in captured.err and f"the result is in {output}" in captured.err
    assert RunResult.model_validate_json(output.read_text()).status.ok


# --- helpers ------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _foreign(path: Path) -> Path:
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE notes (body TEXT)")
    connection.commit()
    connection.close()
    return path


def _contents(path: Path) -> Any:
    if path.is_dir():
        return sorted(item.name for item in path.iterdir())
    return path.read_bytes() if path.exists() else None


@pytest.mark.slow
def test_a_run_stopped_by_its_time_limit_is_stored_with_the_timeout(tmp_path: Path) -> None:
    from core.testing import TINY_FCNN

    database = tmp_path / "core.db"
    with registered_plugins():
        # A limit far below what a fresh interpreter needs to import torch: the child is stopped.
        result = run(
            "fcnn",
            "cpu",
            timeout_seconds=0.5,
            database=database,
            **{**OPTIONS, "workload_options": TINY_FCNN},
        )
    assert result.status.state is RunState.timeout
    with ResultStore(database, create=False) as store:
        [single] = store.runs(single=True)
    assert single.result.status.state is RunState.timeout and single.cell_label.startswith("fcnn on cpu: ")
    with SweepLock(database, "after"):  # the run let go of the database
        pass
