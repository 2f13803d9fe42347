"""The results database: one SQLite row per run, indexed columns beside the full result JSON.

:class:`ResultStore` reads and writes it; the SQLite file itself (schema, opening, checks) is
core.storage.database's, the lock core.storage.lock's, the exports core.storage.export's. Their
names are importable from here too.

Opened with ``create=False`` (``core results``, ``core report``) the database is read and never
written. A row that cannot be read back (damaged JSON, a layout this core does not know) is skipped
and listed in :attr:`ResultStore.skipped_rows`; a damaged database page, a full disk or a file that
is no database is a :class:`StoreError` naming the file, never a traceback.

A sweep holds :class:`SweepLock` (``fcntl.flock`` on ``<database>.lock``) for as long as it runs,
so a second sweep on the same database is refused instead of measuring beside the first; so does a
single run stored with ``core run --database`` (core.storage.single_runs), which has no sweep, cell
or repeat (NULL). The flat export's columns are declared with the figures in core.storage.metrics.
"""

from __future__ import annotations

import json
import os
import sqlite3
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from core.base.files import parse_json
from core.base.results import NEWER_SCHEMA_ERROR, RunResult
from core.base.roofs import MeasuredRoofs, read_measured_roofs
from core.storage import export
from core.storage.database import (
    DEFAULT_DATABASE,
    MINIMUM_FREE_BYTES,
    READ_BUSY_SECONDS,
    REASON_CHARS,
    STORE_SCHEMA_VERSION,
    WRITE_BUSY_SECONDS,
    StoreError,
    StoreWriteError,
    Transaction,
    UndecodableText,
    check_writable,
    explain,
    now,
    open_for_reading,
    open_for_writing,
    quoted_name,
)
from core.storage.lock import DatabaseInUseError, SweepLock, lock_path
from core.storage.metrics import EXPORT_COLUMNS

__all__ = [
    "DATABASE_ENVIRONMENT_VARIABLE",
    "DEFAULT_DATABASE",
    "EXPORT_COLUMNS",
    "MINIMUM_FREE_BYTES",
    "STORE_SCHEMA_VERSION",
    "DatabaseInUseError",
    "ResultStore",
    "SkippedRow",
    "StoreError",
    "StoreWriteError",
    "StoredRun",
    "SweepLock",
    "SweepRecord",
    "default_database",
    "lock_path",
    "unsaved_directory",
]

DATABASE_ENVIRONMENT_VARIABLE = "CORE_DATABASE"


@dataclass(frozen=True)
class SkippedRow:
    """A row that reading skipped because it cannot be parsed: which one, and why."""

    table: str  # "runs" or "sweeps"
    row: int | str  # the run's id, or the sweep's name
    sweep: str | None
    reason: str
    database: Path

    def __str__(self) -> str:
        what = (
            f"run {self.row}" + (f" of sweep {quoted_name(self.sweep)}" if self.sweep is not None else "")
            if self.table == "runs"
            else f"the settings of sweep {quoted_name(self.row)}"
        )
        return f"skipped {what} in {self.database}: {self.reason}"


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


def _optional(value: Any) -> Any:
    return getattr(value, "value", value)


