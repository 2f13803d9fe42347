"""A report people want to read: a summary and contents first, tables without n/a-only columns and
readable at 900 px, numbers in engineering notation, plots for print, an estimate that agrees with
its row, and the host's load beside a flagged cell."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from synthetic import synthetic_result
from test_report import check_page_in_chromium, parse_html
from test_runner import ScriptedAccelerator, ScriptedWorkload

from core import run
from core.base.results import HostLoad, RunResult
from core.report import TrainingPlan, write_report
from core.report.document import format_duration, format_number
from core.report.plots import plot_against_batch, plot_pareto
from core.running import hostload, runner
from core.running.hostload import HostSample, host_load, sample_host
from core.storage.store import ResultStore
from core.storage.summary import summarise
from core.testing import registered_plugins

LONG_MESSAGE = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456789 bytes. " * 12


def busy(load: float) -> HostLoad:
    return HostLoad(cpu_count=2, load_average_start=load, load_average_end=load, steal_fraction=0.0)


def add(store: ResultStore, sweep: str, key: str, results: list[RunResult]) -> None:
    for repeat, result in enumerate(results):
        store.add(result, sweep=sweep, cell_key=key, cell_label=key, repeat=repeat)


@pytest.fixture
def cpu_store(tmp_path: Path) -> ResultStore:
    """A CPU sweep as this machine runs one: no energy, no MFU; batch 8 to 512 at fp32, repeats
    spread 30 % on a host loaded 3 on 2 CPUs (flagged, busy), batch 64 spread 30 % on an idle host,
    and an out-of-memory cell with a long message."""
    store = ResultStore(tmp_path / "cpu.db")
    for batch in (8, 64, 512):
        load = 0.5 if batch == 64 else 3.0
        results = []
        for jitter in (1.0, 1.3, 1.1):
            result = synthetic_result(micro_batch_size=batch, throughput=40.18 * batch * jitter)
            result.host_load = busy(load)
            results.append(result)
        add(store, "cpu", f"b{batch}", results)
    add(store, "cpu", "b4096", [synthetic_result(micro_batch_size=4096, state="oom", message=LONG_MESSAGE)])
    store.save_sweep("cpu", {"name": "cpu", "repeats": 3}, [], "cpu.toml")
    return store


@pytest.fixture
def cpu_report(cpu_store: ResultStore, tmp_path: Path) -> Any:
    return write_report(cpu_store, tmp_path / "report")


def cells(files: Any, table: str = "cells-cpu") -> list[dict[str, tuple[str, str | None]]]:
    return [row for _, row in parse_html(files.html).tables[table]]


# --- numbers ------------------------------------------------------------------------------------


def test_numbers_are_in_engineering_notation_with_units() -> None:
    assert [format_number(v) for v in (None, 0, 146.53, 2172.42, 40180.0, 3.2e6, 0.05, 2.336e-4, -4.5e9)] == [
        "n/a",
        "0",
        "146.5",
        "2.172 k",
        "40.18 k",
        "3.2 M",
        "0.05",
        "233.6 µ",
        "-4.5 G",
    ]
    assert format_number(999_960) == "1 M"  # rounding up to the next prefix, not "1000 k"
    assert [format_duration(s) for s in (None, 1.2e-5, 0.85, 40.18, 4018.0, 27_342.0)] == [
        "n/a",
        "12 µs",
        "850 ms",
        "40.18 s",
        "66.97 min",
        "7.595 h",
    ]


def test_a_latency_of_40180_ms_reads_40_18_s_and_keeps_its_exact_value(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "inference.db")
    result = synthetic_result(mode="inference", throughput=10.0)
    result.step_seconds_median = result.step_seconds_p90 = result.step_seconds_p99 = 40.18
    add(store, "inference", "a", [result])
    files = write_report(store, tmp_path / "report")
    (row,) = cells(files, "inference-inference")
    assert row["latency_p90_milliseconds"] == ("40.18 s", "40180.0")
    headers = re.findall(r'<th data-column="latency_p90_milliseconds">([^<]*)</th>', files.html.read_text())
    assert headers == ["latency p90 (median)"]  # the cell says its unit; "(ms, median)" would contradict it


# --- tables ---------------------------------------------------------------------------------------


def test_columns_n_a_in_every_row_are_left_out_and_named_once(cpu_report: Any) -> None:
    rows = cells(cpu_report)
    assert rows and not any("model_flops_utilization" in row or "energy_joules" in row for row in rows)
    assert "throughput_per_second" in rows[0] and "flops_per_second" in rows[0]
    markdown = cpu_report.markdown.read_text(encoding="utf-8")
    note = "Not shown, n/a in every row: MFU (median), energy (J, median)"
    assert markdown.count(note) == 1
    assert cpu_report.html.read_text(encoding="utf-8").count(note) == 1


def test_a_failure_is_cut_in_the_table_and_whole_in_the_failures(cpu_report: Any) -> None:
    (failed,) = [row for row in cells(cpu_report) if row["status"][0] == "oom"]
    note = failed["note"][0]
    assert len(note) < 130 and note.endswith("(see Failures)")
    markdown = cpu_report.markdown.read_text(encoding="utf-8")
    failures = markdown.split("### Failures", 1)[1]
    assert LONG_MESSAGE[:1000] in failures


# --- plots ----------------------------------------------------------------------------------------


def test_every_plot_is_also_svg_and_pdf_and_the_report_links_them(cpu_report: Any, tmp_path: Path) -> None:
    plots = tmp_path / "report" / "plots"
    pngs = sorted(plots.glob("*.png"))
    assert pngs
    markdown = cpu_report.markdown.read_text(encoding="utf-8")
    page = cpu_report.html.read_text(encoding="utf-8")
    for png in pngs:
        svg, pdf = png.with_suffix(".svg"), png.with_suffix(".pdf")
        assert svg.read_bytes().lstrip().startswith(b"<?xml") and b"<svg" in svg.read_bytes()
        assert pdf.read_bytes().startswith(b"%PDF-")
        for vector in (svg, pdf):
            assert f"(plots/{vector.name})" in markdown
            assert f'href="plots/{vector.name}"' in page
            assert vector in cpu_report.plots
    # The same data gives the same bytes (no dates, no random ids): a second report changes nothing.
    before = {path.name: path.read_bytes() for path in plots.iterdir()}
    write_report(ResultStore(tmp_path / "cpu.db", create=False), tmp_path / "report")
    assert {path.name: path.read_bytes() for path in plots.iterdir()} == before


@pytest.fixture
def tick_labels(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The tick labels of every figure the report saves, read as matplotlib drew them."""
    from matplotlib.figure import Figure

    labels: list[str] = []
    save = Figure.savefig

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = save(self, *args, **kwargs)
        for axes in self.axes:
            for minor in (False, True):
                ticks = axes.get_xticklabels(minor=minor) + axes.get_yticklabels(minor=minor)
                labels.extend(text.get_text() for text in ticks if text.get_text())
        return saved

    monkeypatch.setattr(Figure, "savefig", recording)
    yield labels


