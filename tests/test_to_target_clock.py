"""The clock of a run to a target (core.running.to_target) on a simulated executor and a simulated
time: the partial reports after evaluations are left out of it, every process's alike, with their
energy; a time budget ends training within a check's interval, not at the next scheduled evaluation."""

from __future__ import annotations

from typing import Any

import pytest

from core.base.config import make_config
from core.base.results import EnergyMeasurement, RunResult
from core.executors.base import Executor, StepClock
from core.running import to_target
from core.running.to_target import record_target_energy, train_to_target

UPDATE_SECONDS = 0.01
EVALUATION_SECONDS = 0.25
REPORT_SECONDS = 5.0
WATTS = 100.0
TRAINING_SAMPLES = 320  # ten updates of 32 an epoch


class _Time:
    """perf_counter for the module under test: moved only by the simulated work."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


class _Executor(Executor):
    """Ten updates an epoch; top-1 rises 0.1 an epoch; every call advances the simulated time."""

    def __init__(self, clock: _Time, samples: int = TRAINING_SAMPLES) -> None:
        self.clock, self.updates, self.exchanges, self.samples = clock, 0, 0, samples

    def step(self) -> None:
        self.run_steps(1)

    def run_steps(self, count: int, clock: StepClock | None = None) -> None:
        self.updates += count
        self.clock.now += count * UPDATE_SECONDS

    def synchronize(self) -> None:
        pass

    def step_clock(self) -> StepClock:
        raise NotImplementedError

    def check_finite(self) -> None:
        pass

    def dataset_samples(self) -> int | None:
        return self.samples

    def evaluate(self) -> dict[str, float] | None:
        self.clock.now += EVALUATION_SECONDS
        return {"top1": min(1.0, self.updates / 100), "loss": 1.0}

    def gather_max(self, value: float) -> float:
        self.exchanges += 1
        return value


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> tuple[_Time, _Executor]:
    clock = _Time()
    monkeypatch.setattr(to_target.time, "perf_counter", clock.perf_counter)
    return clock, _Executor(clock)


def _run(
    clock: _Time, executor: _Executor, target: dict[str, Any], report_seconds: float = REPORT_SECONDS
) -> tuple[RunResult, list[float]]:
    config = make_config(workload="digits", accelerator="cpu", micro_batch_size=32, target=target)
    result = RunResult.of_config(config, 1)
    started = clock.now
    reported: list[float] = []

    def report(partial: RunResult) -> None:
        reported.append(clock.now)
        clock.now += report_seconds

    def joules_so_far() -> float:
        return (clock.now - started) * WATTS  # a meter that reads as it goes: every second counts

    def stop(meter: Any) -> EnergyMeasurement:
        raise AssertionError("no meter here")

    train_to_target(result, executor, config, {}, None, stop, report, joules_so_far)
    assert result.to_target is not None
    result.warnings.extend(record_target_energy(result.to_target, (clock.now - started) * WATTS))
    return result, reported


def test_the_reports_after_evaluations_are_left_out_of_the_clock_and_its_energy(
    simulated: tuple[_Time, _Executor],
) -> None:
    clock, executor = simulated
    result, reported = _run(clock, executor, {"metric": "top1", "value": 0.3, "max_epochs": 10})
    outcome = result.to_target
    assert outcome is not None and outcome.reached
    assert len(outcome.curve) == 3 and len(reported) == 2  # no report after the evaluation that ends it
    # Each epoch: ten updates and an evaluation; the two reports' ten seconds are not on the clock.
    epoch = 10 * UPDATE_SECONDS + EVALUATION_SECONDS
    assert [point.seconds for point in outcome.curve] == pytest.approx([epoch, 2 * epoch, 3 * epoch])
    assert outcome.time_to_target_seconds == pytest.approx(3 * epoch)
    assert outcome.paused_seconds == pytest.approx(2 * REPORT_SECONDS)
    assert outcome.epoch_seconds == pytest.approx([10 * UPDATE_SECONDS] * 3)  # neither evaluations nor pauses
    # Energy: the points' and the total's leave the pauses' out, as the clock does.
    assert [point.joules for point in outcome.curve] == pytest.approx(
        [epoch * WATTS, 2 * epoch * WATTS, 3 * epoch * WATTS]
    )
    assert outcome.paused_joules == pytest.approx(2 * REPORT_SECONDS * WATTS)
    assert outcome.energy_to_target_joules == pytest.approx(3 * epoch * WATTS)
    assert result.warnings == []


def test_a_pauses_energy_that_cannot_be_read_is_left_in_and_said(simulated: tuple[_Time, _Executor]) -> None:
    clock, executor = simulated
    config = make_config(
        workload="digits",
        accelerator="cpu",
        micro_batch_size=32,
        target={"metric": "top1", "value": 0.3, "max_epochs": 10},
    )
    result = RunResult.of_config(config, 1)

    def report(partial: RunResult) -> None:
        clock.now += REPORT_SECONDS

    train_to_target(result, executor, config, {}, None, lambda meter: None, report)  # type: ignore[arg-type,return-value]
    outcome = result.to_target
    assert outcome is not None and outcome.paused_seconds == pytest.approx(2 * REPORT_SECONDS)
    assert outcome.paused_joules is None
    warnings = record_target_energy(outcome, 123.0)
    assert outcome.training_joules == 123.0 and warnings and "partial reports" in warnings[0]


def test_a_time_budget_ends_training_between_evaluations(simulated: tuple[_Time, _Executor]) -> None:
    clock, _ = simulated
    executor = _Executor(clock, samples=32_000)  # 1,000 updates an epoch: no epoch ends within the budget
    # An evaluation every 1,000 epochs (10,000 s of updates): the budget of 3 s is spent long before.
    # The simulated loss stays 1: the target is never met.
    target = {"metric": "loss", "value": 0.5, "evaluate_every_epochs": 1000, "max_seconds": 3.0}
    result, _ = _run(clock, executor, target)
    outcome = result.to_target
    assert outcome is not None and not outcome.reached and outcome.stopped_by == "max_seconds"
    assert len(outcome.curve) == 1
    point = outcome.curve[0]
    # Stopped at the first check past 3 s: checks come about every BUDGET_CHECK_SECONDS (the chunk
    # grows at most two-fold from one update), so at most one check's interval past it.
    training = point.seconds - point.evaluation_seconds
    assert 3.0 <= training <= 3.0 + to_target.BUDGET_CHECK_SECONDS + UPDATE_SECONDS
    assert point.samples < 32_000 and outcome.epoch_seconds == []
    # A check is one exchange between processes: about one a second, not one an update.
    assert executor.exchanges < 3.0 / to_target.BUDGET_CHECK_SECONDS + 20


def test_without_a_time_budget_training_runs_an_epoch_a_call_and_times_each(simulated: tuple[_Time, _Executor]) -> None:
    clock, executor = simulated
    calls: list[int] = []
    run_steps = executor.run_steps

    def counted(count: int, clock: StepClock | None = None) -> None:
        calls.append(count)
        run_steps(count)

    executor.run_steps = counted  # type: ignore[method-assign]
    result, _ = _run(clock, executor, {"metric": "top1", "value": 0.2, "max_epochs": 10, "evaluate_every_epochs": 2})
    outcome = result.to_target
    assert outcome is not None and outcome.reached
    # The two epochs to the first evaluation (which meets the target): one call each, waited for at
    # the epoch's end to time it; no check in between.
    assert calls == [10, 10]
    assert outcome.epoch_seconds == pytest.approx([10 * UPDATE_SECONDS, 10 * UPDATE_SECONDS])
    assert outcome.epoch_samples == TRAINING_SAMPLES


def test_a_sweep_repeat_of_a_run_to_a_target_takes_its_own_seed_and_others_keep_theirs() -> None:
    from core.contract.manager import get_plugin_manager
    from core.running.planning import plan_run
    from core.sweep.plan import Cell

    def cell(**options: Any) -> Cell:
        planned = plan_run(get_plugin_manager(), "digits", "cpu", dict(options)).document()
        return Cell(index=0, key="k", label="l", options={"workload": "digits", **options}, planned=planned)

    to_target_cell = cell(seed=7, target={"metric": "top1", "value": 0.9, "max_epochs": 1})
    assert to_target_cell.for_repeat(0) is to_target_cell
    third = to_target_cell.for_repeat(2)
    assert third.config is not None and third.config.seed == 9 and third.options["seed"] == 9
    assert third.key == to_target_cell.key and to_target_cell.config is not None and to_target_cell.config.seed == 7
    throughput_cell = cell(seed=7)
    assert throughput_cell.for_repeat(2) is throughput_cell