class ResultStore:
    """The results database at ``path``.

        store = ResultStore("results/core.db")
        for result in store.results(sweep="fcnn-cpu", status="ok"):
            print(result.config.micro_batch_size, result.throughput_per_second)
        frame = store.dataframe(sweep="fcnn-cpu")   # needs pandas

    :param create: make the database (and its folder) when missing. ``create=False`` also opens it
        for reading only, unless ``read_only=False`` says otherwise: nothing is written, so a
        read-only file, folder or file system can be read.
    :param read_only: open with SQLite's ``mode=ro``; :meth:`add` and :meth:`save_sweep` then fail.
    :raises StoreError: naming the file, when it is a directory, no SQLite database, damaged, of a
        newer layout, cannot be written (for writing: read-only, or its disk nearly full).
    """

    def __init__(self, path: str | Path, *, create: bool = True, read_only: bool | None = None) -> None:
        self.path = Path(path)
        self.read_only = (not create) if read_only is None else read_only
        # Rows that reading skipped, each once: see runs(). Reports and `core results` show them.
        self.skipped_rows: list[SkippedRow] = []
        self._skipped: set[tuple[str, int | str]] = set()
        self.runs_read = 0  # runs runs() gave back whole, for unreadable()
        if self.path.is_dir():
            raise StoreError(
                f"results database {self.path} is a directory; give the path of a file, "
                f"e.g. {self.path / DEFAULT_DATABASE.name}"
            )
        if self.path.exists() and not self.path.is_file():
            raise StoreError(f"results database {self.path} is not a regular file")
        if (self.read_only or not create) and not self.path.exists():
            raise StoreError(f"no results database at {self.path}")
        if self.read_only:
            self._connection = self._open_for_reading()
        else:
            check_writable(self.path)
            self._connection = self._open_for_writing()

    def _open_for_writing(self) -> sqlite3.Connection:
        # A method, so a test can hand the store a connection that fails as a full disk would.
        return open_for_writing(self.path)

    def _open_for_reading(self) -> sqlite3.Connection:
        return open_for_reading(self.path)

    def _explain(self, error: sqlite3.DatabaseError, doing: str) -> str:
        return explain(self.path, error, doing, waited=READ_BUSY_SECONDS if self.read_only else WRITE_BUSY_SECONDS)

    def _rows(self, statement: str, parameters: Any = ()) -> list[tuple[Any, ...]]:
        """Every row of a query; a SQLite error (a damaged page) becomes a StoreError."""
        try:
            return self._connection.execute(statement, parameters).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreError(self._explain(exc, "read")) from None

    def _skip(self, table: str, row: int | str, sweep: str | None, error: BaseException) -> None:
        if (table, row) in self._skipped:
            return
        self._skipped.add((table, row))
        self.skipped_rows.append(
            SkippedRow(table=table, row=row, sweep=sweep, reason=_reason(error), database=self.path)
        )

    # --- writing ---------------------------------------------------------------------------

    def _transaction(self) -> Transaction:
        return Transaction(self._connection)

    def lock(self, sweep: str | None = None, *, run: str | None = None) -> SweepLock:
        """The sweep lock of this database (see :class:`SweepLock`), taken: ``with store.lock("s"): ...``;
        ``run``: taken for a single run, so described."""
        lock = SweepLock(self.path, sweep, run=run)
        lock.acquire()
        return lock

    def add(
        self,
        result: RunResult,
        *,
        sweep: str | None = None,
        cell_key: str | None = None,
        cell_label: str | None = None,
        repeat: int | None = None,
        process_seconds: float | None = None,
        replace: bool = False,
    ) -> int:
        """Insert one run in its own transaction and return its row id.

        :param sweep: the sweep it belongs to, with its ``cell_key`` and ``repeat``; None for a
            single run (core.storage.single_runs), which no other row can clash with.
        :param replace: overwrite the row of the same (sweep, cell_key, repeat); without it such a
            row is an error, so a resumed sweep can never count a run twice.
        """
        config = result.config
        row = {
            "sweep": sweep,
            "cell_key": cell_key,
            "cell_label": cell_label,
            "repeat": repeat,
            "workload": result.workload,
            "accelerator": result.accelerator,
            "framework": result.framework,
            "precision": _optional(config.precision),
            "micro_batch_size": config.micro_batch_size,
            "gradient_accumulation": config.gradient_accumulation,
            "replicas": config.replicas,
            "devices_per_replica": config.devices_per_replica,
            "compile": int(config.compile),
            "samples_per_update": result.samples_per_update,
            "status": result.status.state.value,
            "status_message": result.status.message,
            "throughput_per_second": result.throughput_per_second,
            "energy_joules": result.energy_joules,
            "samples_per_watt_hour": result.samples_per_watt_hour,
            "flops_per_second": result.flops_per_second,
            "model_flops_utilization": getattr(result, "model_flops_utilization", None),
            "process_seconds": process_seconds,
            "started_at": result.started_at.isoformat(),
            "recorded_at": now(),
            "schema_version": result.schema_version,
            "result_json": result.model_dump_json(),
        }
        columns = ", ".join(row)
        placeholders = ", ".join(f":{name}" for name in row)
        statement = f"INSERT INTO runs ({columns}) VALUES ({placeholders})"
        if replace and sweep is not None:
            updates = ", ".join(
                f"{name} = excluded.{name}" for name in row if name not in ("sweep", "cell_key", "repeat")
            )
            statement += f" ON CONFLICT (sweep, cell_key, repeat) DO UPDATE SET {updates}"
        try:
            with self._transaction():
                cursor = self._connection.execute(statement, row)
                if replace and sweep is not None:
                    found = self._connection.execute(
                        "SELECT id FROM runs WHERE sweep IS ? AND cell_key IS ? AND repeat IS ?",
                        (sweep, cell_key, repeat),
                    ).fetchone()
                    return int(found[0])
                return int(cursor.lastrowid or 0)
        except sqlite3.IntegrityError:
            raise StoreError(
                f"sweep {sweep!r} already has repeat {repeat} of cell {cell_label or cell_key!r}"
            ) from None
        except sqlite3.DatabaseError as exc:  # a full disk, a read-only or damaged file: nothing was written
            raise StoreWriteError(self._explain(exc, "write")) from None

    def save_sweep(self, name: str, spec: dict[str, Any], cells: list[dict[str, Any]], source: str | None) -> None:
        """Record (or update) what a sweep asked for, so reports can show refused cells too."""
        timestamp = now()
        if source is not None:  # a path's bytes that are not UTF-8 (surrogateescape), which SQLite's text cannot hold
            source = source.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        try:
            with self._transaction():
                self._connection.execute(
                    "INSERT INTO sweeps (name, source, spec_json, cells_json, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET source = excluded.source, "
                    "spec_json = excluded.spec_json, cells_json = excluded.cells_json, "
                    "updated_at = excluded.updated_at",
                    (name, source, json.dumps(spec, sort_keys=True), json.dumps(cells), timestamp, timestamp),
                )
        except sqlite3.DatabaseError as exc:
            raise StoreWriteError(self._explain(exc, "write")) from None

    def save_host_roofs(self, roofs: MeasuredRoofs) -> None:
        """Record the roofs measured on a host (``core roofs``), so a report built anywhere has them."""
        try:
            with self._transaction():
                self._connection.execute(
                    "INSERT OR REPLACE INTO host_roofs (host, device, measured_at, roofs_json) VALUES (?, ?, ?, ?)",
                    (roofs.host, roofs.device, roofs.measured_at, roofs.model_dump_json()),
                )
        except sqlite3.DatabaseError as exc:
            raise StoreWriteError(self._explain(exc, "write")) from None

    def forget_sweep(self, name: str) -> bool:
        """Remove sweep ``name``'s record if no run of it is stored (a sweep that never got going:
        its submission was refused); returns whether it was removed. Runs are never removed."""
        try:
            with self._transaction():
                removed = self._connection.execute(
                    "DELETE FROM sweeps WHERE name = ? AND NOT EXISTS (SELECT 1 FROM runs WHERE sweep = ?)",
                    (name, name),
                ).rowcount
        except sqlite3.DatabaseError as exc:
            raise StoreWriteError(self._explain(exc, "write")) from None
        return removed > 0

    # --- reading ---------------------------------------------------------------------------

    def sweep(self, name: str) -> SweepRecord | None:
        """What sweep ``name`` asked for; None when unknown, or when its record cannot be read
        (then it is in :attr:`skipped_rows`)."""
        rows = self._rows(
            "SELECT name, source, spec_json, cells_json, created_at, updated_at FROM sweeps WHERE name = ?", (name,)
        )
        records = self._sweep_records(rows)
        return records[0] if records else None

    def host_roofs(self) -> list[MeasuredRoofs]:
        """The roofs measured on each host and device, the latest of each; a row that is no measured
        record (or whose columns disagree with its record) is skipped into :attr:`skipped_rows`. A
        database written before the table existed has none."""
        if not self._rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'host_roofs'"):
            return []
        latest: dict[tuple[str, str], MeasuredRoofs] = {}
        for rowid, host, device, text in self._rows(
            "SELECT rowid, host, device, roofs_json FROM host_roofs ORDER BY measured_at"
        ):
            try:
                if not isinstance(text, (str, bytes)):
                    raise ValueError(f"roofs_json is {type(text).__name__}, not text")
                roofs = read_measured_roofs(text)
                if (roofs.host, roofs.device) != (host, device):
                    raise ValueError(f"its record is of host {roofs.host!r} and device {roofs.device!r}")
            except ValueError as exc:
                self._skip("host_roofs", rowid, None, exc)
                continue
            latest[(roofs.host, roofs.device)] = roofs
        return list(latest.values())

    def sweeps(self) -> list[SweepRecord]:
        return self._sweep_records(
            self._rows(
                "SELECT name, source, spec_json, cells_json, created_at, updated_at FROM sweeps "
                "ORDER BY created_at, name"
            )
        )

    def _sweep_records(self, rows: list[tuple[Any, ...]]) -> list[SweepRecord]:
        records = []
        for row in rows:
            try:
                records.append(_sweep_record(row))
            except (ValueError, TypeError, AttributeError) as exc:
                self._skip("sweeps", _name(row[0]) or "", _name(row[0]), exc)
        return records

    def sweep_names(self) -> list[str]:
        """Sweeps with a spec or with at least one run, in the order they were first seen.

        A name that is not UTF-8 text (a damaged page) names no sweep anyone can ask for: its
        record and each of its runs are left out, each in :attr:`skipped_rows`."""
        names = []
        for (name,) in self._rows("SELECT name FROM sweeps ORDER BY created_at, name"):
            if isinstance(name, UndecodableText):
                self._skip("sweeps", name.shown, name.shown, UnreadableRow(name.describe("name")))
            elif name not in names:
                names.append(name)
        for (name,) in self._rows("SELECT sweep FROM runs WHERE sweep IS NOT NULL GROUP BY sweep ORDER BY MIN(id)"):
            if isinstance(name, UndecodableText):
                self._skip_runs_of(name)
            elif name not in names:
                names.append(name)
        return names

    def _skip_runs_of(self, sweep: UndecodableText) -> None:
        """Each run of a sweep whose name is not UTF-8, in :attr:`skipped_rows`."""
        # Bound as a BLOB and cast: the same bytes, compared byte for byte with the TEXT column.
        for (run_id,) in self._rows("SELECT id FROM runs WHERE sweep = CAST(? AS TEXT) ORDER BY id", (bytes(sweep),)):
            self._skip("runs", run_id, sweep.shown, UnreadableRow(sweep.describe("sweep")))

    def matching_sweeps(self, name: str) -> list[str]:
        """The sweeps recorded under ``name`` as Unicode spells it either way: composed (NFC, as
        core writes names: "é") or decomposed ("e" and a combining accent, as some keyboards,
        file systems and shells give it). Empty when there is none."""
        wanted = unicodedata.normalize("NFC", name)
        return [known for known in self.sweep_names() if unicodedata.normalize("NFC", known) == wanted]

    def finished(self, sweep: str) -> dict[tuple[str, int], str]:
        """(cell_key, repeat) -> status of every run recorded for ``sweep``.

        A run whose cell key is not UTF-8 text (a damaged page) is of no cell: it is left out, in
        :attr:`skipped_rows`, and its repeat runs again beside it. One whose status is not UTF-8
        still holds its repeat, with the status its result gives (escaped where that cannot be read)."""
        rows = self._rows("SELECT id, cell_key, repeat, status FROM runs WHERE sweep = ?", (sweep,))
        finished = {}
        for run_id, cell_key, repeat, status in rows:
            if isinstance(cell_key, UndecodableText):
                self._skip("runs", run_id, sweep, UnreadableRow(cell_key.describe("cell_key")))
                continue
            finished[(cell_key, repeat)] = self._status_of(run_id, status)
        return finished

    def _status_of(self, run_id: int, status: str | UndecodableText) -> str:
        """A run's status, from its result where the column is not UTF-8 (so a run that ended well
        does not stop its cell as a failure would)."""
        if not isinstance(status, UndecodableText):
            return status
        (text,) = self._rows("SELECT result_json FROM runs WHERE id = ?", (run_id,))[0]
        try:
            _check_columns((text,), (("result_json", (str, bytes)),))
            return RunResult.model_validate_json(text).status.state.value
        except (ValueError, TypeError):
            return status.shown

    def process_seconds(self, sweep: str) -> list[float]:
        rows = self._rows(
            "SELECT process_seconds FROM runs WHERE sweep = ? AND process_seconds IS NOT NULL ORDER BY id", (sweep,)
        )
        return [value for (value,) in rows if isinstance(value, (int, float))]

    def count_single_runs(self) -> int:
        """Runs stored outside any sweep (``core run --database``, ``core.run(database=...)``)."""
        return int(self._rows("SELECT COUNT(*) FROM runs WHERE sweep IS NULL")[0][0])

    def count(self, sweep: str | None = None) -> int:
        if sweep is None:
            return int(self._rows("SELECT COUNT(*) FROM runs")[0][0])
        return int(self._rows("SELECT COUNT(*) FROM runs WHERE sweep = ?", (sweep,))[0][0])

    def runs(
        self,
        *,
        sweep: str | list[str] | None = None,
        workload: str | None = None,
        accelerator: str | None = None,
        precision: str | None = None,
        status: str | None = None,
        single: bool = False,
    ) -> list[StoredRun]:
        """Rows matching every filter given, oldest first, each with its validated RunResult.

        :param single: only single runs (``core run --database``: no sweep).

        A row that cannot be parsed (damaged JSON, a result layout this core does not read) is left
        out and added to :attr:`skipped_rows` with its id and the reason; a damaged database page
        is a :class:`StoreError`.
        """
        clauses, parameters = [], []
        for column, value in (
            ("workload", workload),
            ("accelerator", accelerator),
            ("precision", precision),
            ("status", status),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                parameters.append(_optional(value))
        if sweep is not None:
            asked = [sweep] if isinstance(sweep, str) else list(sweep)
            names = list(dict.fromkeys(known for name in asked for known in [name, *self.matching_sweeps(name)]))
            clauses.append(f"sweep IN ({', '.join('?' for _ in names)})")
            parameters.extend(names)
        if single:
            clauses.append("sweep IS NULL")
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._rows(
            "SELECT id, sweep, cell_key, cell_label, repeat, process_seconds, recorded_at, result_json "
            f"FROM runs {where} ORDER BY id",
            parameters,
        )
        runs = []
        for row in rows:
            try:
                _check_run_row(row)
                result = RunResult.model_validate_json(row[7])
                recorded_at = datetime.fromisoformat(row[6])
            except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
                self._skip("runs", row[0], _name(row[1]), exc)
                continue
            runs.append(
                StoredRun(
                    run_id=row[0],
                    sweep=row[1],
                    cell_key=row[2],
                    cell_label=row[3],
                    repeat=row[4],
                    process_seconds=row[5],
                    recorded_at=recorded_at,
                    result=result,
                )
            )
        self.runs_read += len(runs)
        return runs

    def unreadable(self) -> str | None:
        """Why nothing read from this database can be shown, or None: every run read so far was
        skipped as damaged (a page whose bytes changed but whose structure SQLite still accepts),
        so a report or a listing would be empty. Runs skipped only for being a newer core's are
        not damage: they are a warning."""
        damaged = [row for row in self.skipped_rows if row.table == "runs" and not row.reason.startswith(_NEWER)]
        if self.runs_read or not damaged:
            return None
        return (
            f"results database {self.path} is damaged: all {len(damaged)} runs read from it were skipped as unreadable "
            f"(first: run {damaged[0].row}: {damaged[0].reason}); what can still be read can be copied out with: "
            f"sqlite3 {self.path} .recover | sqlite3 recovered.db"
        )

    def results(self, **filters: Any) -> list[RunResult]:
        """The results matching ``filters`` (see :meth:`runs`) as RunResult models."""
        return [run.result for run in self.runs(**filters)]

    # --- exports ---------------------------------------------------------------------------

    def records(self, **filters: Any) -> list[dict[str, Any]]:
        """Flat rows (EXPORT_COLUMNS) for CSV, Parquet and DataFrames."""
        return export.records(self.runs(**filters))

    def dataframe(self, **filters: Any) -> Any:
        """A pandas DataFrame of :meth:`records`; needs pandas (``pip install 'core[report]'``)."""
        return export.dataframe(self.records(**filters))

    def export_csv(self, output: str | Path | TextIO, **filters: Any) -> int:
        """Write :meth:`records` as CSV (standard library only); returns the number of rows."""
        rows = self.records(**filters)
        export.write_csv(output, rows)
        return len(rows)

    def export_parquet(self, output: str | Path, **filters: Any) -> int:
        """Write :meth:`records` as Parquet; needs pyarrow (or pandas with a Parquet engine)."""
        rows = self.records(**filters)
        export.write_parquet(output, rows)
        return len(rows)

    def export_json(self, output: TextIO, **filters: Any) -> int:
        """Write the full documents: [{run_id, sweep, cell_key, cell_label, repeat, process_seconds, result}, ...]."""
        runs = self.runs(**filters)
        export.write_json(output, runs)
        return len(runs)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UnreadableRow(ValueError):
    """A row's value that is no value of its column (text that is not UTF-8, a number where text
    belongs): its message is the reason a skipped row gives."""


_NEWER = "written by a newer core"  # the start of the reason a newer core's row is skipped for

# runs() reads: id, sweep, cell_key, cell_label, repeat, process_seconds, recorded_at, result_json
_RUN_COLUMNS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("id", (int,)),
    ("sweep", (str, type(None))),
    ("cell_key", (str, type(None))),
    ("cell_label", (str, type(None))),
    ("repeat", (int, type(None))),
    ("process_seconds", (int, float, type(None))),
    ("recorded_at", (str,)),
    ("result_json", (str, bytes)),
)
_SWEEP_COLUMNS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("name", (str,)),
    ("source", (str, type(None))),
    ("spec_json", (str, bytes)),
    ("cells_json", (str, bytes)),
    ("created_at", (str,)),
    ("updated_at", (str,)),
)


