"""The results database: one SQLite row per run, indexed columns beside the full result JSON.

SQLite because it is in the standard library, is one file, and makes every insert an atomic
transaction: a sweep killed with SIGKILL loses only the run it had not finished. The database
runs in WAL mode with ``synchronous=FULL``, and each result is committed on its own.

Opened with ``create=False`` (``core results``, ``core report``) the database is read and never
written: SQLite's ``mode=ro``, falling back to ``immutable=1`` where the file's folder cannot take
SQLite's shared-memory file. A row that cannot be read back (damaged JSON, a layout this core does
not know) is skipped and listed in :attr:`ResultStore.skipped_rows`; a damaged database page, a
full disk or a file that is no database is a :class:`StoreError` naming the file, never a traceback.

A sweep holds :class:`SweepLock` (``fcntl.flock`` on ``<database>.lock``) for as long as it runs,
so a second sweep on the same database is refused instead of measuring beside the first; so does a
single run stored with ``core run --database`` (core.storage.single_runs), which has no sweep, cell
or repeat (NULL). The flat export's columns are declared with the figures in core.storage.metrics.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import socket
import sqlite3
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from core.base.errors import CoreError
from core.base.files import describe_os_error, json_text
from core.base.results import NEWER_SCHEMA_ERROR, RunResult
from core.storage.metrics import EXPORT_COLUMNS, flat_record

DEFAULT_DATABASE = Path("results") / "core.db"
DATABASE_ENVIRONMENT_VARIABLE = "CORE_DATABASE"
STORE_SCHEMA_VERSION = 1  # PRAGMA user_version: the layout of the tables below
MINIMUM_FREE_BYTES = 1 << 20  # a sweep refuses to start on a disk with less room than this
_REASON_CHARS = 300  # of a skipped row's reason

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


class StoreError(CoreError):
    """The database cannot be opened or read, or an export needs a library that is missing."""


class StoreWriteError(StoreError):
    """A run or a sweep could not be written (disk full, read-only file, damaged database)."""


class DatabaseInUseError(StoreError):
    """Another sweep holds the database's lock; ``holder`` is what it recorded (pid, host, sweep, since)."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


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
            f"run {self.row}" + (f" of sweep {self.sweep!r}" if self.sweep is not None else "")
            if self.table == "runs"
            else f"the settings of sweep {self.row!r}"
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


_STORE_COLUMNS: dict[str, set[str]] = {}


def _store_columns() -> dict[str, set[str]]:
    """The columns of each of the tables ``_SCHEMA`` makes, read from SQLite itself (so they cannot drift)."""
    if not _STORE_COLUMNS:
        scratch = sqlite3.connect(":memory:")
        try:
            scratch.executescript(_SCHEMA)
            for table in ("runs", "sweeps"):
                _STORE_COLUMNS[table] = {column for (_, column, *_) in scratch.execute(f"PRAGMA table_info({table})")}
        finally:
            scratch.close()
    return _STORE_COLUMNS


