"""Sweeps: grid files, validation before anything runs, isolation of each repeat, resume after
SIGKILL, and the FCNN sweep on the CPU from grid file to report."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from launching import LimitOnceWritten
from synthetic import synthetic_result

import core.sweep.repeat
import core.sweep.run
from core import ConfigError, RunState
from core.cli import main
from core.running.progress import ProgressLine, RunProgress, format_duration
from core.running.runner import classify_fault
from core.storage.store import ResultStore
from core.sweep import SweepError, SweepObserver, expand_cells, load_sweep, make_sweep_spec, plan_sweep, run_sweep
from core.sweep.plan import describe_config_error

TINY = {"hidden_width": 32, "input_width": 64, "output_width": 10}

GRID_TOML = """
name = "grid"
repeats = 2
timeout_seconds = 30

[grid]
workload = "fcnn"
micro_batch_size = [8, 16, 32]
precision = ["fp32", "bf16"]
steps = 3

[grid.workload_options]
hidden_width = [32, 64]
input_width = 64

[[exclude]]
micro_batch_size = 32
precision = "bf16"
"""

GRID_YAML = """
name: grid
repeats: 2
timeout_seconds: 30
grid:
  workload: fcnn
  micro_batch_size: [8, 16, 32]
  precision: [fp32, bf16]
  steps: 3
  workload_options: {hidden_width: [32, 64], input_width: 64}
exclude:
  - {micro_batch_size: 32, precision: bf16}
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- grid files ----------------------------------------------------------------------------------


def test_a_grid_file_expands_to_cells(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path / "grid.toml", GRID_TOML))
    assert (spec.name, spec.repeats, spec.timeout_seconds) == ("grid", 2, 30.0)
    cells = expand_cells(spec)
    assert len(cells) == 3 * 2 * 2 - 2  # batch 32 x bf16 excluded, for both hidden widths
    assert cells[0].label == "micro_batch_size=8 precision=fp32 hidden_width=32"
    assert cells[1].label == "micro_batch_size=8 precision=fp32 hidden_width=64"  # last axis innermost
    assert cells[0].options == {
        "accelerator": "cpu",
        "workload": "fcnn",
        "micro_batch_size": 8,
        "precision": "fp32",
        "steps": 3,
        "workload_options": {"hidden_width": 32, "input_width": 64},
    }
    assert all("precision=bf16" not in cell.label for cell in cells if "micro_batch_size=32 " in cell.label)
    assert len({cell.key for cell in cells}) == len(cells)
    assert json.loads(cells[0].key) == cells[0].options


def test_yaml_and_json_give_the_same_cells(tmp_path: Path) -> None:
    from_toml = expand_cells(load_sweep(write(tmp_path / "grid.toml", GRID_TOML)))
    from_yaml = expand_cells(load_sweep(write(tmp_path / "grid.yaml", GRID_YAML)))
    document = {
        "name": "grid",
        "repeats": 2,
        "timeout_seconds": 30,
        "grid": {
            "workload": "fcnn",
            "micro_batch_size": [8, 16, 32],
            "precision": ["fp32", "bf16"],
            "steps": 3,
            "workload_options": {"hidden_width": [32, 64], "input_width": 64},
        },
        "exclude": [{"micro_batch_size": 32, "precision": "bf16"}],
    }
    from_json = expand_cells(load_sweep(write(tmp_path / "grid.json", json.dumps(document))))
    assert [c.key for c in from_toml] == [c.key for c in from_yaml] == [c.key for c in from_json]


def test_the_example_grid_file_is_valid() -> None:
    plan = plan_sweep(load_sweep(Path(__file__).parent.parent / "examples" / "fcnn-cpu-sweep.toml"))
    assert len(plan.cells) == 6 and not plan.invalid_cells