_SQL_TYPES = {str: "text", bytes: "a blob", int: "an integer", float: "a real", type(None): "NULL"}


def _check_columns(row: tuple[Any, ...], columns: tuple[tuple[str, tuple[type, ...]], ...]) -> None:
    """Refuse a row with a value that is not of its column: text that is not UTF-8 (a damaged page),
    an integer where text belongs (a bit flipped in a record's header)."""
    for (column, types), value in zip(columns, row):
        if isinstance(value, UndecodableText):
            raise UnreadableRow(value.describe(column))
        if not isinstance(value, types):
            allowed = " or ".join(_SQL_TYPES[kind] for kind in types)
            raise UnreadableRow(f"{column} is {_SQL_TYPES.get(type(value), type(value).__name__)}, not {allowed}")


def _check_run_row(row: tuple[Any, ...]) -> None:
    _check_columns(row, _RUN_COLUMNS)


def _name(value: Any) -> str | None:
    """A sweep's name read from a row, for a skipped row's message: escaped where it is not UTF-8."""
    if isinstance(value, UndecodableText):
        return value.shown
    return value if value is None or isinstance(value, str) else str(value)


def _sweep_record(row: tuple[Any, ...]) -> SweepRecord:
    _check_columns(row, _SWEEP_COLUMNS)
    spec, cells = parse_json(row[2]), parse_json(row[3])
    if not isinstance(spec, dict):
        raise TypeError("spec_json is not a JSON object")
    if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
        raise TypeError("cells_json is not a JSON list of objects")
    return SweepRecord(
        name=row[0],
        source=row[1],
        spec=spec,
        cells=cells,
        created_at=datetime.fromisoformat(row[4]),
        updated_at=datetime.fromisoformat(row[5]),
    )


def _reason(error: BaseException) -> str:
    """Why a row could not be parsed, on one line and short."""
    errors = getattr(error, "errors", None)
    if isinstance(error, UnreadableRow):
        text = str(error)
    elif callable(errors):  # pydantic: the first problem, where it is, and how many more
        problems = errors()
        first = problems[0] if problems else {}
        where = ".".join(str(part) for part in first.get("loc", ()))
        text = (f"{where}: " if where else "") + str(first.get("msg", error))
        if len(problems) > 1:
            text += f" (and {len(problems) - 1} more)"
        prefixes = {"json_invalid": "result_json is not valid JSON: ", NEWER_SCHEMA_ERROR: ""}
        text = prefixes.get(str(first.get("type")), "the result does not fit this core's RunResult: ") + text
    else:
        text = f"{type(error).__name__}: {error}"
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def unsaved_directory(database: str | Path) -> Path:
    """Where a sweep saves a result its database could not take: ``<database>.unsaved/``."""
    return Path(f"{database}.unsaved")
