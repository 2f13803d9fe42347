"""Hook specifications: the whole contract between core and its plugins.

Every hook is documented in docs/hooks.md with its exact signature; tests/test_docs.py fails
when one is missing. Hooks grow only by adding arguments: pluggy lets older implementations
ignore arguments they do not name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from core.config import RunConfig
    from core.contract.accelerator import Accelerator
    from core.contract.workload import Workload
    from core.energy.meter import PowerMeterFactory
    from core.storage.results import RunResult

PROJECT_NAME = "core"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --- registration: called once when the plugin manager loads -------------------------------


@hookspec
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    """Register accelerators by calling ``register(accelerator)`` once for each.

    Fires once, when the plugin manager loads. ``register`` checks the object is an
    :class:`core.Accelerator` with a name no other plugin registered, and records which plugin
    supplied it; a bad registration is reported against this plugin and the rest load on.

    :param register: callback taking one :class:`core.Accelerator` instance.
    :returns: nothing; results of this hook are ignored.
    """


@hookspec
def core_register_workloads(register: Callable[[Workload], None]) -> None:
    """Register workloads by calling ``register(workload)`` once for each.

    Fires once, when the plugin manager loads; validated like accelerators.

    :param register: callback taking one :class:`core.Workload` instance.
    :returns: nothing; results of this hook are ignored.
    """


@hookspec
def core_register_power_meters(register: Callable[[PowerMeterFactory], None]) -> None:
    """Register power meters by calling ``register(factory)`` once for each.

    Fires once, when the plugin manager loads; validated like accelerators.

    :param register: callback taking one :class:`core.PowerMeterFactory` instance.
    :returns: nothing; results of this hook are ignored.
    """


# --- selection: firstresult hooks -----------------------------------------------------------


@hookspec(firstresult=True)
def core_select_power_meter(
    accelerator: Accelerator, config: RunConfig, candidates: Sequence[PowerMeterFactory]
) -> PowerMeterFactory | None:
    """Choose the power meter for a run whose ``config.power_meter`` is ``"auto"``.

    Fires before the run's devices are touched. Stops at first non-None result. Core's own
    fallback (``trylast``) takes the first available candidate that ``reads`` the accelerator,
    so a plugin implementing this hook wins over it.

    :param accelerator: the accelerator the run uses.
    :param config: the validated run configuration.
    :param candidates: every registered power meter factory, in registration order.
    :returns: the factory to use, or None to let the next implementation decide.
    """


# --- lifecycle: observers -------------------------------------------------------------------


@hookspec
def core_run_started(config: RunConfig) -> None:
    """A run passed validation and is about to set up its devices.

    Fires in the process that called :func:`core.run` (once per run, not per rank, nor in the
    child process of a run with a time limit), or that runs a sweep (once per repeat). An
    exception raised here is reported as a warning on stderr and does not stop the run.

    :param config: the validated run configuration, with the micro-batch size resolved.
    :returns: nothing; results of this hook are ignored.
    """


@hookspec
def core_result_ready(result: RunResult) -> None:
    """A run finished (successfully or not) and its result is complete.

    Fires in the process that called :func:`core.run`, before ``run`` returns (a run stopped by
    its time limit included), or that runs a sweep (once per repeat, as it is recorded). An
    exception raised here is reported as a warning on stderr and does not change the result.

    :param result: the final result.
    :returns: nothing; results of this hook are ignored.
    """