@pytest.mark.parametrize(
    ("document", "field", "says"),
    [
        ({"grid": {"workload": "fcnn", "batch": [1]}}, "grid.batch", "unknown run option"),
        ({"grid": {"workload": "fcnn"}, "repeat": 2}, "repeat", "unknown setting"),
        ({"grid": {"micro_batch_size": [8]}}, "grid.workload", "required"),
        ({"grid": {"workload": "fcnn", "micro_batch_size": []}}, "grid.micro_batch_size", "empty list"),
        ({"grid": {"workload": "fcnn", "micro_batch_size": [8, 8]}}, "grid.micro_batch_size", "appears twice"),
        ({"grid": {"workload": "fcnn", "precision": [["fp32"]]}}, "grid.precision", "number, a string or a boolean"),
        ({"grid": {"workload": "fcnn", "workload_options": 3}}, "grid.workload_options", "a table"),
        ({"grid": {"workload": "fcnn"}, "repeats": 0}, "repeats", "greater than or equal to 1"),
        (
            {"grid": {"workload": "fcnn"}, "exclude": [{"precision": "bf16"}]},
            "exclude.0.precision",
            "not an option set",
        ),
        ({"grid": {"workload": "fcnn"}, "name": "a b"}, "name", "pattern"),
    ],
)
def test_a_bad_grid_file_names_the_setting(document: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_sweep_spec(document, default_name="sweep")
    assert caught.value.field == field and says in caught.value.allowed


@pytest.mark.parametrize("document", [{"grid": {"micro_batch_size": [8]}}, {"grid": {"workload": "fcnn"}}])
def test_a_missing_setting_reads_missing_not_none(document: dict[str, Any]) -> None:
    # Issue 26, second tester: "invalid machine.description = None: required" read as if None had
    # been written; the sweep file's missing grid.workload and name likewise.
    with pytest.raises(ConfigError) as caught:
        make_sweep_spec(document)
    assert caught.value.missing and " (missing): required" in str(caught.value), caught.value
    assert "= None" not in str(caught.value) and "= None" not in describe_config_error(caught.value)


def test_an_unreadable_grid_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="unknown format '.ini'"):
        load_sweep(write(tmp_path / "grid.ini", "x"))
    with pytest.raises(SweepError, match="cannot parse"):
        load_sweep(write(tmp_path / "grid.toml", "grid = ["))
    with pytest.raises(SweepError, match="cannot read"):
        load_sweep(tmp_path / "missing.toml")


# --- validation before anything runs ---------------------------------------------------------------


INVALID_TOML = """
repeats = 1
[grid]
workload = "fcnn"
micro_batch_size = [8, 0]
precision = ["fp32", "tf32"]
"""


