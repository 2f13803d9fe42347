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
    from core.base.config import RunConfig
    from core.base.machine import MachineProfile
    from core.base.precision import PrecisionPolicy
    from core.base.results import RunResult
    from core.contract.accelerator import Accelerator
    from core.contract.commands import Command
    from core.contract.meter import PowerMeterFactory
    from core.contract.workload import Workload
    from core.report.document import Block

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


@hookspec
def core_register_commands(register: Callable[[Command], None]) -> None:
    """Add sub-commands to ``core`` by calling ``register(command)`` once for each.

    Fires once, when the plugin manager loads; validated like accelerators, and a command may not
    take the name of one of core's own (``run``, ``sweep``, ...). Keep this hook light: ``core
    --help`` calls it, so the command's ``run`` imports what it needs, not the plugin's module.

    :param register: callback taking one :class:`core.plugin.Command`.
    :returns: nothing; results of this hook are ignored.
    """


@hookspec
def core_register_machines(register: Callable[[MachineProfile], None]) -> None:
    """Register the machine profiles this plugin ships by calling ``register(profile)`` once for each.

    Fires once, when the plugin manager loads. A profile describes a machine that is not at hand
    (its device model and count, memory, precisions, host, vendor ``details``), so that
    ``--dry-run --machine NAME`` plans a run or a sweep for it and ``core machines`` lists it. The
    vendor that knows a device ships its machines. ``register`` checks the object is a
    :class:`core.plugin.MachineProfile` whose name no other plugin registered and that cannot be
    read as a profile file's path; the profile is checked against its accelerator's
    ``machine_details`` when a run is planned for it.

    :param register: callback taking one :class:`core.plugin.MachineProfile`.
    :returns: nothing; results of this hook are ignored.
    """


@hookspec
def core_register_precisions(register: Callable[[type[PrecisionPolicy]], None]) -> None:
    """Register precision policies by calling ``register(policy_class)`` once for each.

    Fires once, when the plugin manager loads. ``register`` checks the class is a
    :class:`core.plugin.PrecisionPolicy` subclass with a valid name no policy has (core's own
    fp32, tf32, bf16 and fp16 included), a compute dtype and its size; a bad registration is
    reported against this plugin and the rest load on. An accelerator then lists the name in its
    ``precisions``; planning refuses a listed name that no registered policy has.

    :param register: callback taking one :class:`core.plugin.PrecisionPolicy` subclass (the class).
    :returns: nothing; results of this hook are ignored.
    """


@hookspec
def core_register_packages(register: Callable[[str], None]) -> None:
    """Register the Python distributions whose installed versions a run's result records.

    Fires once, when the plugin manager loads. Call ``register(name)`` once for each distribution
    name as pip spells it (``"nvidia-ml-py"``): a vendor's SDK bindings and runtime. A result's
    ``environment.library_versions`` holds each registered package that is installed, found
    through ``importlib.metadata`` without importing it. Several plugins may register the same name.

    :param register: callback taking one distribution name.
    :returns: nothing; results of this hook are ignored.
    """


# --- selection: firstresult hooks -----------------------------------------------------------


@hookspec(firstresult=True)
def core_select_power_meter(
    accelerator: Accelerator, config: RunConfig, candidates: Sequence[PowerMeterFactory]
) -> PowerMeterFactory | None:
    """Choose the power meter for a run whose ``config.power_meter`` is ``"auto"``.

    Fires before the run's devices are touched. Stops at first non-None result. Core's own
    fallback (``trylast``) takes the first available candidate whose ``accelerators`` name the
    accelerator, so a plugin implementing this hook wins over it.

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


# --- reports -------------------------------------------------------------------------------


@hookspec
def core_report_sections(runs: Sequence[RunResult], add_section: Callable[[str, Sequence[Block]], None]) -> None:
    """Add sections to the report ``core report`` writes, by calling ``add_section(title, blocks)``.

    Fires once per report, after core's own sections are built, in the process writing it. Each
    section is added under a level-2 heading ``title``, after core's sections, in Markdown and in
    HTML alike; its blocks are :class:`core.plugin.Paragraph`, ``Table``, ``Preformatted``,
    ``Figure`` and ``Heading`` (levels 3 to 6), escaped like everything else in a report. An
    implementation that raises, or adds anything else, loses its sections (the report says so and
    the command warns); the rest of the report is written.

    :param runs: the result of every run the report covers, oldest first.
    :param add_section: callback taking a title and a sequence of blocks.
    :returns: nothing; results of this hook are ignored.
    """
