"""`core report` and `core results` under faults and hostile data (issue 11).

Each test reproduces a defect: bad or full output paths (9), sweep names that are paths (11),
filters that match nothing by mistake (15), user text read as Markdown or HTML (18), and odd or
damaged results (8). Each asserts a clear message and exit code, no traceback, no partial file,
and nothing written outside the output directory.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from filesystems import fill, mounted_tmpfs
from synthetic import synthetic_result

from core.base.results import DeviceRecord, EnvironmentInfo, PowerTimeline, RunResult, RunState
from core.cli import format_cells, main
from core.report import (
    PLOTS_DIRECTORY,
    Paragraph,
    markdown_block,
    markdown_code,
    markdown_text,
    render_markdown,
    sweep_slugs,
    write_report,
)
from core.storage.store import ResultStore
from core.storage.summary import summarise

HOSTILE = "<script>alert(1)</script> | pipes | `tick` *star* _under_ [link](javascript:alert(2)) $x$\nsecond line"


def small_store(path: Path, sweeps: tuple[str, ...] = ("s",), **options: Any) -> ResultStore:
    """Each sweep: two cells (batch 8 and 16) with a throughput, so a plot is drawn."""
    store = ResultStore(path)
    for sweep in sweeps:
        for batch in (8, 16):
            store.add(
                synthetic_result(micro_batch_size=batch, throughput=10.0 * batch, **options),
                sweep=sweep,
                cell_key=str(batch),
                cell_label=f"micro_batch_size={batch}",
                repeat=0,
            )
    return store


def every_file(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def hidden_files(root: Path) -> list[str]:
    """Temporary files or staging folders left behind (their names start with a dot)."""
    return [str(path) for path in root.rglob(".*")]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


class FailingFsync:
    """os.fsync that fails with ENOSPC from its ``after``-th call on: a disk that fills up."""

    def __init__(self, after: int) -> None:
        self.calls = 0
        self.after = after
        self._fsync = os.fsync

    def __call__(self, descriptor: int) -> None:
        self.calls += 1
        if self.calls > self.after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._fsync(descriptor)


def make_read_only(directory: Path) -> None:
    """Root ignores file modes, so as root the file system itself is made read-only."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
    else:
        for path in [directory, *directory.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)


# --- 9: report and export outputs ----------------------------------------------------------------


def test_report_output_that_is_a_file_is_refused_before_any_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db").close()
    target = tmp_path / "out"
    target.write_text("keep me")
    monkeypatch.setattr("core.report.build_report", lambda *a, **k: pytest.fail("plots drawn before the check"))
    code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(target)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"core: error: report output {target} is a file" in err and "Traceback" not in err
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("in_the_way", ["report.md/", "report.html/", "plots"])
def test_report_files_in_the_way_are_refused(
    tmp_path: Path, in_the_way: str, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db").close()
    output = tmp_path / "out"
    output.mkdir()
    if in_the_way.endswith("/"):
        (output / in_the_way).mkdir()
    else:
        (output / in_the_way).write_text("a file, not a folder")
    before = every_file(output)
    code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert str(output / in_the_way.rstrip("/")) in err
    assert every_file(output) == before  # nothing written beside it


def test_report_missing_parents_are_created_and_nothing_temporary_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db").close()
    output = tmp_path / "a" / "b" / "report"
    assert main(["report", "--database", str(tmp_path / "r.db"), "--output", str(output)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert every_file(output) == {
        "report.md",
        "report.html",
        "plots",
        *(
            f"plots/s-{kind}-vs-batch-size.{suffix}"
            for kind in ("throughput", "flops")
            for suffix in ("png", "svg", "pdf")
        ),
    }


def test_report_into_a_read_only_directory_is_refused_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db").close()
    with mounted_tmpfs(tmp_path) as disk:
        output = disk / "report"
        assert main(["report", "--database", str(tmp_path / "r.db"), "--output", str(output)]) == 0
        before = snapshot(output)
        make_read_only(disk)
        code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(output)])
        err = capsys.readouterr().err
        after = snapshot(output)
    assert code == 2 and "Traceback" not in err
    assert f"cannot write report file {output / 'report.md'}" in err
    assert after == before


def test_report_on_a_full_disk_keeps_the_previous_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = small_store(tmp_path / "r.db")
    output = tmp_path / "report"
    write_report(store, output)
    before = snapshot(output)
    for batch in (32, 64):  # the next report differs: one more cell in each table and plot
        store.add(
            synthetic_result(micro_batch_size=batch, throughput=5.0 * batch), sweep="s", cell_key=str(batch), repeat=0
        )
    store.close()
    for after in (0, 1, 3):  # the first plot, the second, the HTML page
        failing = FailingFsync(after)
        monkeypatch.setattr(os, "fsync", failing)
        code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(output)])
        monkeypatch.undo()
        err = capsys.readouterr().err
        assert failing.calls > after, "the disk never filled up"
        assert code == 1 and "Traceback" not in err
        assert (
            f"cannot write the report in {output}: no space left on the device (ENOSPC); nothing in it was changed"
            in err
        )
        assert snapshot(output) == before and hidden_files(output) == []


