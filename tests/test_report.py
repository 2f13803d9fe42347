"""Reports: every plot from made-up results, tables that agree with the database, and a page
that opens in headless Chromium without a console error."""

from __future__ import annotations

import base64
import os
import re
import statistics
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from chromium import PageReport, find_chromium, open_page
from synthetic import synthetic_result

from core.report import ReportError, count_label, format_number, pareto_front, power_traces, write_report
from core.storage.store import ResultStore
from core.storage.summary import summarise

PLOT_KINDS = (
    "throughput-vs-batch-size",
    "samples-per-wh-vs-batch-size",
    "scaling-efficiency",
    "mfu-vs-batch-size",
    "pareto",
    "power-timeline",
)


def require_chromium() -> str:
    """CI must run the browser test (scripts/test.sh installs Chromium); elsewhere it may skip."""
    binary = find_chromium()
    if binary is None:
        required = [
            name
            for name in ("CI", "CORE_REQUIRE_CHROMIUM")
            if os.environ.get(name, "").lower() not in ("", "0", "false")
        ]
        if required:
            pytest.fail(
                f"Chromium is not installed, and {required[0]} is set, so the report must be opened in it: "
                "scripts/test.sh installs Debian's chromium package (apt-get install chromium)"
            )
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    return binary


class Tables(HTMLParser):
    """Every <table id=...>: rows of {column: (text, data-value)}, with each row's data-cell-key."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[tuple[str | None, dict[str, tuple[str, str | None]]]]] = {}
        self._table: str | None = None
        self._row: dict[str, tuple[str, str | None]] | None = None
        self._cell: tuple[str, str | None] | None = None
        self._text = ""
        self.images: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "table":
            self._table = attributes.get("id") or f"table-{len(self.tables)}"
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = {}
            self.tables[self._table].append((attributes.get("data-cell-key"), self._row))
        elif tag == "td" and self._row is not None:
            self._cell = (attributes.get("data-column") or "", attributes.get("data-value"))
            self._text = ""
        elif tag == "img":
            self.images.append(attributes)

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._row is not None:
            self._row[self._cell[0]] = (self._text, self._cell[1])
            self._cell = None
        elif tag == "table" and self._table is not None:
            self.tables[self._table] = [(key, row) for key, row in self.tables[self._table] if row]  # not the header
            self._table = None


def parse_html(path: Path) -> Tables:
    parser = Tables()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def markdown_rows(markdown: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table whose header starts with ``first_header``."""
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(f"| {first_header} |"):
            headers = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(headers, (cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip("|"))))))
            return rows
    raise AssertionError(f"no table starting with {first_header!r}")


_PREFIX_POWERS = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "µ": 1e-6, "n": 1e-9}


def parse_number(text: str) -> float:
    """A table's number back from its text: ``146.5``, ``40.18 k``, ``233.6 µ``."""
    number, _, prefix = text.partition(" ")
    return float(number) * _PREFIX_POWERS.get(prefix, 1.0)


