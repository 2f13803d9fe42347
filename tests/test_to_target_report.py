"""Runs trained to a target quality (issue 31) summarised over repeats (MLPerf's olympic mean), shown
by `core results`, the CSV export, `core run`'s text and the report's "Time to target" part."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result
from test_report import check_plots, check_tables_match_database, markdown_rows, parse_html

from core.base.results import QualityPoint, RunResult, RunState, Status, TargetOutcome
from core.report import write_report
from core.storage.store import ResultStore
from core.storage.summary import CellSummary, olympic_mean, summarise

SWEEP = "digits"


def _outcome(
    seconds: float | None, *, epochs_per_second: float = 0.5, joules_per_second: float | None = 20.0
) -> TargetOutcome:
    """A run to top1 >= 0.9 that reached it after ``seconds`` (None: it did not, stopped after 10 s);
    an evaluation each 0.5 epoch whose accuracy rises linearly to 0.9 at the target."""
    reached = seconds is not None
    end = seconds if reached else 10.0
    points = []
    step = 0.5 / epochs_per_second  # seconds between evaluations
    count = max(1, round(end / step))
    for index in range(1, count + 1):
        at = end * index / count
        points.append(
            QualityPoint(
                epoch=at * epochs_per_second,
                samples=int(at * epochs_per_second * 1000),
                seconds=at,
                joules=None if joules_per_second is None else at * joules_per_second,
                value=0.9 * at / end if reached else 0.8 * at / end,
                evaluation_seconds=0.01,
            )
        )
    energy = None if joules_per_second is None else end * joules_per_second
    return TargetOutcome(
        metric="top1",
        target=0.9,
        higher_is_better=True,
        reached=reached,
        stopped_by="target" if reached else "max_seconds",
        time_to_target_seconds=seconds,
        energy_to_target_joules=energy if reached else None,
        epochs_to_target=end * epochs_per_second if reached else None,
        samples_to_target=int(end * epochs_per_second * 1000) if reached else None,
        initialization_seconds=0.5,
        training_seconds=end,
        training_joules=energy,
        evaluation_seconds=0.01 * len(points),
        epochs=end * epochs_per_second,
        samples=int(end * epochs_per_second * 1000),
        curve=points,
    )


def _target_result(batch: int, seconds: float | None, **fields: Any) -> RunResult:
    result = synthetic_result(micro_batch_size=batch, samples_per_watt_hour=1e4, mfu=0.1)
    state = RunState.ok if seconds is not None else RunState.target_not_reached
    message = None if seconds is not None else "top1 0.8 < 0.9 when the time budget ran out"
    return result.model_copy(
        update={"to_target": _outcome(seconds, **fields), "status": Status(state=state, message=message)}
    )


# Each batch size's repeats: seconds to target, None where it was not reached. A batch-size sweep's
# fall then rise: 64 is fastest. 256 has one miss (olympic: it is the slowest, dropped).
TIMES: dict[int, list[float | None]] = {
    16: [9.0, 8.0, 10.0, 12.0, 11.0],
    64: [4.0, 5.0, 3.0],
    256: [7.0, None, 6.0, 8.0],
}


@pytest.fixture
def target_store(tmp_path: Path) -> ResultStore:
    store = ResultStore(tmp_path / "results.db")
    cells = []
    for batch, times in TIMES.items():
        key, label = f"b{batch}", f"micro_batch_size={batch}"
        cells.append({"key": key, "label": label, "invalid_reason": None})
        for repeat, seconds in enumerate(times):
            store.add(_target_result(batch, seconds), sweep=SWEEP, cell_key=key, cell_label=label, repeat=repeat)
    store.save_sweep(SWEEP, {"name": SWEEP, "repeats": 5}, cells, "digits.toml")
    return store


def _cells(store: ResultStore) -> dict[str, CellSummary]:
    return {cell.cell_key: cell for cell in summarise(store.runs(sweep=SWEEP))}


# --- the olympic mean -----------------------------------------------------------------------------


def test_olympic_mean_drops_the_fastest_and_the_slowest() -> None:
    assert olympic_mean([9.0, 8.0, 10.0, 12.0, 11.0]) == 10.0  # 5 runs: the mean of 9, 10, 11
    assert olympic_mean([4.0, 5.0, 3.0]) == 4.0  # 3 runs: the middle one
    assert olympic_mean([1.0, 2.0, 3.0, 10.0]) == 2.5
    # Fewer than 3 runs: MLPerf has no result (its smallest number of runs is 3).
    assert olympic_mean([4.0]) is None
    assert olympic_mean([4.0, 5.0]) is None
    assert olympic_mean([]) is None


def test_a_run_that_missed_the_target_is_the_slowest_and_two_invalidate() -> None:
    # One miss is dropped as the slowest; the fastest reached one is dropped too.
    assert olympic_mean([7.0, 6.0, 8.0], not_reached=1) == 7.5
    assert olympic_mean([7.0, 6.0], not_reached=1) == 7.0  # 3 runs, one missed: the slower reached one
    assert olympic_mean([7.0], not_reached=1) is None  # 2 runs in all
    assert olympic_mean([7.0, 6.0, 8.0, 9.0], not_reached=2) is None  # MLPerf: invalid


def test_cells_summarise_the_figures_to_target(target_store: ResultStore) -> None:
    cells = _cells(target_store)
    fastest = cells["b64"]
    assert fastest.figure("time_to_target_seconds") == 4.0
    assert fastest.figure("energy_to_target_joules") == pytest.approx(80.0)
    assert fastest.figure("epochs_to_target") == pytest.approx(2.0)
    assert fastest.figure("samples_to_target") == pytest.approx(2000)
    assert fastest.figure("target_reached") == 3 and fastest.figure("target_metric") == "top1"
    missed = cells["b256"]
    # A repeat that did not reach the target is measured, not failed: the cell is ok, 4 of 4 measured.
    assert missed.status == "ok" and missed.failure is None and missed.repeats_ok == 4
    assert missed.targets_reached == 3 and missed.trained_to_target == 4
    time = missed.to_target("time_to_target_seconds")
    assert time.values == (7.0, 6.0, 8.0) and time.not_reached == 1
    assert time.olympic_mean == 7.5 and time.median == 7.0 and (time.minimum, time.maximum) == (6.0, 8.0)
    assert missed.figure("time_to_target_seconds") == 7.5
    assert missed.figure("target_final_value") == pytest.approx(0.9)  # the median over the four ends (0.8, 0.9 x 3)
    five = cells["b16"].to_target("time_to_target_seconds")
    assert five.olympic_mean == 10.0 and five.median == 10.0 and five.spread == pytest.approx(0.4)


def test_one_and_two_repeats_have_a_median_but_no_olympic_mean(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        for repeat, seconds in enumerate((4.0, 6.0)):
            store.add(_target_result(8, seconds), sweep="s", cell_key="two", cell_label="two", repeat=repeat)
        store.add(_target_result(8, 5.0), sweep="s", cell_key="one", cell_label="one", repeat=0)
        store.add(_target_result(8, None), sweep="s", cell_key="none", cell_label="none", repeat=0)
        cells = {cell.cell_key: cell for cell in summarise(store.runs())}
    two = cells["two"].to_target("time_to_target_seconds")
    assert two.olympic_mean is None and two.median == 5.0 and cells["two"].figure("time_to_target_seconds") is None
    assert cells["one"].to_target("time_to_target_seconds").median == 5.0
    # A cell whose only repeat missed: a measured outcome, shown as its state, no figure.
    assert cells["none"].status == "target_not_reached" and cells["none"].failure is None
    assert cells["none"].to_target("time_to_target_seconds").median is None


def test_a_failed_repeat_is_a_failure_not_a_miss(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        for repeat, seconds in enumerate((4.0, 5.0, 6.0)):
            store.add(_target_result(8, seconds), sweep="s", cell_key="c", cell_label="c", repeat=repeat)
        broken = _target_result(8, 1.0).model_copy(update={"status": Status(state=RunState.error, message="boom")})
        store.add(broken, sweep="s", cell_key="c", cell_label="c", repeat=3)
        (cell,) = summarise(store.runs())
    assert cell.status == "error" and cell.trained_to_target == 3
    assert cell.to_target("time_to_target_seconds").olympic_mean == 5.0


# --- core results, the export, core run ------------------------------------------------------------


def test_core_results_and_the_export_show_the_figures(target_store: ResultStore) -> None:
    from core.cli import format_cells

    text = format_cells(summarise(target_store.runs(sweep=SWEEP)))
    header, *rows = text.splitlines()
    assert "reached" in header and "to target s" in header and "to target J" in header
    by_label = {row.split()[0]: row for row in rows}
    assert "3/4" in by_label["micro_batch_size=256"] and " 7.5 " in by_label["micro_batch_size=256"]
    assert "5/5" in by_label["micro_batch_size=16"]
    stream = io.StringIO()
    target_store.export_csv(stream, sweep=SWEEP)
    exported = list(csv.DictReader(io.StringIO(stream.getvalue())))
    assert len(exported) == 12
    missed = next(row for row in exported if row["status"] == "target_not_reached")
    assert missed["target_reached"] == "False" and missed["time_to_target_seconds"] == ""
    assert missed["target_stopped_by"] == "max_seconds" and float(missed["target_final_value"]) == pytest.approx(0.8)
    first = exported[0]
    assert float(first["time_to_target_seconds"]) == 9.0 and int(first["target_evaluations"]) == 9


def test_core_results_without_targets_has_no_target_columns(tmp_path: Path) -> None:
    from core.cli import format_cells

    with ResultStore(tmp_path / "r.db") as store:
        store.add(synthetic_result(samples_per_watt_hour=1.0), sweep="s", cell_key="a", cell_label="a", repeat=0)
        header = format_cells(summarise(store.runs())).splitlines()[0]
    assert "reached" not in header and "target" not in header


def test_core_run_prints_the_outcome() -> None:
    from core.cli import format_result

    reached = format_result(_target_result(64, 4.0))
    assert "to target       top1 >= 0.9 reached in 4 s, 80 J = 0.02222 Wh, 2 epochs, 2,000 samples" in reached
    assert "(evaluations 0.04 s inside, initialisation 0.5 s before the clock)" in reached
    assert (
        "trained         top1 0.9 after 2 epochs, 2,000 samples, 4 s, 80 J (4 evaluations, stopped by target)"
        in reached
    )
    missed = format_result(_target_result(64, None))
    assert ": target_not_reached" in missed.splitlines()[0]
    assert "to target       top1 >= 0.9 not reached (stopped by max_seconds)" in missed
    assert "top1 0.8 after 5 epochs" in missed and "error" not in missed
    # The phases a run to a target has: set-up, then the clock's training (no first step, no warm-up).
    phases = next(line for line in reached.splitlines() if line.startswith("  phases"))
    assert "training 4 s (first step and evaluations inside)" in phases
    assert "first step" not in phases.split("training")[0] and "warm-up" not in phases
    steady = next(line for line in format_result(synthetic_result()).splitlines() if line.startswith("  phases"))
    assert "first step" in steady and "warm-up" in steady and "training" not in steady
    assert "to target" not in format_result(synthetic_result())


def test_a_sweeps_run_line_says_the_time_to_target_not_a_throughput() -> None:
    # A run to a target has no steady throughput: its line gives the time and epochs to the target.
    from core.cli.sweep_display import SweepDisplay
    from core.sweep.plan import Cell

    cell = Cell(index=0, key="b64", label="micro_batch_size=64", options={})
    reached = SweepDisplay._run_line(cell, 0, _target_result(64, 4.0), 6.5)
    assert reached == "micro_batch_size=64 repeat 1: ok, top1 0.9 reached in 4 s, 2 epochs (6.5 s)"
    missed = SweepDisplay._run_line(cell, 1, _target_result(64, None), 9.0)
    assert missed.startswith("micro_batch_size=64 repeat 2: target_not_reached")


# --- the report -----------------------------------------------------------------------------------


def test_the_report_has_a_time_to_target_part(target_store: ResultStore, tmp_path: Path) -> None:
    files = write_report(target_store, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "### Time to target" in markdown and "olympic mean" in markdown
    html = parse_html(files.html)
    rows = dict(html.tables[f"to-target-{SWEEP}"])
    cells = _cells(target_store)
    assert set(rows) == set(cells)
    for key, cell in cells.items():
        row = rows[key]
        assert row["reached"] == (f"{cell.targets_reached} of {cell.trained_to_target}", str(cell.targets_reached))
        for name in ("time_to_target_seconds", "energy_to_target_joules", "epochs_to_target"):
            figure = cell.to_target(name)
            # The exact value behind each cell, against the repeats read from the database here.
            values = [
                getattr(run.result.to_target, name)
                for run in target_store.runs(sweep=SWEEP)
                if run.cell_key == key and run.result.to_target is not None and run.result.to_target.reached
            ]
            assert float(row[f"{name}_median"][1]) == pytest.approx(statistics.median(values))
            assert float(row[f"{name}_olympic_mean"][1]) == pytest.approx(figure.olympic_mean)
    assert float(rows["b256"]["time_to_target_seconds_olympic_mean"][1]) == 7.5
    assert rows["b64"]["time_to_target_seconds_min"] == ("3 s", "3.0")
    # The Markdown table says the same.
    md_rows = markdown_rows(markdown.split("### Time to target", 1)[1], "micro_batch_size")
    assert [row["reached"] for row in md_rows] == ["5 of 5", "3 of 3", "3 of 4"]
    # The plot against batch size: median time to target falls, then rises.
    data = [row for _, row in html.tables[f"time-to-target-data-{SWEEP}"]]
    medians = [float(row["value"][1]) for row in data]
    assert medians == [10.0, 4.0, 7.0]
    kinds = {
        f"{SWEEP}-time-to-target-vs-micro-batch-size.png",
        f"{SWEEP}-energy-to-target-vs-micro-batch-size.png",
        f"{SWEEP}-quality-vs-seconds.png",
        f"{SWEEP}-quality-vs-samples.png",
        f"{SWEEP}-quality-vs-joules.png",
    }
    drawn = {path.name for path in (tmp_path / "report" / "plots").glob("*.png")}
    assert kinds <= drawn
    check_plots(tmp_path / "report", drawn)
    # Every evaluation of every measured repeat is in the curves' data.
    curve = html.tables[f"quality-seconds-data-{SWEEP}"]
    assert len(curve) == sum(len(run.result.to_target.curve) for run in target_store.runs(sweep=SWEEP))  # type: ignore[union-attr]
    # A miss is no failure.
    assert "### Failures" not in markdown


def test_a_precision_sweep_draws_bars_by_cell(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        for precision, seconds in (("fp32", 6.0), ("bf16", 4.0)):
            result = _target_result(32, seconds, joules_per_second=None)
            result = result.model_copy(update={"config": result.config.model_copy(update={"precision": precision})})
            store.add(result, sweep="p", cell_key=precision, cell_label=f"precision={precision}", repeat=0)
        write_report(store, tmp_path / "report")
    drawn = {path.name for path in (tmp_path / "report" / "plots").glob("*.png")}
    assert "p-time-to-target-by-cell.png" in drawn and "p-energy-to-target-by-cell.png" not in drawn
    assert "p-quality-vs-joules.png" not in drawn
    markdown = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "no curve against energy" in markdown


def test_a_sweep_without_targets_is_unchanged(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        for batch in (8, 32):
            for repeat in range(2):
                store.add(
                    synthetic_result(micro_batch_size=batch, samples_per_watt_hour=1e3 * batch, mfu=0.1),
                    sweep="plain",
                    cell_key=f"b{batch}",
                    cell_label=f"micro_batch_size={batch}",
                    repeat=repeat,
                )
        files = write_report(store, tmp_path / "report")
        assert check_tables_match_database(store, "plain", tmp_path / "report") == 2
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "Time to target" not in markdown and "quality" not in markdown.lower().replace("quality-of", "")
    assert not [path for path in (tmp_path / "report" / "plots").glob("*target*")]


def test_single_runs_show_their_own_figures_to_target(tmp_path: Path) -> None:
    with ResultStore(tmp_path / "r.db") as store:
        store.add(_target_result(64, 4.0))
        store.add(_target_result(64, None))
        store.add(synthetic_result())
        files = write_report(store, tmp_path / "report")
    rows = [row for _, row in parse_html(files.html).tables["single-runs-to-target"]]
    assert [row["reached"][0] for row in rows] == ["yes", "no (max_seconds)"]
    assert rows[0]["time_to_target_seconds"] == ("4 s", "4.0") and rows[1]["time_to_target_seconds"][1] is None
    assert float(rows[1]["target_final_value"][1]) == pytest.approx(0.8)


@pytest.mark.slow
def test_a_tiny_batch_size_sweep_to_a_target_runs_and_the_report_draws_it(tmp_path: Path) -> None:
    # examples/digits-to-target.toml, shrunk: two batch sizes, two repeats, an easier target.
    from core.cli import main

    sweep = tmp_path / "tiny.toml"
    sweep.write_text(
        'name = "digits-tiny"\nrepeats = 2\ntimeout_seconds = 300\n'
        '[grid]\nworkload = "digits"\naccelerator = "cpu"\nmicro_batch_size = [32, 128]\n'
        '[grid.target]\nmetric = "top1"\nvalue = 0.9\nevaluate_every_epochs = 1\nmax_epochs = 40\n',
        encoding="utf-8",
    )
    database = tmp_path / "results.db"
    assert main(["sweep", str(sweep), "--database", str(database)]) == 0
    runs = ResultStore(database, create=False).runs(sweep="digits-tiny")
    assert len(runs) == 4 and all(run.result.to_target is not None for run in runs)
    assert all(run.result.to_target.reached for run in runs)  # type: ignore[union-attr]
    # Each repeat trains from a seed of its own (MLPerf's runs do): the cell's seed plus the repeat.
    assert sorted((run.result.config.micro_batch_size, run.repeat, run.result.config.seed) for run in runs) == [
        (32, 0, 0),
        (32, 1, 1),
        (128, 0, 0),
        (128, 1, 1),
    ]
    for batch in (32, 128):
        first, second = (
            [point.value for point in run.result.to_target.curve]
            for run in runs  # type: ignore[union-attr]
            if run.result.config.micro_batch_size == batch
        )
        assert first != second  # other weights and another epoch order: another curve
    out = tmp_path / "report"
    assert main(["report", "--database", str(database), "--output", str(out)]) == 0
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "### Time to target" in text and "| 32 | top1 &gt;= 0.9 | 2 of 2 |" in text
    plots = {path.name for path in (out / "plots").glob("*.png")}
    assert {
        "digits-tiny-time-to-target-vs-micro-batch-size.png",
        "digits-tiny-quality-vs-seconds.png",
        "digits-tiny-quality-vs-samples.png",
    } <= plots


@pytest.mark.slow
def test_a_sweep_cell_that_misses_its_target_runs_every_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A missed target is a measured outcome: the cell goes on to its next repeat (a fault would stop
    # it), and `core sweep` counts no failure.
    from core.cli import main

    sweep = tmp_path / "missed.toml"
    sweep.write_text(
        'name = "digits-missed"\nrepeats = 2\ntimeout_seconds = 300\n'
        '[grid]\nworkload = "digits"\naccelerator = "cpu"\nmicro_batch_size = 64\n'
        '[grid.target]\nmetric = "loss"\nvalue = 0.0001\nmax_epochs = 1\n',
        encoding="utf-8",
    )
    database = tmp_path / "results.db"
    main(["sweep", str(sweep), "--database", str(database)])
    printed = capsys.readouterr().out
    assert "1 cell, 0 failed, 1 missed their target, 0 flagged" in printed, printed
    runs = ResultStore(database, create=False).runs(sweep="digits-missed")
    assert sorted(run.repeat for run in runs) == [0, 1]
    assert {run.result.status.state.value for run in runs} == {"target_not_reached"}
