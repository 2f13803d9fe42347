"""Helpers for plugin authors' tests (and core's own).

from core.testing import SimulatedExecutor, registered_plugins, run_tiny

def test_my_accelerator_runs_fcnn():
    with registered_plugins(my_plugin_module):
        result = run_tiny("fcnn", "my-accelerator")
    assert result.throughput_per_second > 0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from core.config import RunConfig
from core.contract.accelerator import Accelerator
from core.contract.context import RunContext
from core.contract.manager import PluginManager, get_plugin_manager, set_plugin_manager
from core.contract.workload import Workload
from core.executors.base import Executor, HostStepClock, StepClock
from core.running.distributed import SINGLE_PROCESS, ProcessContext
from core.storage.results import RunResult

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
    clock or draws its power, without any device work. Return it from ``create_executor``.
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
