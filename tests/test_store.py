"""The results database: round trips, one row per (sweep, cell, repeat), durability, exports."""

from __future__ import annotations

import csv
import io
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import synthetic_result

from core.base.results import RunResult
from core.cli import main
from core.storage.store import EXPORT_COLUMNS, ResultStore, StoreError
from core.storage.summary import SPREAD_FLAG_FRACTION, summarise


def filled_store(path: Path) -> ResultStore:
    store = ResultStore(path)
    for repeat, throughput in enumerate((100.0, 104.0, 98.0)):
        store.add(
            synthetic_result(micro_batch_size=8, throughput=throughput),
            sweep="s",
            cell_key="a",
            cell_label="micro_batch_size=8",
            repeat=repeat,
            process_seconds=3.0,
        )
    for repeat, throughput in enumerate((200.0, 260.0)):
        store.add(
            synthetic_result(micro_batch_size=16, precision="bf16", throughput=throughput),
            sweep="s",
            cell_key="b",
            cell_label="micro_batch_size=16",
            repeat=repeat,
        )
    store.add(
        synthetic_result(micro_batch_size=1 << 24, state="oom", message="can't allocate memory"),
        sweep="s",
        cell_key="c",
        cell_label="micro_batch_size=16777216",
        repeat=0,
    )
    store.add(synthetic_result(micro_batch_size=8), sweep="other", cell_key="a", repeat=0)
    return store


def test_a_result_comes_back_as_the_same_model(tmp_path: Path) -> None:
    result = synthetic_result(micro_batch_size=32, precision="bf16", samples_per_watt_hour=5e5)
    with ResultStore(tmp_path / "r.db") as store:
        store.add(result, sweep="s", cell_key="k", cell_label="label", repeat=0, process_seconds=1.5)
        (back,) = store.results()
        (run,) = store.runs()
    assert isinstance(back, RunResult) and back.model_dump() == result.model_dump()
    assert (run.sweep, run.cell_key, run.cell_label, run.repeat, run.process_seconds) == ("s", "k", "label", 0, 1.5)


def test_indexed_columns_and_write_ahead_log(tmp_path: Path) -> None:
    filled_store(tmp_path / "r.db").close()
    connection = sqlite3.connect(tmp_path / "r.db")
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    row = connection.execute(
        "SELECT workload, accelerator, precision, micro_batch_size, replicas, status, "
        "throughput_per_second, result_json FROM runs WHERE cell_key = 'b' AND repeat = 1"
    ).fetchone()
    assert row[:7] == ("fcnn", "cpu", "bf16", 16, 1, "ok", 260.0)
    assert json.loads(row[7])["throughput_per_second"] == 260.0
    indexes = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"runs_by_sweep", "runs_by_placement", "runs_by_status"} <= indexes


def test_a_repeat_is_recorded_once(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "r.db")
    with pytest.raises(StoreError, match="already has repeat 0"):
        store.add(synthetic_result(micro_batch_size=8), sweep="s", cell_key="a", repeat=0)
    run_id = store.add(
        synthetic_result(micro_batch_size=1 << 24, throughput=5.0), sweep="s", cell_key="c", repeat=0, replace=True
    )
    assert store.count("s") == 6
    (replaced,) = [run for run in store.runs(sweep="s") if run.cell_key == "c"]
    assert replaced.run_id == run_id and replaced.result.status.ok and replaced.result.throughput_per_second == 5.0


def test_filters(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "r.db")
    assert len(store.results(sweep="s")) == 6 and len(store.results()) == 7
    assert len(store.results(sweep=["s", "other"])) == 7
    assert [r.config.micro_batch_size for r in store.results(status="oom")] == [1 << 24]
    assert {r.config.precision.value for r in store.results(sweep="s", precision="bf16")} == {"bf16"}
    assert store.finished("s")[("c", 0)] == "oom"
    assert store.sweep_names() == ["s", "other"]


