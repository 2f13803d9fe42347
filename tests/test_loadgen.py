"""The LoadGen layer drives the real mlperf_loadgen over a fake QuerySource that sleeps a known time
per batch, and reads back what LoadGen measured: throughput, latencies, validity, the logs."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import core.running.loadgen.run
import core.running.loadgen.settings
from core.base.config import make_config
from core.base.errors import ConfigError
from core.base.results import RunState
from core.running.loadgen import (
    LoadGenError,
    LoadGenOutcome,
    LoadGenSettings,
    QuerySource,
    make_loadgen_settings,
    run_scenario,
)
from core.running.loadgen.outcome import DETAIL_FILE, LOG_FILES, SUMMARY_FILE, read_detail_log, read_outcome
from core.running.loadgen.settings import settings_for_run
from core.running.runner import classify_fault

needs_loadgen = pytest.mark.skipif(
    importlib.util.find_spec("mlperf_loadgen") is None,
    reason="mlperf_loadgen is not installed (pip install 'core[inference]')",
)

SLEEP_SECONDS = 0.002
# Short runs: LoadGen takes durations to the millisecond and counts as small as 1.
SHORT = {"min_duration_seconds": 0.2, "min_query_count": 16}


class SleepingSource:
    """A QuerySource whose model takes SLEEP_SECONDS per batch, whatever its size, and that records
    every call (and on which thread), checking that LoadGen asks only for loaded samples."""

    def __init__(self, total: int = 64, performance: int = 32, *, fail_on_call: int | None = None) -> None:
        self.total, self.performance = total, performance
        self.fail_on_call = fail_on_call
        self.loaded: list[list[int]] = []
        self.unloaded: list[list[int]] = []
        self.batches: list[list[int]] = []
        self.infer_threads: set[str] = set()
        self.infer_times: list[tuple[float, float]] = []
        self.calls_after_failure = 0
        self._failed = False
        self._resident: set[int] = set()

    @property
    def total_samples(self) -> int:
        return self.total

    @property
    def performance_samples(self) -> int:
        return self.performance

    def load(self, indices: Sequence[int]) -> None:
        self.loaded.append(list(indices))
        self._resident.update(indices)

    def unload(self, indices: Sequence[int]) -> None:
        self.unloaded.append(list(indices))
        self._resident.difference_update(indices)

    def infer(self, indices: Sequence[int]) -> None:
        if self._failed:
            self.calls_after_failure += 1
        if self.fail_on_call is not None and len(self.batches) + 1 == self.fail_on_call:
            self._failed = True
            raise RuntimeError("the device fell over")
        assert set(indices) <= self._resident, "LoadGen asked for a sample that is not loaded"
        started = time.perf_counter()
        time.sleep(SLEEP_SECONDS)
        self.infer_times.append((started, time.perf_counter()))
        self.batches.append(list(indices))
        self.infer_threads.add(threading.current_thread().name)

    @property
    def samples_inferred(self) -> int:
        return sum(len(batch) for batch in self.batches)


@pytest.fixture
def quiet_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working directory that must stay empty: LoadGen writes only to the log directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    threads_before = set(threading.enumerate())
    yield cwd
    assert set(threading.enumerate()) <= threads_before, "a thread outlived run_scenario"


def _detail_values(outcome: LoadGenOutcome) -> dict[str, Any]:
    return read_detail_log(outcome.log_dir / DETAIL_FILE).values


def _check_logs_and_balance(outcome: LoadGenOutcome, source: SleepingSource, log_dir: Path, cwd: Path) -> None:
    assert outcome.log_dir == log_dir.resolve()
    assert sorted(path.name for path in log_dir.iterdir()) == sorted(LOG_FILES)
    assert list(cwd.iterdir()) == []
    assert outcome.summary_text == (log_dir / SUMMARY_FILE).read_text()
    assert "MLPerf Results Summary" in outcome.summary_text
    assert outcome.loadgen_version and outcome.loadgen_version.startswith("6.")
    assert outcome.loadgen_errors == []
    # One performance set, loaded once and unloaded once.
    assert len(source.loaded) == 1 and source.unloaded == source.loaded
    assert len(source.loaded[0]) == source.performance
    assert outcome.samples_answered == source.samples_inferred
    # The host's window holds every inference and sits inside the StartTest call.
    assert outcome.window_start_perf_counter is not None and outcome.window_end_perf_counter is not None
    assert outcome.window_seconds is not None and 0 < outcome.window_seconds <= outcome.start_test_seconds
    assert outcome.window_start_perf_counter <= source.infer_times[0][0]
    assert source.infer_times[-1][1] <= outcome.window_end_perf_counter
    # LoadGen's own first-issue-to-last-answer span (to the millisecond) lies within it.
    assert outcome.loadgen_window_seconds is not None
    assert outcome.loadgen_window_seconds <= outcome.window_seconds + 0.002


# --- the scenarios --------------------------------------------------------------------------------


@needs_loadgen
def test_offline_throughput_is_the_batch_over_the_sleep(tmp_path: Path, quiet_cwd: Path) -> None:
    batch = 8
    ideal = batch / SLEEP_SECONDS
    settings = make_loadgen_settings(
        scenario="offline", max_batch_size=batch, offline_expected_samples_per_second=ideal, **SHORT
    )
    source = SleepingSource()
    outcome = run_scenario(source, settings, tmp_path / "logs")

    assert outcome.scenario == "offline"
    assert outcome.valid and outcome.invalid_reason is None
    assert outcome.min_duration_met and outcome.min_queries_met
    # A sleep lasts at least its time, so the throughput cannot beat the ideal (LoadGen times to the
    # millisecond); how far below it a busy host falls is not this test's business.
    assert outcome.samples_per_second is not None
    assert 0 < outcome.samples_per_second <= 1.02 * ideal
    # LoadGen's one query, split into full batches (the last may be short), every sample answered.
    issued = _detail_values(outcome)["effective_samples_per_query"]
    assert outcome.query_count == 1
    assert source.samples_inferred == issued == outcome.samples_answered
    assert all(len(b) == batch for b in source.batches[:-1]) and 1 <= len(source.batches[-1]) <= batch
    # Answered inline on the caller's thread (its CUDA stream, its inference_mode).
    assert source.infer_threads == {threading.current_thread().name}
    assert outcome.window_seconds is not None and outcome.window_seconds >= settings.min_duration_seconds
    _check_logs_and_balance(outcome, source, tmp_path / "logs", quiet_cwd)


@needs_loadgen
def test_single_stream_latency_is_the_sleep(tmp_path: Path, quiet_cwd: Path) -> None:
    # At least 64 queries, whatever the host's speed: LoadGen's early stopping at p90 needs them for
    # a VALID result. The expected latency is the least a query can take, so its queries never run out.
    settings = make_loadgen_settings(
        scenario="single-stream",
        max_batch_size=8,
        single_stream_expected_latency_seconds=SLEEP_SECONDS,
        **{**SHORT, "min_query_count": 100},
    )
    source = SleepingSource()
    outcome = run_scenario(source, settings, tmp_path / "logs")

    assert outcome.valid, outcome.invalid_reason
    assert outcome.latency_p50_seconds is not None
    # Each query's latency holds its model call, which holds the sleep: the median cannot be less
    # than the median call (how much more a busy host adds is not asserted).
    calls = sorted(end - start for start, end in source.infer_times)
    assert SLEEP_SECONDS <= calls[len(calls) // 2] <= outcome.latency_p50_seconds + 0.0005
    figures = [
        outcome.latency_min_seconds,
        outcome.latency_p50_seconds,
        outcome.latency_p90_seconds,
        outcome.latency_p95_seconds,
        outcome.latency_p99_seconds,
        outcome.latency_max_seconds,
    ]
    assert all(figure is not None for figure in figures)
    assert figures == sorted(figures)  # type: ignore[type-var]
    assert outcome.latency_mean_seconds is not None and outcome.latency_mean_seconds >= SLEEP_SECONDS
    assert outcome.early_stopping_latency_seconds is not None
    assert outcome.early_stopping_latency_seconds >= SLEEP_SECONDS
    # One sample per query whatever max_batch_size says; every query answered by the model.
    assert {len(b) for b in source.batches} == {1}
    assert outcome.query_count == outcome.samples_answered == source.samples_inferred >= SHORT["min_query_count"]
    assert outcome.samples_per_second is not None and outcome.samples_per_second <= 1 / SLEEP_SECONDS
    _check_logs_and_balance(outcome, source, tmp_path / "logs", quiet_cwd)


@needs_loadgen
def test_server_batches_what_arrived_on_a_worker_thread(tmp_path: Path, quiet_cwd: Path) -> None:
    # Twice as many arrivals per second as one-sample batches could serve: the worker must batch.
    rate = 1.0 / SLEEP_SECONDS * 2
    settings = make_loadgen_settings(
        scenario="server",
        max_batch_size=4,
        server_target_samples_per_second=rate,
        server_target_latency_seconds=0.05,
        min_duration_seconds=0.3,
        min_query_count=16,
    )
    source = SleepingSource()
    outcome = run_scenario(source, settings, tmp_path / "logs")

    assert max(len(b) for b in source.batches) > 1
    assert all(1 <= len(b) <= 4 for b in source.batches)
    assert source.infer_threads == {"loadgen-server-worker"}
    assert outcome.query_count == outcome.samples_answered == source.samples_inferred
    # LoadGen's verdict on the latency target is read as it gave it: met exactly when its p99 is within
    # the 50 ms (whether a busy host meets it is not this test's business).
    assert outcome.latency_p99_seconds is not None and outcome.latency_constraint_met is not None
    assert outcome.latency_constraint_met == (outcome.latency_p99_seconds <= 0.05)
    assert outcome.latency_p50_seconds is not None and outcome.latency_p50_seconds >= SLEEP_SECONDS
    assert outcome.scheduled_samples_per_second is not None and outcome.samples_per_second is not None
    assert 0.5 * rate <= outcome.scheduled_samples_per_second <= 1.5 * rate
    # A short run cannot satisfy early stopping at p99; the reason says so rather than nothing.
    if not outcome.valid:
        assert outcome.invalid_reason
    _check_logs_and_balance(outcome, source, tmp_path / "logs", quiet_cwd)


@needs_loadgen
def test_window_callbacks_bracket_every_inference(tmp_path: Path, quiet_cwd: Path) -> None:
    marks: list[tuple[str, float, str]] = []

    def opened() -> None:
        marks.append(("open", time.perf_counter(), threading.current_thread().name))

    def closed() -> None:
        marks.append(("close", time.perf_counter(), threading.current_thread().name))

    settings = make_loadgen_settings(
        scenario="offline", max_batch_size=16, offline_expected_samples_per_second=8000.0, **SHORT
    )
    source = SleepingSource()
    outcome = run_scenario(source, settings, tmp_path / "logs", on_window_open=opened, on_window_close=closed)

    assert [mark[0] for mark in marks] == ["open", "close"]
    assert {mark[2] for mark in marks} == {threading.current_thread().name}
    (_, opened_at, _), (_, closed_at, _) = marks
    assert opened_at <= source.infer_times[0][0] and source.infer_times[-1][1] <= closed_at
    assert outcome.window_start_perf_counter is not None and outcome.window_end_perf_counter is not None
    # The host's window is stamped just before the open callback and just before the close one.
    assert outcome.window_start_perf_counter <= opened_at and outcome.window_end_perf_counter <= closed_at
    assert source.infer_times[-1][1] <= outcome.window_end_perf_counter


# --- faults ---------------------------------------------------------------------------------------


@needs_loadgen
@pytest.mark.parametrize(
    "scenario, rates",
    [
        ("offline", {"offline_expected_samples_per_second": 4000.0, "max_batch_size": 8}),
        ("single-stream", {"single_stream_expected_latency_seconds": SLEEP_SECONDS}),
        ("server", {"server_target_samples_per_second": 500.0, "max_batch_size": 4}),
    ],
)
def test_a_failing_infer_is_raised_once_loadgen_has_ended(
    tmp_path: Path, quiet_cwd: Path, scenario: str, rates: dict[str, Any]
) -> None:
    settings = make_loadgen_settings(scenario=scenario, **rates, **SHORT)
    source = SleepingSource(fail_on_call=3)
    started = time.perf_counter()
    with pytest.raises(RuntimeError, match="the device fell over"):
        run_scenario(source, settings, tmp_path / "logs")
    # LoadGen was answered without the model after the failure, so it ended at once (server: when
    # its schedule of arrivals ran out, about min_duration_seconds); a hang guard, generous for a busy host.
    assert time.perf_counter() - started < 120.0
    assert source.calls_after_failure == 0 and len(source.batches) == 2
    assert source.unloaded == source.loaded  # the samples were still released
    assert (tmp_path / "logs" / SUMMARY_FILE).is_file()  # LoadGen's own account of the broken run


@needs_loadgen
def test_a_failing_window_callback_is_raised(tmp_path: Path, quiet_cwd: Path) -> None:
    def meter_fails() -> None:
        raise OSError("no power meter")

    settings = make_loadgen_settings(scenario="offline", offline_expected_samples_per_second=4000.0, **SHORT)
    source = SleepingSource()
    with pytest.raises(OSError, match="no power meter"):
        run_scenario(source, settings, tmp_path / "logs", on_window_open=meter_fails)
    assert source.batches == []  # the model never ran without its meter
    assert source.unloaded == source.loaded


@needs_loadgen
def test_loadgen_runs_one_test_at_a_time(tmp_path: Path, quiet_cwd: Path) -> None:
    settings = make_loadgen_settings(scenario="offline", offline_expected_samples_per_second=4000.0, **SHORT)

    class Reentrant(SleepingSource):
        def infer(self, indices: Sequence[int]) -> None:
            run_scenario(SleepingSource(), settings, tmp_path / "inner")

    with pytest.raises(LoadGenError, match="already running"):
        run_scenario(Reentrant(), settings, tmp_path / "outer")
    assert not (tmp_path / "inner").exists()


@needs_loadgen
@pytest.mark.parametrize("audit_in", ["cwd", "log_dir"])
def test_only_an_audit_config_in_the_log_dir_applies(tmp_path: Path, quiet_cwd: Path, audit_in: str) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    folder = quiet_cwd if audit_in == "cwd" else log_dir
    # LoadGen config files give percentiles in percent.
    (folder / "audit.config").write_text("*.SingleStream.target_latency_percentile = 50\n")
    settings = make_loadgen_settings(
        scenario="single-stream", single_stream_expected_latency_seconds=SLEEP_SECONDS, **SHORT
    )
    outcome = run_scenario(SleepingSource(), settings, log_dir)
    percentile = _detail_values(outcome)["effective_target_latency_percentile"]
    assert percentile == (0.9 if audit_in == "cwd" else 0.5)
    (folder / "audit.config").unlink()  # quiet_cwd checks nothing else is left behind


@needs_loadgen
def test_stale_logs_do_not_pass_for_a_new_run(tmp_path: Path, quiet_cwd: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / SUMMARY_FILE).write_text("Result is : VALID\n")
    settings = make_loadgen_settings(
        scenario="single-stream", single_stream_expected_latency_seconds=SLEEP_SECONDS, **SHORT
    )
    outcome = run_scenario(SleepingSource(), settings, log_dir)
    assert outcome.summary_text.startswith("====")


def test_source_counts_are_checked_before_loadgen(tmp_path: Path) -> None:
    settings = make_loadgen_settings(scenario="offline", offline_expected_samples_per_second=10.0)
    with pytest.raises(ConfigError) as caught:
        run_scenario(SleepingSource(total=8, performance=16), settings, tmp_path / "logs")
    assert caught.value.field == "source.performance_samples"
    assert not (tmp_path / "logs").exists()


def test_without_loadgen_the_error_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)  # import now raises ImportError
    settings = make_loadgen_settings(scenario="offline", offline_expected_samples_per_second=10.0)
    with pytest.raises(LoadGenError, match=r"core\[inference\]"):
        run_scenario(SleepingSource(), settings, tmp_path / "logs")


def test_core_imports_without_loading_loadgen() -> None:
    code = "import sys, core, core.running.loadgen; assert 'mlperf_loadgen' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_fake_is_a_query_source() -> None:
    assert isinstance(SleepingSource(), QuerySource)


# --- settings ---------------------------------------------------------------------------------------


OFFLINE = {"scenario": "offline", "offline_expected_samples_per_second": 1.0}


@pytest.mark.parametrize(
    "options, field",
    [
        ({"scenario": "multi-stream"}, "scenario"),
        ({**OFFLINE, "max_batch_size": 0}, "max_batch_size"),
        ({**OFFLINE, "max_batch_size": 8.0}, "max_batch_size"),
        ({**OFFLINE, "min_duration_seconds": 0}, "min_duration_seconds"),
        ({**OFFLINE, "min_duration_seconds": "10"}, "min_duration_seconds"),
        ({**OFFLINE, "offline_expected_samples_per_second": True}, "offline_expected_samples_per_second"),
        ({"scenario": "offline"}, "offline_expected_samples_per_second"),
        ({"scenario": "server"}, "server_target_samples_per_second"),
        ({"scenario": "server", "server_target_samples_per_second": -5.0}, "server_target_samples_per_second"),
        ({**OFFLINE, "single_stream_target_latency_percentile": 1.0}, "single_stream_target_latency_percentile"),
        ({**OFFLINE, "min_duration_seconds": 5.0, "max_duration_seconds": 1.0}, "max_duration_seconds"),
        ({**OFFLINE, "min_query_count": 100, "max_query_count": 10}, "max_query_count"),
        ({**OFFLINE, "seed": -1}, "seed"),
        ({**OFFLINE, "target_qps": 10.0}, "target_qps"),
    ],
)
def test_bad_settings_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_loadgen_settings(**options)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize(
    "options, field",
    [
        # below LoadGen's nanosecond: it would read 0 (single-stream's query count overflowed)
        (
            {"scenario": "single-stream", "single_stream_expected_latency_seconds": 1e-320},
            "single_stream_expected_latency_seconds",
        ),
        (
            {"scenario": "single-stream", "single_stream_expected_latency_seconds": 5e-324},
            "single_stream_expected_latency_seconds",
        ),
        (
            {"scenario": "server", "server_target_samples_per_second": 1.0, "server_target_latency_seconds": 1e-12},
            "server_target_latency_seconds",
        ),
        # a rate whose min_query_count queries would take years (or forever) to arrive
        ({"scenario": "server", "server_target_samples_per_second": 1e-6}, "server_target_samples_per_second"),
        (
            {"scenario": "server", "server_target_samples_per_second": 5e-324, "min_query_count": 1},
            "server_target_samples_per_second",
        ),
    ],
)
def test_settings_loadgen_cannot_keep_to_are_refused_naming_the_setting(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_loadgen_settings(**options)
    assert caught.value.field == field
    config = make_config(
        workload="fcnn",
        accelerator="cpu",
        mode="inference",
        scenario=options["scenario"],
        loadgen={key: value for key, value in options.items() if key != "scenario"},
    )
    with pytest.raises(ConfigError) as planned:
        settings_for_run(config)
    assert planned.value.field == f"loadgen.{field}"


def test_the_slowest_server_rate_a_refusal_states_is_accepted() -> None:
    with pytest.raises(ConfigError) as caught:
        make_loadgen_settings(scenario="server", server_target_samples_per_second=1e-6)
    lowest = float(caught.value.allowed.split(" ")[2])
    assert make_loadgen_settings(scenario="server", server_target_samples_per_second=lowest)
    assert "604800 s" in caught.value.allowed


@pytest.mark.parametrize(
    "scenario, field",
    [("offline", "offline_expected_samples_per_second"), ("server", "server_target_samples_per_second")],
)
def test_a_scenario_s_rate_left_out_is_said_to_be_missing_not_none(scenario: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make_loadgen_settings(scenario=scenario)
    assert str(caught.value).startswith(f"invalid {field} (missing): a number above 0 is required for the {scenario}")
    assert "None" not in str(caught.value)


def test_settings_are_frozen_and_the_defaults_are_loadgen_s() -> None:
    settings = make_loadgen_settings(scenario="single-stream")
    assert settings.min_duration_seconds == 10.0 and settings.min_query_count == 100
    assert settings.single_stream_target_latency_percentile == 0.90
    with pytest.raises(Exception, match="frozen"):
        settings.seed = 3  # type: ignore[misc]


# --- what LoadGen's queries cost in memory ------------------------------------------------------------

GIB = 1 << 30
# With 1 GiB of memory, half of it for LoadGen: 1,048,576 single-sample queries at 512 bytes, or
# 524,288 offline samples at 1 KiB (core.running.loadgen.settings).
MOST_QUERIES, MOST_OFFLINE_SAMPLES = 1 << 20, 1 << 19


@pytest.fixture
def one_gib_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # (The refusals' messages name the 1 GiB: an injection that stopped working would show.)
    monkeypatch.setattr(core.running.loadgen.settings, "host_memory_bytes", lambda: GIB, raising=False)


def loadgen_generates(settings: LoadGenSettings) -> int:
    """The samples LoadGen 6.0 generates before its first query, from its own code: offline's one
    query holds max(min_query_count, 1.1 x min_duration x expected rate) samples
    (test_settings_internal.cc, kSlack); single-stream generates queries until one is scheduled at
    or past twice min_duration at the expected latency, server past min_duration at the target
    rate (on average), at least min_query_count (GenerateQueries in loadgen.cc)."""
    duration = settings.min_duration_seconds
    if settings.scenario == "offline":
        rate = settings.offline_expected_samples_per_second or 0.0
        return max(settings.min_query_count, int(1.1 * duration * rate))
    if settings.scenario == "single-stream":
        timed = 2 * duration / settings.single_stream_expected_latency_seconds
    else:
        timed = duration * (settings.server_target_samples_per_second or 0.0)
    return max(settings.min_query_count, math.ceil(timed) + 1)


@pytest.mark.parametrize(
    "options, field",
    [
        # a huge expected rate times the duration
        ({"scenario": "server", "server_target_samples_per_second": 1e9}, "server_target_samples_per_second"),
        (
            {"scenario": "server", "server_target_samples_per_second": 1e4, "min_duration_seconds": 604800.0},
            "server_target_samples_per_second",
        ),
        ({**OFFLINE, "offline_expected_samples_per_second": 1e12}, "offline_expected_samples_per_second"),
        # a tiny latency target, or LoadGen's default latency over a week
        (
            {"scenario": "single-stream", "single_stream_expected_latency_seconds": 1e-9},
            "single_stream_expected_latency_seconds",
        ),
        ({"scenario": "single-stream", "min_duration_seconds": 604800.0}, "single_stream_expected_latency_seconds"),
        # huge counts
        ({"scenario": "single-stream", "min_query_count": 1 << 40}, "min_query_count"),
        # (at 10,000 queries per second: 1.0 would take 31 years, refused as such)
        ({"scenario": "server", "server_target_samples_per_second": 1e4, "min_query_count": 10**9}, "min_query_count"),
        ({**OFFLINE, "min_query_count": MOST_OFFLINE_SAMPLES + 1}, "min_query_count"),
    ],
)
def test_settings_whose_queries_do_not_fit_in_memory_are_refused_naming_the_setting(
    options: dict[str, Any], field: str, one_gib_host: None, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        make_loadgen_settings(**options)
    assert caught.value.field == field and caught.value.value == options.get(field, caught.value.value)
    assert "fit in 50% of this host's 1 GiB of memory" in caught.value.allowed, caught.value.allowed
    # The bound it states is one that is accepted.
    bound = caught.value.allowed.split(" ")[2].replace(",", "").rstrip(":")
    accepted = make_loadgen_settings(**{**options, field: type(caught.value.value)(float(bound))})
    assert getattr(accepted, field) == float(bound)
    # Settings built without make_loadgen_settings are refused before LoadGen is touched too.
    with pytest.raises(ConfigError) as again:
        run_scenario(SleepingSource(), LoadGenSettings(**options), tmp_path / "logs")
    assert again.value.field == field
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "scenario, setting, fits, too_many",
    [
        ("server", "server_target_samples_per_second", (MOST_QUERIES - 1) / 10, MOST_QUERIES / 10),
        ("single-stream", "single_stream_expected_latency_seconds", 20 / (MOST_QUERIES - 1), 20 / MOST_QUERIES),
        ("offline", "offline_expected_samples_per_second", MOST_OFFLINE_SAMPLES / 11, MOST_OFFLINE_SAMPLES / 11 + 0.1),
        ("server", "min_query_count", MOST_QUERIES, MOST_QUERIES + 1),
    ],
)
def test_the_bound_is_the_count_loadgen_generates(
    scenario: str, setting: str, fits: float, too_many: float, one_gib_host: None
) -> None:
    """LoadGen generates rate x 10 s (server), 2 x 10 s / latency (single-stream) or 1.1 x 10 s x
    rate (offline) samples, or min_query_count where that is more: up to the bound is accepted."""
    base: dict[str, Any] = {"scenario": scenario, "min_duration_seconds": 10.0, "min_query_count": 1}
    base |= {"server": {"server_target_samples_per_second": 10.0}, "offline": OFFLINE}.get(scenario, {})
    base["scenario"] = scenario
    settings = make_loadgen_settings(**{**base, setting: type(base.get(setting, fits))(fits)})
    assert loadgen_generates(settings) <= (MOST_OFFLINE_SAMPLES if scenario == "offline" else MOST_QUERIES)
    with pytest.raises(ConfigError) as caught:
        make_loadgen_settings(**{**base, setting: type(base.get(setting, too_many))(too_many)})
    assert caught.value.field == setting


def test_a_source_whose_loaded_samples_do_not_fit_is_refused(one_gib_host: None, tmp_path: Path) -> None:
    settings = make_loadgen_settings(scenario="single-stream", min_query_count=1)
    with pytest.raises(ConfigError) as caught:
        run_scenario(SleepingSource(total=1 << 40, performance=1 << 40), settings, tmp_path / "logs")
    assert caught.value.field == "source.performance_samples"


def test_the_run_derives_no_more_queries_than_fit(one_gib_host: None) -> None:
    """Where the run measures the expected rate or latency, the queries it implies stay within
    memory (offline) and within 2 million (single-stream), however fast the model is."""
    week = {"min_duration_seconds": 604800.0}
    single = make_config(workload="fcnn", accelerator="cpu", mode="inference", scenario="single-stream", loadgen=week)
    planned = settings_for_run(single)  # in planning: the lowest latency the run may use
    measured = settings_for_run(single, measured_samples_per_second=1e6)
    for settings in (planned, measured):
        assert loadgen_generates(settings) <= 2_000_000
    offline = make_config(workload="fcnn", accelerator="cpu", mode="inference", scenario="offline")
    fast = settings_for_run(offline, measured_samples_per_second=1e9)
    assert loadgen_generates(fast) <= MOST_OFFLINE_SAMPLES
    assert settings_for_run(offline, measured_samples_per_second=100.0).offline_expected_samples_per_second == 200.0


def test_the_memory_is_the_smallest_limit_the_process_has() -> None:
    """An address-space limit (ulimit -v) is memory LoadGen cannot exceed either."""
    limit = 3 * GIB
    code = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, resource.RLIM_INFINITY)); "
        "from core.running.loadgen.settings import host_memory_bytes; print(host_memory_bytes())"
    )
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    from core.running.loadgen.settings import host_memory_bytes

    assert int(printed) == min(limit, host_memory_bytes())


class _LoadGenThatRaises:
    """mlperf_loadgen's surface whose StartTest raises what pybind11 makes of LoadGen's std::bad_alloc."""

    class TestScenario:
        Offline = SingleStream = Server = "scenario"

    class TestMode:
        PerformanceOnly = "performance"

    class _Anything:
        def __init__(self) -> None:
            self.log_output = self

    TestSettings = LogSettings = _Anything

    def ConstructSUT(self, *callbacks: Any) -> Any:  # noqa: N802 - LoadGen's names
        return callbacks

    ConstructQSL = ConstructSUT

    def DestroySUT(self, handle: Any) -> None:  # noqa: N802
        pass

    DestroyQSL = DestroySUT

    def StartTestWithLogSettings(self, *arguments: Any) -> None:  # noqa: N802
        raise MemoryError("std::bad_alloc")


def test_a_failure_inside_loadgen_is_loadgens_not_the_models_oom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core.running.loadgen.run, "import_loadgen", _LoadGenThatRaises)
    settings = make_loadgen_settings(scenario="single-stream", min_query_count=1)
    with pytest.raises(LoadGenError) as caught:
        run_scenario(SleepingSource(), settings, tmp_path / "logs")
    assert "std::bad_alloc" in str(caught.value) and isinstance(caught.value.__cause__, MemoryError)
    assert classify_fault(caught.value) is RunState.error  # the model did not run out of memory


# --- reading LoadGen's logs ---------------------------------------------------------------------------

_SUMMARY_ONLY = """\
================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : SingleStream
Mode     : PerformanceOnly
90.0th percentile latency (ns) : 2368597
Result is : INVALID
  Min duration satisfied : NO
  Min queries satisfied : Yes
  Early stopping satisfied: Yes