def test_log_axes_have_plain_tick_labels(tick_labels: list[str], tmp_path: Path) -> None:
    """Decades (0.1 to 10k) and, where the axis spans less than a decade, the ticks between (0.6)."""
    store = ResultStore(tmp_path / "ticks.db")
    for sweep, values in (("wide", (0.6, 2.0, 900.0, 25_000.0)), ("short", (0.5, 0.6, 0.8, 1.5))):
        for batch, value in zip((8, 16, 32, 64), values):
            result = synthetic_result(micro_batch_size=batch, throughput=value, samples_per_watt_hour=value * 3)
            add(store, sweep, f"b{batch}", [result])
        cells = summarise(store.runs(sweep=sweep))
        plot_against_batch(cells, ["micro_batch_size"], lambda c: c.throughput_per_second, None, "y", "t")
        plot_pareto(cells, ["micro_batch_size"])
    assert not [label for label in tick_labels if "times" in label or "^" in label or "$" in label], tick_labels
    assert {"0.1", "1", "10", "100", "1000", "10k"} <= set(tick_labels)
    assert "0.6" in tick_labels


# --- time to train --------------------------------------------------------------------------------


def test_the_time_to_train_is_the_rows_own_throughput(tmp_path: Path) -> None:
    """Repeats at 100 and 300 samples/s: the row shows 200 samples/s, so the estimate is the epochs'
    samples at 200/s, 83.3 min (the median of the repeats' estimates would be at 150/s: 111 min)."""
    store = ResultStore(tmp_path / "train.db")
    add(store, "train", "b64", [synthetic_result(throughput=t) for t in (100.0, 300.0)])
    files = write_report(store, tmp_path / "report", training=TrainingPlan(10, "samples:100000"))
    (row,) = cells(files, "to-train-train")
    first, throughput = float(row["first_step_seconds"][1] or 0), float(row["throughput_per_second"][1] or 0)
    assert throughput == pytest.approx(200.0)
    expected = first + (10 * 100_000 - 64) / throughput
    assert float(row["time_to_train_seconds"][1] or 0) == pytest.approx(expected)
    assert row["time_to_train_seconds"][0] == format_duration(expected) == "83.33 min"


# --- the host's load --------------------------------------------------------------------------------


def test_the_host_load_is_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "loadavg").write_text("3.50 2.00 1.00 4/512 12345\n")
    (tmp_path / "stat").write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n")
    start = sample_host(tmp_path)
    assert start == HostSample(3.5, 40, 1000)
    end = HostSample(1.5, 60, 1400)  # 400 ticks later, 20 of them stolen
    load = host_load(start, end, cpu_count=2)
    assert load == HostLoad(cpu_count=2, load_average_start=3.5, load_average_end=1.5, steal_fraction=0.05)
    assert load.busy and load.overloaded and load.stolen
    assert not HostLoad(cpu_count=4, load_average_start=3.5, steal_fraction=0.0).busy
    # A host without /proc: nothing read, nothing recorded.
    assert sample_host(tmp_path / "missing") == HostSample(None, None, None)
    assert host_load(HostSample(None, None, None), HostSample(None, None, None)) is None


