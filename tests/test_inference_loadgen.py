"""Inference runs under MLPerf LoadGen's scenarios, end to end through core.run and the CLI, on the
real mlperf_loadgen (docs/inference.md). The runner's phases stay; LoadGen replaces the window."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core import ConfigError, make_config, run
from core.api import run_here
from core.cli import main
from core.plugin import Availability, EnergyMeasurement, PowerMeter, PowerMeterFactory, hookimpl
from core.testing import TINY_FCNN, registered_plugins

pytest.importorskip("mlperf_loadgen", reason="MLPerf LoadGen is not installed (pip install 'core[inference]')")

# Short tests: LoadGen's own defaults are 10 s and 100 queries (MLPerf submissions use 600 s).
SHORT = {"min_duration_seconds": 0.3, "min_query_count": 20}
# Every model call of the paced tests lasts at least this long, which bounds how fast the run can go
# however quiet the machine: LoadGen told to expect that bound sizes its queries for any speed below it.
PACE_SECONDS = 0.002


@pytest.fixture
def paced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """The CPU's PyTorch inference executor with a floor of PACE_SECONDS per model call; returns
    the (start, end) perf_counter times of every call, calibration's and the window's."""
    from core.executors.pytorch_inference import TorchInferenceExecutor

    calls: list[tuple[float, float]] = []
    original = TorchInferenceExecutor.infer

    def infer(self: TorchInferenceExecutor, indices: Any) -> None:
        started = time.perf_counter()
        original(self, indices)
        time.sleep(max(0.0, PACE_SECONDS - (time.perf_counter() - started)))
        calls.append((started, time.perf_counter()))

    monkeypatch.setattr(TorchInferenceExecutor, "infer", infer)
    return calls


def infer(scenario: str, **options: Any) -> Any:
    # In this process (core.run would measure a LoadGen scenario in a child of its own), so that the
    # pacing above, a patch of this process, applies to the calls LoadGen makes.
    return run_here(
        "fcnn",
        "cpu",
        mode="inference",
        scenario=scenario,
        micro_batch_size=8,
        workload_options=TINY_FCNN,
        **{"loadgen": SHORT, "power_meter": "none", **options},
    )


def test_single_stream_reports_loadgen_latencies_as_the_runs_own(paced: list[tuple[float, float]]) -> None:
    # The least latency a query can have is expected, so LoadGen's queries never run out; 100 of
    # them at least, which LoadGen's early stopping needs for a VALID result at any speed.
    loadgen = {**SHORT, "min_query_count": 100, "single_stream_expected_latency_seconds": PACE_SECONDS}
    result = infer("single-stream", loadgen=loadgen)
    assert result.status.ok, result.status
    figures = result.loadgen
    assert figures is not None and figures.scenario == "single-stream"
    assert figures.valid, figures.invalid_reason
    assert "Scenario : SingleStream" in figures.summary_text and "Result is : VALID" in figures.summary_text
    # One sample per query: the window's samples are the queries answered, one model call each.
    assert result.window_samples == figures.query_count == result.window_steps
    assert result.throughput_per_second == pytest.approx(result.window_samples / result.window_seconds)
    assert result.window_seconds >= SHORT["min_duration_seconds"]
    assert result.step_seconds_median == figures.latency_p50_seconds
    assert 0 < figures.latency_p50_seconds <= figures.latency_p90_seconds <= figures.latency_p99_seconds
    assert figures.settings["max_batch_size"] == 8 and figures.settings["seed"] == 0
    assert result.first_step_seconds is not None and result.warmup_seconds is not None  # phases kept apart


def test_offline_batches_by_the_micro_batch_and_agrees_with_loadgen(paced: list[tuple[float, float]]) -> None:
    # The fastest the paced model can go is expected: LoadGen's one query then lasts at least 1.1 x
    # min_duration_seconds however quiet the machine (a calibration on a busy host that quietened
    # before the window once made it too short, and INVALID: "Increase expected QPS").
    fastest = 8 / PACE_SECONDS
    result = infer("offline", loadgen={**SHORT, "offline_expected_samples_per_second": fastest})
    assert result.status.ok, result.status
    figures = result.loadgen
    assert figures is not None and figures.valid, figures.invalid_reason
    assert result.window_steps == -(-result.window_samples // 8)  # batches of the micro-batch, the last partial
    assert result.window_samples >= 1.1 * SHORT["min_duration_seconds"] * fastest
    # core's samples / host window and LoadGen's own first-issue-to-last-answer count the same work;
    # the host's window holds LoadGen's (which it times to the millisecond), so core's rate is not above it.
    assert figures.samples_per_second is not None and result.throughput_per_second is not None
    assert 0 < result.throughput_per_second <= figures.samples_per_second * 1.01
    assert result.step_seconds_median is None  # one query: no latency distribution


def test_the_measured_rate_sets_what_loadgen_expects() -> None:
    """Where the loadgen options leave them out, offline's expected rate is twice the rate measured
    before the window, and single-stream's expected latency a quarter of its inverse."""
    from core.running.loadgen.settings import settings_for_run
    from core.running.loadgen.window import calibrated_samples_per_second

    offline = make_config(workload="fcnn", accelerator="cpu", mode="inference", scenario="offline", micro_batch_size=8)
    assert settings_for_run(offline, 1000.0).offline_expected_samples_per_second == pytest.approx(2000.0)
    stream = offline.model_copy(update={"scenario": "single-stream"})
    assert settings_for_run(stream, 1000.0).single_stream_expected_latency_seconds == pytest.approx(0.25 / 1000.0)

    class Source:
        total_samples = performance_samples = 16
        calls: list[int] = []

        def load(self, indices: Any) -> None:
            pass

        def unload(self, indices: Any) -> None:
            pass

        def infer(self, indices: Any) -> None:
            Source.calls.append(len(indices))
            time.sleep(PACE_SECONDS)

    rate = calibrated_samples_per_second(Source(), 8)
    assert Source.calls == [8] * 11  # one untimed call, then the timed ones
    assert 0 < rate <= 8 / PACE_SECONDS  # a call lasts at least its sleep