def _quoted(identifier: str) -> str:
    """An SQL identifier from another database quoted, so that any name is read as a name."""
    return '"' + identifier.replace('"', '""') + '"'


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


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
            self._check_writable()
            self._connection = self._open_for_writing()

    def _check_writable(self) -> None:
        """Refuse, before any run, a database that cannot take what a sweep will write."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocking = next((parent for parent in (folder, *folder.parents) if parent.exists()), None)
            why = (
                f"{blocking} is not a directory"
                if blocking is not None and not blocking.is_dir()
                else describe_os_error(exc)
            )
            raise StoreError(f"cannot create the folder of results database {self.path}: {why}") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise StoreError(
                f"cannot write results database {self.path}: no permission to write in {folder} "
                "(SQLite keeps its log beside the database); `core results` and `core report` "
                "can still read it"
            )
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise StoreError(
                f"results database {self.path} is read-only; a sweep must write it "
                "(`core results` and `core report` can still read it)"
            )
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            return
        if free < MINIMUM_FREE_BYTES:
            raise StoreError(
                f"cannot write results database {self.path}: its disk is full ({free:,} bytes free); "
                "free some space first"
            )

    def _open_for_writing(self) -> sqlite3.Connection:
        connection = None
        try:
            connection = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            # Checked before anything is written: another application's database is left as it was.
            self._check_database(connection, writing=True)
            connection.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed run survives a power cut too, not only a killed process.
            connection.execute("PRAGMA synchronous=FULL")
            with _Transaction(connection):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        connection.execute(statement)
                if connection.execute("PRAGMA user_version").fetchone()[0] != STORE_SCHEMA_VERSION:
                    connection.execute(f"PRAGMA user_version={STORE_SCHEMA_VERSION}")
            return connection
        except BaseException as exc:
            if connection is not None:
                connection.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(self._explain(exc, "open")) from None
            raise

    def _open_for_reading(self) -> sqlite3.Connection:
        uri = self.path.absolute().as_uri()
        try:
            return self._connect_read_only(f"{uri}?mode=ro")
        except sqlite3.OperationalError as exc:
            # SQLite says "unable to open" (no -shm file can be made beside a WAL database) or
            # "readonly database" (SQLITE_READONLY_DIRECTORY, the shared-memory file cannot be
            # written) when the folder is read-only: both are a read-only folder, not a fault.
            if "unable to open" not in str(exc) and "readonly" not in str(exc):
                raise StoreError(self._explain(exc, "open")) from None
            # A database in WAL mode needs its shared-memory file (-shm), which a read-only folder
            # cannot take. Without a log to replay, the file alone is the whole database.
            log = Path(f"{self.path}-wal")
            if log.exists() and log.stat().st_size > 0:
                raise StoreError(
                    f"cannot read results database {self.path}: its folder is read-only and it has "
                    f"an unfinished write-ahead log ({log.name}) that SQLite cannot read without "
                    f"writing beside it; copy {self.path.name} and {log.name} to a writable folder "
                    "and read the copy"
                ) from None
        except sqlite3.DatabaseError as exc:  # no database at all, or a damaged one
            raise StoreError(self._explain(exc, "open")) from None
        try:
            return self._connect_read_only(f"{uri}?mode=ro&immutable=1")
        except sqlite3.DatabaseError as exc:
            raise StoreError(self._explain(exc, "open")) from None

    def _connect_read_only(self, uri: str) -> sqlite3.Connection:
        connection = sqlite3.connect(uri, uri=True, timeout=60.0, isolation_level=None)
        try:
            self._check_database(connection, writing=False)
        except BaseException:
            connection.close()
            raise
        return connection

    def _check_database(self, connection: sqlite3.Connection, *, writing: bool) -> None:
        """Refuse, when it is opened, a file that is not a whole results database of this core.

        Another application's SQLite database, a layout this core does not know and a damaged
        page anywhere in the file are found here, before anything is read or written: a damaged
        page found later would end a report or a sweep half-way (sqlite3 errors propagate).
        """
        tables = {
            name: {column for (_, column, *_) in connection.execute(f"PRAGMA table_info({_quoted(name)})")}
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if isinstance(name, str)
        }
        if not tables and not writing:
            raise StoreError(f"{self.path} is no results database of core: it is empty (no tables)")
        if tables and "runs" not in tables:
            listed = ", ".join(repr(name) for name in sorted(tables)[:10]) + (", ..." if len(tables) > 10 else "")
            raise StoreError(
                f"{self.path} is no results database of core: it is an SQLite database with the tables "
                f"{listed} and no table 'runs' (another application's?); give another --database"
            )
        for table, columns in _store_columns().items():
            if table not in tables and writing:
                continue  # made below
            missing = sorted(columns - tables.get(table, set()))
            if missing:
                named = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                lacks = f"no table {table!r}" if table not in tables else f"no column {named} in table {table!r}"
                raise StoreError(f"{self.path} is no results database of core: it has {lacks}; give another --database")
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > STORE_SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has database layout {version}; this core reads up to {STORE_SCHEMA_VERSION}: upgrade core"
            )
        # Every page, read once (about a second per GB): a damaged page deeper in the file would
        # otherwise show only when a query reaches it, half-way through a report or a sweep.
        problems = [text for (text,) in connection.execute("PRAGMA quick_check(1)")]
        if problems != ["ok"]:
            first = " ".join(str(problems[0] if problems else "no answer").split()).replace(
                "*** in database main *** ", ""
            )
            damaged = self._explain(sqlite3.DatabaseError("database disk image is malformed"), "open")
            raise StoreError(f"{damaged} (SQLite's quick_check: {first[:_REASON_CHARS]})")

    def _explain(self, error: sqlite3.DatabaseError, doing: str) -> str:
        """What a SQLite error means for the user, naming the file."""
        text = str(error)
        lowered = text.lower()
        if "file is not a database" in lowered or "not a database" in lowered:
            return (
                f"{self.path} is not a SQLite database ({text}); give another --database, "
                "or move the file out of the way"
            )
        if "malformed" in lowered or "corrupt" in lowered:
            return (
                f"results database {self.path} is damaged ({text}); what can still be read can be copied "
                f"out with: sqlite3 {self.path} .recover | sqlite3 recovered.db"
            )
        if "readonly" in lowered or "read-only" in lowered:
            return (
                f"results database {self.path} is read-only ({text}); a sweep must write it "
                "(`core results` and `core report` can still read it)"
            )
        if "disk is full" in lowered or "disk full" in lowered:
            return f"cannot write results database {self.path}: its disk is full ({text})"
        if "unable to open" in lowered:
            return f"cannot open results database {self.path} ({text})"
        if "locked" in lowered or "busy" in lowered:
            return f"results database {self.path} stayed locked by another process for 60 s ({text})"
        return f"cannot {doing} results database {self.path}: {text}"

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

    def _transaction(self) -> _Transaction:
        return _Transaction(self._connection)

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
            "recorded_at": _now(),
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
        now = _now()
        try:
            with self._transaction():
                self._connection.execute(
                    "INSERT INTO sweeps (name, source, spec_json, cells_json, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET source = excluded.source, "
                    "spec_json = excluded.spec_json, cells_json = excluded.cells_json, "
                    "updated_at = excluded.updated_at",
                    (name, source, json.dumps(spec, sort_keys=True), json.dumps(cells), now, now),
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
                self._skip("sweeps", row[0], row[0], exc)
        return records

    def sweep_names(self) -> list[str]:
        """Sweeps with a spec or with at least one run, in the order they were first seen."""
        names = [name for (name,) in self._rows("SELECT name FROM sweeps ORDER BY created_at, name")]
        for (name,) in self._rows("SELECT sweep FROM runs WHERE sweep IS NOT NULL GROUP BY sweep ORDER BY MIN(id)"):
            if name not in names:
                names.append(name)
        return names

    def matching_sweeps(self, name: str) -> list[str]:
        """The sweeps recorded under ``name`` as Unicode spells it either way: composed (NFC, as
        core writes names: "é") or decomposed ("e" and a combining accent, as some keyboards,
        file systems and shells give it). Empty when there is none."""
        wanted = unicodedata.normalize("NFC", name)
        return [known for known in self.sweep_names() if unicodedata.normalize("NFC", known) == wanted]

    def finished(self, sweep: str) -> dict[tuple[str, int], str]:
        """(cell_key, repeat) -> status of every run recorded for ``sweep``."""
        rows = self._rows("SELECT cell_key, repeat, status FROM runs WHERE sweep = ?", (sweep,))
        return {(cell_key, repeat): status for cell_key, repeat, status in rows}

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
                if not isinstance(row[7], (str, bytes)):
                    raise TypeError(f"result_json is {type(row[7]).__name__}, not text")
                result = RunResult.model_validate_json(row[7])
                recorded_at = datetime.fromisoformat(row[6])
            except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
                self._skip("runs", row[0], row[1], exc)
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
        return runs

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
        documents = [
            {
                "run_id": run.run_id,
                "sweep": run.sweep,
                "cell_key": run.cell_key,
                "cell_label": run.cell_label,
                "repeat": run.repeat,
                "process_seconds": run.process_seconds,
                "result": run.result.model_dump(mode="json"),
            }
            for run in runs
        ]
        output.write(json_text(documents, indent=2) + "\n")  # null, never NaN or Infinity: JSON has neither
        return len(runs)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT: takes the write lock up front, so two writers queue, not fail.

    A failed statement or COMMIT (a full disk) rolls back, if SQLite has not already, and the
    first error is what propagates.
    """

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def __enter__(self) -> None:
        self._connection.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            try:
                self._connection.execute("COMMIT")
                return
            except BaseException:
                self._rollback()
                raise
        self._rollback()

    def _rollback(self) -> None:
        if self._connection.in_transaction:
            try:
                self._connection.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite may have rolled back itself (SQLITE_FULL); the first error tells what happened