def test_dry_run_lists_cells_and_refuses_invalid_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = write(tmp_path / "mixed.toml", INVALID_TOML)
    database = tmp_path / "results.db"
    assert main(["sweep", str(grid), "--dry-run", "--database", str(database)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == f"sweep mixed ({grid}), database {database}"
    assert lines[1] == "1  micro_batch_size=8 precision=fp32  [to run]"
    assert "micro_batch_size=8 precision=tf32  [invalid: precision = 'tf32': accelerator 'cpu'" in lines[2]
    assert "micro_batch_size=0 precision=fp32  [invalid: micro_batch_size = 0: Input should be greater" in lines[3]
    assert lines[-1].startswith("4 cells (1 valid, 3 invalid) x 1 repeat = 1 run")
    assert "3 invalid cells" in captured.err
    assert main(["sweep", str(grid), "--dry-run", "--skip-invalid", "--database", str(database)]) == 0
    capsys.readouterr()
    # Without --dry-run it refuses too, before anything runs or any database is made.
    assert main(["sweep", str(grid), "--database", str(database)]) == 2
    assert "3 of 4 cells are invalid" in capsys.readouterr().err and not database.exists()


def test_planning_a_sweep_imports_no_framework_and_no_plotting(tmp_path: Path) -> None:
    """`core sweep --dry-run` validates every cell without PyTorch; matplotlib loads only for reports."""
    grid = write(tmp_path / "grid.yaml", GRID_YAML)
    heavy = ("torch", "tensorflow", "matplotlib", "pandas", "pyarrow")
    code = (
        "import sys; from core.cli import main; rc = main(sys.argv[1:]); "
        f"loaded = [m for m in {heavy!r} if m in sys.modules]; assert not loaded, loaded; sys.exit(rc)"
    )
    outputs = []
    for arguments in (
        ["sweep", str(grid), "--dry-run", "--database", str(tmp_path / "r.db")],
        ["report", "--help"],
        ["results", "--help"],
    ):
        completed = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr
        outputs.append(completed.stdout)
    assert "10 cells (10 valid, 0 invalid) x 2 repeats = 20 runs" in outputs[0]


def test_a_sweep_in_the_database_continues_only_with_resume(tmp_path: Path) -> None:
    spec = make_sweep_spec({"name": "s", "grid": {"workload": "fcnn", "micro_batch_size": [8, 16]}})
    plan = plan_sweep(spec)
    with ResultStore(tmp_path / "r.db") as store:
        store.save_sweep("s", spec.model_dump(mode="json"), [cell.describe() for cell in plan.cells], None)
        store.add(synthetic_result(micro_batch_size=8), sweep="s", cell_key=plan.cells[0].key, repeat=0)
    with pytest.raises(SweepError, match="already has 1 run.*--resume"):
        run_sweep(plan, database=tmp_path / "r.db")
    changed = plan_sweep(make_sweep_spec({"name": "s", "grid": {"workload": "fcnn", "micro_batch_size": [8, 32]}}))
    with pytest.raises(SweepError, match=r"different grid \(1 cell\(s\) gone, 1 new\)"):
        run_sweep(changed, database=tmp_path / "r.db", resume=True)


# --- each repeat in its own process: crashes, kills and hangs become results ---------------------

FAKE_OK = """
import json, sys
from core.base.config import make_config
from core.base.results import RunResult
request = json.load(open(sys.argv[1]))
config = make_config(**request["options"])
result = RunResult(workload=config.workload, accelerator=config.accelerator, framework="torch", config=config,
                   samples_per_update=config.samples_per_update, samples_per_host_call=config.samples_per_update,
                   world_size=1, window_seconds=1.0, throughput_per_second=100.0 * config.micro_batch_size)
open(sys.argv[2], "w").write(result.model_dump_json())
"""
FAKE_CRASH = "import sys; print('segmentation fault, pretend'); sys.exit(3)"
FAKE_KILLED = "import os, signal; print('about to be killed', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
FAKE_HANG_AFTER_SETUP = (
    FAKE_OK.replace(
        "window_seconds=1.0, throughput_per_second=100.0 * config.micro_batch_size", "setup_seconds=0.25"
    ).replace('open(sys.argv[2], "w")', "open(sys.argv[2] + '.partial', \"w\")")
    + "\nimport time\ntime.sleep(600)\n"
)


def fake_workers(monkeypatch: pytest.MonkeyPatch, by_batch: dict[int, str]) -> None:
    """Replace the worker: the cell's micro-batch size picks which fake program runs."""

    def command(request: Path, result: Path) -> list[str]:
        batch = json.loads(request.read_text())["options"]["micro_batch_size"]
        return [sys.executable, "-c", by_batch[batch], str(request), str(result)]

    monkeypatch.setattr(core.sweep.repeat, "worker_command", command)


class Recorder(SweepObserver):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def run_started(self, cell: Any, repeat: int, runs_done: int, runs_total: int, seconds_left: float | None) -> None:
        self.events.append(("start", cell.label, repeat, runs_done, runs_total, seconds_left))

    def run_finished(self, cell: Any, repeat: int, result: Any, process_seconds: float) -> None:
        self.events.append(("end", cell.label, repeat, result.status.state.value))


@pytest.mark.slow
def test_crashes_kills_and_hangs_are_recorded_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core.sweep.repeat, "STOP_GRACE_SECONDS", 2.0)
    fake_workers(monkeypatch, {8: FAKE_CRASH, 16: FAKE_KILLED, 32: FAKE_HANG_AFTER_SETUP, 64: FAKE_OK})
    # The hung cell's time limit passes once it wrote its setup, not after 3 s a busy machine may
    # spend starting Python: its timeout is in the phase after setup every time.
    monkeypatch.setattr(
        core.sweep.repeat, "time", LimitOnceWritten(f"core-sweep-{os.getpid()}-*/cell-*", "setup_seconds")
    )
    spec = make_sweep_spec(
        {
            "name": "faults",
            "repeats": 2,
            "timeout_seconds": 300,
            "grid": {"workload": "fcnn", "micro_batch_size": [8, 16, 32, 64]},
        }
    )
    recorder = Recorder()
    started = time.monotonic()
    outcome = run_sweep(spec, database=tmp_path / "r.db", observer=recorder)
    assert time.monotonic() - started < 600  # a hang guard: the hung cell was stopped at its time limit
    cells = {cell.label: cell for cell in outcome.cells}
    crash, killed, hang, ok = (cells[f"micro_batch_size={b}"] for b in (8, 16, 32, 64))
    assert crash.status == "error" and crash.failure.status.error_type == "ProcessFailed"
    assert "exited with code 3 without a result" in crash.failure.status.message
    assert "segmentation fault, pretend" in crash.failure.status.message
    assert killed.status == "killed" and "SIGKILL" in killed.failure.status.message
    assert "about to be killed" in killed.failure.status.message
    assert hang.status == "timeout" and "no result after 300 s" in hang.failure.status.message
    assert hang.failure.setup_seconds == 0.25 and hang.failure.status.phase == "first_step"  # kept from the partial
    assert ok.status == "ok" and ok.repeats_ok == 2 and ok.throughput_per_second == 6400.0
    # A failed cell stops at its first failure; the good one ran both repeats.
    assert [cell.repeats_recorded for cell in (crash, killed, hang, ok)] == [1, 1, 1, 2]
    assert outcome.runs_done == 5
    assert [event[:3] for event in recorder.events if event[0] == "start"] == [
        ("start", f"micro_batch_size={b}", 0) for b in (8, 16, 32, 64)
    ] + [("start", "micro_batch_size=64", 1)]
    assert recorder.events[-2][4] == 5 and recorder.events[-2][5] is not None  # total and an estimate of time left
    with ResultStore(tmp_path / "r.db") as store:
        assert store.count("faults") == 5

    # --resume --retry-failed runs the failed repeats again (their rows are replaced), then the rest.
    fake_workers(monkeypatch, {8: FAKE_OK, 16: FAKE_OK, 32: FAKE_OK, 64: FAKE_CRASH})
    again = run_sweep(spec, database=tmp_path / "r.db", resume=True, retry_failed=True)
    assert again.runs_done == 6 and again.runs_already_finished == 2
    assert all(cell.status == "ok" and cell.repeats_ok == 2 for cell in again.cells)
    with ResultStore(tmp_path / "r.db") as store:
        assert store.count("faults") == 8


def test_progress_is_redrawn_on_terminals_and_plain_in_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the line is cut to the terminal's width, whatever runs the test

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    log = io.StringIO()  # a batch job's log: a plain line, no control sequence (issue 30)
    ProgressLine(log).show("[1/6] cell 1/6 micro_batch_size=8")
    assert log.getvalue() == "[1/6] cell 1/6 micro_batch_size=8\n"
    terminal = Terminal()
    line = ProgressLine(terminal)
    RunProgress(line, "fcnn on cpu", steps=20, warmup_steps=4)(
        synthetic_result(throughput=None).model_copy(update={"warmup_seconds": 0.4, "window_seconds": None})
    )
    status = terminal.getvalue().rsplit("\n", 1)[-1]  # after the phases' lines
    assert status.startswith("\r\x1b[2K") and status.endswith("timed window of 20 steps | ~2 s left")
    line.clear()
    assert terminal.getvalue().endswith("\r\x1b[2K")
    assert [format_duration(s) for s in (None, 4.4, 125, 3725)] == ["?", "4 s", "2:05", "1:02:05"]
    assert core.sweep.run._seconds_left([2.0, 4.0], runs_left=3, current_elapsed=1.0) == 8.0
    assert core.sweep.run._seconds_left([], runs_left=3) is None


def test_the_cpu_allocator_running_out_is_out_of_memory() -> None:
    error = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert classify_fault(error) is RunState.oom
    assert classify_fault(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is RunState.error


# --- real sweeps of the FCNN on the CPU -------------------------------------------------------------


def core_cli(*arguments: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.cli", *arguments], capture_output=True, text=True, timeout=timeout
    )


def grid_file(
    path: Path, name: str, batches: list[int], precisions: list[str], repeats: int, workload_options: dict[str, int]
) -> Path:
    options = "\n".join(f"{key} = {value}" for key, value in workload_options.items())
    return write(
        path,
        f"""
name = "{name}"
repeats = {repeats}
timeout_seconds = 300
[grid]
workload = "fcnn"
accelerator = "cpu"
micro_batch_size = {batches}
precision = {json.dumps(precisions)}
steps = 3
warmup_steps = 1
threads_per_replica = 1
[grid.workload_options]
{options}
""",
    )


def _children(parent: int, marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and marker in command:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _rows(database: Path) -> dict[tuple[str, int], tuple[int, str]]:
    try:
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            return {
                (key, repeat): (ident, document)
                for ident, key, repeat, document in connection.execute(
                    "SELECT id, cell_key, repeat, result_json FROM runs"
                )
            }
        finally:
            connection.close()
    except sqlite3.OperationalError:  # not created yet
        return {}


@pytest.fixture(scope="module")
def fcnn_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The FCNN over 3 batch sizes x 2 precisions, 2 repeats: killed with SIGKILL while a run is in
    flight, resumed to the end, then reported. The tests below check each step's record."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("finds the sweep's worker through /proc")
    directory = tmp_path_factory.mktemp("fcnn-sweep")
    grid = grid_file(directory / "fcnn.toml", "fcnn-cpu", [8, 32, 128], ["fp32", "bf16"], 2, TINY)
    database = directory / "results.db"
    facts: dict[str, Any] = {"directory": directory, "database": database}
    started = time.monotonic()
    sweep = subprocess.Popen(
        [sys.executable, "-m", "core.cli", "sweep", str(grid), "--database", str(database)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and sweep.poll() is None:
            # A fresh interpreter per run, or runs forked from the sweep's fork server (warm workers).
            servers = _children(sweep.pid, "core.running.forkserver")
            forked = [run for server in servers for run in _children(server, "core.running.forkserver")]
            workers = _children(sweep.pid, "core.running.child") + forked + (servers if forked else [])
            if len(_rows(database)) >= 3 and workers:
                break
            time.sleep(0.05)
        facts["rows_before_kill"] = _rows(database)
        facts["workers_at_kill"] = list(workers)
        os.kill(sweep.pid, signal.SIGKILL)  # kill -9 mid-sweep, with a run in flight
        sweep.wait(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    facts["killed_returncode"] = sweep.returncode
    deadline = time.monotonic() + 120  # hang guards, generous for a busy machine
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    facts["orphans"] = [pid for pid in workers if _alive(pid)]
    facts["rows_after_kill"] = _rows(database)
    facts["without_resume"] = core_cli("sweep", str(grid), "--database", str(database))
    facts["scratch_at_kill"] = sorted(Path(tempfile.gettempdir()).glob(f"core-sweep-{sweep.pid}-*"))
    facts["resumed"] = core_cli("sweep", str(grid), "--database", str(database), "--resume")
    facts["scratch_after_resume"] = sorted(Path(tempfile.gettempdir()).glob(f"core-sweep-{sweep.pid}-*"))
    facts["sweep_seconds"] = time.monotonic() - started
    facts["reported"] = core_cli("report", "--database", str(database), "--output", str(directory / "report"))
    return facts


@pytest.mark.slow
def test_a_sweep_killed_with_sigkill_resumes_and_counts_every_cell_once(fcnn_sweep: dict[str, Any]) -> None:
    before = fcnn_sweep["rows_before_kill"]
    assert fcnn_sweep["killed_returncode"] == -signal.SIGKILL, "the sweep ended before it could be killed"
    assert len(before) >= 3 and fcnn_sweep["workers_at_kill"], "no run was in flight when the sweep was killed"
    # The orphaned run stops itself rather than measuring alongside the resumed sweep.
    assert fcnn_sweep["orphans"] == [], "the killed sweep's worker outlived it"
    assert fcnn_sweep["rows_after_kill"] == before  # nothing lost, nothing half-written
    # The killed sweep could not remove its scratch directory; the resumed one does.
    assert fcnn_sweep["scratch_at_kill"] and fcnn_sweep["scratch_after_resume"] == []
    refused = fcnn_sweep["without_resume"]
    assert refused.returncode == 2 and "--resume" in refused.stderr
    resumed = fcnn_sweep["resumed"]
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming sweep fcnn-cpu: {len(before)} of 12 runs already recorded" in resumed.stdout
    assert f"sweep fcnn-cpu: {12 - len(before)} runs now, {len(before)} before; 6 cells, 0 failed" in resumed.stdout
    # Off a terminal the progress is plain lines: no carriage return, no escape code.
    assert "\r" not in resumed.stderr and "\x1b" not in resumed.stderr
    after = _rows(fcnn_sweep["database"])
    cells = {key for key, _ in after}
    assert len(cells) == 6 and sorted(after) == sorted((key, repeat) for key in cells for repeat in (0, 1))
    assert all(after[key] == row for key, row in before.items())  # the rows from before, untouched
    print(f"\nFCNN sweep of 12 runs, killed and resumed, took {fcnn_sweep['sweep_seconds']:.1f} s")


@pytest.mark.slow
def test_the_fcnn_sweep_completes_and_its_report_matches_the_database(fcnn_sweep: dict[str, Any]) -> None:
    from test_report import check_plots, check_tables_match_database

    reported = fcnn_sweep["reported"]
    assert reported.returncode == 0, reported.stderr
    with ResultStore(fcnn_sweep["database"]) as store:
        runs = store.runs(sweep="fcnn-cpu")
        assert len(runs) == 12 and len({(run.cell_key, run.repeat) for run in runs}) == 12
        assert all(run.result.status.ok and run.result.throughput_per_second > 0 for run in runs)
        assert {(run.result.config.micro_batch_size, run.result.config.precision.value) for run in runs} == {
            (b, p) for b in (8, 32, 128) for p in ("fp32", "bf16")
        }
        report = fcnn_sweep["directory"] / "report"
        # What the plots are depends on what this machine's results carry: an MFU plot where any
        # precision's runs have a peak (the CPU's is derived from /proc/cpuinfo: a CPU without bf16
        # units has none for bf16), else achieved FLOP/s; a roofline, its log-log FLOP/s plot and
        # MFU heatmaps per precision whose runs have a peak and a memory bandwidth; energy plots
        # where RAPL can be read.
        with_peak = any(run.result.peak_flops_per_second for run in runs)
        roofed = {
            run.result.config.precision.value
            for run in runs
            if run.result.peak_flops_per_second and run.result.memory_bandwidth_bytes_per_second
        }
        drawn = {path.name for path in (report / "plots").glob("*.png")}
        roof_plots = {
            name for name in drawn if re.fullmatch(r"fcnn-cpu-(roofline|flops-vs-batch-log)(-\d+)?\.png", name)
        }
        assert len(roof_plots) == 2 * len(roofed)
        heatmaps = {name for name in drawn if re.fullmatch(r"fcnn-cpu-heatmap-(mfu|best)-\d+\.png", name)}
        check_plots(
            report,
            {"fcnn-cpu-throughput-vs-batch-size.png"}
            | {"fcnn-cpu-mfu-vs-batch-size.png" if with_peak else "fcnn-cpu-flops-vs-batch-size.png"}
            | roof_plots
            | heatmaps
            | {
                f"fcnn-cpu-{kind}.png"
                for kind in ("samples-per-wh-vs-batch-size", "pareto")
                if any(run.result.samples_per_watt_hour for run in runs)
            },
        )
        assert check_tables_match_database(store, "fcnn-cpu", report) == 6


@pytest.mark.slow
def test_the_fcnn_report_opens_in_chromium_without_console_errors(fcnn_sweep: dict[str, Any]) -> None:
    from test_report import check_page_in_chromium

    assert fcnn_sweep["reported"].returncode == 0, fcnn_sweep["reported"].stderr
    page = fcnn_sweep["directory"] / "report" / "report.html"
    images = len(list((fcnn_sweep["directory"] / "report" / "plots").glob("*.png")))
    check_page_in_chromium(page, tables=page.read_text(encoding="utf-8").count("<table"), images=images)


@pytest.mark.slow
def test_a_cell_that_runs_out_of_memory_is_recorded_and_the_sweep_goes_on(tmp_path: Path) -> None:
    # 2^24 samples x 2^20 features x 4 bytes = 64 TiB for one batch: no machine has it.
    grid = grid_file(
        tmp_path / "oom.toml",
        "oom",
        [1 << 24, 8],
        ["fp32"],
        1,
        {"input_width": 1 << 20, "synthetic_pool_samples": 1, "hidden_width": 8, "output_width": 2},
    )
    completed = core_cli("sweep", str(grid), "--database", str(tmp_path / "r.db"))
    assert completed.returncode == 0, completed.stderr
    with ResultStore(tmp_path / "r.db") as store:
        runs = store.runs(sweep="oom")
    failed = [run for run in runs if run.result.config.micro_batch_size == 1 << 24]
    ok = [run for run in runs if run.result.config.micro_batch_size == 8]
    assert len(failed) == 1 and len(ok) == 1  # the failed cell is recorded; the sweep went on to the next
    status = failed[0].result.status
    overcommit = Path("/proc/sys/vm/overcommit_memory")
    if overcommit.exists() and overcommit.read_text().strip() == "1":
        assert status.state.value in ("oom", "killed"), status  # "always overcommit": the kernel may kill instead
    else:
        assert status.state.value == "oom" and status.phase == "setup", status
        assert "can't allocate memory" in status.message
    assert all(run.result.status.ok for run in ok)
    assert (
        "micro_batch_size=16777216 precision=fp32 repeat 1: oom in setup" in completed.stdout
        or status.state.value == "killed"
    )


def test_a_window_as_long_as_the_repeats_time_limit_is_an_invalid_cell() -> None:
    # Issue 28: a 30-minute window (CARAML's) cannot end inside a 30-minute repeat.
    spec = make_sweep_spec(
        {
            "name": "s",
            "timeout_seconds": 1800,
            "grid": {"workload": "fcnn", "accelerator": "cpu", "duration_seconds": [600.0, 1800.0]},
        }
    )
    plan = plan_sweep(spec)
    short, long = plan.cells
    assert short.valid and not long.valid
    assert "duration_seconds = 1800.0" in long.invalid_reason
    assert "less than the sweep's timeout_seconds (1800 s)" in long.invalid_reason


@pytest.mark.parametrize("toy", [[], ["--toy"]])
def test_a_sweep_whose_every_cell_is_invalid_runs_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], toy: list[str]
) -> None:
    # Issue 28: with --skip-invalid, a (toy) sweep that could run none of its cells exited 0.
    sweep = tmp_path / "nothing.toml"
    sweep.write_text('name = "nothing"\n[grid]\nworkload = "fcnn"\naccelerator = "cpu"\nprecision = ["fp6", "fp8"]\n')
    database = tmp_path / "results.db"
    code = main(["sweep", str(sweep), "--skip-invalid", "--database", str(database), *toy])
    err = capsys.readouterr().err
    assert code == 2 and "every cell is invalid here (2 of 2), so nothing can run" in err, err
    assert "precision = 'fp6'" in err and not database.exists()