def test_server_batches_what_arrived_and_keeps_its_verdict() -> None:
    result = infer("server", loadgen={**SHORT, "server_target_samples_per_second": 400.0})
    assert result.status.ok, result.status
    figures = result.loadgen
    assert figures is not None and figures.latency_p99_seconds is not None
    assert result.window_steps <= result.window_samples  # several arrivals may share one model call
    if not figures.valid:  # a short run may fail LoadGen's early stopping: said, not hidden
        assert any("LoadGen: the result is INVALID" in warning for warning in result.warnings)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mode": "train", "scenario": "offline"}, "scenario"),
        ({"mode": "inference", "loadgen": {"min_query_count": 5}}, "loadgen"),
        ({"mode": "inference", "scenario": "offline", "loadgen": {"scenario": "server"}}, "loadgen.scenario"),
        ({"mode": "inference", "scenario": "offline", "loadgen": {"max_batch_size": 4}}, "loadgen.max_batch_size"),
        (
            {"mode": "inference", "scenario": "offline", "loadgen": {"min_duraton_seconds": 1.0}},
            "loadgen.min_duraton_seconds",
        ),
        (
            {"mode": "inference", "scenario": "offline", "loadgen": {"min_duration_seconds": True}},
            "loadgen.min_duration_seconds",
        ),
        ({"mode": "inference", "scenario": "server"}, "loadgen.server_target_samples_per_second"),
        ({"mode": "inference", "scenario": "offline", "replicas": 2}, "replicas"),
        ({"mode": "inference", "scenario": "offline", "framework": "tensorflow"}, "scenario"),
        ({"mode": "inference", "scenario": "closed-loop"}, "scenario"),
    ],
)
def test_bad_loadgen_options_are_refused_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        run("fcnn", "cpu", workload_options=TINY_FCNN, **options)
    assert refused.value.field == field, refused.value


def test_graphcore_says_why_it_keeps_to_the_loop(capsys: pytest.CaptureFixture[str]) -> None:
    dry = ["run", "fcnn", "--accelerator", "graphcore", "--machine", "ipu-pod4", "--dry-run", "--precision", "fp16"]
    assert main([*dry, "--mode", "inference", "--scenario", "offline"]) == 2
    assert "fixed-size host calls of one compiled shape" in capsys.readouterr().err


