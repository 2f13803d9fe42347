"""The SQLite file under the results database: its schema, opening it for writing or for reading
only, the checks that it is a whole results database of this core, transactions, and what a SQLite
error means for the user. :class:`core.storage.store.ResultStore` reads and writes through it.

SQLite because it is in the standard library, is one file, and makes every insert an atomic
transaction: a sweep killed with SIGKILL loses only the run it had not finished. The database
runs in WAL mode with ``synchronous=FULL``, and each result is committed on its own.

Opened for reading only (``core results``, ``core report``) the file is never written: SQLite's
``mode=ro``, falling back to ``immutable=1`` where the file's folder cannot take SQLite's
shared-memory file. A damaged database page, a full disk or a file that is no database is a
:class:`StoreError` naming the file, never a traceback.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from core.base.errors import CoreError
from core.base.files import describe_os_error

DEFAULT_DATABASE = Path("results") / "core.db"
STORE_SCHEMA_VERSION = 1  # PRAGMA user_version: the layout of the tables below
MINIMUM_FREE_BYTES = 1 << 20  # a sweep refuses to start on a disk with less room than this
REASON_CHARS = 300  # of a quoted SQLite message, or of a skipped row's reason
#: How long a writer waits for another writer's lock: sweeps and runs sharing a database queue.
WRITE_BUSY_SECONDS = 60.0
#: How long a reader waits: a core database is in WAL mode, where a writer never blocks a reader, so
#: a lock that lasts is another program's exclusive lock, and `core results` need not hang a minute.
READ_BUSY_SECONDS = 10.0

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS host_roofs (
    host TEXT NOT NULL,
    device TEXT NOT NULL,
    measured_at TEXT NOT NULL,
    roofs_json TEXT NOT NULL,
    PRIMARY KEY (host, device, measured_at)
);
"""


class UndecodableText(bytes):
    """A TEXT value of the database that is not UTF-8 (a bit flipped in a page, another program's
    write): its raw bytes. sqlite3's own decoding raised for the whole query, so one such row made
    the whole database unreadable; with this, the reader skips the one row, naming it."""

    @property
    def shown(self) -> EscapedText:
        """The text as UTF-8 where it is, each byte that is not written as ``\\xNN`` (never U+FFFD)."""
        return EscapedText(self.decode("utf-8", errors="backslashreplace"))

    def describe(self, column: str) -> str:
        """``result_json is not UTF-8 text (byte 0xff at offset 2: '{"\\xff')``: where it breaks."""
        try:
            self.decode("utf-8")
        except UnicodeDecodeError as error:
            start = error.start
        else:  # pragma: no cover - made only from text that does not decode
            start = 0
        around = UndecodableText(self[max(0, start - 24) : start + 24]).shown
        return f"{column} is not UTF-8 text (byte 0x{self[start]:02x} at offset {start}: '{around}')"


class EscapedText(str):
    """Text decoded from bytes that were not all UTF-8, each such byte written ``\\xNN``: shown
    between quotes as it is (``repr`` would double the backslashes)."""

    def quoted(self) -> str:
        return f"'{self}'"


def decode_text(data: bytes) -> str | UndecodableText:
    """The connections' ``text_factory``: a TEXT value as str, or, where it is not UTF-8, its bytes
    for the reader to skip the row it is in (see :class:`UndecodableText`)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(data)


def quoted_name(name: object, limit: int | None = None) -> str:
    """A sweep's name between quotes for a message (its first ``limit`` characters): ``repr``, or
    an :class:`EscapedText` as it is."""
    if isinstance(name, EscapedText):
        return EscapedText(name[:limit]).quoted()
    return repr(str(name)[:limit])


class StoreError(CoreError):
    """The database cannot be opened or read, or an export needs a library that is missing."""


class StoreWriteError(StoreError):
    """A run or a sweep could not be written (disk full, read-only file, damaged database)."""


def now() -> str:
    """The time now, as the database records it: ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat()