def test_a_run_records_the_hosts_load_at_the_windows_two_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([HostSample(1.0, 0, 1000), HostSample(9.0, 100, 2000)])
    taken: list[str] = []

    def sample() -> HostSample:
        taken.append("sample")
        return next(readings)

    monkeypatch.setattr(runner, "sample_host", sample)
    with registered_plugins():
        result = run(ScriptedWorkload(), ScriptedAccelerator(), steps=3, warmup_steps=1)
    assert taken == ["sample", "sample"]
    assert result.host_load is not None
    assert (result.host_load.load_average_start, result.host_load.load_average_end) == (1.0, 9.0)
    assert result.host_load.steal_fraction == pytest.approx(0.1)
    assert RunResult.model_validate_json(result.model_dump_json()).host_load == result.host_load


def test_this_host_has_a_load_to_read() -> None:
    if not hostload.PROC.joinpath("loadavg").exists():
        pytest.skip("no /proc/loadavg here")
    sample = sample_host()
    assert sample.load_average is not None and sample.total_ticks


def test_results_before_1_10_read_without_a_host_load(tmp_path: Path) -> None:
    document = json.loads(synthetic_result().model_dump_json())
    document.pop("host_load")
    document["schema_version"] = "1.9"
    assert RunResult.model_validate(document).host_load is None
    store = ResultStore(tmp_path / "old.db")
    add(store, "old", "a", [RunResult.model_validate(document)])
    files = write_report(store, tmp_path / "report")
    assert "Host load: not recorded (results written before schema 1.10" in files.markdown.read_text("utf-8")


def test_a_flagged_cell_says_why_and_whether_the_host_was_busy(cpu_report: Any) -> None:
    notes = {row["micro_batch_size"][0]: row["note"][0] for row in cells(cpu_report)}
    assert notes["8"].startswith("spread 27.3 % > 10.0 %")  # (1.3 - 1.0) / 1.1
    assert "host busy in 3 of 3 runs (load 3.00 on 2 CPUs" in notes["8"]
    assert notes["64"].endswith("host not busy")
    markdown = cpu_report.markdown.read_text(encoding="utf-8")
    assert "3 of 4 cells are flagged" in markdown
    assert "the host was busy during the runs of 2 of them" in markdown


# --- the summary and the contents ---------------------------------------------------------------------


def test_the_summary_comes_first_and_the_contents_link_every_section(cpu_report: Any) -> None:
    markdown = cpu_report.markdown.read_text(encoding="utf-8")
    summary, contents, sweep = (markdown.index(text) for text in ("## Summary", "Contents:", "## Sweep cpu"))
    assert summary < contents < sweep
    head = markdown[summary:contents]
    for fact in (
        "What ran: 10 runs in 4 cells of 1 sweep",
        "workloads fcnn (10 runs)",
        "10 steps after 3 warm-up steps",
        "data synthetic",
        "Options that vary: `micro_batch_size` (8, 64, 512 and 4096)",
        "`precision=fp32`",
        "Where: accelerators cpu (10 runs)",
        "When: the first run started ",
        "the last ",
        "Host load during the timed windows: the 1-minute load average peaked at 3.00 on 2 CPUs",
        "Warnings: 1 failed cell; 3 flagged cells.",
    ):
        assert fact in head, fact
    links = re.findall(r"\]\(#([^)]+)\)", markdown)
    assert "sweep-cpu" in links and "cells" in links and "failures" in links
    page = cpu_report.html.read_text(encoding="utf-8")
    targets = re.findall(r'<a href="#([^"]+)">', page)
    ids = set(re.findall(r'<h[23] id="([^"]+)"', page))
    assert targets and set(targets) <= ids and len(targets) == len(links)


# --- the browser, at 900 and 1400 px ------------------------------------------------------------------


@pytest.mark.parametrize("width", [900, 1400])
def test_the_page_reads_at_900_and_1400_px(cpu_report: Any, width: int, tmp_path: Path) -> None:
    """Nothing leaves the page sideways (a wide table scrolls in its own box), no cell is squeezed
    to a letter a line, and a failed cell's row stays a line or two."""
    shot = tmp_path / f"report-{width}.png"
    report = check_page_in_chromium(cpu_report.html, tables=None, images=None, width=width, screenshot=shot)
    values = report.values
    assert values["page_width"] <= width, values
    assert values["tallest_row"] < 120, values
    assert values["narrowest_text_cell"] >= 30, values
    assert values["boxes"] and all(box["inside"] for box in values["boxes"]), values
    assert shot.read_bytes().startswith(b"\x89PNG")
