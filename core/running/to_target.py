"""Training to a target quality, timed as MLPerf Training times it (docs/to-target.md).

Set-up (building the model, placing it and the data) is reported apart, as initialisation. The
clock starts at the first training step and runs, evaluations included, to the end of the first
evaluation that meets the target, or to the end of the one that spends the budget. The energy's
span is the clock's. Every evaluation is a point of the quality curve, told to the observer as it
is taken, so a run that breaks keeps the curve up to its last evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from core.base.config import HIGHER_IS_BETTER_METRICS, RunConfig, TargetConfig
from core.base.results import EnergyMeasurement, QualityPoint, RunResult, RunState, Status, TargetOutcome
from core.contract.meter import PowerMeter
from core.executors.base import Executor


def higher_is_better(metric: str, declared: dict[str, bool]) -> bool:
    """Whether ``metric`` improves upward: the workload's declaration, else core's ('loss' is lower)."""
    return declared.get(metric, HIGHER_IS_BETTER_METRICS.get(metric, True))


def meets(value: float, target: float, higher: bool) -> bool:
    return value >= target if higher else value <= target


@dataclass(frozen=True)
class Schedule:
    """How many updates an epoch is, and between evaluations, and at most (the epoch budget)."""

    updates_per_epoch: int
    updates_between_evaluations: int
    max_updates: int | None

    @classmethod
    def of(cls, target: TargetConfig, training_samples: int, samples_per_update: int) -> Schedule:
        per_epoch = training_samples // samples_per_update
        if per_epoch < 1:
            raise ValueError(
                f"the training split's {training_samples} samples hold no global batch of {samples_per_update}"
            )
        epochs = target.epochs_between_evaluations
        if epochs is not None:
            between = epochs * per_epoch
        else:
            assert target.evaluate_every_samples is not None
            between = max(1, math.ceil(target.evaluate_every_samples / samples_per_update))
        most = None if target.max_epochs is None else target.max_epochs * per_epoch
        return cls(per_epoch, between, most)


def train_to_target(
    result: RunResult,
    executor: Executor,
    config: RunConfig,
    declared_metrics: dict[str, bool],
    meter: PowerMeter | None,
    stop_meter: Callable[[PowerMeter], EnergyMeasurement],
    report: Callable[[RunResult], None],
    joules_so_far: Callable[[], float | None] = lambda: None,
) -> EnergyMeasurement | None:
    """Train and evaluate until the target or the budget; fill ``result.to_target`` (and the status
    ``target_not_reached`` where the budget ended it). Every process calls it; the decisions are
    every process's alike (the metrics are summed over the processes, the times their maximum).

    :param meter: opened, not started: started with the clock, stopped at its end (None: no meter here)
    :param joules_so_far: the run's energy since the clock started, read at the end of each evaluation
        (every process calls it, so it may gather; None: unknown now); the last point's is the
        meter's total, set by :func:`record_target_energy`
    :returns: the meter's measurement over the clock's span (None without a meter)
    """
    target = config.target
    assert target is not None
    training_samples = executor.dataset_samples()
    if training_samples is None:
        raise ValueError("a run to a target needs the executor to read a training split of known size")
    samples_per_update = config.samples_per_update
    schedule = Schedule.of(target, training_samples, samples_per_update)
    higher = higher_is_better(target.metric, declared_metrics)
    outcome = TargetOutcome(
        metric=target.metric,
        target=target.value,
        higher_is_better=higher,
        reached=False,
        stopped_by="max_epochs",
        initialization_seconds=result.setup_seconds,
        training_seconds=0.0,
        evaluation_seconds=0.0,
        epochs=0.0,
        samples=0,
    )
    outcome.epoch_samples = schedule.updates_per_epoch * samples_per_update
    result.to_target = outcome
    result.samples_per_epoch = training_samples

    updates = 0
    clock = _Clock(executor, joules_so_far)
    if meter is not None:
        meter.start()
    clock.start()
    while True:
        steps = schedule.updates_between_evaluations
        if schedule.max_updates is not None:
            steps = min(steps, schedule.max_updates - updates)
        updates = _train(executor, updates, steps, schedule.updates_per_epoch, outcome, clock, target.max_seconds)
        evaluation_started = time.perf_counter()
        metrics = executor.evaluate()
        executor.synchronize()
        executor.check_finite()  # outside no span: a NaN ends the run as it would end a window
        now = time.perf_counter()
        joules = clock.joules_so_far()  # at the evaluation's end, as its time is
        read_at = time.perf_counter()  # a pause after this evaluation starts here, in time as in energy
        evaluation_seconds = executor.gather_max(now - evaluation_started)
        seconds = executor.gather_max(clock.seconds(now))
        if metrics is None or target.metric not in metrics:
            raise ValueError(
                f"the executor's evaluation gave {sorted(metrics or {})}, not target.metric {target.metric!r}"
            )
        samples = updates * samples_per_update
        point = QualityPoint(
            epoch=samples / training_samples,
            samples=samples,
            seconds=seconds,
            joules=joules,
            value=metrics[target.metric],
            metrics=metrics,
            evaluation_seconds=evaluation_seconds,
        )
        outcome.curve.append(point)
        outcome.evaluation_seconds += evaluation_seconds
        outcome.training_seconds, outcome.epochs, outcome.samples = seconds, point.epoch, samples
        stopped_by = _stopped_by(point, target, higher, updates, schedule)
        if stopped_by is None:
            # The curve so far, told (a crash later loses none of it) with the clock paused: every
            # process waits for it, and its time and energy are taken out of the clock's.
            clock.pause(lambda: report(result), joules, read_at)
            outcome.paused_seconds, outcome.paused_joules = clock.paused_seconds, clock.paused_joules
            continue
        outcome.stopped_by = stopped_by
        outcome.reached = stopped_by == "target"
        break
    energy = None if meter is None else stop_meter(meter)
    if outcome.reached:
        last = outcome.curve[-1]
        outcome.time_to_target_seconds = last.seconds
        outcome.epochs_to_target = last.epoch
        outcome.samples_to_target = last.samples
    else:
        result.status = Status(
            state=RunState.target_not_reached,
            phase="training",
            message=f"{target.metric} {outcome.curve[-1].value:.4g} after {outcome.epochs:.4g} epochs, "
            f"{outcome.training_seconds:.4g} s: target {target.value:g} not reached ({outcome.stopped_by} spent)",
        )
    return energy


#: with a time budget, training between evaluations checks the clock about this often (a host sync
#: and, over several processes, one exchange each time), so a budget ends training within about it
BUDGET_CHECK_SECONDS = 1.0


class _Clock:
    """MLPerf's clock for this run: seconds since the first step, less the pauses (the partial reports
    after evaluations); energy so far, less the pauses' where the meter can read so far."""

    def __init__(self, executor: Executor, joules_so_far: Callable[[], float | None]) -> None:
        self._executor, self._joules_so_far = executor, joules_so_far
        self._started = 0.0
        self.paused_seconds = 0.0
        self._paused_joules: float | None = 0.0  # None: a pause's energy could not be read

    def start(self) -> None:
        self._started = time.perf_counter()

    def seconds(self, now: float | None = None) -> float:
        return (time.perf_counter() if now is None else now) - self._started - self.paused_seconds

    def joules_so_far(self) -> float | None:
        joules = self._joules_so_far()
        if joules is None or self._paused_joules is None:
            return None
        return joules - self._paused_joules

    def pause(self, work: Callable[[], None], joules_before: float | None, read_at: float) -> None:
        """Do ``work`` outside the clock. The pause ends for every process alike, after an exchange
        that waits for the slowest (the one that reports), so every process's clock leaves out the same.
        It spans the same stretch in time and in energy: from the reading ``joules_before``, taken at
        ``read_at``, to the reading taken as it ends."""
        work()
        self._executor.gather_max(0.0)
        joules_after = self.joules_so_far()
        self.paused_seconds += time.perf_counter() - read_at
        if joules_before is None or joules_after is None or self._paused_joules is None:
            self._paused_joules = None
        else:
            self._paused_joules += joules_after - joules_before

    @property
    def paused_joules(self) -> float | None:
        """The pauses' energy, to take out of the meter's total (None: unknown, so the total cannot be)."""
        return self._paused_joules


