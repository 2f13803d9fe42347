"""JSON that a user or an earlier run controls (a file, a database row, a header) is read by one
helper, ``core.base.files.parse_json``: a document nested thousands deep, not UTF-8, or with an
integer too long to convert is an error naming the file, never an internal RecursionError (issue
26, F11). Each surface that reads such JSON is tried here with a hostile document."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from core import ConfigError
from core.base.files import MAX_JSON_DEPTH, JsonError, json_depth, parse_json
from core.cli import main
from core.storage.store import ResultStore
from core.sweep import make_sweep_spec, plan_sweep

#: far deeper than Python's recursion limit: json.loads raised RecursionError on it
DEEP = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"


def test_parse_json_refuses_what_the_parser_cannot_read_with_one_error_type() -> None:
    for text, fragment in [
        (DEEP, "nested 100001 deep, more than the 100 levels allowed"),
        (b"\xff\xfe{}", "not UTF-8 text"),
        ("1" * 5000, "digits"),  # more digits than Python converts to an int
    ]:
        with pytest.raises(JsonError, match=fragment):
            parse_json(text)
    assert isinstance(JsonError("x"), ValueError)  # what callers of json.loads already catch
    with pytest.raises(json.JSONDecodeError, match="Expecting property name"):  # as json.loads says it
        parse_json("{")


def test_parse_json_counts_only_the_brackets_that_nest() -> None:
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_depth(nested) == MAX_JSON_DEPTH and parse_json(nested) is not None
    text = json.dumps({"name": '[[[[ {{{{ \\" ]', "cells": [{"a": [1, 2]}]})
    assert json_depth(text) == 4 and parse_json(text)["name"] == '[[[[ {{{{ \\" ]'
    assert parse_json(b'{"a": 1}') == {"a": 1}


def test_a_coco_annotation_file_nested_too_deeply_is_refused_naming_it(tmp_path: Path) -> None:
    from core.data.listing import coco_samples

    document = tmp_path / "coco" / "annotations" / "instances_train2017.json"
    document.parent.mkdir(parents=True)
    (tmp_path / "coco" / "train2017").mkdir()
    document.write_text('{"images":' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError) as refused:
        coco_samples(tmp_path / "coco")
    assert refused.value.field == "data" and str(document) in str(refused.value)
    assert "nested 100001 deep" in str(refused.value)


def test_a_sweep_record_nested_too_deeply_is_skipped_with_a_warning_naming_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "r.db"
    store = ResultStore(database)
    spec = make_sweep_spec({"name": "s", "grid": {"workload": "fcnn"}})
    store.save_sweep(spec.name, spec.model_dump(mode="json"), [], source=None)
    with sqlite3.connect(database) as connection:
        connection.execute("UPDATE sweeps SET spec_json = ?", (DEEP,))
    assert ResultStore(database, create=False).sweeps() == []
    assert main(["report", "--database", str(database), "--output", str(tmp_path / "report")]) == 0
    error = capsys.readouterr().err
    assert "skipped the settings of sweep 's' in" in error and "nested 100001 deep" in error, error
    assert "internal error" not in error


def test_an_unsaved_result_nested_too_deeply_is_left_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from core.storage.store import unsaved_directory
    from core.sweep.loop import record_unsaved

    database = tmp_path / "r.db"
    store = ResultStore(database)
    plan = plan_sweep(make_sweep_spec({"name": "s", "grid": {"workload": "fcnn", "steps": 1}}))
    saved = unsaved_directory(database) / "s-cell1-repeat9.json"
    saved.parent.mkdir()
    saved.write_text(DEEP)
    with caplog.at_level(logging.WARNING):
        assert record_unsaved(store, plan, {}) == 0
    assert f"cannot record {saved}" in caplog.text and "nested 100001 deep" in caplog.text
    assert saved.exists()


def test_a_job_ledger_nested_too_deeply_is_refused_naming_it(tmp_path: Path) -> None:
    from core.sweep.cluster import JobLedger, NotSubmitted

    ledger = tmp_path / "jobs.json"
    ledger.write_text(DEEP)
    with pytest.raises(NotSubmitted, match="cannot read the sweep's job ledger") as refused:
        JobLedger.load(ledger, "s", tmp_path / "r.db")
    assert str(ledger) in str(refused.value) and "nested 100001 deep" in str(refused.value)


def test_a_child_request_nested_too_deeply_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from core.running import child

    request = tmp_path / "request.json"
    request.write_text(DEEP)
    assert child.main([str(request), str(tmp_path / "result.json")]) == 2
    assert f"cannot read the run's request {request}" in capsys.readouterr().err


def test_a_workload_option_nested_too_deeply_for_json_is_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "fcnn", "-o", "layers=" + "[" * 5000, "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert "workload_options.layers (-o layers)" in error and "internal error" not in error, error


def test_a_machine_profile_nested_too_deeply_is_refused_naming_it(tmp_path: Path) -> None:
    from core.machines import load_machine

    profile = tmp_path / "deep.toml"
    profile.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as refused:
        load_machine(str(profile))
    assert refused.value.field == "machine" and "nest too deeply" in str(refused.value)
