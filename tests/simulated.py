"""An executor that does no training: each update only calls ``on_step``, which moves a fake
device's clock or draws its power. Vendor tests use it to run the whole of core (planning,
phases, the meter over the window) against a fake SDK without the device work."""

from __future__ import annotations

from typing import Callable

from core.executors.base import Executor, HostStepClock, StepClock


class SimulatedExecutor(Executor):
    def __init__(self, samples_per_update: int, on_step: Callable[[], None]) -> None:
        self.local_samples_per_update = samples_per_update
        self._on_step = on_step

    def step(self) -> None:
        self._on_step()

    def synchronize(self) -> None:
        pass

    def step_clock(self) -> StepClock:
        return HostStepClock()

    def check_finite(self) -> None:
        pass