def _train(
    executor: Executor,
    updates: int,
    steps: int,
    per_epoch: int,
    outcome: TargetOutcome,
    clock: _Clock,
    max_seconds: float | None,
) -> int:
    """Run ``steps`` updates from update ``updates``; returns the updates done in all, the devices
    synchronised. Two things cut them into chunks, each waited for:

    - each epoch's end, where that epoch's training time is appended to ``outcome.epoch_seconds`` (the
      clock there, less the evaluations so far and the epochs before: ACES's first-epoch and per-epoch
      times from real epochs);
    - with a time budget, about every :data:`BUDGET_CHECK_SECONDS`: training stops after the chunk
      that spends it.

    Every process takes the same decisions: they are made on the clock's maximum over the processes."""
    budget_chunk = 1  # updates between budget checks: grows to about a check's worth
    checked = executor.gather_max(clock.seconds()) if max_seconds is not None and steps > 0 else 0.0
    while steps > 0:
        chunk = min(steps, per_epoch - updates % per_epoch)
        if max_seconds is not None:
            chunk = min(chunk, budget_chunk)
        executor.run_steps(chunk)
        executor.synchronize()
        updates += chunk
        steps -= chunk
        elapsed: float | None = None
        if updates % per_epoch == 0:
            elapsed = executor.gather_max(clock.seconds())
            training = elapsed - outcome.evaluation_seconds
            outcome.epoch_seconds.append(max(0.0, training - sum(outcome.epoch_seconds)))
        if max_seconds is not None:
            if elapsed is None:
                elapsed = executor.gather_max(clock.seconds())
            if elapsed >= max_seconds:
                break
            per_update = max(elapsed - checked, 1e-9) / chunk
            # grows at most two-fold a check, so a first slow update does not make the next chunk long
            budget_chunk = max(1, min(int(BUDGET_CHECK_SECONDS / per_update), 2 * chunk + 1))
            checked = elapsed
    return updates


