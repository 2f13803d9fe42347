"""The results database and what reads it, under bad files and hostile data (issue 26, items 7 and 8).

A damaged or foreign file is one message and exit code 2 from every command that reads it; two
hosts' default databases report together; a result from a newer core is skipped with a warning;
``--baseline`` and ``--sweep`` say what there is when they match nothing (or match in either
Unicode form); the JSON export is JSON; and no name from a database reaches the terminal with a
control character it would obey.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result

import core.sweep.run
from core.base.results import SCHEMA_VERSION, EnvironmentInfo, RunResult
from core.cli import main
from core.storage.store import ResultStore, StoreError

SWEEP_FILE = """
name = "s"
repeats = 1
[grid]
workload = "fcnn"
micro_batch_size = [8, 16]
steps = 2
warmup_steps = 1
power_meter = "none"
[grid.workload_options]
layers = 2
hidden_width = 32
input_width = 16
output_width = 8
"""


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweeps here must be refused before anything runs."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a run started although the sweep should have been refused")

    monkeypatch.setattr(core.sweep.run, "run_in_process", refuse)


def filled(path: Path, runs: int = 40, sweep: str = "s", host: str | None = None) -> Path:
    """A database of ``runs`` runs of one sweep, checkpointed (the file alone is the whole database)."""
    with ResultStore(path) as store:
        for index in range(runs):
            result = synthetic_result(micro_batch_size=8 + index, throughput=10.0 + index)
            if host is not None:
                result.environment = EnvironmentInfo(
                    hostname=host, platform="Linux", python_version="3.11", core_version="0.2"
                )
            store.add(result, sweep=sweep, cell_key=str(index), cell_label=f"micro_batch_size={8 + index}", repeat=0)
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    return path


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "internal error" not in text, text


# --- 7. a damaged or foreign file: one message, exit 2, from every command ------------------------


def _random_bytes(path: Path) -> None:
    path.write_bytes(bytes((index * 7919 + 13) % 256 for index in range(8192)))


def _text(path: Path) -> None:
    path.write_text("name,throughput\nfcnn,12.5\n" * 200, encoding="utf-8")


def _truncated(path: Path) -> None:
    data = filled(path).read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _damaged_last_page(path: Path) -> None:
    """A page deep in the runs table (the last one written) overwritten: the header, the schema and
    the first pages read fine, so only a query that reaches that page would meet it."""
    filled(path)
    connection = sqlite3.connect(path)
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    pages = connection.execute("PRAGMA page_count").fetchone()[0]
    connection.close()
    with open(path, "r+b") as stream:
        stream.seek((pages - 1) * page_size)
        stream.write(b"\xa5" * page_size)


def _damaged_index(path: Path) -> None:
    """The sweep index's keys rewritten in place ('s' to 't'): every page is a well-formed b-tree,
    so quick_check passes, but a query by sweep finds no run and a report of sweep 's' is empty."""
    filled(path)
    connection = sqlite3.connect(path)
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    (root,) = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs_by_sweep'").fetchone()
    assert connection.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    connection.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * page_size
    page = data[start : start + page_size]
    data[start : start + page_size] = page.replace(b"s0", b"t0").replace(b"s1", b"t1").replace(b"s2", b"t2")
    path.write_bytes(bytes(data))


def _zero_length(path: Path) -> None:
    path.write_bytes(b"")


def _directory(path: Path) -> None:
    path.mkdir()


def _another_application(path: Path) -> None:
    """Another program's SQLite file, with its own user_version (Firefox's places.sqlite has 70+)."""
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
    connection.execute("INSERT INTO moz_places (url) VALUES ('https://example.org')")
    connection.execute("PRAGMA user_version = 70")
    connection.commit()
    connection.close()


def _another_runs_table(path: Path) -> None:
    """A table named runs that is not core's."""
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, command TEXT)")
    connection.execute("CREATE TABLE sweeps (name TEXT)")
    connection.commit()
    connection.close()


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "random bytes": (_random_bytes, "is not a SQLite database"),
    "a text file": (_text, "is not a SQLite database"),
    "a truncated database": (_truncated, "is damaged (database disk image is malformed)"),
    "a damaged page": (_damaged_last_page, "is damaged (database disk image is malformed)"),
    "a damaged index page": (_damaged_index, "is damaged (database disk image is malformed)"),
    "a zero-length file": (_zero_length, "is no results database of core: it is empty"),
    "a directory": (_directory, "is a directory"),
    "another application's database": (_another_application, "is no results database of core"),
    "another runs table": (_another_runs_table, "is no results database of core: it has no column"),
}