def check_tables_match_database(store: ResultStore, sweep: str, report_directory: Path) -> int:
    """The cells table in report.html and report.md against medians computed here from the database."""
    runs = store.runs(sweep=sweep)
    by_cell: dict[str, list[Any]] = {}
    for run in runs:
        by_cell.setdefault(run.cell_key, []).append(run)
    html_rows = {key: row for key, row in parse_html(report_directory / "report.html").tables[f"cells-{sweep}"]}
    markdown = (report_directory / "report.md").read_text(encoding="utf-8")
    section = markdown.split(f"## Sweep {sweep}", 1)[1]
    assert set(html_rows) == set(by_cell)
    checked = 0
    for key, members in by_cell.items():
        row = html_rows[key]
        ok = [run.result.throughput_per_second for run in members if run.result.status.ok]
        states = [run.result.status.state.value for run in members]
        expected_status = next((state for state in states if state != "ok"), "ok")
        assert row["status"][0].split(" ")[0] == expected_status
        assert row["repeats_ok"] == (f"{len(ok)}/{len(members)}", repr(len(ok)))
        if ok:
            median = statistics.median(ok)
            assert float(row["throughput_per_second"][1]) == median  # the exact figure, kept in data-value
            assert parse_number(row["throughput_per_second"][0]) == pytest.approx(median, rel=5e-4)
            assert row["throughput_per_second"][0] == format_number(median)
            if len(ok) > 1:
                spread = (max(ok) - min(ok)) / median
                assert float(row["spread"][1]) == pytest.approx(spread, rel=1e-12)
                assert ("(flagged)" in row["status"][0]) == (spread > 0.10)
            # Energy in J and Wh, and per device, each the median over the repeats.
            joules = [
                r.energy_joules for r in (run.result for run in members) if r.status.ok and r.energy_joules is not None
            ]
            devices = len(members[0].result.devices)
            if not joules:  # n/a, or the column left out where every row is n/a (a host without a meter)
                na = ("n/a", None)
                assert row.get("energy_joules", na) == na and row.get("energy_watt_hours", na) == na
            else:
                assert float(row["energy_joules"][1]) == pytest.approx(statistics.median(joules), rel=1e-12)
                assert float(row["energy_watt_hours"][1]) == pytest.approx(statistics.median(joules) / 3600, rel=1e-12)
                assert float(row["energy_watt_hours_per_device"][1]) == pytest.approx(
                    statistics.median(joules) / 3600 / devices, rel=1e-12
                )
        else:
            assert row["throughput_per_second"] == ("n/a", None)
        checked += 1
    # The Markdown table shows the same text, row for row.
    options = [
        name
        for name in html_rows[next(iter(html_rows))]
        if name
        not in (
            "status",
            "repeats_ok",
            "throughput_per_second",
            "spread",
            "samples_per_watt_hour",
            "energy_joules",
            "energy_watt_hours",
            "energy_watt_hours_per_device",
            "energy_watt_hours_per_epoch",
            "tokens_per_second",
            "tokens_per_watt_hour",
            "flops_per_second",
            "model_flops_utilization",
            "note",
        )
    ]
    first = options[0].split(".", 1)[-1] if options else "status"
    for row in markdown_rows(section, first):
        match = [
            html for html in html_rows.values() if all(html[name][0] == row[name.split(".", 1)[-1]] for name in options)
        ]
        assert len(match) == 1, row
        assert row["throughput (samples/s, median)"] == match[0]["throughput_per_second"][0]
        assert row["repeats ok"] == match[0]["repeats_ok"][0]
    return checked


def check_plots(report_directory: Path, expected: set[str]) -> None:
    """Markdown links the PNG files; the HTML page embeds the same bytes and names the file."""
    plots = {path.name: path.read_bytes() for path in (report_directory / "plots").glob("*.png")}
    assert set(plots) == expected
    markdown = (report_directory / "report.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"!\[[^\]]*\]\(plots/([^)]+\.png)\)", markdown))
    assert linked == expected
    images = parse_html(report_directory / "report.html").images
    assert len(images) == len(expected)
    for image in images:
        name = (image["data-file"] or "").removeprefix("plots/")
        source = image["src"] or ""
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]) == plots[name]
        assert plots[name].startswith(b"\x89PNG") and len(plots[name]) > 5000


# How the page is laid out: its width (wider than the window: it scrolls sideways), the cells
# tables' tallest row, their narrowest cell with text (a squeezed column breaks words letter by
# letter), and whether each table's scrolling box stays inside the window.
LAYOUT = {
    "page_width": "document.documentElement.scrollWidth",
    "tallest_row": "Math.max(0, ...Array.from(document.querySelectorAll('table[id^=cells-] tbody tr'))"
    ".map(r => r.getBoundingClientRect().height))",
    "narrowest_text_cell": "Math.min(1e9, ...Array.from(document.querySelectorAll('table[id^=cells-] td'))"
    ".filter(c => c.textContent.trim().length > 2).map(c => c.getBoundingClientRect().width))",
    "boxes": "Array.from(document.querySelectorAll('.table-scroll')).map(b => ({"
    "inside: b.getBoundingClientRect().right <= window.innerWidth + 1, "
    "scrolls: b.scrollWidth > b.clientWidth}))",
}