def record_target_energy(outcome: TargetOutcome, joules: float | None) -> list[str]:
    """The energy over the clock's span (every node's, where several read a meter), from the meter's
    total over its span (``joules``), which holds the pauses the clock leaves out: less their energy.
    Set on the last point, the training, and, where the target was reached, the energy to it, which
    is the reading at the evaluation that met it (training stops there). The earlier points keep
    what the meter read at them, where it could (``PowerMeter.read_joules_so_far``; docs/to-target.md).
    Returns warnings for the result: where the pauses' energy could not be read, it is left in."""
    if not outcome.curve:
        return []
    warnings = []
    if joules is not None and outcome.paused_seconds > 0:
        if outcome.paused_joules is None:
            warnings.append(
                f"the energy to target includes the {outcome.paused_seconds:.3g} s of partial reports after "
                "evaluations, which the clock leaves out: the meter cannot read before it stops"
            )
        else:
            joules -= outcome.paused_joules
    outcome.curve[-1].joules = joules
    outcome.training_joules = joules
    outcome.energy_to_target_joules = joules if outcome.reached else None
    return warnings


StoppedBy = Literal["target", "max_epochs", "max_seconds"]


def _stopped_by(
    point: QualityPoint, target: TargetConfig, higher: bool, updates: int, schedule: Schedule
) -> StoppedBy | None:
    """What ends training at this evaluation: the target, a budget, or nothing (None)."""
    if meets(point.value, target.value, higher):
        return "target"
    if schedule.max_updates is not None and updates >= schedule.max_updates:
        return "max_epochs"
    if target.max_seconds is not None and point.seconds >= target.max_seconds:
        return "max_seconds"
    return None
