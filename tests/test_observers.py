"""One observer mechanism (core.running.observe): the plugins' lifecycle hooks, ``core.run``'s
``on_progress`` and a sweep's observers are told by the process that owns the run, once, wherever
the run runs (here, a child process with a time limit, a sweep's repeat)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest

import core.running.launch
import core.sweep.run
from core import run
from core.base.config import RunConfig
from core.base.results import RunResult, RunState, Status
from core.plugin import hookimpl
from core.running.observe import Observer, ObserverGroup, ProgressCallbackObserver
from core.sweep import SweepObserver, make_sweep_spec, run_sweep
from core.testing import TINY_FCNN, registered_plugins

TINY = {"steps": 2, "warmup_steps": 1, "power_meter": "none", "threads_per_replica": 1, "workload_options": TINY_FCNN}


class HookRecorder:
    """A plugin that records what its lifecycle hooks hear."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[tuple[str, Any]] = []
        self.fail = fail

    @hookimpl
    def core_run_started(self, config: RunConfig) -> None:
        self.events.append(("started", config.micro_batch_size))
        if self.fail:
            raise RuntimeError("the dashboard is down")

    @hookimpl
    def core_result_ready(self, result: RunResult) -> None:
        self.events.append(("ready", result.status.state))
        if self.fail:
            raise RuntimeError("the dashboard is down")


# --- core.run with a time limit: the run is in a child process, its observers here ----------------


@pytest.mark.slow
def test_a_run_with_a_time_limit_tells_the_hooks_in_the_calling_process() -> None:
    recorder = HookRecorder()
    with registered_plugins(recorder):
        result = run("fcnn", "cpu", micro_batch_size=4, timeout_seconds=300, **TINY)
    assert result.status.ok, result.status
    assert recorder.events == [("started", 4), ("ready", RunState.ok)]


@pytest.mark.slow
def test_a_run_stopped_by_its_time_limit_still_tells_result_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    # The limit's clock leaps past it once the run reached its window (on_progress saw the warm-up
    # end), not after seconds a busy machine may spend starting the child.
    leap = [0.0]

    def progress(partial: RunResult) -> None:
        if partial.warmup_seconds is not None:
            leap[0] = 1e6

    original = core.running.launch.run_in_child
    clock = functools.partial(lambda: time.monotonic() + leap[0])
    monkeypatch.setattr(core.running.launch, "run_in_child", functools.partial(original, clock=clock))
    recorder = HookRecorder()
    options = {**TINY, "steps": 16_000_000}
    with registered_plugins(recorder):
        result = run("fcnn", "cpu", micro_batch_size=4, timeout_seconds=300, on_progress=progress, **options)
    assert result.status.state is RunState.timeout
    assert recorder.events == [("started", 4), ("ready", RunState.timeout)]


# --- a sweep: every repeat is told to the hooks, here ----------------------------------------------


def _made_up_runs(monkeypatch: pytest.MonkeyPatch, failing_batch: int | None = None) -> list[int]:
    """Each repeat a result made up from its cell (no process); the batch ``failing_batch`` fails."""
    batches: list[int] = []

    def runs(cell: Any, **kwargs: Any) -> tuple[RunResult, float]:
        config = cell.config
        batches.append(config.micro_batch_size)
        result = RunResult.of_config(config, 1, window_seconds=1.0, throughput_per_second=100.0)
        if config.micro_batch_size == failing_batch:
            result.status = Status(state=RunState.oom, phase="first_step", message="made up")
        return result, 0.5

    monkeypatch.setattr(core.sweep.run, "run_in_process", runs)
    return batches


def _spec(name: str, batches: list[int], repeats: int = 2) -> Any:
    return make_sweep_spec(
        {"name": name, "repeats": repeats, "grid": {"workload": "fcnn", "micro_batch_size": batches}}
    )


def test_every_repeat_of_a_sweep_is_told_to_the_hooks_in_the_sweeps_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = _made_up_runs(monkeypatch, failing_batch=16)
    recorder = HookRecorder()
    with registered_plugins(recorder):
        run_sweep(_spec("hooks", [8, 16]), database=tmp_path / "r.db")
    assert ran == [8, 16, 8]  # the failed cell stops
    assert recorder.events == [
        ("started", 8),
        ("ready", RunState.ok),
        ("started", 16),
        ("ready", RunState.oom),
        ("started", 8),
        ("ready", RunState.ok),
    ]


def test_a_hook_that_raises_in_a_sweep_is_a_warning_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _made_up_runs(monkeypatch)
    recorder = HookRecorder(fail=True)
    with registered_plugins(recorder):
        outcome = run_sweep(_spec("failing-hooks", [8]), database=tmp_path / "r.db")
    assert outcome.runs_done == 2 and all(cell.status == "ok" for cell in outcome.cells)
    err = capsys.readouterr().err
    assert err.count("core: warning: a run-started observer failed: RuntimeError: the dashboard is down") == 2
    assert err.count("core: warning: a result-ready observer failed: RuntimeError: the dashboard is down") == 2


def test_a_sweep_observer_hears_each_runs_events_and_the_sweeps_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _made_up_runs(monkeypatch)
    events: list[str] = []

    class Everything(SweepObserver):
        def started(self, plan: Any, runs_total: int, runs_finished: int, runs_recorded: int | None = None) -> None:
            events.append(f"sweep started: {runs_total} runs")

        def run_started(self, cell: Any, repeat: int, runs_done: int, runs_total: int, left: float | None) -> None:
            events.append(f"repeat {repeat} of {cell.label} started")

        def run_starting(self, config: RunConfig) -> None:
            events.append(f"run of batch {config.micro_batch_size} starting")

        def result_ready(self, result: RunResult) -> None:
            events.append(f"result {result.status.state.value}")

        def run_finished(self, cell: Any, repeat: int, result: RunResult, process_seconds: float) -> None:
            events.append(f"repeat {repeat} of {cell.label} finished")

    run_sweep(_spec("ordered", [8], repeats=1), database=tmp_path / "r.db", observer=Everything())
    assert events == [
        "sweep started: 1 runs",
        "repeat 0 of micro_batch_size=8 started",
        "run of batch 8 starting",
        "result ok",
        "repeat 0 of micro_batch_size=8 finished",
    ]


def test_an_observer_of_the_older_kind_with_some_methods_only_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SweepObserver was a protocol: "any object with these methods". One with a single method, not
    # a subclass, hears that event and nothing breaks for the ones it lacks.
    _made_up_runs(monkeypatch)
    finished: list[int] = []

    class OnlyFinished:
        def run_finished(self, cell: Any, repeat: int, result: RunResult, process_seconds: float) -> None:
            finished.append(repeat)

    run_sweep(_spec("duck", [8]), database=tmp_path / "r.db", observer=OnlyFinished())  # type: ignore[arg-type]
    assert finished == [0, 1]


# --- the adapters --------------------------------------------------------------------------------


def test_on_progress_is_an_observer_whose_failures_are_warnings_in_the_result() -> None:
    config = RunConfig(workload="fcnn", accelerator="cpu", micro_batch_size=4)
    partial = RunResult.of_config(config, 1)
    seen: list[RunResult] = []

    def flaky(result: RunResult) -> None:
        seen.append(result)
        raise ValueError("display went away")

    group = ObserverGroup([Observer(), ProgressCallbackObserver(flaky), None])
    group.phase_ended(partial)
    group.phase_ended(partial)
    assert seen == [partial, partial]
    assert partial.warnings == ["on_progress callback failed: ValueError: display went away"]  # once
