"""Reports of sweeps that hold inference cells: kept apart from the training cells (their own table
and plots, by scenario), from made-up results and from tiny real runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result
from test_report import PLOT_KINDS, check_page_in_chromium, check_plots, parse_html

import core
import core.report.sections
from core.base.results import LoadGenFigures, RunResult
from core.report import is_inference, write_report
from core.storage.store import ResultStore
from core.testing import TINY_FCNN

BATCHES = (8, 32, 128)
# Speeds per sample of batch: no inference cell shares a throughput with a training cell.
INFERENCE_SPEED = 7_000.0
TRAINING_SPEED = 100.0
INFERENCE_PLOTS = ("inference-throughput-vs-batch-size", "inference-p90-latency-vs-batch-size")


def inference_result(batch: int, scenario: str, valid: bool = True) -> RunResult:
    """An inference cell's result as the runner writes one: latencies in the loop and under
    single-stream, none offline (one query), LoadGen's figures under a LoadGen scenario."""
    result = synthetic_result(
        micro_batch_size=batch,
        throughput=INFERENCE_SPEED * batch,
        samples_per_watt_hour=5e4 * batch,
        mode="inference",
        scenario=scenario,
        epoch_definition="samples:50000",
    )
    if scenario != "offline":
        result.step_seconds_median, result.step_seconds_p90, result.step_seconds_p99 = (
            batch * 1e-4,
            batch * 2e-4,
            batch * 3e-4,
        )
    result.epoch_seconds = 50_000 / INFERENCE_SPEED / batch
    if scenario != "loop":
        result.loadgen = LoadGenFigures(
            scenario=scenario,
            valid=valid,
            invalid_reason=None if valid else "Min duration not met",
            samples_per_second=INFERENCE_SPEED * batch,
        )
    return result


def add(store: ResultStore, sweep: str, key: str, result: RunResult, repeat: int = 0) -> None:
    store.add(result, sweep=sweep, cell_key=key, cell_label=key, repeat=repeat)


@pytest.fixture
def mixed_store(tmp_path: Path) -> ResultStore:
    """Training cells (fp32, bf16) and inference cells (loop, offline, single-stream) in one sweep."""
    store = ResultStore(tmp_path / "results.db")
    for batch in BATCHES:
        for precision in ("fp32", "bf16"):
            for repeat in (0, 1):
                training = synthetic_result(
                    micro_batch_size=batch,
                    precision=precision,
                    throughput=TRAINING_SPEED * batch,
                    samples_per_watt_hour=1e3 * batch,
                    mfu=0.1,
                )
                add(store, "mixed", f"train-{precision}-{batch}", training, repeat)
        for scenario in ("loop", "offline", "single-stream"):
            add(store, "mixed", f"{scenario}-{batch}", inference_result(batch, scenario, valid=batch != 128))
    store.save_sweep("mixed", {"name": "mixed", "repeats": 2}, [], "mixed.toml")
    return store


def drawn_series(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Any], dict[str, list[Any]]]]:
    """Record every plot against batch size: its y label, its cells and its series (label -> cells)."""
    calls: list[tuple[str, list[Any], dict[str, list[Any]]]] = []
    draw = core.report.sections.plot_against_batch

    def recording(cells: Any, series_names: Any, figure_of: Any, spread_of: Any, ylabel: str, *args: Any, **kw: Any):
        from core.report import group_series

        calls.append((ylabel, list(cells), group_series(cells, series_names)))
        return draw(cells, series_names, figure_of, spread_of, ylabel, *args, **kw)

    monkeypatch.setattr(core.report.sections, "plot_against_batch", recording)
    return calls


