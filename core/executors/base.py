"""The executor interface the runner drives: one call per weight update, syncs only when asked."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class StepClock(ABC):
    """Timestamps step boundaries without forcing the host to wait for the device."""

    @abstractmethod
    def mark(self) -> None:
        """Record a boundary (a host timestamp, or a device event queued on the stream)."""

    @abstractmethod
    def intervals_seconds(self) -> list[float]:
        """Seconds between consecutive marks; call only after the window's final synchronise."""


class Executor(ABC):
    """A workload placed on this process's devices, ready to train (or, in an inference run, to
    run forward passes: ``RunConfig.mode``)."""

    #: weight updates one ``step()`` performs: device_iterations where the device loops on its own
    updates_per_step: int = 1

    @abstractmethod
    def step(self) -> None:
        """One weight update: every micro-step of gradient accumulation, then the optimizer step; in
        an inference run, one forward pass over a micro-batch.

        Must not wait for the device: the runner synchronises at window boundaries only.
        """

    def run_steps(self, count: int, clock: StepClock | None = None) -> None:
        """``count`` steps back to back, ``clock`` marked after each: how the runner drives a phase.

        An executor may override it to do once per phase what ``step()`` does once per call
        (enter the forward pass's contexts, fetch a fixed micro-batch); it must not wait for the
        device, and the figures must be those of ``count`` calls of ``step()``.
        """
        for _ in range(count):
            self.step()
            if clock is not None:
                clock.mark()

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every queued device operation of this process has finished."""

    @abstractmethod
    def step_clock(self) -> StepClock:
        """A fresh clock for the steady window."""

    @abstractmethod
    def check_finite(self) -> None:
        """Raise NonFiniteLossError if any update since the last check had a NaN/inf loss or gradient,
        naming the update of the first NaN/inf loss (the run's first step is update 1).

        Every update counts, the last before the check included: checking only the latest loss
        misses a NaN that a kernel masks on its way to the loss (oneDNN's fused ReLU maps it to
        0) and that reaches only the gradients of the phase's last update. So ``step()`` records
        each micro-step's loss on the device, with no host sync and no pass over the gradients,
        and this method (called after ``synchronize()``, outside any timed span) reads that
        record, clears it, and reads the trained weights: an optimizer step with a NaN/inf
        gradient leaves a NaN/inf weight, so they carry every gradient fault since the last
        check. A fault is reported once. Gradients that loss scaling skips (fp16 overflow) are
        the scaler's business, not a fault: losses only then. Every process of a run reaches the
        same verdict.
        """

    def top1_counts(self) -> tuple[int, int] | None:
        """(correct, samples) of top-1 predictions over the run's labelled dataset, every process's
        summed (``accuracy=true`` inference runs; called after the window, outside it); None where
        this executor does not measure accuracy."""
        return None

    def evaluate(self) -> dict[str, float] | None:
        """The model's quality now, over the workload's labelled held-out split: a run to a target
        (``RunConfig.target``) calls it at each evaluation, inside its clock.

        A plugin's executor must: evaluate the current weights without changing them or the order
        training reads its data in (eval mode, no gradients, the run's precision's forward context);
        shard the split over the run's processes and add their counts and sums, so that every process
        returns the same figures and they equal one process's; return when the device has finished.
        Returns the metrics by name: ``"top1"`` (a fraction of 1), ``"loss"`` (the mean over the split)
        and any the workload declares in ``Workload.evaluation_metrics``; None where this executor
        does not evaluate (planning refuses a target then only where the framework has none)."""
        return None

    def data_wait_seconds(self) -> float:
        """Seconds, since setup, that step() spent blocked waiting for input data."""
        return 0.0

    def begin_window(self) -> None:
        """Called before the steady window opens (outside it): snapshot what window_warnings compares."""

    def window_warnings(self) -> list[str]:
        """After the window: anything that makes its figures less clean (e.g. a recompilation)."""
        return []

    def profile_communication(self) -> dict[str, Any] | None:
        """Run one more update under the framework's profiler and return this process's share of it
        spent in collectives (``update_seconds``, ``communication_seconds``, ``fraction``, ``source``,
        ``collectives``: each kind's count and seconds); None where the executor cannot attribute
        them. Called after the timed window, on every process, outside every timed span."""
        return None

    def barrier(self) -> None:
        """Wait for every process of the run (no-op in a single process)."""

    def gather_max(self, value: float) -> float:
        """The maximum of ``value`` over every process (itself in a single process)."""
        return value

    def gather_objects(self, value: object) -> list[object]:
        """``value`` from every process, in rank order (a JSON-able object; ``[value]`` in a single
        process). Every process must call it, outside any timed span."""
        return [value]

    def details(self) -> dict[str, Any]:
        """Effective settings recorded in the result: precision flags, threads, strategy."""
        return {}

    def host_threads(self) -> dict[str, int]:
        """Host compute-thread settings in force (``{"intra_op_threads": 8}``), recorded in
        ``result.environment.host_threads``."""
        return {}

    def dataset_samples(self) -> int | None:
        """Samples in the real dataset this run reads (an epoch's size); None for synthetic data,
        whose epoch the workload defines."""
        return None

    def framework_version(self) -> str | None:
        return None

    def close(self) -> None:
        """Release what the executor holds (process groups, compiled graphs)."""


class HostStepClock(StepClock):
    """Host timestamps: exact where the device runs synchronously with the host (CPUs)."""

    def __init__(self) -> None:
        import time

        self._now = time.perf_counter
        self._marks: list[float] = []

    def mark(self) -> None:
        self._marks.append(self._now())

    def intervals_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self._marks, self._marks[1:])]