def check_page_in_chromium(
    page: Path, tables: int | None, images: int | None, width: int | None = None, screenshot: Path | None = None
) -> PageReport:
    """The page opens without a console error, every image decoded, ``tables`` tables (None: any);
    its layout (LAYOUT) at ``width`` px is in the returned report's values."""
    report = open_page(
        page,
        {
            "images": "Array.from(document.images)"
            ".map(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100)",
            "tables": "document.querySelectorAll('table').length",
            "rows": "document.querySelectorAll('table[id^=cells-] tbody tr').length",
            **LAYOUT,
        },
        binary=require_chromium(),
        width=width,
        screenshot=screenshot,
    )
    assert report.errors == [], report.errors
    if images is not None:
        assert report.values["images"] == [True] * images
    else:
        assert all(report.values["images"])
    if tables is not None:
        assert report.values["tables"] == tables
    assert '<table id="cells-' in report.dom and "<figure>" in report.dom
    return report


# --- a report from made-up results ---------------------------------------------------------------


@pytest.fixture
def synthetic_store(tmp_path: Path) -> ResultStore:
    """3 batch sizes x 2 precisions x 2 replica counts, 2 repeats, energy and MFU, and one oom cell."""
    store = ResultStore(tmp_path / "results.db")
    cells = []
    for precision in ("fp32", "bf16"):
        for replicas in (1, 2):
            for batch in (8, 32, 128, 1 << 24):
                key = f"{precision}-{replicas}-{batch}"
                label = f"micro_batch_size={batch} precision={precision} replicas={replicas}"
                cells.append({"key": key, "label": label, "invalid_reason": None})
                if batch == 1 << 24:
                    store.add(
                        synthetic_result(
                            micro_batch_size=batch,
                            precision=precision,
                            replicas=replicas,
                            state="oom",
                            message="DefaultCPUAllocator: can't allocate memory",
                        ),
                        sweep="synthetic",
                        cell_key=key,
                        cell_label=label,
                        repeat=0,
                    )
                    continue
                speed = batch * (2.0 if precision == "bf16" else 1.0) * replicas * 0.9 ** (replicas - 1)
                for repeat, jitter in enumerate((1.0, 1.03)):
                    store.add(
                        synthetic_result(
                            micro_batch_size=batch,
                            precision=precision,
                            replicas=replicas,
                            throughput=100 * speed * jitter,
                            samples_per_watt_hour=1e4 * speed**0.5 * jitter,
                            mfu=min(0.6, 0.01 * speed),
                        ),
                        sweep="synthetic",
                        cell_key=key,
                        cell_label=label,
                        repeat=repeat,
                    )
    cells.append(
        {
            "key": "tf32",
            "label": "precision=tf32",
            "invalid_reason": "precision = 'tf32': cpu supports fp32, bf16, fp16",
        }
    )
    store.save_sweep("synthetic", {"name": "synthetic", "repeats": 2, "description": "made up"}, cells, "grid.toml")
    return store


def test_every_plot_is_drawn_and_tables_match(synthetic_store: ResultStore, tmp_path: Path) -> None:
    files = write_report(synthetic_store, tmp_path / "report")
    assert files.markdown.exists() and files.html.exists()
    # Batch x precision per replica count and batch x replicas per precision: MFU maps (every cell has one).
    heatmaps = {f"synthetic-heatmap-mfu-{index}.png" for index in range(1, 5)}
    check_plots(tmp_path / "report", {f"synthetic-{kind}.png" for kind in PLOT_KINDS} | heatmaps)
    assert check_tables_match_database(synthetic_store, "synthetic", tmp_path / "report") == 16
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "Cells refused by validation" in markdown and "precision=tf32" in markdown
    assert "### Failures" in markdown and "can't allocate memory" in markdown
    # The batch table shows the out-of-memory cells as such, as the AI4NP heatmap's blank cells.
    batches = markdown_rows(markdown, "series")
    assert [row["16777216"] for row in batches] == ["oom"] * 4
    # Six series (batch x precision) over 1 and 2 replicas; two replicas give 90 % per device.
    scaling = [row for _, row in parse_html(files.html).tables["scaling-synthetic"]]
    efficiencies = {(row["devices"][0], round(float(row["scaling_efficiency"][1]), 9)) for row in scaling}
    assert len(scaling) == 12 and efficiencies == {("1", 1.0), ("2", 0.9)}


