"""What a plugin is handed to set up one process's share of a run: the options, parsed once.

Planning validates ``workload_options`` and ``accelerator_options`` with the plugins' own models
(``Workload.options_model``, ``Accelerator.options_model``) before any device is touched. The
parsed objects travel with the plan, so an accelerator reads ``context.accelerator_options.x``
instead of parsing the raw dictionary again in every method that needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel

from core.base.config import RunConfig
from core.base.deprecation import REMOVED_IN, warn_deprecated
from core.base.distributed import ProcessContext
from core.base.machine import MachineProfile
from core.base.precision import PrecisionPolicy, policy_for
from core.contract.pipeline import PipelineLayout

OptionsModel = TypeVar("OptionsModel", bound=BaseModel)


@dataclass(frozen=True)
class RunContext:
    """One process's view of a validated run."""

    config: RunConfig  # micro_batch_size resolved
    workload_options: BaseModel  # an instance of the workload's options_model
    accelerator_options: BaseModel  # an instance of the accelerator's options_model
    process: ProcessContext  # this process's rank, local rank and world size
    #: planning for a machine described by a profile, not this host (``--dry-run --machine``):
    #: hardware facts come from it, and nothing here is probed
    machine: MachineProfile | None = None
    #: what planning wants the user to know without refusing the run (shown by a dry run, kept in the result)
    warnings: list[str] = field(default_factory=list)
    #: where the workload's model may be cut into pipeline stages; planning asks the workload only
    #: for a replica over several devices (``devices_per_replica > 1``), else None
    pipeline_layout: PipelineLayout | None = None
    #: the precision policy planning chose for this accelerator (None: core's policy of the name)
    planned_precision: type[PrecisionPolicy] | None = None

    @property
    def precision_policy(self) -> type[PrecisionPolicy]:
        """The policy ``config.precision`` runs under: planning's choice (the registered policy, or
        the accelerator's subclass of it)."""
        return self.planned_precision or policy_for(self.config.precision)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def accelerator_options_as(self, model: type[OptionsModel]) -> OptionsModel:
        """The accelerator options as ``model`` (typed for the plugin's own code; checked)."""
        return _as(self.accelerator_options, model, "accelerator_options")

    def workload_options_as(self, model: type[OptionsModel]) -> OptionsModel:
        """The workload options as ``model``."""
        return _as(self.workload_options, model, "workload_options")


def _as(options: BaseModel, model: type[OptionsModel], field: str) -> OptionsModel:
    if not isinstance(options, model):
        raise TypeError(f"{field} were parsed as {type(options).__name__}, not {model.__name__}")
    return options


def overrides_old_form(plugin: object, new: str, old: str) -> bool:
    """Whether ``plugin``'s class last overrides the older form ``old`` of a method, not ``new``.

    A plugin class may derive from a base that implements the new form (``executor_for``) and
    itself override the old one (``create_executor``), as plugins written against 0.1 do when they
    subclass ``TorchGpuAccelerator``. The override nearest the plugin's class is its intent.
    """
    cls = old_form_class(plugin, new, old)
    if cls is None:
        return False
    _warn_old_form(cls, new, old)
    return True


def old_form_class(plugin: object, new: str, old: str) -> type | None:
    """The class whose override of the old form ``old`` is nearest ``plugin``'s, or None where
    ``new`` is overridden nearer (or neither is). ``new`` may be a class attribute (a meter's
    ``accelerators``) as well as a method."""
    for cls in type(plugin).__mro__:
        if new in vars(cls):
            return None
        if old in vars(cls):
            return cls
    return None


#: (new, old) forms of the Accelerator methods that take the parsed run context now: the 0.1 forms
#: took the raw configuration; ``max_replicas`` and ``devices_for`` kept it until 0.2
ACCELERATOR_OLD_FORMS = (
    ("validate_run", "validate"),
    ("executor_for", "create_executor"),
    ("max_replicas_for", "max_replicas"),
    ("devices_used", "devices_for"),
    ("configure_torch_for", "configure_torch"),  # TorchGpuAccelerator's
)
#: ... and of PowerMeterFactory's: a meter declares the accelerators it reads instead of answering
#: ``reads(name)`` by comparing strings
METER_OLD_FORMS = (("meter_for", "create"), ("accelerators", "reads"))
#: the release whose form each old one is (what a plugin was written against)
_OLD_FORM_RELEASE = {"max_replicas": "0.2", "devices_for": "0.2", "configure_torch": "0.2", "reads": "0.2"}


def old_form_warnings(plugin: object, forms: tuple[tuple[str, str], ...]) -> list[str]:
    """A deprecation message for each old form ``plugin`` still implements (a run keeps them)."""
    messages = []
    for new, old in forms:
        cls = old_form_class(plugin, new, old)
        if cls is not None:
            messages.append(old_form_message(cls, new, old))
    return messages


def old_form_message(cls: type, new: str, old: str) -> str:
    replacement = f"{new}()" if callable(getattr(cls, new, None)) else f"the class attribute {new}"
    return (
        f"{cls.__module__}.{cls.__qualname__}.{old}() is core {_OLD_FORM_RELEASE.get(old, '0.1')}'s form, still "
        f"called and to be removed in {REMOVED_IN}: implement {replacement} instead (docs/writing-a-plugin.md)"
    )


_warned: set[tuple[type, str]] = set()


def _warn_old_form(cls: type, new: str, old: str) -> None:
    """A DeprecationWarning, once per class and method, pointing at the plugin's own class: its
    author is the one who can act on it."""
    if (cls, old) in _warned:
        return
    _warned.add((cls, old))
    warn_deprecated(old_form_message(cls, new, old), removed_in=REMOVED_IN, stacklevel=3)