_STORE_COLUMNS: dict[str, set[str]] = {}


def _store_columns() -> dict[str, set[str]]:
    """The columns of each of the tables ``SCHEMA`` makes, read from SQLite itself (so they cannot drift)."""
    if not _STORE_COLUMNS:
        scratch = sqlite3.connect(":memory:")
        try:
            scratch.executescript(SCHEMA)
            for table in ("runs", "sweeps"):
                _STORE_COLUMNS[table] = {column for (_, column, *_) in scratch.execute(f"PRAGMA table_info({table})")}
        finally:
            scratch.close()
    return _STORE_COLUMNS


def _quoted(identifier: str) -> str:
    """An SQL identifier from another database quoted, so that any name is read as a name."""
    return '"' + identifier.replace('"', '""') + '"'


def check_writable(path: Path) -> None:
    """Refuse, before any run, a database that cannot take what a sweep will write."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocking = next((parent for parent in (folder, *folder.parents) if parent.exists()), None)
        not_a_folder = blocking is not None and not blocking.is_dir()
        why = f"{blocking} is not a directory" if not_a_folder else describe_os_error(exc)
        raise StoreError(f"cannot create the folder of results database {path}: {why}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(
            f"cannot write results database {path}: no permission to write in {folder} "
            "(SQLite keeps its log beside the database); `core results` and `core report` "
            "can still read it"
        )
    if path.exists() and not os.access(path, os.W_OK):
        raise StoreError(
            f"results database {path} is read-only; a sweep must write it "
            "(`core results` and `core report` can still read it)"
        )
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if free < MINIMUM_FREE_BYTES:
        raise StoreError(
            f"cannot write results database {path}: its disk is full ({free:,} bytes free); free some space first"
        )


def open_for_writing(path: Path) -> sqlite3.Connection:
    """The database at ``path``, checked, its tables made where missing; a StoreError naming it."""
    connection = None
    try:
        connection = sqlite3.connect(path, timeout=WRITE_BUSY_SECONDS, isolation_level=None)
        connection.text_factory = decode_text  # the store reads through this connection too
        # Checked before anything is written: another application's database is left as it was.
        check_database(path, connection, writing=True)
        connection.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed run survives a power cut too, not only a killed process.
        connection.execute("PRAGMA synchronous=FULL")
        with Transaction(connection):
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    connection.execute(statement)
            if connection.execute("PRAGMA user_version").fetchone()[0] != STORE_SCHEMA_VERSION:
                connection.execute(f"PRAGMA user_version={STORE_SCHEMA_VERSION}")
        return connection
    except BaseException as exc:
        if connection is not None:
            connection.close()
        if isinstance(exc, sqlite3.DatabaseError):
            raise StoreError(explain(path, exc, "open")) from None
        raise


def open_for_reading(path: Path) -> sqlite3.Connection:
    """The database at ``path``, checked, opened so that nothing can be written (a read-only folder
    or file system included); a StoreError naming it."""
    uri = path.absolute().as_uri()
    try:
        return _connect_read_only(path, f"{uri}?mode=ro")
    except sqlite3.OperationalError as exc:
        # SQLite says "unable to open" (no -shm file can be made beside a WAL database) or
        # "readonly database" (SQLITE_READONLY_DIRECTORY, the shared-memory file cannot be
        # written) when the folder is read-only: both are a read-only folder, not a fault.
        if "unable to open" not in str(exc) and "readonly" not in str(exc):
            raise StoreError(explain(path, exc, "open", waited=READ_BUSY_SECONDS)) from None
        # A database in WAL mode needs its shared-memory file (-shm), which a read-only folder
        # cannot take. Without a log to replay, the file alone is the whole database.
        log = Path(f"{path}-wal")
        if log.exists() and log.stat().st_size > 0:
            raise StoreError(
                f"cannot read results database {path}: its folder is read-only and it has "
                f"an unfinished write-ahead log ({log.name}) that SQLite cannot read without "
                f"writing beside it; copy {path.name} and {log.name} to a writable folder "
                "and read the copy"
            ) from None
    except sqlite3.DatabaseError as exc:  # no database at all, or a damaged one
        raise StoreError(explain(path, exc, "open", waited=READ_BUSY_SECONDS)) from None
    try:
        return _connect_read_only(path, f"{uri}?mode=ro&immutable=1")
    except sqlite3.DatabaseError as exc:
        raise StoreError(explain(path, exc, "open", waited=READ_BUSY_SECONDS)) from None


def _connect_read_only(path: Path, uri: str) -> sqlite3.Connection:
    connection = sqlite3.connect(uri, uri=True, timeout=READ_BUSY_SECONDS, isolation_level=None)
    connection.text_factory = decode_text
    try:
        check_database(path, connection, writing=False)
    except BaseException:
        connection.close()
        raise
    return connection


def check_database(path: Path, connection: sqlite3.Connection, *, writing: bool) -> None:
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
        raise StoreError(f"{path} is no results database of core: it is empty (no tables)")
    if tables and "runs" not in tables:
        listed = ", ".join(repr(name) for name in sorted(tables)[:10]) + (", ..." if len(tables) > 10 else "")
        raise StoreError(
            f"{path} is no results database of core: it is an SQLite database with the tables "
            f"{listed} and no table 'runs' (another application's?); give another --database"
        )
    for table, columns in _store_columns().items():
        if table not in tables and writing:
            continue  # made by open_for_writing
        missing = sorted(columns - tables.get(table, set()))
        if missing:
            named = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            lacks = f"no table {table!r}" if table not in tables else f"no column {named} in table {table!r}"
            raise StoreError(f"{path} is no results database of core: it has {lacks}; give another --database")
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version > STORE_SCHEMA_VERSION:
        raise StoreError(
            f"{path} has database layout {version}; this core reads up to {STORE_SCHEMA_VERSION}: upgrade core"
        )
    # Every page, read once (about a second per GB): a damaged page deeper in the file would
    # otherwise show only when a query reaches it, half-way through a report or a sweep. The
    # integrity check, not the quick one: only it compares each index with its table, and a
    # damaged index page that is still a well-formed b-tree hides runs from every query by sweep.
    problems = [text for (text,) in connection.execute("PRAGMA integrity_check(1)")]
    if problems != ["ok"]:
        first = " ".join(str(problems[0] if problems else "no answer").split()).replace("*** in database main *** ", "")
        damaged = explain(path, sqlite3.DatabaseError("database disk image is malformed"), "open")
        raise StoreError(f"{damaged} (SQLite's integrity_check: {first[:REASON_CHARS]})")


def explain(path: Path, error: sqlite3.DatabaseError, doing: str, *, waited: float = WRITE_BUSY_SECONDS) -> str:
    """What a SQLite error means for the user, naming the file. ``waited``: the seconds the
    connection waited for a lock (said when it stayed locked)."""
    text = str(error)
    lowered = text.lower()
    if "file is not a database" in lowered or "not a database" in lowered:
        return f"{path} is not a SQLite database ({text}); give another --database, or move the file out of the way"
    if "malformed" in lowered or "corrupt" in lowered:
        return (
            f"results database {path} is damaged ({text}); what can still be read can be copied "
            f"out with: sqlite3 {path} .recover | sqlite3 recovered.db"
        )
    if "readonly" in lowered or "read-only" in lowered:
        return (
            f"results database {path} is read-only ({text}); a sweep must write it "
            "(`core results` and `core report` can still read it)"
        )
    if "disk is full" in lowered or "disk full" in lowered:
        return f"cannot write results database {path}: its disk is full ({text})"
    if "unable to open" in lowered:
        return f"cannot open results database {path} ({text})"
    if "locked" in lowered or "busy" in lowered:
        held = f"stayed locked by another process for {waited:g} s ({text})"
        return f"results database {path} {held}; try again when it is done"
    return f"cannot {doing} results database {path}: {text}"


class Transaction:
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
