"""The results database: one SQLite row per run, indexed columns beside the full result JSON.

SQLite because it is in the standard library, is one file, and makes every insert an atomic
transaction: a sweep killed with SIGKILL loses only the run it had not finished. The database
runs in WAL mode with ``synchronous=FULL``, and each result is committed on its own.
"""

from __future__ import annotations

import csv
import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from core.errors import CoreError
from core.results import RunResult

DEFAULT_DATABASE = Path("results") / "core.db"
DATABASE_ENVIRONMENT_VARIABLE = "CORE_DATABASE"
STORE_SCHEMA_VERSION = 1  # PRAGMA user_version: the layout of the tables below

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    sweep TEXT,
    cell_key TEXT,
    cell_label TEXT,
    repeat INTEGER,
    workload TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    framework TEXT NOT NULL,
    precision TEXT NOT NULL,
    micro_batch_size INTEGER,
    gradient_accumulation INTEGER NOT NULL,
    replicas INTEGER NOT NULL,
    devices_per_replica INTEGER NOT NULL,
    compile INTEGER NOT NULL,
    samples_per_update INTEGER NOT NULL,
    status TEXT NOT NULL,
    status_message TEXT,
    throughput_per_second REAL,
    energy_joules REAL,
    samples_per_watt_hour REAL,
    flops_per_second REAL,
    model_flops_utilization REAL,
    process_seconds REAL,
    started_at TEXT NOT NULL,
    recorded_at TEXT NOT NULL,
    schema_version TEXT NOT NULL,
    result_json TEXT NOT NULL,
    UNIQUE (sweep, cell_key, repeat)
);
CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep, cell_key, repeat);
CREATE INDEX IF NOT EXISTS runs_by_placement ON runs (workload, accelerator, precision, micro_batch_size, replicas);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status);
CREATE TABLE IF NOT EXISTS sweeps (
    name TEXT PRIMARY KEY,
    source TEXT,
    spec_json TEXT NOT NULL,
    cells_json TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
"""

# The columns of a flat export (CSV, Parquet, DataFrame), in order: what people sort and plot by.
EXPORT_COLUMNS = (
    "sweep", "cell_key", "cell_label", "repeat", "status", "status_phase", "status_message",
    "workload", "accelerator", "framework", "precision", "micro_batch_size", "gradient_accumulation",
    "replicas", "devices_per_replica", "device_iterations", "compile", "steps", "warmup_steps",
    "samples_per_update", "world_size", "setup_seconds", "first_step_seconds", "warmup_seconds",
    "window_seconds", "throughput_per_second", "step_seconds_median", "step_seconds_p90",
    "parameter_count", "flops_per_sample", "flops_per_second", "model_flops_utilization",
    "energy_joules", "samples_per_watt_hour", "energy_unavailable_reason", "workload_options",
    "accelerator_options", "hostname", "started_at", "process_seconds", "run_id",
)


class StoreError(CoreError):
    """The database cannot be opened or read, or an export needs a library that is missing."""


@dataclass(frozen=True)
class StoredRun:
    """One row: where the run belongs (sweep, cell, repeat) and its full result."""

    run_id: int
    sweep: str | None
    cell_key: str | None
    cell_label: str | None
    repeat: int | None
    process_seconds: float | None
    recorded_at: datetime
    result: RunResult


@dataclass(frozen=True)
class SweepRecord:
    """What a sweep was asked to run: its spec and every cell, including ones refused by validation."""

    name: str
    source: str | None
    spec: dict[str, Any]
    cells: list[dict[str, Any]]
    created_at: datetime
    updated_at: datetime


def default_database() -> Path:
    """``$CORE_DATABASE`` if set, else results/core.db under the working directory."""
    return Path(os.environ.get(DATABASE_ENVIRONMENT_VARIABLE) or DEFAULT_DATABASE)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _optional(value: Any) -> Any:
    return getattr(value, "value", value)


class ResultStore:
    """The results database at ``path`` (created on first use).

        store = ResultStore("results/core.db")
        for result in store.results(sweep="fcnn-cpu", status="ok"):
            print(result.config.micro_batch_size, result.throughput_per_second)
        frame = store.dataframe(sweep="fcnn-cpu")   # needs pandas
    """

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            raise StoreError(f"no results database at {self.path}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._connection = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            self._connection.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed run survives a power cut too, not only a killed process.
            self._connection.execute("PRAGMA synchronous=FULL")
            version = self._connection.execute("PRAGMA user_version").fetchone()[0]
            if version > STORE_SCHEMA_VERSION:
                raise StoreError(f"{self.path} has database layout {version}; this core reads up to "
                                 f"{STORE_SCHEMA_VERSION}: upgrade core")
            with self._transaction():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._connection.execute(statement)
                self._connection.execute(f"PRAGMA user_version={STORE_SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open results database {self.path}: {exc}") from None

    # --- writing ---------------------------------------------------------------------------

    def _transaction(self) -> "_Transaction":
        return _Transaction(self._connection)

    def add(self, result: RunResult, *, sweep: str | None = None, cell_key: str | None = None,
            cell_label: str | None = None, repeat: int | None = None, process_seconds: float | None = None,
            replace: bool = False) -> int:
        """Insert one run in its own transaction and return its row id.

        :param replace: overwrite the row of the same (sweep, cell_key, repeat); without it such a
            row is an error, so a resumed sweep can never count a run twice.
        """
        config = result.config
        row = {
            "sweep": sweep, "cell_key": cell_key, "cell_label": cell_label, "repeat": repeat,
            "workload": result.workload, "accelerator": result.accelerator, "framework": result.framework,
            "precision": _optional(config.precision), "micro_batch_size": config.micro_batch_size,
            "gradient_accumulation": config.gradient_accumulation, "replicas": config.replicas,
            "devices_per_replica": config.devices_per_replica, "compile": int(config.compile),
            "samples_per_update": result.samples_per_update, "status": result.status.state.value,
            "status_message": result.status.message, "throughput_per_second": result.throughput_per_second,
            "energy_joules": result.energy_joules, "samples_per_watt_hour": result.samples_per_watt_hour,
            "flops_per_second": result.flops_per_second,
            "model_flops_utilization": getattr(result, "model_flops_utilization", None),
            "process_seconds": process_seconds, "started_at": result.started_at.isoformat(),
            "recorded_at": _now(), "schema_version": result.schema_version, "result_json": result.model_dump_json(),
        }
        columns = ", ".join(row)
        placeholders = ", ".join(f":{name}" for name in row)
        statement = f"INSERT INTO runs ({columns}) VALUES ({placeholders})"
        if replace and sweep is not None:
            updates = ", ".join(f"{name} = excluded.{name}" for name in row if name not in ("sweep", "cell_key", "repeat"))
            statement += f" ON CONFLICT (sweep, cell_key, repeat) DO UPDATE SET {updates}"
        try:
            with self._transaction():
                cursor = self._connection.execute(statement, row)
                if replace and sweep is not None:
                    found = self._connection.execute(
                        "SELECT id FROM runs WHERE sweep IS ? AND cell_key IS ? AND repeat IS ?",
                        (sweep, cell_key, repeat)).fetchone()
                    return int(found[0])
                return int(cursor.lastrowid or 0)
        except sqlite3.IntegrityError:
            raise StoreError(f"sweep {sweep!r} already has repeat {repeat} of cell {cell_label or cell_key!r}") from None

    def save_sweep(self, name: str, spec: dict[str, Any], cells: list[dict[str, Any]], source: str | None) -> None:
        """Record (or update) what a sweep asked for, so reports can show refused cells too."""
        now = _now()
        with self._transaction():
            self._connection.execute(
                "INSERT INTO sweeps (name, source, spec_json, cells_json, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET source = excluded.source, "
                "spec_json = excluded.spec_json, cells_json = excluded.cells_json, updated_at = excluded.updated_at",
                (name, source, json.dumps(spec, sort_keys=True), json.dumps(cells), now, now))

    # --- reading ---------------------------------------------------------------------------

    def sweep(self, name: str) -> SweepRecord | None:
        row = self._connection.execute(
            "SELECT name, source, spec_json, cells_json, created_at, updated_at FROM sweeps WHERE name = ?",
            (name,)).fetchone()
        return None if row is None else _sweep_record(row)

    def sweeps(self) -> list[SweepRecord]:
        rows = self._connection.execute(
            "SELECT name, source, spec_json, cells_json, created_at, updated_at FROM sweeps ORDER BY created_at, name")
        return [_sweep_record(row) for row in rows]

    def sweep_names(self) -> list[str]:
        """Sweeps with a spec or with at least one run, in the order they were first seen."""
        names = [record.name for record in self.sweeps()]
        for (name,) in self._connection.execute(
                "SELECT sweep FROM runs WHERE sweep IS NOT NULL GROUP BY sweep ORDER BY MIN(id)"):
            if name not in names:
                names.append(name)
        return names

    def finished(self, sweep: str) -> dict[tuple[str, int], str]:
        """(cell_key, repeat) -> status of every run recorded for ``sweep``."""
        rows = self._connection.execute("SELECT cell_key, repeat, status FROM runs WHERE sweep = ?", (sweep,))
        return {(cell_key, repeat): status for cell_key, repeat, status in rows}

    def process_seconds(self, sweep: str) -> list[float]:
        rows = self._connection.execute(
            "SELECT process_seconds FROM runs WHERE sweep = ? AND process_seconds IS NOT NULL ORDER BY id", (sweep,))
        return [value for (value,) in rows]

    def count(self, sweep: str | None = None) -> int:
        if sweep is None:
            return int(self._connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        return int(self._connection.execute("SELECT COUNT(*) FROM runs WHERE sweep = ?", (sweep,)).fetchone()[0])

    def runs(self, *, sweep: str | list[str] | None = None, workload: str | None = None,
             accelerator: str | None = None, precision: str | None = None, status: str | None = None
             ) -> list[StoredRun]:
        """Rows matching every filter given, oldest first, each with its validated RunResult."""
        clauses, parameters = [], []
        for column, value in (("workload", workload), ("accelerator", accelerator),
                              ("precision", precision), ("status", status)):
            if value is not None:
                clauses.append(f"{column} = ?")
                parameters.append(_optional(value))
        if isinstance(sweep, str):
            clauses.append("sweep = ?")
            parameters.append(sweep)
        elif sweep is not None:
            clauses.append(f"sweep IN ({', '.join('?' for _ in sweep)})")
            parameters.extend(sweep)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._connection.execute(
            "SELECT id, sweep, cell_key, cell_label, repeat, process_seconds, recorded_at, result_json "
            f"FROM runs {where} ORDER BY id", parameters)
        return [StoredRun(run_id=row[0], sweep=row[1], cell_key=row[2], cell_label=row[3], repeat=row[4],
                          process_seconds=row[5], recorded_at=datetime.fromisoformat(row[6]),
                          result=RunResult.model_validate_json(row[7])) for row in rows]

    def results(self, **filters: Any) -> list[RunResult]:
        """The results matching ``filters`` (see :meth:`runs`) as RunResult models."""
        return [run.result for run in self.runs(**filters)]

    # --- exports ---------------------------------------------------------------------------

    def records(self, **filters: Any) -> list[dict[str, Any]]:
        """Flat rows (EXPORT_COLUMNS) for CSV, Parquet and DataFrames."""
        return [flat_record(run) for run in self.runs(**filters)]

    def dataframe(self, **filters: Any) -> Any:
        """A pandas DataFrame of :meth:`records`; needs pandas (``pip install 'core[report]'``)."""
        try:
            import pandas
        except ImportError:
            raise StoreError("a DataFrame needs pandas: pip install 'core[report]'") from None
        frame = pandas.DataFrame.from_records(self.records(**filters), columns=list(EXPORT_COLUMNS))
        frame["started_at"] = pandas.to_datetime(frame["started_at"], utc=True)
        return frame

    def export_csv(self, output: str | Path | TextIO, **filters: Any) -> int:
        """Write :meth:`records` as CSV (standard library only); returns the number of rows."""
        records = self.records(**filters)
        if isinstance(output, (str, Path)):
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            with open(output, "w", newline="", encoding="utf-8") as stream:
                _write_csv(stream, records)
        else:
            _write_csv(output, records)
        return len(records)

    def export_parquet(self, output: str | Path, **filters: Any) -> int:
        """Write :meth:`records` as Parquet; needs pyarrow (or pandas with a Parquet engine)."""
        records = self.records(**filters)
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        try:
            import pyarrow
            import pyarrow.parquet
        except ImportError:
            pyarrow = None
        if pyarrow is not None:
            columns = {name: [record[name] for record in records] for name in EXPORT_COLUMNS}
            pyarrow.parquet.write_table(pyarrow.table(columns), str(output))
            return len(records)
        try:
            frame = self.dataframe(**filters)
            frame.to_parquet(output)
        except (StoreError, ImportError) as exc:
            raise StoreError(f"Parquet export needs pyarrow: pip install 'core[report]' ({exc})") from None
        return len(records)

    def export_json(self, output: TextIO, **filters: Any) -> int:
        """Write the full documents: [{sweep, cell_key, cell_label, repeat, result}, ...]."""
        runs = self.runs(**filters)
        documents = [{"run_id": run.run_id, "sweep": run.sweep, "cell_key": run.cell_key,
                      "cell_label": run.cell_label, "repeat": run.repeat, "process_seconds": run.process_seconds,
                      "result": run.result.model_dump(mode="json")} for run in runs]
        json.dump(documents, output, indent=2)
        output.write("\n")
        return len(runs)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT: takes the write lock up front, so two writers queue, not fail."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def __enter__(self) -> None:
        self._connection.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._connection.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _sweep_record(row: tuple[Any, ...]) -> SweepRecord:
    return SweepRecord(name=row[0], source=row[1], spec=json.loads(row[2]), cells=json.loads(row[3]),
                       created_at=datetime.fromisoformat(row[4]), updated_at=datetime.fromisoformat(row[5]))


def flat_record(run: StoredRun) -> dict[str, Any]:
    """One run as a flat dict of EXPORT_COLUMNS (options as JSON text)."""
    result, config = run.result, run.result.config
    return {
        "sweep": run.sweep, "cell_key": run.cell_key, "cell_label": run.cell_label, "repeat": run.repeat,
        "status": result.status.state.value, "status_phase": result.status.phase,
        "status_message": result.status.message, "workload": result.workload, "accelerator": result.accelerator,
        "framework": result.framework, "precision": _optional(config.precision),
        "micro_batch_size": config.micro_batch_size, "gradient_accumulation": config.gradient_accumulation,
        "replicas": config.replicas, "devices_per_replica": config.devices_per_replica,
        "device_iterations": config.device_iterations, "compile": config.compile, "steps": config.steps,
        "warmup_steps": config.warmup_steps, "samples_per_update": result.samples_per_update,
        "world_size": result.world_size, "setup_seconds": result.setup_seconds,
        "first_step_seconds": result.first_step_seconds, "warmup_seconds": result.warmup_seconds,
        "window_seconds": result.window_seconds, "throughput_per_second": result.throughput_per_second,
        "step_seconds_median": result.step_seconds_median, "step_seconds_p90": result.step_seconds_p90,
        "parameter_count": result.parameter_count, "flops_per_sample": result.flops_per_sample,
        "flops_per_second": result.flops_per_second,
        "model_flops_utilization": getattr(result, "model_flops_utilization", None),
        "energy_joules": result.energy_joules, "samples_per_watt_hour": result.samples_per_watt_hour,
        "energy_unavailable_reason": result.energy_unavailable_reason,
        "workload_options": json.dumps(dict(config.workload_options), sort_keys=True),
        "accelerator_options": json.dumps(dict(config.accelerator_options), sort_keys=True),
        "hostname": result.environment.hostname if result.environment else None,
        "started_at": result.started_at.isoformat(), "process_seconds": run.process_seconds,
        "run_id": run.run_id,
    }


def _write_csv(stream: TextIO, records: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(stream, fieldnames=list(EXPORT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