def test_training_and_inference_cells_are_reported_apart(
    mixed_store: ResultStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = drawn_series(monkeypatch)
    files = write_report(mixed_store, tmp_path / "report")
    expected_plots = {f"mixed-{kind}.png" for kind in (*PLOT_KINDS, *INFERENCE_PLOTS) if kind != "scaling-efficiency"}
    expected_plots.add("mixed-heatmap-mfu-1.png")  # the training cells' batch x precision, against MFU
    check_plots(tmp_path / "report", expected_plots)
    tables = parse_html(files.html).tables

    # The training table has the training cells only, with no mode or scenario column.
    training_rows = dict(tables["cells-mixed"])
    assert set(training_rows) == {f"train-{p}-{b}" for p in ("fp32", "bf16") for b in BATCHES}
    assert {float(row["throughput_per_second"][1]) for row in training_rows.values()} == {
        TRAINING_SPEED * batch for batch in BATCHES
    }
    assert not {"mode", "scenario"} & set(next(iter(training_rows.values())))

    # The inference table: every inference cell, its latencies in ms, energy per sample, LoadGen's verdict.
    inference_rows = dict(tables["inference-mixed"])
    assert set(inference_rows) == {f"{s}-{b}" for s in ("loop", "offline", "single-stream") for b in BATCHES}
    for key, row in inference_rows.items():
        scenario, batch = key.rsplit("-", 1)
        assert row["scenario"][0] == scenario
        assert float(row["throughput_per_second"][1]) == INFERENCE_SPEED * int(batch)
        if scenario == "offline":
            assert row["latency_p90_milliseconds"] == ("n/a", None)
        else:
            assert float(row["latency_p90_milliseconds"][1]) == pytest.approx(int(batch) * 0.2)
            assert float(row["latency_p99_milliseconds"][1]) == pytest.approx(int(batch) * 0.3)
        assert float(row["energy_joules_per_sample"][1]) == pytest.approx(3600 / (5e4 * int(batch)))
        assert float(row["epoch_seconds"][1]) == pytest.approx(50_000 / INFERENCE_SPEED / int(batch))
        verdict = "-" if scenario == "loop" else "VALID" if batch != "128" else "INVALID"
        assert row["loadgen_verdict"][0] == verdict
        assert ("Min duration not met" in row["note"][0]) == (verdict == "INVALID")

    # No plot mixes the modes; every inference series names its scenario.
    assert calls
    for ylabel, cells, series in calls:
        modes = {is_inference(cell) for cell in cells}
        assert len(modes) == 1, ylabel
        if modes == {True}:
            assert all(label.startswith("scenario=") for label in series), list(series)
    inference_labels = {label for _, cells, series in calls if is_inference(cells[0]) for label in series}
    assert inference_labels == {"scenario=loop", "scenario=offline", "scenario=single-stream"}

    markdown = files.markdown.read_text(encoding="utf-8")
    assert "6 training and 9 inference cells" in markdown
    for heading in (
        "### Cells (training)",
        "### Throughput against batch size (training)",
        "### Cells (inference)",
        "### Throughput against batch size (inference)",
        "### p90 latency against batch size (inference)",
    ):
        assert heading in markdown
    assert "`samples:50000 (50,000 samples)`" in markdown


def test_the_mixed_page_opens_in_chromium(mixed_store: ResultStore, tmp_path: Path) -> None:
    files = write_report(mixed_store, tmp_path / "report")
    tables = files.html.read_text(encoding="utf-8").count("<table")
    check_page_in_chromium(files.html, tables=tables, images=len(PLOT_KINDS) - 1 + len(INFERENCE_PLOTS) + 1)


def test_an_inference_only_sweep_has_no_training_parts(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.db")
    for batch in BATCHES:
        add(store, "offline", f"offline-{batch}", inference_result(batch, "offline"))
    files = write_report(store, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "(training)" not in markdown and "### Cells (inference)" in markdown
    assert "training and" not in markdown
    assert "Not drawn: no cell has a p90 latency that can be drawn (offline has none" in markdown
    check_plots(tmp_path / "report", {"offline-inference-throughput-vs-batch-size.png"})
    rows = dict(parse_html(files.html).tables["inference-offline"])
    assert {row["loadgen_verdict"][0] for row in rows.values()} == {"VALID"}


def test_a_training_sweep_reads_as_before(tmp_path: Path) -> None:
    """No mode note, no (training) in the headings, no inference table."""
    store = ResultStore(tmp_path / "r.db")
    for batch in BATCHES:
        add(store, "train", str(batch), synthetic_result(micro_batch_size=batch, throughput=10.0 * batch))
    markdown = write_report(store, tmp_path / "report").markdown.read_text(encoding="utf-8")
    assert "### Cells\n" in markdown and "(training)" not in markdown and "inference" not in markdown.lower()


def test_a_report_of_real_training_and_inference_runs(tmp_path: Path) -> None:
    """Tiny real runs, a LoadGen offline one among them, through the database into the report."""
    store = ResultStore(tmp_path / "r.db")
    quick = {"steps": 3, "warmup_steps": 1, "workload_options": TINY_FCNN}
    for batch in (4, 16):
        runs = {
            f"train-{batch}": core.run("fcnn", "cpu", micro_batch_size=batch, **quick),
            f"loop-{batch}": core.run("fcnn", "cpu", mode="inference", micro_batch_size=batch, **quick),
            f"offline-{batch}": core.run(
                "fcnn",
                "cpu",
                mode="inference",
                scenario="offline",
                loadgen={"min_duration_seconds": 0.2, "min_query_count": 20},
                micro_batch_size=batch,
                **quick,
            ),
        }
        for key, result in runs.items():
            assert result.status.ok, (key, result.status)
            add(store, "real", key, result)
    files = write_report(store, tmp_path / "report")
    tables = parse_html(files.html).tables
    assert set(dict(tables["cells-real"])) == {"train-4", "train-16"}
    inference = dict(tables["inference-real"])
    assert set(inference) == {"loop-4", "loop-16", "offline-4", "offline-16"}
    assert inference["offline-4"]["loadgen_verdict"][0] in ("VALID", "INVALID")
    assert inference["loop-4"]["loadgen_verdict"][0] == "-"
    assert float(inference["loop-16"]["latency_p90_milliseconds"][1]) > 0
    plots = {path.name for path in files.plots}
    assert {f"real-{kind}.png" for kind in INFERENCE_PLOTS} <= plots