def test_report_on_a_really_full_disk_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small_store(tmp_path / "r.db").close()
    with mounted_tmpfs(tmp_path, kilobytes=64) as disk:
        fill(disk / "filler")
        code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(disk / "new" / "report")])
        err = capsys.readouterr().err
        left = sorted(path.name for path in disk.iterdir())
    assert code == 1 and "no space left on the device (ENOSPC)" in err and "Traceback" not in err
    assert left == ["filler"]  # no report, no plots, no staging folder, not even the empty folders


@pytest.mark.parametrize("format_", ["summary", "csv", "json"])
def test_results_output_is_whole_and_its_parents_are_created(
    tmp_path: Path, format_: str, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db", sweeps=("s", "t")).close()
    target = tmp_path / "a" / "b" / f"runs.{format_}"
    assert main(["results", "--database", str(tmp_path / "r.db"), "--format", format_, "--output", str(target)]) == 0
    text = target.read_text(encoding="utf-8")
    if format_ == "csv":
        assert len(list(csv.DictReader(io.StringIO(text)))) == 4
    elif format_ == "json":
        assert len(json.loads(text)) == 4
    else:
        assert text.splitlines()[0].split()[:2] == ["sweep", "cell"] and len(text.splitlines()) == 5
    assert [path.name for path in target.parent.iterdir()] == [target.name]


@pytest.mark.parametrize("format_", ["summary", "csv", "json", "parquet"])
def test_results_on_a_full_disk_keep_the_old_file(
    tmp_path: Path, format_: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if format_ == "parquet":
        pytest.importorskip("pyarrow.parquet")
    small_store(tmp_path / "r.db").close()
    target = tmp_path / "out" / "runs"
    target.parent.mkdir()
    target.write_text("the previous export")
    monkeypatch.setattr(os, "fsync", FailingFsync(0))
    code = main(["results", "--database", str(tmp_path / "r.db"), "--format", format_, "--output", str(target)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"cannot write --output {target}: no space left on the device (ENOSPC)" in err
    assert target.read_text() == "the previous export"
    assert [path.name for path in target.parent.iterdir()] == ["runs"]  # no temporary file


def test_results_output_problems_are_refused_before_the_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db").close()
    monkeypatch.setattr(ResultStore, "runs", lambda *a, **k: pytest.fail("queried before the check"))
    assert main(["results", "--database", str(tmp_path / "r.db"), "--format", "csv", "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path} is a directory" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["results", "--database", str(tmp_path / "r.db"), "--output", str(blocker / "runs.csv")]) == 2
    err = capsys.readouterr().err
    assert f"{blocker} is a file, not a folder" in err and "Traceback" not in err


def test_results_into_a_read_only_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small_store(tmp_path / "r.db").close()
    with mounted_tmpfs(tmp_path) as disk:
        (disk / "runs.csv").write_text("old")
        make_read_only(disk)
        code = main(
            ["results", "--database", str(tmp_path / "r.db"), "--format", "csv", "--output", str(disk / "runs.csv")]
        )
        err = capsys.readouterr().err
        assert (disk / "runs.csv").read_text() == "old"
    assert code == 2 and f"cannot write --output {disk / 'runs.csv'}" in err and "Traceback" not in err


# --- 11: file names from data ---------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_names_never_put_files_outside_the_output_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    output = root / "deep" / "report"
    outside = tmp_path / "elsewhere"
    names = [
        "../escape",
        "../../escape",
        f"{outside}/evil",
        "a/b",
        "..",
        ".",
        ".hidden",
        "Sweep One",
        "x" * 300,
        "évolution",
        "C:\\windows",
        "tab\tname",
        "plain",
        "Case",
        "case",
    ]
    names.append(sweep_slugs(["../escape"])["../escape"])  # a name equal to another name's slug
    small_store(tmp_path / "r.db", sweeps=tuple(names)).close()
    files = write_report(tmp_path / "r.db", output)
    assert not outside.exists() and every_file(root) == {"deep", "deep/report"} | {
        f"deep/report/{name}" for name in every_file(output)
    }
    assert set(every_file(tmp_path)) == {"r.db", "root"} | {f"root/{name}" for name in every_file(root)} | {
        name for name in every_file(tmp_path) if name.startswith("r.db-")
    }  # SQLite's WAL files
    plots = sorted(path.name for path in files.plots)
    # Two plots a sweep, each as PNG, SVG and PDF: distinct, also ignoring case.
    assert len(plots) == 3 * 2 * len(names) == len(set(name.lower() for name in plots))
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*\.(png|svg|pdf)", name) for name in plots), plots
    assert all(path.parent == output / PLOTS_DIRECTORY for path in files.plots)
    assert "plain-throughput-vs-batch-size.png" in plots  # a plain name is kept as it is
    markdown = files.markdown.read_text(encoding="utf-8")
    linked = re.findall(r"\]\(plots/([^)]+)\)", markdown)
    assert sorted(linked) == plots
    # HTML ids are the same slugs: one cells table per sweep, every id distinct.
    page = files.html.read_text(encoding="utf-8")
    identifiers = re.findall(r'<table id="([^"]+)"', page)
    assert len(identifiers) == len(set(identifiers)) and sum(i.startswith("cells-") for i in identifiers) == len(names)


def test_sweep_slugs_are_stable_safe_and_distinct() -> None:
    names = ["fcnn-cpu", "../x", "/x", "x/", "X", "x", "ÿ", "a" * 500]
    slugs = sweep_slugs(names)
    assert slugs == sweep_slugs(list(reversed(names)))  # the same name, the same files, in any report
    assert slugs["fcnn-cpu"] == "fcnn-cpu"
    assert len({slug.lower() for slug in slugs.values()}) == len(names)
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", slug) for slug in slugs.values()), slugs


# --- 15: filters that match nothing by mistake ------------------------------------------------------


def test_results_unknown_status_is_an_error_naming_the_states(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small_store(tmp_path / "r.db").close()
    code = main(["results", "--database", str(tmp_path / "r.db"), "--status", "typo"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "Traceback" not in captured.err
    assert "unknown --status 'typo'" in captured.err
    assert all(state.value in captured.err for state in RunState)
    assert main(["results", "--database", str(tmp_path / "r.db"), "--status", "oom"]) == 0  # known, no runs
    captured = capsys.readouterr()
    assert "no runs in" in captured.err and "--status oom" in captured.err


def test_results_unknown_sweep_is_an_error_naming_the_sweeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = small_store(tmp_path / "r.db", sweeps=("fcnn-cpu", "../odd"))
    store.save_sweep("planned", {"name": "planned"}, [], None)  # in the database, no runs yet
    store.close()
    for format_ in ("summary", "csv", "json"):
        code = main(["results", "--database", str(tmp_path / "r.db"), "--sweep", "typo", "--format", format_])
        captured = capsys.readouterr()
        assert code == 2 and captured.out == "" and "Traceback" not in captured.err
        assert "no sweep named 'typo'" in captured.err and "it has: planned, fcnn-cpu, '../odd'" in captured.err
    assert main(["results", "--database", str(tmp_path / "r.db"), "--sweep", "planned"]) == 0


def test_the_summary_has_a_sweep_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small_store(tmp_path / "r.db", sweeps=("first", "second")).close()
    assert main(["results", "--database", str(tmp_path / "r.db")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["sweep", "cell", "status"]
    rows = [line.split()[:2] for line in lines[1:]]
    assert rows == [
        ["first", "micro_batch_size=8"],
        ["first", "micro_batch_size=16"],
        ["second", "micro_batch_size=8"],
        ["second", "micro_batch_size=16"],
    ]
    assert main(["results", "--database", str(tmp_path / "r.db"), "--sweep", "second"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sweep") and all(line.startswith("second") for line in lines[1:])


def test_the_summary_shows_database_text_on_one_line(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "r.db")
    store.add(synthetic_result(), sweep="s\x1b[2J", cell_key="k", cell_label="two\nlines\x1b[31m", repeat=0)
    text = format_cells(summarise(store.runs()), sweep_column=True)
    assert "\x1b" not in text and len(text.splitlines()) == 2


# --- 18: user text in report.md -------------------------------------------------------------------


@pytest.fixture
def hostile_store(tmp_path: Path) -> ResultStore:
    store = ResultStore(tmp_path / "r.db")
    for batch in (8, 16):
        store.add(
            synthetic_result(micro_batch_size=batch, throughput=10.0 * batch, workload_options={"label": HOSTILE}),
            sweep="evil <b>|",
            cell_key=str(batch),
            cell_label=HOSTILE + str(batch),
            repeat=0,
        )
    store.add(
        synthetic_result(
            micro_batch_size=32,
            workload_options={"label": HOSTILE},
            state="error",
            message="```\n<script>alert(3)</script>\n````",
        ),
        sweep="evil <b>|",
        cell_key="32",
        cell_label=HOSTILE + "32",
        repeat=0,
    )
    store.save_sweep(
        "evil <b>|",
        {"name": "evil", "description": HOSTILE, "repeats": "<i>1</i>"},
        [{"key": "x", "label": HOSTILE, "invalid_reason": HOSTILE}],
        "grid `x`.toml",
    )
    return store


def rendered_markdown(markdown: str) -> Any:
    import markdown_it

    # CommonMark passes raw HTML through, as GitHub and most viewers do for safe tags: any
    # unescaped tag in report.md shows up in this rendering.
    return markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])


def test_markdown_escapes_user_text(hostile_store: ResultStore, tmp_path: Path) -> None:
    files = write_report(hostile_store, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    # Outside code spans and blocks (where it is literal text) no tag is left as it was.
    assert "<b>" not in markdown and "<i>" not in markdown and "<script>alert(1)</script> | pipes" in markdown
    # Labels and the summary's fixed option, in code spans; the message, in a code block.
    in_code = markdown.count("`<script>alert(1)</script>") + markdown.count("`label=<script>alert(1)</script>")
    assert markdown.count("<script>") == in_code + 1
    parser = rendered_markdown(markdown)
    rendered = parser.render(markdown)
    for tag in ("<script", "<b>", "<i>", "<strong>", "<del>", "<s>"):
        assert tag not in rendered, tag
    # The only links are the report's own: its contents (to its headings) and the plots' print files.
    links = re.findall(r"<a ([^>]*)>", rendered)
    assert links and all(re.fullmatch(r'href="(#[\w-]+|plots/[A-Za-z0-9_-]+\.(svg|pdf))"', link) for link in links)
    pngs = [path for path in files.plots if path.suffix == ".png"]
    assert rendered.count("<em>") == len(pngs)  # the captions; none from user text
    assert (
        "&lt;script&gt;alert(1)&lt;/script&gt; | pipes | `tick` *star* _under_ [link](javascript:alert(2)) "
        "$x$ second line" in rendered
    )  # the description, literally, on one line
    assert "<h2>Sweep evil &lt;b&gt;|</h2>" in rendered
    # Pipes in cells stay in their cell: every row has as many cells as its table has headers.
    tokens = parser.parse(markdown)
    widths: list[int] = []
    for token in tokens:
        if token.type == "tr_open":
            widths.append(0)
        elif token.type in ("th_open", "td_open"):
            widths[-1] += 1
        elif token.type == "thead_close":
            header = widths[-1]
        elif token.type == "table_close":
            assert set(widths) == {header}, widths
            widths = []
    # The failure message stays in its code block, whatever fences it contains.
    assert (
        '<pre><code class="language-text">```\n&lt;script&gt;alert(3)&lt;/script&gt;\n````\n</code></pre>' in rendered
    )
    # The HTML page escapes the same text.
    page = files.html.read_text(encoding="utf-8")
    assert page.count("<script") == 0 and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a|b", "a\\|b"),
        ("<x> & y", "&lt;x&gt; &amp; y"),
        ("two\nlines\r\n", "two lines "),
        ("micro_batch_size", "micro_batch_size"),
        ("_x_", "\\_x\\_"),
        ("*x* `y` [z] ~w~ $m$ #", "\\*x\\* \\`y\\` \\[z\\] \\~w\\~ \\$m\\$ \\#"),
        ("back\\slash", "back\\\\slash"),
        ("bell\x07", "bell\\\\x07"),  # escaped as on the terminal (\x07), its backslash for Markdown
    ],
)
def test_markdown_text(text: str, expected: str) -> None:
    assert markdown_text(text) == expected


def test_markdown_line_starts_code_spans_and_blocks() -> None:
    assert [markdown_text(text, line_start=True) for text in ("- x", "+ x", "1. x", "12) x", "    code", "= x")] == [
        "\\- x",
        "\\+ x",
        "1\\. x",
        "12\\) x",
        "code",
        "\\= x",
    ]
    assert markdown_code("a`b") == "``a`b``" and markdown_code("`x`") == "`` `x` ``"
    assert markdown_block("```\nx")[0] == "````text" and markdown_block("plain")[0] == "```text"
    markdown = render_markdown("t", [Paragraph("- looks like a list ", "| and a table |")])
    assert "\\- looks like a list \\| and a table \\|" in markdown


# --- 8: odd results ---------------------------------------------------------------------------------


def _set_json(store: ResultStore, run_id: int, **figures: Any) -> None:
    """Write figures into a stored result's JSON as a damaged or hand-edited database has them."""
    (text,) = store._connection.execute("SELECT result_json FROM runs WHERE id = ?", (run_id,)).fetchone()
    document = json.loads(text)
    document.update(figures)
    text = (
        json.dumps(document)
        .replace('"NaN"', "NaN")
        .replace('"-Infinity"', "-Infinity")
        .replace('"Infinity"', "Infinity")
    )
    store._connection.execute("UPDATE runs SET result_json = ? WHERE id = ?", (text, run_id))


def odd_store(path: Path) -> ResultStore:
    store = ResultStore(path)

    def add(sweep: str, key: str, result: RunResult, repeat: int = 0, label: str | None = None) -> int:
        return store.add(result, sweep=sweep, cell_key=key, cell_label=label or key, repeat=repeat)

    for batch in (8, 16):  # every run failed, no figure at all
        add("only-failed", str(batch), synthetic_result(micro_batch_size=batch, state="error", message=None))
    figures = [
        ("NaN", "Infinity", "NaN"),
        ("Infinity", "NaN", 1e300),
        ("-Infinity", 0.0, -3.0),
        (0.0, -1.0, None),
        (-5.0, 1e-300, 0.5),
        (1e308, 5.0, "Infinity"),
    ]
    for index, (throughput, energy, mfu) in enumerate(figures):
        run_id = add(
            "non-finite",
            str(8 << (index // 2)),
            synthetic_result(micro_batch_size=8 << (index // 2), throughput=1.0, samples_per_watt_hour=1.0, mfu=0.1),
            repeat=index % 2,
        )
        _set_json(
            store, run_id, throughput_per_second=throughput, samples_per_watt_hour=energy, model_flops_utilization=mfu
        )
    store.save_sweep("empty", {"name": "empty"}, [], None)
    store.save_sweep("odd-record", ["not", "a", "dict"], ["a cell", {"label": None, "invalid_reason": 5}], "grid")
    add("odd-record", "a", synthetic_result())
    store.save_sweep(
        "odd-cells",
        {"name": "odd-cells", "repeats": [1]},
        [{"invalid_reason": 5}, {"label": None}, {"key": "k", "invalid_reason": "<b>"}],
        None,
    )
    add("odd-cells", "a", synthetic_result())
    huge = "L" * 50_000
    for batch in (8, 16):  # huge labels, mathtext, a label matplotlib would hide
        add(
            "huge",
            f"h{batch}",
            synthetic_result(
                micro_batch_size=batch,
                throughput=batch,
                samples_per_watt_hour=batch,
                workload_options={"label": "$x^" + huge},
            ),
            label=huge + "$\\frac",
        )
        add(
            "huge",
            f"u{batch}",
            synthetic_result(
                micro_batch_size=batch,
                throughput=batch,
                samples_per_watt_hour=batch,
                workload_options={"label": "_hidden"},
            ),
            label="_hidden",
        )
    unresolved = synthetic_result(micro_batch_size=8, throughput=5.0)
    unresolved.config = unresolved.config.model_copy(update={"micro_batch_size": None})
    add("no-batch", "none", unresolved)
    for key in ("a", "b"):  # two cells with the same options and the same figure
        add("no-batch", key, synthetic_result(micro_batch_size=8, throughput=5.0))
    add("no-batch", "c", synthetic_result(micro_batch_size=16, throughput=5.0))
    broken = synthetic_result(micro_batch_size=8, throughput=5.0, samples_per_watt_hour=3.0)
    broken.environment = EnvironmentInfo(
        hostname="<host>", platform="p|x", python_version="3", core_version="0", processor="\x1b[31mred"
    )
    broken.devices = [DeviceRecord(index=0, name="dev`ice", kind="cpu")]
    broken.energy.power_timeline = PowerTimeline(
        start_seconds=[0, 1, 2],
        stop_seconds=[1, 2],  # type: ignore[union-attr]
        watts={"a": [1.0], "b": [None, 2.0, 3.0, 4.0]},
    )
    add("environment", "a", broken)
    empty_timeline = synthetic_result(micro_batch_size=16, throughput=5.0, samples_per_watt_hour=3.0)
    empty_timeline.energy.power_timeline = PowerTimeline(start_seconds=[0, 1], stop_seconds=[1, 2], watts={})  # type: ignore[union-attr]
    add("environment", "b", empty_timeline)
    for index in range(24):  # more series than a legend can name
        for batch in (8, 16):
            add(
                "many",
                f"{index}-{batch}",
                synthetic_result(
                    micro_batch_size=batch,
                    throughput=10.0 * batch + index,
                    samples_per_watt_hour=1.0 + index,
                    seed=index,
                ),
            )
    return store


@pytest.mark.slow
def test_odd_results_do_not_stop_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd_store(tmp_path / "r.db").close()
    code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(tmp_path / "report")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    markdown = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    assert "drawing it failed" not in markdown and "The runs of this sweep could not be read" not in markdown
    # The store skips a sweep record it cannot parse; the report says so and shows the sweep's runs.
    assert "skipped the settings of sweep 'odd-record'" in markdown.split("## Database warnings", 1)[1]
    section = markdown.split("## Sweep odd-cells", 1)[1].split("## Sweep", 1)[0]
    assert "| ? | 5 |" in section and "| k | &lt;b&gt; |" in section and "2 cells refused by validation" in section
    for sweep in (
        "only-failed",
        "non-finite",
        "empty",
        "odd-record",
        "odd-cells",
        "huge",
        "no-batch",
        "environment",
        "many",
    ):
        assert f"## Sweep {sweep}\n" in markdown
    section = markdown.split("## Sweep only-failed", 1)[1].split("## Sweep", 1)[0]
    assert "Not drawn: no cell has a throughput figure." in section and "2 cells with results (2 error)" in section
    section = markdown.split("## Sweep non-finite", 1)[1].split("## Sweep", 1)[0]
    assert "nan" not in section.lower() and "inf" not in section.replace("information", "")
    assert "No results recorded for this sweep yet." in markdown.split("## Sweep empty", 1)[1]
    assert max(len(line) for line in markdown.splitlines()) < 5000  # huge labels are shortened
    assert "| environment | not recorded |" in markdown.split("## Sweep odd-record", 1)[1]
    assert "core: warning: skipped the settings of sweep 'odd-record'" in captured.err
    plots = {path.name for path in (tmp_path / "report" / "plots").iterdir()}
    assert {
        "huge-throughput-vs-batch-size.png",
        "huge-pareto.png",
        "many-throughput-vs-batch-size.png",
        "no-batch-throughput-vs-batch-size.png",
        "environment-power-timeline.png",
    } <= plots
    assert "\x1b" not in markdown and "\x1b" not in (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    rendered_markdown(markdown).render(markdown)


def test_a_plot_that_fails_is_a_note_not_the_end_of_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> bytes:
        raise ValueError("a bug in a plot")

    monkeypatch.setattr("core.report.sections.plot_power_traces", broken)
    store = small_store(tmp_path / "r.db", samples_per_watt_hour=5.0)
    files = write_report(store, tmp_path / "report")
    markdown = files.markdown.read_text(encoding="utf-8")
    assert "Not drawn: drawing it failed (ValueError: a bug in a plot)." in markdown
    assert "s-pareto.png" in {path.name for path in files.plots}  # the other plots are there


def test_rows_the_store_skips_are_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = small_store(tmp_path / "r.db", sweeps=("good", "damaged"))
    store._connection.execute("UPDATE runs SET result_json = '{\"not\": \"a result\"' WHERE sweep = 'damaged'")
    store._connection.execute(
        "UPDATE runs SET result_json = '{\"<script>\": 1}' WHERE sweep = 'good' AND cell_key = '16'"
    )
    store.close()
    code = main(["report", "--database", str(tmp_path / "r.db"), "--output", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    assert err.count("core: warning: skipped run ") == 3 and "of sweep 'damaged'" in err
    markdown = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    warnings = markdown.split("## Database warnings", 1)[1].split("## Sweep", 1)[0]
    assert "3 rows of the database could not be read" in warnings and warnings.count("skipped run ") == 3
    assert "<script>" not in warnings
    good = markdown.split("## Sweep good", 1)[1].split("## Sweep", 1)[0]
    assert "| ok | 1/1 | 80 |" in good and "1 cells with results" in good  # the readable row is reported
    assert "No results recorded for this sweep yet." in markdown.split("## Sweep damaged", 1)[1]
    assert main(["results", "--database", str(tmp_path / "r.db"), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("core: warning: skipped run ") == 3
    assert len(list(csv.DictReader(io.StringIO(captured.out)))) == 1


def test_a_sweep_whose_pages_cannot_be_read_ends_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged page met half-way (issue 26): the report stops, naming the file, and writes nothing.
    It used to be a note in an otherwise whole-looking report, and `core report` ended with 0."""
    from core.storage.store import StoreError

    read = ResultStore.runs

    def runs(self: ResultStore, **filters: Any) -> Any:
        if filters.get("sweep") == "damaged":
            raise StoreError(f"results database {self.path} is damaged (database disk image is malformed)")
        return read(self, **filters)

    monkeypatch.setattr(ResultStore, "runs", runs)
    store = small_store(tmp_path / "r.db", sweeps=("good", "damaged"))
    with pytest.raises(StoreError, match="is damaged"):
        write_report(store, tmp_path / "report")
    assert not (tmp_path / "report").exists()
