"""Helpers for plugin authors' tests (and core's own).

from core.testing import SimulatedExecutor, registered_plugins, run_on_cpu_as, run_tiny

def test_my_accelerator_runs_fcnn():
    with registered_plugins(my_plugin_module):
        result = run_tiny("fcnn", "my-accelerator")
    assert result.throughput_per_second > 0

def test_my_hpu_placement_trains_on_a_host_without_one():
    with registered_plugins(my_plugin_module), run_on_cpu_as("hpu") as cpu:
        run_tiny("fcnn", "my-accelerator", compile=True)
    assert cpu.placed == ["hpu:0"] and cpu.compile_backends == ["hpu_backend"]
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from core.base.config import RunConfig
from core.base.distributed import SINGLE_PROCESS, ProcessContext
from core.base.results import RunResult
from core.contract.accelerator import Accelerator
from core.contract.context import RunContext
from core.contract.manager import PluginManager, get_plugin_manager, set_plugin_manager
from core.contract.workload import Workload
from core.energy.sampling import StopFlag
from core.executors.base import Executor, HostStepClock, StepClock
from core.executors.stand_in import CpuStandIn

TINY_FCNN = {"layers": 2, "hidden_width": 32, "input_width": 16, "output_width": 8, "synthetic_pool_samples": 64}


@contextmanager
def registered_plugins(
    *plugins: object, entry_points: bool = True, builtin_workloads: bool = False
) -> Iterator[PluginManager]:
    """Use a fresh plugin manager with ``plugins`` registered for the duration of the block.

    :param plugins: modules or objects with ``@hookimpl`` functions; each is registered under its
        ``__name__`` (modules) or class name.
    :param entry_points: also load the installed entry-point plugins (the built-ins among them).
    :param builtin_workloads: register core's workload zoo (fcnn, resnet50, ...) even without the
        entry points, for a test of one accelerator against known workloads and nothing else.
    """
    manager = PluginManager()
    if entry_points:
        manager.load_entry_points()
    if builtin_workloads and not entry_points:
        import core.workloads

        manager.register_plugin(core.workloads, name="workloads")
    for plugin in plugins:
        if manager.is_registered(plugin):  # the plugin under test is installed: its entry point loaded it
            continue
        manager.register_plugin(plugin, name=getattr(plugin, "__name__", type(plugin).__name__))
    previous = set_plugin_manager(manager)
    try:
        yield manager
    finally:
        set_plugin_manager(previous)


@contextmanager
def run_on_cpu_as(device_type: str) -> Iterator[CpuStandIn]:
    """Run core's own PyTorch loop, in this process, for an accelerator whose device type
    (``"hpu"``) this host lacks: the CPU stands in for that device.

    For the duration of the block, a ``TorchPlacement`` whose device is of ``device_type``
    (``"hpu"``, ``"hpu:0"``) places the model and data on the CPU, and a ``torch.compile`` backend
    this host does not know (Gaudi's ``hpu_backend``) is replaced by one that runs the traced graph
    as it is. Everything else is the real thing: the plugin's ``executor_for``, its placement and
    every ``TorchDeviceHooks`` method it overrides (``after_backward``, ``cut_graph``,
    ``synchronize``, ...), called where core calls them on the device. Calls into the vendor's SDK
    from those hooks are the test's to fake. A run's worker processes (replicas > 1) are not
    covered: they start without the stand-in.

    :param device_type: the torch device type the CPU stands in for.
    :returns: (as the block's value) a :class:`CpuStandIn` recording the devices placed on the CPU
        (``placed``), the compile backends asked for (``compile_backends``) and the graphs a
        stand-in backend was handed (``graphs_compiled``).
    """
    from core.executors import stand_in

    if not isinstance(device_type, str) or not device_type or ":" in device_type or device_type == "cpu":
        raise ValueError(f"a device type such as 'hpu', not {device_type!r}")
    record = CpuStandIn(device_type)
    previous = stand_in.activate(record)
    try:
        yield record
    finally:
        stand_in.activate(previous)


def run_context(
    config: RunConfig,
    accelerator: Accelerator | None = None,
    workload: Workload | None = None,
    process: ProcessContext = SINGLE_PROCESS,
) -> RunContext:
    """The context planning would hand the plugins for ``config``, the options parsed by their models.

    For a test that calls ``executor_for``, ``validate_run`` or a meter's ``meter_for`` directly.
    Without ``accelerator`` (or ``workload``) those options are parsed as none (an empty model).
    The precision policy is the one registered for ``config.precision`` (a plugin's too, within
    :func:`registered_plugins`), as ``accelerator.precision_policy`` refines it.
    """
    from core.contract.workload import NoOptions

    workload_options = workload.parse_options(dict(config.workload_options)) if workload else NoOptions()
    accelerator_options = accelerator.parse_options(dict(config.accelerator_options)) if accelerator else NoOptions()
    policy = get_plugin_manager().precision_policy(config.precision)
    if policy is not None and accelerator is not None:
        policy = accelerator.precision_policy(policy, config.framework)
    return RunContext(config, workload_options, accelerator_options, process, planned_precision=policy)


def run_tiny(workload: str, accelerator: str, **options: Any) -> RunResult:
    """Run two timed updates with small defaults; fails the test if the run did not succeed."""
    from core.api import run

    settings: dict[str, Any] = {"steps": 2, "warmup_steps": 1, "micro_batch_size": 4, "power_meter": "none"}
    if workload == "fcnn":
        settings["workload_options"] = TINY_FCNN
    settings.update(options)
    result = run(workload, accelerator, **settings)
    assert result.status.ok, f"{workload} on {accelerator} failed: {result.status}"
    return result


class SimulatedExecutor(Executor):
    """An executor that trains nothing: each update only calls ``on_step``.

    A vendor plugin's tests use it to run the whole of core (planning, the timed phases, the
    meter over exactly the window) against a fake SDK, where ``on_step`` moves the fake device's
    clock or draws its power, without any device work. Return it from ``executor_for``.
    """

    def __init__(self, on_step: Callable[[], None] = lambda: None) -> None:
        self._on_step = on_step

    def step(self) -> None:
        self._on_step()

    def synchronize(self) -> None:
        pass

    def step_clock(self) -> StepClock:
        return HostStepClock()

    def check_finite(self) -> None:
        pass


class SimulatedClock:
    """Time that moves only when the test moves it: a ``core.energy.sampling.Clock`` for a meter
    (``DeviceEnergyMeter(clock=...)``, the sampler, the counter poller) and whatever fake device
    reads it, so the energy a test measures is the same on a loaded machine as on a quiet one.

    ``advance`` moves the time and returns once each thread that was waiting on the clock (a
    meter's sampler or poller) has done what the new time asked of it and waits again: what the
    meter read is then decided by the test alone. ``wait_for_waiters`` first lets a meter's
    threads start waiting, so that none misses the first step.

    :param start: the time at first, in seconds.
    :param on_change: called with each new time (a simulated driver's own clock), before any
        waiting thread wakes.
    :param hang_seconds: how long ``advance`` waits for a thread before failing: a hang guard only.
    """

    def __init__(
        self, start: float = 0.0, *, on_change: Callable[[float], None] | None = None, hang_seconds: float = 120.0
    ) -> None:
        self._t = start
        self._on_change = on_change
        self._hang_seconds = hang_seconds
        self._cond = threading.Condition()
        self._waiting: dict[int, float] = {}  # thread -> the deadline it waits for
        self._ended: set[int] = set()  # threads that returned because they were told to stop
        if on_change is not None:
            on_change(start)

    def now(self) -> float:
        return self._t

    def wait_until(self, deadline: float, stop: StopFlag) -> bool:
        thread = threading.get_ident()
        with self._cond:
            self._ended.discard(thread)
            self._waiting[thread] = deadline
            self._cond.notify_all()
            # stop is set from another thread without this condition: look at it often.
            while self._t < deadline and not stop.is_set():
                self._cond.wait(0.01)
            del self._waiting[thread]
            stopped = stop.is_set()
            if stopped:
                self._ended.add(thread)
            self._cond.notify_all()
            return stopped

    def wait_for_waiters(self, count: int) -> None:
        """Return once ``count`` threads wait on the clock (a meter's sampler has started)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._waiting) >= count, self._hang_seconds):
                raise TimeoutError(f"{len(self._waiting)} of {count} threads wait on the clock")

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds`` and let every waiting thread catch up with it."""
        self.advance_to(self._t + seconds)

    def advance_to(self, t: float) -> None:
        """Move the time on to ``t`` and let every waiting thread catch up with it."""
        if not t >= self._t:
            raise ValueError(f"time moves forward only, not from {self._t!r} to {t!r}")
        with self._cond:
            due = set(self._waiting)
            self._t = t
            if self._on_change is not None:
                self._on_change(self._t)
            self._cond.notify_all()

            def caught_up() -> bool:
                return all(self._waiting.get(thread, -math.inf) > self._t or thread in self._ended for thread in due)

            if not self._cond.wait_for(caught_up, self._hang_seconds):
                raise TimeoutError(f"a thread waiting on the clock did not come back within {self._hang_seconds} s")

    def run_for(self, seconds: float, step: float) -> None:
        """Move on ``seconds`` from now in steps of ``step`` (a window the meter samples), each to
        begin + k x step as a sampler's grid computes it, so no grid point falls between two steps."""
        begin = self._t
        steps = math.ceil(seconds / step - 1e-9)
        for k in range(1, steps + 1):
            self.advance_to(min(begin + k * step, begin + seconds))