class _ClockMeter(PowerMeter):
    """Reports 100 W over exactly the span between its start and stop calls."""

    name = "clock"
    spans: ClassVar[list[tuple[float, float]]] = []

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> EnergyMeasurement:
        stopped = time.perf_counter()
        _ClockMeter.spans.append((self._started, stopped))
        return EnergyMeasurement(meter=self.name, energy_joules=100.0 * (stopped - self._started))


class _ClockMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "clock"

    def reads(self, accelerator_name: str) -> bool:
        return accelerator_name == "cpu"

    def availability(self) -> Availability:
        return Availability.yes()

    def meter_for(self, devices: Any, context: Any) -> PowerMeter:
        return _ClockMeter()


class _MeterPlugin:
    @hookimpl
    def core_register_power_meters(self, register: Callable[[PowerMeterFactory], None]) -> None:
        register(_ClockMeterFactory())


def test_energy_covers_exactly_the_loadgen_window(paced: list[tuple[float, float]]) -> None:
    _ClockMeter.spans.clear()
    with registered_plugins(_MeterPlugin()):
        result = infer("single-stream", power_meter="clock")
    assert result.status.ok, result.status
    ((started, stopped),) = _ClockMeter.spans
    # The meter ran over LoadGen's window (samples loaded to last answer), not the warm-up's or the
    # calibration's: every model call before it started ended before, every call after it is the
    # window's and ended before it stopped. (Orders of events, not durations: a busy host keeps them.)
    before = [call for call in paced if call[0] < started]
    during = [call for call in paced if call[0] >= started]
    assert before and all(end <= started for _, end in before)
    assert len(during) == result.window_steps and all(end <= stopped for _, end in during)
    assert stopped - started >= during[-1][1] - during[0][0] and result.window_seconds >= during[-1][1] - during[0][0]
    assert result.energy_joules_per_sample == pytest.approx(result.energy_joules / result.window_samples)


@pytest.mark.slow  # a sweep: each run in its own process
def test_the_cli_prints_loadgen_and_the_export_keeps_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = ["run", "fcnn", "--mode", "inference", "--scenario", "single-stream", "--batch-size", "4"]
    loadgen = ["-l", "min_duration_seconds=0.2", "-l", "min_query_count=10"]
    assert main([*command, *loadgen, "-o", "layers=1", "-o", "hidden_width=8", "--power-meter", "none"]) == 0
    out = capsys.readouterr().out
    assert "loadgen         single-stream, VALID" in out and "query latency" in out
    assert main([*command, "-l", "scenario=offline"]) == 2
    assert "invalid loadgen.scenario (-l scenario)" in capsys.readouterr().err
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'name = "lg"\nrepeats = 1\n[grid]\nworkload = "fcnn"\nmode = "inference"\n'
        'scenario = ["offline", "single-stream"]\n'
        'micro_batch_size = 4\npower_meter = "none"\n'
        "[grid.workload_options]\nlayers = 1\nhidden_width = 8\n"
        "[grid.loadgen]\nmin_duration_seconds = 0.2\nmin_query_count = [10, 20]\n"
    )
    database, exported = tmp_path / "r.db", tmp_path / "r.csv"
    assert main(["sweep", str(sweep), "--database", str(database)]) == 0
    assert main(["results", "--database", str(database), "--format", "csv", "--output", str(exported)]) == 0
    rows = list(csv.DictReader(exported.open()))
    assert sorted(row["scenario"] for row in rows) == ["offline", "offline", "single-stream", "single-stream"]
    assert all(row["loadgen_valid"] in ("True", "False") and float(row["throughput_per_second"]) > 0 for row in rows)


# --- settings LoadGen cannot hold, and LoadGen failing in native code ----------------------------------


