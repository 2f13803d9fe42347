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
    if meter is not None:
        meter.start()
    started = time.perf_counter()
    while True:
        steps = schedule.updates_between_evaluations
        if schedule.max_updates is not None:
            steps = min(steps, schedule.max_updates - updates)
        updates = _train(executor, updates, steps, schedule.updates_per_epoch, outcome, started)
        evaluation_started = time.perf_counter()
        metrics = executor.evaluate()
        executor.synchronize()
        executor.check_finite()  # outside no span: a NaN ends the run as it would end a window
        now = time.perf_counter()
        joules = joules_so_far()  # at the evaluation's end, as its time is
        evaluation_seconds = executor.gather_max(now - evaluation_started)
        seconds = executor.gather_max(now - started)
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
            report(result)  # the curve so far: a crash later loses none of it
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


def _train(executor: Executor, updates: int, steps: int, per_epoch: int, outcome: TargetOutcome, started: float) -> int:
    """Run ``steps`` updates from update ``updates``, stopping the devices at each epoch's end on the
    way to append that epoch's training time to ``outcome.epoch_seconds`` (the clock there, less the
    evaluations so far and the epochs before: ACES's first-epoch and per-epoch times from real
    epochs). Returns the updates done in all, the devices synchronised."""
    while steps > 0:
        chunk = min(steps, per_epoch - updates % per_epoch)
        executor.run_steps(chunk)
        executor.synchronize()
        updates += chunk
        steps -= chunk
        if updates % per_epoch == 0:
            clock = executor.gather_max(time.perf_counter() - started)
            training = clock - outcome.evaluation_seconds
            outcome.epoch_seconds.append(max(0.0, training - sum(outcome.epoch_seconds)))
    return updates


def record_target_energy(outcome: TargetOutcome, joules: float | None) -> None:
    """The energy over the clock's span (every node's, where several read a meter): the last point's,
    the training's, and, where the target was reached, the energy to it, which is the reading at the
    evaluation that met it (training stops there). The earlier points keep what the meter read at
    them, where it could (``PowerMeter.read_joules_so_far``; docs/to-target.md)."""
    if not outcome.curve:
        return
    outcome.curve[-1].joules = joules
    outcome.training_joules = joules
    outcome.energy_to_target_joules = joules if outcome.reached else None


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
