"""An inference run's timed window under a LoadGen scenario, in place of the runner's own loop.

The runner keeps its phases (setup, first step, warm-up): LoadGen only replaces the steady window.
The power meter covers exactly the span LoadGen measures, from the first query (samples loaded)
to the last answer, through ``run_scenario``'s window callbacks; throughput stays core's rule,
samples answered over that span, with LoadGen's own figures and verdict kept beside it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from core.base.config import RunConfig
from core.base.errors import CoreError
from core.base.results import EnergyMeasurement, LoadGenFigures
from core.contract.meter import PowerMeter, UnavailableMeter
from core.executors.base import Executor
from core.running import processes
from core.running.loadgen.outcome import LoadGenOutcome
from core.running.loadgen.run import run_scenario
from core.running.loadgen.settings import settings_for_run
from core.running.loadgen.sut import AnsweringSource, QuerySource

#: where a run's LoadGen logs are written, read and removed (a work directory of core's)
LOG_DIRECTORY_PREFIX = f"{processes.WORK_DIRECTORY_PREFIX}loadgen-"


class NotAQuerySourceError(CoreError, TypeError):
    """The accelerator's executor cannot be driven by LoadGen (it answers no queries by index)."""


@dataclass
class LoadGenWindow:
    """What the window measured: the figures the runner records, as for its own loop."""

    window_seconds: float
    infer_calls: int
    samples: int
    energy: EnergyMeasurement | None
    figures: LoadGenFigures


class _CountingSource:
    """The executor as LoadGen sees it, counting the model calls (the window's steps)."""

    def __init__(self, source: QuerySource) -> None:
        self._source = source
        self.calls = 0

    @property
    def total_samples(self) -> int:
        return self._source.total_samples

    @property
    def performance_samples(self) -> int:
        return self._source.performance_samples

    def load(self, indices: Sequence[int]) -> None:
        self._source.load(indices)

    def unload(self, indices: Sequence[int]) -> None:
        self._source.unload(indices)

    def infer(self, indices: Sequence[int]) -> None:
        self.calls += 1
        self._source.infer(indices)

    def answering(self) -> AbstractContextManager[Any]:
        source = self._source
        return source.answering() if isinstance(source, AnsweringSource) else contextlib.nullcontext()


class _WindowMeter:
    """Starts and stops the run's meter at LoadGen's window; a failing meter costs the energy only."""

    def __init__(self, meter: PowerMeter | None) -> None:
        self._meter = meter
        self.energy: EnergyMeasurement | None = None

    def open(self) -> None:
        if self._meter is None:
            return
        try:
            self._meter.start()
        except Exception as exc:
            name = getattr(self._meter, "name", "?")
            self._meter = UnavailableMeter(name, f"meter failed to start: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self._meter is None:
            return
        try:
            self.energy = self._meter.stop()
        except Exception as exc:
            self.energy = EnergyMeasurement(
                meter=getattr(self._meter, "name", "?"), unavailable_reason=f"meter failed: {type(exc).__name__}: {exc}"
            )


#: model calls timed before LoadGen starts, to set its expected rate or latency (after one untimed)
CALIBRATION_CALLS = 10


def calibrated_samples_per_second(source: QuerySource, batch: int) -> float:
    """Samples per second of ``source`` at ``batch`` samples per call: the median of a few calls,
    outside any timed window. A warm-up of a few steps is too noisy for this on a small model (its
    first steps can be 100x slower), and LoadGen told a latency too high ends its test INVALID."""
    indices = list(range(min(batch, source.total_samples)))
    source.load(indices)
    try:
        source.infer(indices)
        seconds = []
        for _ in range(CALIBRATION_CALLS):
            started = time.perf_counter()
            source.infer(indices)
            seconds.append(time.perf_counter() - started)
    finally:
        source.unload(indices)
    return len(indices) / max(statistics.median(seconds), 1e-9)


@runtime_checkable
class PaddedQuerySource(Protocol):
    """A query source that pads queries up to a few batch sizes, each a program compiled once
    (``TorchInferenceExecutor`` on a device that compiles per shape, such as XLA)."""

    def warm_query_sizes(self) -> None:
        """Compile every padded size now, outside any timed span."""
        ...


def query_source(executor: Executor) -> QuerySource:
    """``executor`` as LoadGen's query source, or NotAQuerySourceError saying what to do instead."""
    if not isinstance(executor, QuerySource):
        raise NotAQuerySourceError(
            f"{type(executor).__name__} answers no queries by sample index, so LoadGen cannot drive it; "
            "use scenario 'loop' on this accelerator"
        )
    return executor


def calibrate(executor: Executor, config: RunConfig) -> float:
    """The rate LoadGen is told to expect (see ``settings_for_run``), measured at the batch its
    scenario sends: the micro-batch for offline, one sample otherwise. Call it before the window
    opens: a first call at a new batch size may compile."""
    batch = (config.micro_batch_size or 1) if config.scenario == "offline" else 1
    source = query_source(executor)
    if isinstance(source, PaddedQuerySource):
        source.warm_query_sizes()
    return calibrated_samples_per_second(source, batch)


def loadgen_window(
    executor: Executor, meter: PowerMeter | None, config: RunConfig, calibrated_rate: float | None
) -> LoadGenWindow:
    """Run ``config.scenario`` under LoadGen over ``executor``; LoadGen's logs are read, kept in the
    figures (the summary verbatim) and removed with their temporary folder.

    :param calibrated_rate: what ``calibrate`` measured, for the settings ``loadgen`` leaves open.
    """
    source_executor = query_source(executor)
    settings = settings_for_run(config, calibrated_rate)
    source = _CountingSource(source_executor)
    window_meter = _WindowMeter(meter)
    # A work directory records its owner: one a crash left (LoadGen's native code can take its
    # process down) is removed by the next (core.running.processes.remove_abandoned).
    with processes.work_directory(LOG_DIRECTORY_PREFIX) as log_dir:
        outcome = run_scenario(
            source, settings, log_dir, on_window_open=window_meter.open, on_window_close=window_meter.close
        )
    if outcome.window_seconds is None:
        raise CoreError("LoadGen ended without answering a query: no window was measured")
    return LoadGenWindow(
        window_seconds=outcome.window_seconds,
        infer_calls=source.calls,
        samples=outcome.samples_answered,
        energy=window_meter.energy,
        figures=figures_of(outcome, settings.model_dump(mode="json")),
    )


def figures_of(outcome: LoadGenOutcome, settings: dict[str, object]) -> LoadGenFigures:
    return LoadGenFigures(
        scenario=outcome.scenario,
        valid=outcome.valid,
        invalid_reason=outcome.invalid_reason,
        samples_per_second=outcome.samples_per_second,
        query_count=outcome.query_count,
        latency_p50_seconds=outcome.latency_p50_seconds,
        latency_p90_seconds=outcome.latency_p90_seconds,
        latency_p95_seconds=outcome.latency_p95_seconds,
        latency_p99_seconds=outcome.latency_p99_seconds,
        latency_mean_seconds=outcome.latency_mean_seconds,
        early_stopping_latency_seconds=outcome.early_stopping_latency_seconds,
        settings=settings,
        loadgen_version=outcome.loadgen_version,
        errors=list(outcome.loadgen_errors),
        summary_text=outcome.summary_text,
    )