@pytest.mark.parametrize(
    "setting, field",
    [
        (
            ["-l", "server_target_samples_per_second=1e9", "-l", "min_duration_seconds=600"],
            "server_target_samples_per_second",
        ),
        (["-l", "min_query_count=1099511627776"], "min_query_count"),
        (["-l", "single_stream_expected_latency_seconds=1e-10"], "single_stream_expected_latency_seconds"),
        (["-l", "offline_expected_samples_per_second=1e12"], "offline_expected_samples_per_second"),
    ],
)
def test_settings_that_need_billions_of_queries_are_refused_before_the_run(
    setting: list[str], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = {"server": "server", "offline": "offline"}.get(field.split("_")[0], "single-stream")
    if field == "min_query_count":
        scenario = "server"
        setting = [*setting, "-l", "server_target_samples_per_second=10"]
    output = tmp_path / "result.json"
    command = ["run", "fcnn", "--mode", "inference", "--scenario", scenario, "--output", str(output), *setting]
    assert main([*command, "-o", "layers=1", "--power-meter", "none"]) == 2
    error = capsys.readouterr().err
    assert f"invalid loadgen.{field} (-l {field})" in error and "memory" in error, error
    assert not output.exists()


def test_a_sweep_cell_whose_loadgen_queries_cannot_fit_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'name = "huge"\n[grid]\nworkload = "fcnn"\nmode = "inference"\nscenario = "server"\n'
        "[grid.loadgen]\nserver_target_samples_per_second = [100.0, 1e9]\n"
    )
    assert main(["sweep", str(sweep), "--dry-run", "--database", str(tmp_path / "r.db")]) == 2
    out = capsys.readouterr().out
    assert "[invalid: loadgen.server_target_samples_per_second = 1000000000.0: at most" in out


# mlperf_loadgen's surface, crashing in native code after the window opened, as LoadGen's log thread
# does once an exception (its std::bad_alloc) has left StartTest.
_CRASHING_LOADGEN = """
import ctypes
from types import SimpleNamespace

TestScenario = SimpleNamespace(Offline="Offline", SingleStream="SingleStream", Server="Server")
TestMode = SimpleNamespace(PerformanceOnly="PerformanceOnly")


def TestSettings():
    return SimpleNamespace()


def LogSettings():
    return SimpleNamespace(log_output=SimpleNamespace())


def QuerySampleResponse(sample_id, data, size):
    return sample_id


def QuerySamplesComplete(responses):
    pass


def ConstructSUT(issue, flush):
    return issue


def ConstructQSL(total, performance, load, unload):
    return performance, load


def DestroySUT(sut):
    pass


DestroyQSL = DestroySUT


def StartTestWithLogSettings(sut, qsl, settings, logs, audit_config):
    performance, load = qsl
    load(list(range(performance)))  # the samples are loaded: the window is open
    sut([SimpleNamespace(id=1, index=0)])  # a query answered
    ctypes.string_at(0)  # SIGSEGV
"""


@pytest.mark.slow  # core run in a process, which runs LoadGen in one of its own
def test_a_native_crash_in_loadgen_keeps_the_phases_and_writes_the_output(tmp_path: Path) -> None:
    fake, scratch = tmp_path / "fake", tmp_path / "tmp"
    fake.mkdir()
    scratch.mkdir()
    (fake / "mlperf_loadgen.py").write_text(_CRASHING_LOADGEN)
    output = tmp_path / "result.json"
    command = ["run", "fcnn", "--mode", "inference", "--scenario", "offline", "--batch-size", "4"]
    command += ["-o", "layers=1", "-o", "hidden_width=8", "--power-meter", "none", "--output", str(output)]
    environment = {**os.environ, "PYTHONPATH": str(fake), "TMPDIR": str(scratch)}
    completed = subprocess.run(
        [sys.executable, "-m", "core.cli", *command], capture_output=True, text=True, env=environment, timeout=600
    )
    assert completed.returncode == 1, (completed.returncode, completed.stderr[-2000:])
    result = json.loads(output.read_text())
    status = result["status"]
    assert status["state"] == "error" and status["phase"] == "window", status
    assert "killed by SIGSEGV" in status["message"], status["message"]
    # What was measured before LoadGen's window is kept.
    assert result["setup_seconds"] is not None and result["first_step_seconds"] is not None
    assert result["warmup_seconds"] is not None
    assert "fcnn on cpu" in completed.stdout and "error" in completed.stdout
    assert list(scratch.iterdir()) == [], "a temporary directory was left behind"