def test_the_page_opens_in_chromium_without_console_errors(synthetic_store: ResultStore, tmp_path: Path) -> None:
    files = write_report(synthetic_store, tmp_path / "report")
    html = files.html.read_text(encoding="utf-8")
    tables = html.count("<table")
    check_page_in_chromium(files.html, tables=tables, images=len(PLOT_KINDS) + 4)  # and 4 heatmaps
    # Every plot carries the data it draws, in a table beside it.
    assert html.count("<figure>") == html.count('<details class="plot-data">') == len(PLOT_KINDS) + 4


def test_the_chromium_check_sees_errors(tmp_path: Path) -> None:
    """The browser check would catch a broken page: a console error, an exception, a missing file."""
    require_chromium()
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="missing.png">'
        '<script>console.error("boom"); notDefined();</script></body></html>',
        encoding="utf-8",
    )
    errors = " | ".join(open_page(page).errors)
    assert "console.error: boom" in errors and "notDefined" in errors and "missing.png" in errors


def test_plots_without_data_are_explained(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.db")
    for batch in (8, 16):
        store.add(
            synthetic_result(micro_batch_size=batch, throughput=10.0 * batch),
            sweep="cpu",
            cell_key=str(batch),
            cell_label=f"micro_batch_size={batch}",
            repeat=0,
        )
    files = write_report(store, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "Not drawn: no energy figures (no power meter in this test)" in markdown
    assert "Not drawn: no series of cells differs only in device count" in markdown
    assert "Not drawn: no run recorded a power timeline" in markdown
    assert "No datasheet peak is known for the devices of cpu" in markdown
    check_plots(tmp_path / "report", {"cpu-throughput-vs-batch-size.png", "cpu-flops-vs-batch-size.png"})


def test_power_traces_sum_the_devices_and_keep_gaps(synthetic_store: ResultStore) -> None:
    cells = summarise(synthetic_store.runs(sweep="synthetic"))
    traces = power_traces(cells)
    assert len(traces) == 12  # every cell with energy; the oom cells have none
    for trace in traces:
        result = next(cell for cell in cells if cell.label == trace.label).ok_results[0]
        # The total's spans carry the run's whole energy: the timeline adds up.
        joules = sum(w * (b - a) for w, a, b in zip(trace.watts, trace.start_seconds, trace.stop_seconds))
        assert joules == pytest.approx(result.energy_joules)
    result = synthetic_result(micro_batch_size=8, samples_per_watt_hour=1e4)
    result.energy.power_timeline.watts["gpu1"][3] = None
    store = ResultStore(synthetic_store.path.parent / "gap.db")
    store.add(result, sweep="gap", cell_key="k", cell_label="gap", repeat=0)
    trace = power_traces(summarise(store.runs(sweep="gap")))[0]
    assert trace.watts[3] is None and all(w is not None for k, w in enumerate(trace.watts) if k != 3)


def test_errors_name_the_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResultStore(tmp_path / "r.db")
    with pytest.raises(ReportError, match="no sweeps or single runs to report"):
        write_report(store, tmp_path / "out")
    store.add(synthetic_result(), sweep="a", cell_key="k", repeat=0)
    with pytest.raises(ReportError, match="no sweep named 'b'.*it has: a"):
        write_report(store, tmp_path / "out", ["b"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ReportError, match=r"pip install 'core\[report\]'"):
        write_report(store, tmp_path / "out")


def test_helpers() -> None:
    assert [format_number(v) for v in (None, 0, 12345.6, 2172.42, 146.53, 0.0002336)] == [
        "n/a",
        "0",
        "12.35 k",
        "2.172 k",
        "146.5",
        "233.6 µ",
    ]
    assert [count_label(v) for v in (8, 1024, 1 << 24, 3e7)] == ["8", "1024", "2^24", "3e+07"]
    assert pareto_front([(1, 5), (2, 4), (1.5, 3), (3, 1), (0.5, 5)]) == [0, 1, 3]