def _sweep_record(row: tuple[Any, ...]) -> SweepRecord:
    spec, cells = json.loads(row[2]), json.loads(row[3])
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
    if callable(errors):  # pydantic: the first problem, where it is, and how many more
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
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def lock_path(database: str | Path) -> Path:
    """The file a sweep locks beside its database: ``<database>.lock``."""
    return Path(f"{database}.lock")


def unsaved_directory(database: str | Path) -> Path:
    """Where a sweep saves a result its database could not take: ``<database>.unsaved/``."""
    return Path(f"{database}.unsaved")


class SweepLock:
    """An exclusive ``fcntl.flock`` on ``<database>.lock``, held by a sweep (or a single run stored
    with ``core run --database``) from start to end.

    A second sweep or run on the same database is refused at once (:class:`DatabaseInUseError`,
    naming the holder's pid, host and sweep or run) rather than measure beside the first and
    disturb both measurements. The kernel releases the lock when its holder ends in any way,
    ``kill -9`` included; the lock file stays (removing it would let two sweeps lock two
    different files).

    :param sweep: the sweep that holds it.
    :param run: a single run that holds it instead, described ("fcnn on cpu").
    """

    def __init__(self, database: str | Path, sweep: str | None = None, *, run: str | None = None) -> None:
        self.database = Path(database)
        self.path = lock_path(database)
        self.sweep = sweep
        self.run = run
        self._descriptor: int | None = None

    def acquire(self) -> None:
        import fcntl

        try:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise StoreError(
                f"cannot create the lock file {self.path} of results database {self.database}: {describe_os_error(exc)}"
            ) from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(descriptor)
            os.close(descriptor)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreError(
                    f"cannot lock results database {self.database} ({self.path}): {describe_os_error(exc)}"
                ) from None
            refused = "this run" if self.run is not None else "a second sweep"
            raise DatabaseInUseError(_in_use_message(self.database, holder, refused), holder) from None
        self._descriptor = descriptor
        note = {"pid": os.getpid(), "host": socket.gethostname(), "sweep": self.sweep, "since": _now()}
        if self.run is not None:
            note["run"] = self.run
        try:  # who holds it, for the message of the one refused; the lock holds without it
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (json.dumps(note) + "\n").encode("utf-8"), 0)
        except OSError:
            pass

    def release(self) -> None:
        if self._descriptor is None:
            return
        import fcntl

        descriptor, self._descriptor = self._descriptor, None
        try:
            os.ftruncate(descriptor, 0)
        except OSError:
            pass
        try:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)

    def __enter__(self) -> SweepLock:
        if self._descriptor is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(descriptor: int) -> dict[str, Any]:
    try:
        note = json.loads(os.pread(descriptor, 4096, 0).decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def _in_use_message(database: Path, holder: dict[str, Any], refused: str = "a second sweep") -> str:
    facts = [
        f"pid {holder['pid']}" if holder.get("pid") else "",
        f"on {holder['host']}" if holder.get("host") else "",
        f"since {holder['since']}" if holder.get("since") else "",
    ]
    if holder.get("sweep"):
        who = f"sweep {str(holder['sweep'])[:200]!r}"
    elif holder.get("run"):
        who = f"a run of {str(holder['run'])[:200]}"
    else:
        who = "another sweep"
    details = " ".join(fact for fact in facts if fact)
    what = "sweep" if refused == "a second sweep" else "run"
    return (
        f"results database {database} is in use by {who}"
        + (f" ({details})" if details else "")
        + f"; {refused} would run beside it and disturb both measurements. Wait for it to end, "
        f"or give this {what} another --database"
    )


def _write_csv(stream: TextIO, records: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(stream, fieldnames=list(EXPORT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