def _commands(sweep_file: Path, output: Path) -> dict[str, list[str]]:
    return {
        "results": ["results"],
        "results csv": ["results", "--format", "csv"],
        "report": ["report", "--output", str(output)],
        "dry run": ["sweep", str(sweep_file), "--dry-run"],
        "sweep": ["sweep", str(sweep_file)],
        "resume": ["sweep", str(sweep_file), "--resume"],
    }


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_file_that_is_no_whole_results_database_is_one_message_and_exit_2_everywhere(
    tmp_path: Path, kind: str, no_runs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    make, says = BROKEN[kind]
    database = tmp_path / "results.db"
    make(database)
    before = database.read_bytes() if database.is_file() else None
    sweep_file = tmp_path / "s.toml"
    sweep_file.write_text(SWEEP_FILE, encoding="utf-8")
    for name, command in _commands(sweep_file, tmp_path / "report").items():
        if kind == "a zero-length file" and name in ("sweep", "resume"):
            continue  # an empty file is an empty database, which a sweep may fill
        code = main([*command, "--database", str(database)])
        err = capsys.readouterr().err
        assert code == 2, (kind, name, err)
        assert "core: error: " in err and str(database) in err and says in err, (kind, name, err)
        no_traceback(err)
        if before is not None:  # nothing was written into it, not even WAL mode in its header
            assert database.read_bytes() == before, (kind, name)
    assert not (tmp_path / "report").exists()
    assert {path.name for path in tmp_path.iterdir()} <= {"results.db", "results.db.lock", "s.toml"}


def test_a_database_another_program_holds_locked_is_one_message_and_exit_2_for_every_reader(
    tmp_path: Path, no_runs: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import core.storage.database

    monkeypatch.setattr(core.storage.database, "READ_BUSY_SECONDS", 0.2)  # readers waited 60 s, as writers do
    database = filled(tmp_path / "r.db", runs=2)
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")  # another program's exclusive lock: readers cannot read
    sweep_file = tmp_path / "s.toml"
    sweep_file.write_text(SWEEP_FILE, encoding="utf-8")
    try:
        for name, command in _commands(sweep_file, tmp_path / "report").items():
            if name in ("sweep", "resume"):
                continue  # writers wait their 60 s for the lock
            assert main([*command, "--database", str(database)]) == 2, name
            err = capsys.readouterr().err
            assert f"core: error: results database {database} stayed locked by another process for 0.2 s" in err, err
            no_traceback(err)
    finally:
        holder.close()
    assert not (tmp_path / "report").exists()


def test_a_foreign_database_is_left_as_it_was_by_a_sweep(tmp_path: Path, no_runs: None) -> None:
    """Another application's database without a user_version: core used to add its tables to it."""
    database = tmp_path / "notes.db"
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE notes (text TEXT)")
    connection.commit()
    connection.close()
    before = database.read_bytes()
    with pytest.raises(StoreError, match=r"no results database of core: .* tables 'notes' and no table 'runs'"):
        ResultStore(database)
    assert database.read_bytes() == before


def test_a_damaged_page_is_found_when_the_database_is_opened(tmp_path: Path) -> None:
    database = tmp_path / "r.db"
    _damaged_last_page(database)
    with pytest.raises(StoreError, match=r"is damaged .* \.recover .*integrity_check"):
        ResultStore(database, create=False)
    with pytest.raises(StoreError, match="is damaged"):
        ResultStore(database)  # a sweep too, before it measures anything it could not store


def test_a_database_whose_every_run_is_damaged_is_no_empty_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes of every result changed in place: each page is still a well-formed b-tree, so the
    integrity check passes, and every row was skipped: an empty report or listing with exit 0."""
    database = filled(tmp_path / "r.db", runs=3)
    data = database.read_bytes()
    assert data.count(b'{"schema_version"') == 3
    database.write_bytes(data.replace(b'{"schema_version"', b'{\0schema_version"'))
    for command in (["results"], ["results", "--format", "json"], ["report", "--output", str(tmp_path / "report")]):
        assert main([*command, "--database", str(database)]) == 2, command
        err = capsys.readouterr().err
        assert f"core: error: results database {database} is damaged: all 3 runs read from it were skipped" in err
        assert "(first: run 1: result_json is not valid JSON" in err and ".recover" in err, err
        no_traceback(err)
    assert not (tmp_path / "report").exists()


def test_runs_of_a_newer_core_alone_are_a_warning_not_damage(tmp_path: Path) -> None:
    database = filled(tmp_path / "r.db", runs=1)
    _set_schema(database, 1, "99.0")
    assert main(["results", "--database", str(database)]) == 0
    with ResultStore(database, create=False) as store:
        assert store.runs() == [] and store.unreadable() is None


# --- 7. two hosts' default databases report together ----------------------------------------------


def test_two_hosts_default_databases_report_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    filled(tmp_path / "a" / "core.db", runs=3, host="host-a")
    filled(tmp_path / "b" / "core.db", runs=3, host="host-b")
    output = tmp_path / "report"
    code = main(["report", str(tmp_path / "a" / "core.db"), str(tmp_path / "b" / "core.db"), "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    markdown = (output / "report.md").read_text(encoding="utf-8")
    assert f"## Sweep s ({tmp_path / 'a' / 'core.db'})" in markdown
    assert f"## Sweep s ({tmp_path / 'b' / 'core.db'})" in markdown
    assert "Comparison across platforms and hosts" in markdown  # the two hosts ran the same cells
    plots = {path.name for path in (output / "plots").iterdir()}
    assert {"a-core-s-throughput-vs-batch-size.png", "b-core-s-throughput-vs-batch-size.png"} <= plots


def test_database_labels_tell_databases_apart() -> None:
    from core.report import database_labels

    assert database_labels([Path("a/core.db"), Path("b/core.db")]) == ["a-core", "b-core"]
    assert database_labels([Path("a100.db"), Path("gh200.db")]) == ["a100", "gh200"]
    assert database_labels([Path("x/a/core.db"), Path("y/a/core.db")]) == ["x-a-core", "y-a-core"]
    # Names that differ only in case are one file on some file systems: told apart by position.
    assert database_labels([Path("/r/A/core.db"), Path("/r/a/core.db")]) == ["database1", "database2"]


# --- 7. a result from a newer core is skipped with a warning --------------------------------------


def _set_schema(database: Path, run_id: int, version: Any) -> None:
    connection = sqlite3.connect(database)
    (text,) = connection.execute("SELECT result_json FROM runs WHERE id = ?", (run_id,)).fetchone()
    document = json.loads(text)
    document["schema_version"] = version
    connection.execute("UPDATE runs SET result_json = ? WHERE id = ?", (json.dumps(document), run_id))
    connection.commit()
    connection.close()


def test_a_result_of_a_newer_schema_is_skipped_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = filled(tmp_path / "r.db", runs=4)
    _set_schema(database, 2, "1.100")  # newer than 1.11 as numbers, though not as text
    _set_schema(database, 3, "2.0")
    _set_schema(database, 4, "1.0")  # an older layout reads
    with ResultStore(database, create=False) as store:
        assert [run.run_id for run in store.runs()] == [1, 4]
        reasons = [row.reason for row in store.skipped_rows]
    assert reasons == [
        f"written by a newer core: result schema 1.100, this core reads up to {SCHEMA_VERSION}; "
        "upgrade core to read it",
        f"written by a newer core: result schema 2.0, this core reads up to {SCHEMA_VERSION}; upgrade core to read it",
    ]
    assert main(["results", "--database", str(database), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("core: warning: skipped run ") == 2 and "written by a newer core" in captured.err
    assert len(captured.out.strip().splitlines()) == 1 + 2  # the header and the two readable runs
    assert main(["report", "--database", str(database), "--output", str(tmp_path / "report")]) == 0
    warnings = (tmp_path / "report" / "report.md").read_text(encoding="utf-8").split("## Database warnings")[1]
    assert warnings.count("written by a newer core") == 2


@pytest.mark.parametrize("version", ["", "x.y", "1", "1.6.1", "١.٦"])
def test_a_result_whose_schema_is_no_version_is_not_read(version: str) -> None:
    document = json.loads(synthetic_result().model_dump_json())
    document["schema_version"] = version
    with pytest.raises(ValueError, match="is no layout version"):
        RunResult.model_validate(document)


# --- 8. --baseline that matches no side ----------------------------------------------------------


def _two_sides(tmp_path: Path) -> list[str]:
    paths = [filled(tmp_path / f"{host}.db", runs=2, host=host) for host in ("node-a100", "node-a100x", "gh")]
    return [str(path) for path in paths]


def test_a_baseline_that_matches_no_side_is_an_error_naming_the_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    databases = _two_sides(tmp_path)
    output = tmp_path / "report"
    assert main(["report", *databases, "--output", str(output), "--baseline", "H100"]) == 2
    err = capsys.readouterr().err
    assert "--baseline 'H100' matches no side compared; the sides are: 'node-a100: " in err and "'gh: " in err
    assert not output.exists()
    # Ambiguous: two sides contain the text; the whole label of one names it.
    assert main(["report", *databases, "--output", str(output), "--baseline", "a100"]) == 2
    assert "--baseline 'a100' matches 2 sides: 'node-a100: " in capsys.readouterr().err
    assert main(["report", *databases, "--output", str(output), "--baseline", "gh"]) == 0
    markdown = (output / "report.md").read_text(encoding="utf-8")
    assert "Percentages are against the baseline gh: 1x device 0 (cpu)" in markdown
    # One database, one side: there is nothing to compare against a baseline.
    assert main(["report", databases[0], "--output", str(output), "--baseline", "a100"]) == 2
    assert "this report compares no sides" in capsys.readouterr().err
    # An empty text is in every label: refused before anything is read, not "matches 3 sides".
    for empty in ("", "  "):
        assert main(["report", *databases, "--output", str(output), "--baseline", empty]) == 2
        assert "--baseline '': give a text that one side's label" in capsys.readouterr().err


# --- 8. --sweep in either Unicode form ------------------------------------------------------------

COMPOSED = unicodedata.normalize("NFC", "größe-é")
DECOMPOSED = unicodedata.normalize("NFD", COMPOSED)


@pytest.mark.parametrize(("recorded", "asked"), [(COMPOSED, DECOMPOSED), (DECOMPOSED, COMPOSED)])
def test_a_sweep_filter_matches_in_either_unicode_form(
    tmp_path: Path, recorded: str, asked: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert recorded != asked
    database = filled(tmp_path / "r.db", runs=2, sweep=recorded)
    with ResultStore(database, create=False) as store:
        assert len(store.runs(sweep=asked)) == 2 and store.matching_sweeps(asked) == [recorded]
    assert main(["results", "--database", str(database), "--sweep", asked, "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3
    assert main(["report", "--database", str(database), "--sweep", asked, "--output", str(tmp_path / "rep")]) == 0
    assert "2 cells with results" in (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")


# --- 8. the JSON export is JSON ---------------------------------------------------------------------


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def test_the_json_export_writes_null_for_non_finite_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = synthetic_result(throughput=100.0)
    result.throughput_per_second = math.nan
    result.step_seconds_median = math.inf
    result.workload_details = {"ratio": -math.inf, "nested": [math.nan, 1.5]}
    database = tmp_path / "r.db"
    with ResultStore(database) as store:
        store.add(result, sweep="s", cell_key="k", repeat=0, process_seconds=math.inf)
    assert main(["results", "--database", str(database), "--format", "json"]) == 0
    text = capsys.readouterr().out
    (document,) = json.loads(text, parse_constant=_refuse_constant)
    assert document["process_seconds"] is None
    assert document["result"]["throughput_per_second"] is None and document["result"]["step_seconds_median"] is None
    assert document["result"]["workload_details"] == {"ratio": None, "nested": [None, 1.5]}
    output = tmp_path / "runs.json"
    assert main(["results", "--database", str(database), "--format", "json", "--output", str(output)]) == 0
    json.loads(output.read_text(encoding="utf-8"), parse_constant=_refuse_constant)


# --- 8. names with terminal escape sequences are shown escaped --------------------------------------

# OSC (set the window title), SGR (red), a bidirectional override, CSI as one C1 byte, a bell.
HOSTILE = "\x1b]0;pwned\x07\x1b[31m\u202e\x9b2J\r"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c == "\u202e"]


def test_printable_escapes_what_a_terminal_would_obey() -> None:
    from core.running.progress import printable

    assert printable("plain\ttext\nnext é 日本") == "plain\ttext\nnext é 日本"
    assert printable(HOSTILE) == "\\x1b]0;pwned\\x07\\x1b[31m\\u202e\\x9b2J\\x0d"
    assert printable("lone \ud800 surrogate") == "lone \\ud800 surrogate"


def test_the_progress_line_escapes_a_cells_label_and_keeps_its_own_control(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sweep's live line (a terminal only) and its line per finished run show a label escaped;
    the line's own carriage return and erase still reach the terminal, also through the filter."""
    import io

    from core.running.progress import EscapingStream, ProgressLine

    terminal = io.StringIO()
    line = ProgressLine(EscapingStream(terminal), interactive=True)
    line.show("[1/2] cell 1/2 label" + HOSTILE)
    line.print("label" + HOSTILE + " repeat 1: ok")
    shown = terminal.getvalue()
    assert shown.startswith("\r\x1b[2K[1/2] cell 1/2 label\\x1b]0;pwned") and shown.count("\x1b") == 2
    assert "label\\x1b]0;pwned\\x07\\x1b[31m\\u202e\\x9b2J\\x0d repeat 1: ok" in capsys.readouterr().out


def test_names_from_the_database_reach_the_terminal_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "r.db"
    with ResultStore(database) as store:
        for index, sweep in enumerate(("s" + HOSTILE, "plain")):
            result = synthetic_result(micro_batch_size=8 + index, throughput=10.0 + index)
            result.workload, result.accelerator = "fcnn" + HOSTILE, "cpu" + HOSTILE
            result.devices[0].name = "device" + HOSTILE
            result.environment = EnvironmentInfo(
                hostname="host" + HOSTILE, platform="Linux", python_version="3.11", core_version="0.2"
            )
            store.add(result, sweep=sweep, cell_key="k" + HOSTILE, cell_label="label" + HOSTILE, repeat=0)
        store.add(synthetic_result(state="error", message="boom" + HOSTILE), sweep="plain", cell_key="x", repeat=0)
    commands = [
        ["results"],
        ["results", "--format", "csv"],
        ["results", "--format", "json"],
        ["results", "--sweep", "s" + HOSTILE],
        ["results", "--sweep", "missing" + HOSTILE],
        ["report", "--output", str(tmp_path / "report"), "--sweep", "missing" + HOSTILE],
        ["report", "--output", str(tmp_path / "report"), "--baseline", "none" + HOSTILE],
    ]
    for command in commands:
        main([*command, "--database", str(database)])
        captured = capsys.readouterr()
        assert not _raw_controls(captured.out + captured.err), (command, captured)
    # A name that argparse quotes back, and a sweep file's cell labels in a dry run.
    with pytest.raises(SystemExit):
        main(["results", "unexpected" + HOSTILE])
    err = capsys.readouterr().err
    assert "unrecognized arguments: unexpected\\x1b" in err and not _raw_controls(err)
    # A sweep file's cell labels and refusals in a dry run (TOML spells the controls as escapes).
    sweep_file = tmp_path / "hostile.toml"
    sweep_file.write_text(SWEEP_FILE + '"depth\\u001b]0;pwned\\u0007\\u001b[31m\\u009b2J" = [1, 2]\n', encoding="utf-8")
    assert main(["sweep", str(sweep_file), "--dry-run", "--database", str(tmp_path / "other.db")]) == 2
    captured = capsys.readouterr()
    assert "depth\\x1b]0;pwned\\x07\\x1b[31m\\x9b2J=1" in captured.out, captured.out
    assert not _raw_controls(captured.out + captured.err)


def test_controls_in_database_text_are_escaped_as_the_docs_show_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 26 (F13): the table's one_line/clean_text replaced ESC with U+FFFD before the terminal
    # filter saw it, so `core results` showed "\ufffd[31mX" where the docs (and the CSV) show \x1b[31m.
    database = tmp_path / "r.db"
    with ResultStore(database) as store:
        store.add(synthetic_result(), sweep="s", cell_key="k", cell_label="\x1b[31mX\u202e", repeat=0)
    assert main(["results", "--database", str(database)]) == 0
    out = capsys.readouterr().out
    assert "\\x1b[31mX\\u202e" in out and "\ufffd" not in out, out
    from core.report.document import clean_text, one_line

    assert clean_text("bell\x07\ttab\n") == "bell\\x07\ttab\n"
    assert one_line("two\nlines\x1b[2J") == "two lines\\x1b[2J"


# --- 8. equal epoch definitions are one cell ---------------------------------------------------------

EPOCH_GRID = """
name = "epochs"
[grid]
workload = "fcnn"
epoch_definition = {definition}
{exclude}
"""


def _epoch_spec(folder: Path, definition: str, exclude: str = "") -> Any:
    from core.sweep import load_sweep

    path = folder / f"epochs-{len(list(folder.iterdir()))}.toml"
    path.write_text(EPOCH_GRID.format(definition=definition, exclude=exclude), encoding="utf-8")
    return load_sweep(path)


@pytest.mark.parametrize("spelling", ['"samples:1_000"', '"samples: 1000"', '" samples : 01000 "'])
def test_spellings_of_one_epoch_definition_are_one_cell(tmp_path: Path, spelling: str) -> None:
    from core import ConfigError
    from core.sweep import expand_cells

    (plain,) = expand_cells(_epoch_spec(tmp_path, '"samples:1000"'))
    (spelled,) = expand_cells(_epoch_spec(tmp_path, spelling))
    assert spelled.key == plain.key and spelled.options["epoch_definition"] == "samples:1000"
    # Two spellings in one axis are the same cell twice: refused as any repeated value is.
    with pytest.raises(ConfigError, match="a value appears twice .* are the same value"):
        _epoch_spec(tmp_path, f'["samples:1000", {spelling}]')
    # An exclusion matches the cell whatever spelling either side uses.
    excluded = _epoch_spec(tmp_path, '["samples:1000", "dataset"]', f"[[exclude]]\nepoch_definition = {spelling}")
    assert [cell.options["epoch_definition"] for cell in expand_cells(excluded)] == ["dataset"]


def test_a_report_states_the_epoch_definition_in_its_one_spelling() -> None:
    from core.report import TrainingPlan

    assert TrainingPlan(10, "samples:1_281_167").describe() == "10 epochs (samples:1281167)"


# --- 7. a value that is not UTF-8 leaves out its row, not the whole database -----------------------


def _not_utf8(database: Path, statement: str) -> None:
    with sqlite3.connect(database) as connection:
        connection.execute(statement)
    connection.close()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE runs SET result_json = CAST(x'7b22ff' AS TEXT) WHERE id = 1",
        "UPDATE runs SET cell_label = CAST(x'6d6963726fff' AS TEXT) WHERE id = 1",
        "UPDATE runs SET cell_key = CAST(x'ff' AS TEXT) WHERE id = 1",
        "UPDATE runs SET recorded_at = CAST(x'32303234ff' AS TEXT) WHERE id = 1",
        "UPDATE runs SET sweep = CAST(x'73ff' AS TEXT) WHERE id = 1",
        "UPDATE runs SET sweep = NULL, cell_key = NULL, repeat = NULL, cell_label = CAST(x'ff' AS TEXT) WHERE id = 1",
        "UPDATE runs SET result_json = 7 WHERE id = 1",
    ],
    ids=["result_json", "cell_label", "cell_key", "recorded_at", "sweep", "single run", "an integer"],
)
def test_a_row_whose_text_is_not_utf8_is_skipped_and_every_other_run_read(
    tmp_path: Path, statement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 26 (r3 A): sqlite3 decoded every TEXT value and raised OperationalError ("Could not
    # decode to UTF-8 column 'result_json'") for the whole query: one bad byte (a bit flipped in a
    # page) made core results, core report and every export refuse the whole database with exit 2.
    database = filled(tmp_path / "r.db", runs=3)
    _not_utf8(database, statement)
    report = tmp_path / "report"
    commands = [
        ["results"],
        ["results", "--format", "csv"],
        ["results", "--format", "json"],
        ["results", "--format", "parquet", "--output", str(tmp_path / "r.parquet")],
        ["report", "--output", str(report)],
    ]
    for command in commands:
        assert main([*command, "--database", str(database)]) == 0, (command, capsys.readouterr())
        captured = capsys.readouterr()
        no_traceback(captured.err)
        assert "core: warning: skipped run 1" in captured.err, (command, captured.err)
        assert f"in {database}: " in captured.err
        assert "\ufffd" not in captured.out + captured.err, (command, captured)
        if "CAST" in statement:
            assert "\\xff" in captured.err, captured.err
    assert "skipped run 1" in (report / "report.md").read_text(encoding="utf-8")
    with ResultStore(database, create=False) as store:
        assert [run.run_id for run in store.runs()] == [2, 3]
        assert store.sweep_names() == ["s"]
        skipped = [str(row).split(": ")[0] for row in store.skipped_rows]
    of_sweep = "" if "NULL" in statement else " of sweep 's\\xff'" if "sweep = CAST" in statement else " of sweep 's'"
    assert skipped == [f"skipped run 1{of_sweep} in {database}"], skipped


def test_a_sweep_whose_name_is_not_utf8_is_shown_escaped(tmp_path: Path) -> None:
    database = filled(tmp_path / "r.db", runs=3)
    _not_utf8(database, "UPDATE runs SET sweep = CAST(x'73ff' AS TEXT) WHERE id IN (1, 2)")
    with ResultStore(database) as store:
        store.save_sweep("t", {}, [], None)
    _not_utf8(database, "UPDATE sweeps SET name = CAST(x'74ff' AS TEXT)")
    with ResultStore(database, create=False) as store:
        assert store.sweep_names() == ["s"] and store.sweeps() == []
        skipped = [str(row) for row in store.skipped_rows]
    where = "not UTF-8 text (byte 0xff at offset 1:"
    assert skipped == [
        f"skipped the settings of sweep 't\\xff' in {database}: name is {where} 't\\xff')",
        f"skipped run 1 of sweep 's\\xff' in {database}: sweep is {where} 's\\xff')",
        f"skipped run 2 of sweep 's\\xff' in {database}: sweep is {where} 's\\xff')",
    ]


def test_a_sweep_record_whose_text_is_not_utf8_is_skipped(tmp_path: Path) -> None:
    database = filled(tmp_path / "r.db", runs=1)
    with ResultStore(database) as store:
        store.save_sweep("s", {"name": "s"}, [], None)
    _not_utf8(database, "UPDATE sweeps SET cells_json = CAST(x'5bff' AS TEXT)")
    with ResultStore(database, create=False) as store:
        assert store.sweep("s") is None and store.sweep_names() == ["s"]
        assert [str(row) for row in store.skipped_rows] == [
            f"skipped the settings of sweep 's' in {database}: "
            "cells_json is not UTF-8 text (byte 0xff at offset 1: '[\\xff')"
        ]


def test_a_lock_holders_note_that_is_not_utf8_is_shown_escaped(tmp_path: Path) -> None:
    from core.storage.store import DatabaseInUseError, SweepLock, lock_path

    database = tmp_path / "r.db"
    with SweepLock(database, "first"):
        lock_path(database).write_bytes(b'{"pid": 12, "host": "h\xff", "sweep": "s\xfe", "since": "now"}\n')
        with pytest.raises(DatabaseInUseError) as refused:
            SweepLock(database, "second").acquire()
    message = str(refused.value)
    assert "in use by sweep 's\\xfe' (pid 12 on h\\xff since now)" in message, message
    assert "\ufffd" not in message


# --- 7. a database named twice is refused naming it ---------------------------------------------------


@pytest.mark.parametrize(
    "spelling", ["./a/core.db", "a//core.db", "link/core.db", "a/link.db", "hard.db", "--database a/core.db"]
)
def test_a_database_named_twice_is_refused_naming_both_spellings_and_the_file(
    tmp_path: Path, spelling: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    filled(tmp_path / "a" / "core.db", runs=1)
    (tmp_path / "link").symlink_to("a")
    (tmp_path / "a" / "link.db").symlink_to("core.db")
    os.link(tmp_path / "a" / "core.db", tmp_path / "hard.db")
    second = spelling.split()
    assert main(["report", "a/core.db", *second, "--output", "r"]) == 2
    err = capsys.readouterr().err
    named = second[-1]
    first, then = ("a/core.db", named) if not spelling.startswith("--") else (named, "a/core.db")
    resolved = (tmp_path / "a" / "core.db").resolve()
    if spelling == "hard.db":
        resolved = (tmp_path / "hard.db").resolve()
    assert f"results database {first} and {then} are the same file ({resolved}); name each once" in err, err
    assert not (tmp_path / "r").exists()
