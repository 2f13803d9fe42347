"""Energy in the papers' units: Wh beside J, per device, per sample and token in the workload's
unit, and per epoch under the definition a run or sweep chooses; old results still read."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result

from core.base.config import make_config
from core.base.epochs import EpochDefinition
from core.base.errors import ConfigError
from core.base.results import SCHEMA_VERSION, DeviceRecord, EnergyMeasurement, RunResult
from core.cli import format_result
from core.storage.store import EXPORT_COLUMNS, ResultStore
from core.sweep import make_sweep_spec, plan_sweep

# --- the epoch definition: a RunConfig field, validated strictly ---------------------------------


@pytest.mark.parametrize(
    "text,canonical,samples",
    [
        ("dataset", "dataset", 50_000),
        ("samples:1281167", "samples:1281167", 1_281_167),
        ("samples:1_000_000", "samples:1000000", 1_000_000),
        ("global-batches:4", "global-batches:4", 4 * 32),
        ("host-calls:4", "host-calls:4", 4 * 128),
    ],
)
def test_an_epoch_definition_is_parsed_to_one_spelling(text: str, canonical: str, samples: int) -> None:
    config = make_config(workload="fcnn", accelerator="cpu", epoch_definition=text)
    assert config.epoch_definition == canonical
    assert config.epoch.samples(50_000, samples_per_update=32, samples_per_host_call=128) == samples
    assert make_config(workload="fcnn", accelerator="cpu").epoch_definition == "dataset"  # what core did before


def test_the_dataset_epoch_of_an_unknown_dataset_is_none() -> None:
    assert EpochDefinition.parse("dataset").samples(None, 32, 32) is None


@pytest.mark.parametrize(
    "value,why",
    [
        (True, "a boolean is not an epoch definition"),
        (1281167, "for 1281167 samples write 'samples:1281167'"),
        (4.0, "a number is not an epoch definition"),
        ("samples", "one of 'dataset'"),
        ("dataset:3", "one of 'dataset'"),
        ("epochs:1", "one of 'dataset'"),
        ("samples:0", "a count of 0 is out of range"),
        ("samples:-4", "one of 'dataset'"),
        ("samples:1e6", "one of 'dataset'"),
        ("samples 4", "one of 'dataset'"),
        ("samples::4", "one of 'dataset'"),
        ("global-batches:10000000000000", "out of range"),
    ],
)
def test_a_bad_epoch_definition_names_the_field_the_value_and_what_is_allowed(value: Any, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config(workload="fcnn", accelerator="cpu", epoch_definition=value)
    assert caught.value.field == "epoch_definition" and caught.value.value == value
    assert why in caught.value.allowed
    assert "'samples:N'" in caught.value.allowed and "'global-batches:N'" in caught.value.allowed


@pytest.mark.parametrize("spelling", [" samples:4", "samples: 4", "samples:0_4", "samples:04 "])
def test_spaces_and_underscores_spell_the_same_definition(spelling: str) -> None:
    # One definition, one stored spelling: a sweep's cells are told apart by it (issue 26).
    assert make_config(workload="fcnn", accelerator="cpu", epoch_definition=spelling).epoch_definition == "samples:4"


def test_the_cli_has_a_flag_for_it() -> None:
    from core.cli import build_parser

    args = build_parser().parse_args(["run", "fcnn", "--epoch-definition", "samples:1281167"])
    assert args.epoch_definition == "samples:1281167"


# --- the result: derived figures beside the measured ones ----------------------------------------


def _result(**fields: Any) -> RunResult:
    config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=16, epoch_definition="samples:1000")
    devices = [DeviceRecord(index=index, name=f"gpu {index}", kind="cpu") for index in range(4)]
    energy = EnergyMeasurement(
        meter="test", method="counter", energy_joules=7200.0, components_joules={"gpu0": 3600.0, "gpu1": 1800.0}
    )
    values: dict[str, Any] = {
        "devices": devices,
        "energy": energy,
        "energy_joules": 7200.0,
        "window_samples": 800,
        "window_seconds": 8.0,
        "window_steps": 50,
        "window_updates": 50,
        "throughput_per_second": 100.0,
        "samples_per_watt_hour": 400.0,
        "samples_per_epoch": 1000,
        "epoch_seconds": 10.0,
        "energy_joules_per_epoch": 9000.0,
        **fields,
    }
    return RunResult.of_config(config, 4, **values)


def test_energy_appears_in_joules_and_watt_hours_per_device_and_per_epoch() -> None:
    result = _result(sample_unit="images")
    assert result.energy_watt_hours == 2.0
    assert result.energy_joules_per_device == 1800.0 and result.energy_watt_hours_per_device == 0.5
    assert result.energy_watt_hours_per_epoch == 2.5
    assert result.energy_joules_per_device_per_epoch == 2250.0
    assert result.energy_watt_hours_per_device_per_epoch == 0.625
    assert result.energy is not None and result.energy.energy_watt_hours == 2.0
    assert result.energy.components_watt_hours == {"gpu0": 1.0, "gpu1": 0.5}
    assert result.tokens_per_second is None and result.tokens_per_watt_hour is None


def test_tokens_are_sequences_times_sequence_length() -> None:
    result = _result(sample_unit="sequences", tokens_per_sample=2048)
    assert result.tokens_per_second == 100.0 * 2048
    assert result.tokens_per_watt_hour == 400.0 * 2048


def test_without_a_measurement_no_derived_figure_is_made_up() -> None:
    result = _result(energy=None, energy_joules=None, energy_joules_per_epoch=None, devices=[])
    assert result.energy_watt_hours is None and result.energy_watt_hours_per_device is None
    assert result.energy_watt_hours_per_epoch is None and result.energy_joules_per_device_per_epoch is None


def test_the_document_carries_the_derived_figures_and_reading_it_recomputes_them() -> None:
    result = _result(sample_unit="sequences", tokens_per_sample=1024)
    document = json.loads(result.to_json())
    assert document["schema_version"] == SCHEMA_VERSION  # "1.3" brought these figures
    assert document["energy_joules"] == 7200.0 and document["energy_watt_hours"] == 2.0
    assert document["energy_watt_hours_per_device"] == 0.5 and document["energy_watt_hours_per_epoch"] == 2.5
    assert document["tokens_per_watt_hour"] == 400.0 * 1024
    assert document["energy"]["components_watt_hours"] == {"gpu0": 1.0, "gpu1": 0.5}
    assert document["config"]["epoch_definition"] == "samples:1000"
    assert RunResult.model_validate(document) == result
    # A derived figure is never trusted from the file: it follows what was measured.
    document["energy_watt_hours"] = 99.0
    document["energy"]["energy_watt_hours"] = 99.0
    read = RunResult.model_validate_json(json.dumps(document))
    assert read.energy_watt_hours == 2.0 and read.energy is not None and read.energy.energy_watt_hours == 2.0


def _as_version_1_2(result: RunResult) -> dict[str, Any]:
    """The document core wrote before 1.3: no derived figures, sample unit, tokens or epoch definition."""
    document = json.loads(result.to_json())
    for name in list(RunResult.model_computed_fields) + ["sample_unit", "tokens_per_sample"]:
        document.pop(name, None)
    if document.get("energy"):
        for name in EnergyMeasurement.model_computed_fields:
            document["energy"].pop(name)
    document["config"].pop("epoch_definition")
    document["schema_version"] = "1.2"
    return document


def test_a_version_1_2_document_still_reads_and_gains_the_new_figures() -> None:
    result = _result(workload_details={"tokens_per_sample": 512}, energy_joules_per_epoch=None)
    result.config = result.config.model_copy(update={"epoch_definition": "dataset"})
    document = _as_version_1_2(result)
    assert "energy_watt_hours" not in document and "tokens_per_sample" not in document
    read = RunResult.model_validate_json(json.dumps(document))
    assert read.schema_version == "1.2" and read.config.epoch_definition == "dataset"
    assert read.energy_watt_hours == 2.0 and read.energy_watt_hours_per_device == 0.5
    assert read.tokens_per_sample == 512 and read.tokens_per_watt_hour == 400.0 * 512  # from workload_details
    assert read.sample_unit is None


def test_an_old_database_still_reads_and_exports_watt_hours(tmp_path: Path) -> None:
    database = tmp_path / "old.db"
    with ResultStore(database) as store:
        run_id = store.add(synthetic_result(samples_per_watt_hour=1e4), sweep="old", cell_key="a", repeat=0)
    old = synthetic_result(samples_per_watt_hour=1e4)
    with sqlite3.connect(database) as connection:  # a row as a core before 1.3 wrote it
        connection.execute(
            "UPDATE runs SET result_json = ?, schema_version = '1.2' WHERE id = ?",
            (json.dumps(_as_version_1_2(old)), run_id),
        )
    with ResultStore(database, create=False) as store:
        [run] = store.runs(sweep="old")
        assert not store.skipped_rows
        assert run.result.energy_watt_hours == pytest.approx(old.energy_joules / 3600)
        text = io.StringIO()
        store.export_csv(text)
    [row] = list(csv.DictReader(io.StringIO(text.getvalue())))
    assert float(row["energy_watt_hours"]) == pytest.approx(old.energy_joules / 3600)
    assert row["epoch_definition"] == "dataset"


# --- where people read them: core run's text, the CSV ---------------------------------------------


def test_the_run_text_shows_joules_watt_hours_per_device_tokens_and_the_epoch_estimate() -> None:
    text = format_result(_result(sample_unit="sequences", tokens_per_sample=1024))
    assert "100 sequences/s" in text and "102400 tokens/s (1024 tokens per sequence)" in text
    assert "7200 J = 2 Wh over the window (counter), 0.5 Wh per device (4 devices)" in text
    assert "gpu0 1 Wh, gpu1 0.5 Wh" in text
    assert "400 sequences/Wh, 4.096e+05 tokens/Wh" in text
    assert "samples:1000 (1,000 samples): 10 s, 9000 J = 2.5 Wh, 0.625 Wh per device (4 devices)" in text
    assert "(estimate, extrapolated from the timed window)" in text


def test_the_run_text_of_a_vision_run_counts_images() -> None:
    text = format_result(_result(sample_unit="images"))
    assert "400 images/Wh" in text and "tokens" not in text


def test_the_csv_has_energy_in_both_units_per_device_tokens_and_epoch(tmp_path: Path) -> None:
    result = _result(sample_unit="sequences", tokens_per_sample=1024)
    with ResultStore(tmp_path / "r.db") as store:
        store.add(result, sweep="s", cell_key="a", repeat=0)
        text = io.StringIO()
        store.export_csv(text)
    [row] = list(csv.DictReader(io.StringIO(text.getvalue())))
    assert list(row) == list(EXPORT_COLUMNS)
    expected = {
        "energy_joules": 7200.0,
        "energy_watt_hours": 2.0,
        "device_count": 4,
        "energy_joules_per_device": 1800.0,
        "energy_watt_hours_per_device": 0.5,
        "samples_per_watt_hour": 400.0,
        "tokens_per_sample": 1024,
        "tokens_per_second": 102400.0,
        "tokens_per_watt_hour": 409600.0,
        "samples_per_epoch": 1000,
        "epoch_seconds": 10.0,
        "energy_joules_per_epoch": 9000.0,
        "energy_watt_hours_per_epoch": 2.5,
        "energy_joules_per_device_per_epoch": 2250.0,
        "energy_watt_hours_per_device_per_epoch": 0.625,
    }
    assert {name: float(row[name]) for name in expected} == expected
    assert row["sample_unit"] == "sequences" and row["epoch_definition"] == "samples:1000"
    assert json.loads(row["energy_components_watt_hours"]) == {"gpu0": 1.0, "gpu1": 0.5}


# --- the built-in language models, and sweeps -------------------------------------------------------


def test_the_built_in_language_models_declare_their_tokens_per_sample() -> None:
    from core.workloads.language import LANGUAGE_WORKLOADS, LanguageWorkload
    from core.workloads.vision import VISION_WORKLOADS, VisionWorkload

    checked = 0
    for workload in [kind() for kind in (*LANGUAGE_WORKLOADS, *VISION_WORKLOADS)]:
        options = workload.parse_options({"variant": "small"})
        if isinstance(workload, LanguageWorkload):
            assert workload.tokens_per_sample(options) == workload.details(options)["tokens_per_sample"]
            checked += 1
        elif isinstance(workload, VisionWorkload):
            assert workload.tokens_per_sample(options) is None and workload.sample_unit == "images"
    assert checked >= 2


def test_a_sweep_grid_can_choose_the_epoch_definition() -> None:
    spec = make_sweep_spec(
        {
            "name": "epochs",
            "grid": {
                "workload": "fcnn",
                "epoch_definition": ["dataset", "samples:1281167", "global-batches:4"],
            },
        }
    )
    plan = plan_sweep(spec)
    assert not plan.invalid_cells
    assert [cell.config.epoch_definition for cell in plan.cells if cell.config] == [
        "dataset",
        "samples:1281167",
        "global-batches:4",
    ]


def test_a_sweep_cell_with_a_bad_epoch_definition_is_refused_naming_it() -> None:
    spec = make_sweep_spec({"name": "epochs", "grid": {"workload": "fcnn", "epoch_definition": ["samples:0", True]}})
    plan = plan_sweep(spec)
    reasons = [cell.invalid_reason or "" for cell in plan.invalid_cells]
    assert len(reasons) == 2 and all("epoch_definition" in reason for reason in reasons)
    assert "out of range" in reasons[0] and "a boolean is not an epoch definition" in reasons[1]


# --- the report's cells table and core results' summary ----------------------------------------


def _cells(tmp_path: Path, results: list[RunResult]) -> list[Any]:
    from core.storage.summary import summarise

    with ResultStore(tmp_path / "cells.db") as store:
        for repeat, result in enumerate(results):
            store.add(result, sweep="s", cell_key="a", cell_label="a", repeat=repeat)
        return summarise(store.runs(sweep="s"))


def test_the_report_table_has_units_in_its_headers_and_token_and_epoch_columns(tmp_path: Path) -> None:
    from core.report import cells_table

    results = [
        _result(sample_unit="sequences", tokens_per_sample=1024, energy_joules=joules)
        for joules in (3600.0, 7200.0, 10800.0)
    ]
    table = cells_table(_cells(tmp_path, results), [], "cells-s")
    headers = dict(table.columns)
    assert headers["throughput_per_second"] == "throughput (sequences/s, median)"
    assert headers["samples_per_watt_hour"] == "sequences/Wh (median)"
    assert headers["energy_joules"] == "energy (J, median)" and headers["energy_watt_hours"] == "energy (Wh, median)"
    assert headers["energy_watt_hours_per_epoch"] == "energy per epoch (Wh, estimate, median)"
    row = dict(zip(headers, table.rows[0]))
    assert row["energy_joules"].number == 7200.0 and row["energy_watt_hours"].number == 2.0
    assert row["energy_watt_hours_per_device"].number == 0.5
    assert row["tokens_per_watt_hour"].number == 400.0 * 1024
    assert row["energy_watt_hours_per_epoch"].number == 2.5


def test_a_vision_table_has_no_token_columns(tmp_path: Path) -> None:
    from core.report import cells_table

    table = cells_table(_cells(tmp_path, [_result(sample_unit="images", energy_joules_per_epoch=None)]), [], "c")
    headers = dict(table.columns)
    assert headers["throughput_per_second"] == "throughput (images/s, median)"
    assert not {"tokens_per_second", "tokens_per_watt_hour", "energy_watt_hours_per_epoch"} & set(headers)


def test_core_results_summary_shows_watt_hours(tmp_path: Path) -> None:
    from core.cli import format_cells

    header, row = format_cells(_cells(tmp_path, [_result(sample_unit="images")])).splitlines()
    # The figures in the order core.storage.metrics declares them (energy, then efficiency), as in the report.
    assert header.split() == [
        "cell",
        "status",
        "ok/runs",
        "images/s",
        "spread",
        "energy",
        "Wh",
        "images/Wh",
        "epoch",
        "Wh",
        "(estimate)",
    ]
    assert row.split()[-3:] == ["2", "400", "2.5"]