def test_cells_have_median_and_flagged_spread(tmp_path: Path) -> None:
    cells = {cell.cell_key: cell for cell in summarise(filled_store(tmp_path / "r.db").runs(sweep="s"))}
    a, b, c = cells["a"], cells["b"], cells["c"]
    assert a.throughput_per_second == 100.0 and a.spread == pytest.approx(6 / 100) and not a.flagged
    assert b.throughput_per_second == 230.0 and b.spread == pytest.approx(60 / 230) and b.flagged
    assert b.spread > SPREAD_FLAG_FRACTION
    assert c.status == "oom" and c.throughput_per_second is None and c.spread is None and c.repeats_ok == 0


def test_a_committed_run_survives_sigkill(tmp_path: Path) -> None:
    """The process that wrote the row dies with SIGKILL straight after add(): the row is there."""
    code = (
        "import os, signal, sys; sys.path.insert(0, sys.argv[2]); from synthetic import synthetic_result; "
        "from core.storage.store import ResultStore; store = ResultStore(sys.argv[1]); "
        "store.add(synthetic_result(throughput=123.0), sweep='k', cell_key='x', repeat=0); "
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "r.db"), str(Path(__file__).parent)], capture_output=True, text=True
    )
    assert completed.returncode == -signal.SIGKILL, completed.stderr
    with ResultStore(tmp_path / "r.db") as store:
        (result,) = store.results(sweep="k")
    assert result.throughput_per_second == 123.0


def test_a_newer_layout_is_refused(tmp_path: Path) -> None:
    ResultStore(tmp_path / "r.db").close()
    connection = sqlite3.connect(tmp_path / "r.db")
    connection.execute("PRAGMA user_version = 99")
    connection.commit()
    connection.close()
    with pytest.raises(StoreError, match="upgrade core"):
        ResultStore(tmp_path / "r.db")


def test_csv_export(tmp_path: Path) -> None:
    store = filled_store(tmp_path / "r.db")
    assert store.export_csv(tmp_path / "out" / "runs.csv", sweep="s") == 6
    with open(tmp_path / "out" / "runs.csv", newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert tuple(rows[0]) == EXPORT_COLUMNS and len(rows) == 6
    assert [float(row["throughput_per_second"]) for row in rows[:3]] == [100.0, 104.0, 98.0]
    assert rows[-1]["status"] == "oom" and rows[-1]["throughput_per_second"] == ""
    assert rows[-1]["status_message"] == "can't allocate memory"


def test_parquet_export_and_dataframe(tmp_path: Path) -> None:
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    pandas = pytest.importorskip("pandas")
    store = filled_store(tmp_path / "r.db")
    assert store.export_parquet(tmp_path / "runs.parquet", sweep="s") == 6
    table = pyarrow_parquet.read_table(tmp_path / "runs.parquet")
    assert table.column_names == list(EXPORT_COLUMNS) and table.num_rows == 6
    assert table.column("throughput_per_second").to_pylist()[:3] == [100.0, 104.0, 98.0]
    frame = store.dataframe(sweep="s")
    assert list(frame.columns) == list(EXPORT_COLUMNS) and len(frame) == 6
    assert frame.groupby("cell_key")["throughput_per_second"].median()["a"] == 100.0
    assert isinstance(frame["started_at"].dtype, pandas.DatetimeTZDtype)


def test_results_command_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "r.db"
    filled_store(database).close()
    assert main(["results", "--database", str(database), "--sweep", "s"]) == 0
    summary = capsys.readouterr().out
    assert "micro_batch_size=16777216  oom" in summary and "230" in summary and "(flagged)" in summary
    assert main(["results", "--database", str(database), "--format", "csv", "--status", "ok"]) == 0
    assert len(list(csv.DictReader(io.StringIO(capsys.readouterr().out)))) == 6
    assert main(["results", "--database", str(database), "--format", "json", "--sweep", "other"]) == 0
    (document,) = json.loads(capsys.readouterr().out)
    assert document["sweep"] == "other" and RunResult.model_validate(document["result"]).status.ok
    assert main(["results", "--database", str(database), "--format", "parquet"]) == 2
    assert "needs --output" in capsys.readouterr().err
    assert main(["results", "--database", str(tmp_path / "missing.db")]) == 2
    assert "no results database" in capsys.readouterr().err
