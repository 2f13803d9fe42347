"""Each figure of a result declared once (core.storage.metrics): every scalar field of RunResult
reaches the flat export, every declaration reads a field that exists, and the consumers (the
export, a cell's summary, the report's tables, `core results` and `core run`'s text) show what the
declarations say."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from core.base.config import make_config
from core.base.results import DeviceRecord, EnergyMeasurement, LoadGenFigures, RunResult, RunState, Status
from core.storage.store import EXPORT_COLUMNS, ResultStore
from core.storage.summary import summarise

# The columns of the export before 0.3, in their order: readers by position and by name keep working.
COLUMNS_BEFORE_0_3 = (
    "sweep cell_key cell_label repeat status status_phase status_message workload accelerator framework mode "
    "scenario precision micro_batch_size gradient_accumulation replicas devices_per_replica device_iterations "
    "compile steps warmup_steps samples_per_update world_size setup_seconds first_step_seconds warmup_seconds "
    "window_seconds throughput_per_second step_seconds_median step_seconds_p90 step_seconds_p99 loadgen_valid "
    "loadgen_samples_per_second loadgen_early_stopping_latency_seconds top1_accuracy parameter_count "
    "flops_per_sample flops_per_second model_flops_utilization energy_joules energy_watt_hours device_count "
    "energy_joules_per_device energy_watt_hours_per_device energy_components_watt_hours samples_per_watt_hour "
    "energy_joules_per_sample sample_unit tokens_per_sample tokens_per_second tokens_per_watt_hour "
    "epoch_definition samples_per_epoch epoch_seconds energy_joules_per_epoch energy_watt_hours_per_epoch "
    "energy_joules_per_device_per_epoch energy_watt_hours_per_device_per_epoch energy_unavailable_reason "
    "workload_options accelerator_options hostname started_at process_seconds run_id"
).split()

ROOFLINE_FIGURES = {
    "peak_flops_per_second": 4.0e12,
    "peak_flops_source": "datasheet, 2 x 2 TFLOP/s",
    "memory_bytes_per_sample": 2.0e6,
    "memory_bandwidth_bytes_per_second": 2.0e11,
    "memory_bandwidth_source": "datasheet",
    "memory_kind": "HBM3",
}
# --- the declaration covers the result ----------------------------------------------------------


def test_every_scalar_result_field_reaches_an_export_column() -> None:
    from core.storage.metrics import scalar_fields, unexported_fields

    fields = scalar_fields(RunResult)
    assert {"arithmetic_intensity", "peak_flops_per_second", "window_updates", "mode", "started_at"} <= set(fields)
    assert not {"config", "status", "devices", "energy", "workload_details"} & set(fields)  # not scalars
    assert not unexported_fields(), "RunResult fields no export column reads"
    assert set(fields) <= set(EXPORT_COLUMNS)


def test_every_declared_metric_reads_a_field_that_exists() -> None:
    from core.storage.metrics import METRICS, unknown_sources

    assert not unknown_sources(), "metrics reading no field"
    names = [metric.name for metric in METRICS]
    assert len(names) == len(set(names)), "a metric is declared twice"


def test_the_checks_find_a_field_no_column_reads_and_a_metric_that_reads_no_field() -> None:
    from core.storage.metrics import METRICS, Metric, source_exists, unexported_fields, unknown_sources

    class Wider(RunResult):
        joules_per_token: float | None = None

    assert unexported_fields(METRICS, Wider) == ["joules_per_token"]
    misspelt = [Metric("energy", "energy.joules"), Metric("gone", "row.nothing"), Metric("t", "throughput.per_second")]
    assert unknown_sources(misspelt) == ["energy (energy.joules)", "gone (row.nothing)", "t (throughput.per_second)"]
    assert source_exists("energy.components_watt_hours") and source_exists("config.precision")
    assert source_exists("row.sweep") and not source_exists("row.result")


def test_the_export_keeps_its_columns_before_0_3_first_and_in_order() -> None:
    assert EXPORT_COLUMNS[: len(COLUMNS_BEFORE_0_3)] == tuple(COLUMNS_BEFORE_0_3)
    assert len(set(EXPORT_COLUMNS)) == len(EXPORT_COLUMNS)


def test_every_printed_part_names_a_declared_line_and_every_reported_table_is_known() -> None:
    from core.storage.metrics import INFERENCE, METRICS, PRINTED_LINES, RESULTS, TRAINING

    lines = {line.key for line in PRINTED_LINES if not line.structural}
    assert {part.line for metric in METRICS for part in metric.printed} <= lines
    assert {table for metric in METRICS if metric.reported for table in metric.reported.tables} <= {
        TRAINING,
        INFERENCE,
        RESULTS,
    }


# --- the consumers follow the declaration ------------------------------------------------------


def _result(**fields: Any) -> RunResult:
    config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=16, epoch_definition="samples:1000")
    values: dict[str, Any] = {
        "devices": [DeviceRecord(index=index, name=f"dev {index}", kind="cpu") for index in range(2)],
        "energy": EnergyMeasurement(meter="test", method="counter", energy_joules=7200.0),
        "energy_joules": 7200.0,
        "window_samples": 800,
        "window_seconds": 8.0,
        "window_steps": 25,
        "window_updates": 50,
        "throughput_per_second": 100.0,
        "data_wait_seconds": 2.0,
        "data_wait_fraction": 0.25,
        "flops_per_sample": 4.0e6,
        "flops_per_second": 4.0e8,
        "model_flops_utilization": 1e-4,
        "samples_per_watt_hour": 400.0,
        "top1_accuracy": 0.5,
        "accuracy_samples": 64,
        "cache_bandwidths_bytes_per_second": {"L2": 1e12},
        **ROOFLINE_FIGURES,
        **fields,
    }
    return RunResult.of_config(config, 2, **values)


def _exported_row(tmp_path: Path, result: RunResult) -> dict[str, str]:
    with ResultStore(tmp_path / "r.db") as store:
        store.add(result, sweep="s", cell_key="a", cell_label="a", repeat=0)
        text = io.StringIO()
        store.export_csv(text)
    [row] = list(csv.DictReader(io.StringIO(text.getvalue())))
    return row


def test_the_roofline_and_window_figures_reach_the_csv_with_their_values(tmp_path: Path) -> None:
    row = _exported_row(tmp_path, _result())
    assert float(row["peak_flops_per_second"]) == 4.0e12
    assert float(row["memory_bandwidth_bytes_per_second"]) == 2.0e11
    assert float(row["memory_bytes_per_sample"]) == 2.0e6
    assert float(row["arithmetic_intensity"]) == 2.0  # computed: flops_per_sample / memory_bytes_per_sample
    assert row["memory_kind"] == "HBM3" and row["peak_flops_source"].startswith("datasheet")
    assert json.loads(row["cache_bandwidths_bytes_per_second"]) == {"L2": 1e12}
    assert (row["window_steps"], row["window_updates"], row["window_samples"]) == ("25", "50", "800")
    assert float(row["data_wait_fraction"]) == 0.25 and row["accuracy_samples"] == "64"
    assert row["samples_per_host_call"] == "16" and row["schema_version"] and row["energy_method"] == "counter"


def test_the_dataframe_and_parquet_have_the_roofline_columns(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    with ResultStore(tmp_path / "r.db") as store:
        store.add(_result(), sweep="s", cell_key="a", repeat=0)
        frame = store.dataframe()
        store.export_parquet(tmp_path / "runs.parquet")
    assert frame.loc[0, "arithmetic_intensity"] == 2.0 and frame.loc[0, "memory_kind"] == "HBM3"
    parquet = pandas.read_parquet(tmp_path / "runs.parquet")
    assert list(parquet.columns) == list(EXPORT_COLUMNS)
    assert parquet.loc[0, "peak_flops_per_second"] == 4.0e12


def test_a_cell_summarises_each_figure_as_declared(tmp_path: Path) -> None:
    from core.storage.metrics import METRICS, Summary

    results = [_result(throughput_per_second=value) for value in (90.0, 100.0, 130.0)]
    results.append(_result(status=Status(state=RunState.oom), throughput_per_second=1.0))
    with ResultStore(tmp_path / "r.db") as store:
        for repeat, result in enumerate(results):
            store.add(result, sweep="s", cell_key="a", cell_label="a", repeat=repeat, process_seconds=2.0)
        [cell] = summarise(store.runs())
    assert cell.figure("throughput_per_second") == 100.0  # the median of the successful repeats
    assert cell.spread_of("throughput_per_second") == pytest.approx(0.4)
    assert cell.figure("process_seconds") == 8.0  # summed over every recorded repeat, the failed one too
    assert cell.figure("memory_kind") == "HBM3" and cell.figure("arithmetic_intensity") == 2.0
    assert cell.figure("status") is None  # not summarised
    summarised = cell.figures()
    assert set(summarised) == {metric.name for metric in METRICS if metric.summary is not Summary.none}
    with pytest.raises(KeyError):
        cell.figure("no_such_figure")


def test_the_report_tables_and_core_results_show_the_declared_columns(tmp_path: Path) -> None:
    from core.cli import format_cells
    from core.report import cells_table, inference_table
    from core.storage.metrics import INFERENCE, RESULTS, TRAINING, reported

    with ResultStore(tmp_path / "r.db") as store:
        store.add(_result(sample_unit="images"), sweep="s", cell_key="a", cell_label="a", repeat=0)
        cells = summarise(store.runs())
    for table, build in ((TRAINING, cells_table), (INFERENCE, inference_table)):
        built = build(cells, [], "t")
        keys = [key for key, _ in built.columns]
        declared = [m.reported.key or m.name for m in reported(table) if m.reported and not m.reported.optional]
        # Each declared column is shown, in order, or named among those n/a in every row.
        dropped = [key for key, _ in built.dropped]
        assert [key for key in keys if key in declared] == [key for key in declared if key not in dropped]
        assert set(declared) <= set(keys) | set(dropped)
    assert "FLOP/s (median)" in dict(cells_table(cells, [], "t").columns).values()
    header = format_cells(cells).splitlines()[0]
    assert "images/s" in header and "images/Wh" in header and "energy Wh" in header
    assert len(reported(RESULTS)) == 9  # 4, and 5 to a target quality (optional: only where a cell has them)


def test_core_run_prints_every_declared_figure_it_has(tmp_path: Path) -> None:
    from core.cli import _text_context, format_result
    from core.storage.metrics import METRICS

    result = _result(sample_unit="images", samples_per_epoch=1000, epoch_seconds=10.0, energy_joules_per_epoch=9.0)
    text = format_result(result)
    context = _text_context(result)
    for metric in METRICS:
        for part in metric.printed:
            value = metric.value(result)
            if value is None or (part.shown is not None and not part.shown(result)):
                continue
            shown = part.text.format(value=value * part.scale if part.scale != 1.0 else value, **context)
            assert shown in text, f"{metric.name}: {shown!r} not in:\n{text}"
    assert "throughput      100 images/s (window 8 s, 50 updates in 25 host calls)" in text
    assert "achieved        0.0004 TFLOP/s, MFU 0.01% (4e+06 FLOP/sample)" in text
    assert "data wait       25.0% of the window (2 s)" in text
    assert "roofline        intensity 2 FLOP/byte, memory 200 GB/s (HBM3)" in text
    assert "top-1 accuracy  50.0000% of 64 labelled images" in text


def test_core_run_prints_a_missing_phase_as_n_a_and_no_line_for_figures_it_lacks() -> None:
    from core.cli import format_result

    result = _result(
        setup_seconds=None, first_step_seconds=1.5, data_wait_seconds=None, data_wait_fraction=None, **_no_roofline()
    )
    text = format_result(result)
    assert "phases          setup n/a, first step 1.5 s, warm-up n/a" in text
    assert "data wait" not in text and "roofline" not in text


def _no_roofline() -> dict[str, Any]:
    return {name: None for name in ROOFLINE_FIGURES} | {"flops_per_sample": None}


def test_loadgen_figures_are_exported(tmp_path: Path) -> None:
    loadgen = LoadGenFigures(scenario="offline", valid=True, samples_per_second=12.5)
    row = _exported_row(tmp_path, _result(loadgen=loadgen))
    assert row["loadgen_valid"] == "True" and float(row["loadgen_samples_per_second"]) == 12.5


def test_the_docs_name_every_column_added_since_0_2() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "sweeps.md").read_text(encoding="utf-8")
    added = EXPORT_COLUMNS[len(COLUMNS_BEFORE_0_3) :]
    assert added and not [name for name in added if f"`{name}`" not in docs]