================================================
Additional Stats
================================================
QPS w/ loadgen overhead         : 456.43
QPS w/o loadgen overhead        : 457.33

Min latency (ns)                : 2072787
Max latency (ns)                : 3882822
Mean latency (ns)               : 2186600
50.00 percentile latency (ns)   : 2082221
90.00 percentile latency (ns)   : 2368597
95.00 percentile latency (ns)   : 2730617
97.00 percentile latency (ns)   : 3415236
99.00 percentile latency (ns)   : 3882822
99.90 percentile latency (ns)   : 3882822
"""


def _read(log_dir: Path) -> LoadGenOutcome:
    return read_outcome(
        log_dir,
        "single-stream",
        samples_answered=93,
        start_test_seconds=0.3,
        window_start_perf_counter=None,
        window_end_perf_counter=None,
    )


def test_a_summary_without_its_detail_log_still_gives_the_figures(tmp_path: Path) -> None:
    (tmp_path / SUMMARY_FILE).write_text(_SUMMARY_ONLY)
    outcome = _read(tmp_path)
    assert not outcome.valid and not outcome.min_duration_met and outcome.min_queries_met
    assert outcome.samples_per_second == pytest.approx(456.43)
    assert outcome.latency_p50_seconds == pytest.approx(0.002082221)
    assert outcome.latency_p99_seconds == pytest.approx(0.003882822)
    assert outcome.latency_mean_seconds == pytest.approx(0.0021866)
    assert outcome.summary_text == _SUMMARY_ONLY and outcome.window_seconds is None


def test_the_detail_log_wins_over_the_summary_and_its_flags_are_collected(tmp_path: Path) -> None:
    (tmp_path / SUMMARY_FILE).write_text(_SUMMARY_ONLY)
    lines = [
        '{"key": "result_validity", "value": "INVALID", "metadata": {"is_error": false, "is_warning": false}}',
        '{"key": "result_invalid_reason", "value": "Reduce target QPS to improve latency. ", "metadata": {}}',
        '{"key": "result_50.00_percentile_latency_ns", "value": 1000000, "metadata": {}}',
        '{"key": "error_runtime", "value": "Ending early: Ran out of generated queries", '
        '"metadata": {"is_error": true, "is_warning": false}}',
        '{"key": "warning_generic_message", "value": "clocks differ", '
        '"metadata": {"is_error": false, "is_warning": true}}',
        '{"key": "power_begin", "value": "11-25-2026 12:32:50.237", "metadata": {}}',
        '{"key": "power_end", "value": "11-25-2026 12:32:50.441", "metadata": {}}',
    ]
    text = "".join(f":::MLLOG {line}\n" for line in lines) + ":::MLLOG {cut short\nnot a log line\n"
    (tmp_path / DETAIL_FILE).write_text(text)
    outcome = _read(tmp_path)
    assert outcome.latency_p50_seconds == pytest.approx(0.001)  # the detail log's, not the summary's
    assert outcome.invalid_reason == "Reduce target QPS to improve latency."
    assert outcome.loadgen_errors == ["error_runtime: Ending early: Ran out of generated queries"]
    assert outcome.loadgen_warnings == ["warning_generic_message: clocks differ"]
    assert outcome.loadgen_window_seconds == pytest.approx(0.204)


def test_logs_without_a_result_are_a_loadgen_error(tmp_path: Path) -> None:
    with pytest.raises(LoadGenError, match="no mlperf_log_summary.txt"):
        _read(tmp_path)
    (tmp_path / SUMMARY_FILE).write_text("LoadGen gave up\n")
    with pytest.raises(LoadGenError, match="no result"):
        _read(tmp_path)


def test_a_latency_below_a_nanosecond_reaches_loadgen_as_one_not_zero() -> None:
    # LoadGen reads 0 ns as a latency no query meets (expected: infinitely many queries).
    lg = core.running.loadgen.run.import_loadgen()
    settings = LoadGenSettings(scenario="single-stream", single_stream_expected_latency_seconds=1e-12)
    assert core.running.loadgen.run.loadgen_test_settings(lg, settings).single_stream_expected_latency_ns == 1


def test_a_rate_the_scenario_needs_and_nobody_gave_reads_missing_not_none() -> None:
    # Issue 26, third pass: "loadgen.server_target_samples_per_second = None" quoted a value never written.
    config = make_config(workload="fcnn", accelerator="cpu", mode="inference", scenario="server")
    with pytest.raises(ConfigError) as refused:
        settings_for_run(config)
    assert refused.value.missing and refused.value.field == "loadgen.server_target_samples_per_second"
    assert "= None" not in str(refused.value) and "(missing): a number above 0 is required" in str(refused.value)
    with pytest.raises(ConfigError) as direct:
        make_loadgen_settings(scenario="server")
    assert direct.value.missing and "= None" not in str(direct.value)
