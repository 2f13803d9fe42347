"""The plugin manager: loads entry-point plugins, validates what they register, reports failures.

Built-in plugins (the CPU, NVIDIA, AMD, Graphcore and XLA accelerators, the workload zoo) load
through the same ``core`` entry-point group as a third party's. A plugin that fails to import,
to validate against the hook specs, or to register is recorded with its error and unloaded;
every other plugin keeps working.

Environment switches, for the day a plugin breaks an install:
``CORE_PLUGINS=a,b``              load only these entry points;
``CORE_DISABLE_PLUGINS=a,b``      skip these;
``CORE_DISABLE_PLUGIN_AUTOLOAD=1`` load no entry point except those named in ``CORE_PLUGINS``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from types import ModuleType
from typing import Any, Generic, TypeVar

import pluggy

from core.base.config import RunConfig
from core.base.deprecation import warn_deprecated_at
from core.base.errors import ConfigError, PluginError, RegistrationError, did_you_mean
from core.base.machine import MachineProfile
from core.base.precision import BUILTIN_POLICIES, PrecisionPolicy, policy_problem
from core.contract import hookspecs
from core.contract.accelerator import Accelerator, Availability
from core.contract.commands import Command, command_problem
from core.contract.context import old_form_class, overrides_old_form
from core.contract.hookspecs import hookimpl
from core.contract.internal_imports import internal_imports
from core.contract.meter import PowerMeterFactory
from core.contract.workload import Workload

ENTRY_POINT_GROUP = "core"
ENV_ALLOW = "CORE_PLUGINS"
ENV_BLOCK = "CORE_DISABLE_PLUGINS"
ENV_NO_AUTOLOAD = "CORE_DISABLE_PLUGIN_AUTOLOAD"
# The distribution whose entry points are the built-in plugins: they load first, and their
# entry-point names are reserved, so a third party cannot stand in for `cpu` even when the
# built-in failed to load.
BUILTIN_DISTRIBUTION = "core"
#: who registered core's own precision policies (no plugin: they are there before any loads)
CORE_ITSELF = "core"

T = TypeVar("T")


class PluginState(str, Enum):
    loaded = "loaded"
    failed = "failed"
    blocked = "blocked"


@dataclass
class PluginRecord:
    """What ``core plugins`` shows for one plugin."""

    name: str
    state: PluginState
    module: str | None = None
    distribution: str | None = None
    version: str | None = None
    error: str | None = None
    traceback: str | None = None
    hooks: list[str] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)
    builtin: bool = False
    #: loaded from an entry point, as every process loads it (not registered in this process only)
    entry_point: bool = False
    #: every time this plugin's code raised after loading: (what it was asked, error, traceback)
    faults: list[PluginFault] = field(default_factory=list)
    #: what the plugin should change, though it loaded (an import of core's internals)
    warnings: list[str] = field(default_factory=list)


class PluginFault(PluginError):
    """A plugin's code raised where core called it: names the plugin, what it was asked, and where.

    Core turns it into an "unavailable" entry (listings), a refused run (planning) or a run's
    error status (running); it never escapes as a bare traceback.
    """

    def __init__(self, plugin: str, call: str, error: BaseException) -> None:
        self.plugin = plugin
        self.call = call
        self.error = error
        self.location = innermost_location(error)
        self.traceback_text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        where = f" at {self.location}" if self.location else ""
        super().__init__(f"plugin {plugin!r} raised in {call}{where}: {type(error).__name__}: {error}")


def innermost_location(error: BaseException) -> str | None:
    """``path/to/file.py:42 in function`` of the frame that raised, for one-line error reports."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


@dataclass(frozen=True)
class Registered(Generic[T]):
    item: T
    plugin: str


@dataclass(frozen=True)
class _Registration:
    """What one registration hook accepts and the registry it fills."""

    registry: str  # the PluginManager attribute, and the key of PluginRecord.registered
    kind: type
    #: True where several plugins may register the same name (a Python package two vendors both
    #: depend on); the first keeps it, and each plugin's record lists what it registered
    shared: bool = False


_REGISTRATION_HOOKS: dict[str, _Registration] = {
    "core_register_accelerators": _Registration("accelerators", Accelerator),
    "core_register_workloads": _Registration("workloads", Workload),
    "core_register_power_meters": _Registration("power_meters", PowerMeterFactory),
    "core_register_machines": _Registration("machines", MachineProfile),
    "core_register_packages": _Registration("packages", str, shared=True),
    "core_register_commands": _Registration("commands", Command),
    # classes, not instances: each run's executor makes its own (it holds fp16's gradient scaler)
    "core_register_precisions": _Registration("precisions", PrecisionPolicy),
}


def _type_problem(item: object, expected: type) -> str | None:
    """Why ``item`` is not what a registration hook takes, or None: an instance of ``expected``,
    or for precision policies a class (core.base.precision.policy_problem)."""
    if expected is PrecisionPolicy:
        return policy_problem(item)
    if not isinstance(item, expected):
        wanted = "a package name (a string)" if expected is str else f"a {expected.__name__} instance"
        return f"expected {wanted}, got {type(item).__name__}"
    return None


def _names_from_env(variable: str) -> set[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _env_flag(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() not in ("", "0", "false", "no")


_DEFAULT_SELECTION = "core.default-power-meter-selection"


class _DefaultPowerMeterSelection:
    """Core's fallback: the first available registered meter that reads the accelerator."""

    def __init__(self, manager: PluginManager) -> None:
        self._manager = manager

    @hookimpl(trylast=True)
    def core_select_power_meter(
        self, accelerator: Accelerator, config: RunConfig, candidates: Sequence[PowerMeterFactory]
    ) -> PowerMeterFactory | None:
        for candidate in candidates:
            # A meter whose own checks raise is passed over (and its fault recorded), never fatal.
            if (
                self._manager.meter_reads(candidate, accelerator.name)
                and self._manager.availability(candidate).available
            ):
                return candidate
        return None


# Methods of which a plugin's class must implement one: the form with the parsed run context or the
# older one. The base classes' defaults call each other's way, so neither is abstract.
_ONE_OF: dict[type, tuple[tuple[str, str], ...]] = {
    Accelerator: (("executor_for", "create_executor"), ("max_replicas_for", "max_replicas")),
    PowerMeterFactory: (("meter_for", "create"), ("accelerators", "reads")),
}


def _missing_method(item: object, base: type) -> str | None:
    for new, old in _ONE_OF.get(base, ()):
        if not any(_overrides(item, base, name) for name in (new, old)):
            verb = "implements" if callable(getattr(base, new)) else "declares"
            return f"{verb} neither {new} (core 0.2) nor {old}"
    return None


def _overrides(item: object, base: type, name: str) -> bool:
    """Whether ``item`` implements (a method) or declares (an attribute, on its class or itself)
    ``name`` other than ``base`` does."""
    default = getattr(base, name)
    return (getattr(type(item), name) if callable(default) else getattr(item, name)) is not default


# A distribution name as PEP 508 spells one (what importlib.metadata.version looks up).
_PACKAGE_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
# A machine profile's name is what `--machine NAME` selects, where a path to a profile file is
# allowed too: a name that reads as a path would hide the file.
_MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _key(item: Any) -> Any:
    """The name ``item`` is registered under: its ``name``; a package's canonical name (PEP 503:
    ``torch_xla`` and ``Torch-XLA`` are one distribution)."""
    if isinstance(item, str):
        return re.sub(r"[-_.]+", "-", item).lower()
    return getattr(item, "name", None)


def _registration_problem(item: Any, registration: _Registration) -> str | None:
    """What is wrong with one registered item beyond its type and name, or None."""
    if isinstance(item, Command):
        return command_problem(item)
    if isinstance(item, PowerMeterFactory) and not old_form_class(item, "accelerators", "reads"):
        return _accelerators_problem(item)
    if isinstance(item, MachineProfile) and (not _MACHINE_NAME.match(item.name) or item.name.endswith(".toml")):
        return (
            f"MachineProfile {item.name!r}: a profile's name has letters, digits, '.', '_' and '-', beginning "
            "with a letter or digit and not ending in .toml (a name that reads as a profile file's path would hide "
            "the file)"
        )
    if registration.kind is str and not _PACKAGE_NAME.match(item):
        return f"package {item!r} is not a distribution name (letters, digits, '.', '_' and '-', as pip spells one)"
    return None


def _unknown(kind: str, name: str, registered: Mapping[str, object]) -> str:
    """What a look-up of an unregistered ``kind`` says: the closest registered name, then them all."""
    return f"unknown {kind}{did_you_mean(name, registered)}; registered: {', '.join(sorted(registered)) or 'none'}"


def _accelerators_problem(meter: PowerMeterFactory) -> str | None:
    declared = meter.accelerators
    if not isinstance(declared, tuple) or not all(isinstance(name, str) and name for name in declared):
        return (
            f"PowerMeterFactory {meter.name!r}: accelerators must be a tuple of accelerator names, "
            f"e.g. ('nvidia',), not {declared!r}"
        )
    if not declared:
        return f"PowerMeterFactory {meter.name!r} declares no accelerators it reads (accelerators = ('name', ...))"
    return None


class PluginManager:
    """Loads plugins and holds everything they registered, each item tagged with its plugin."""

    def __init__(self) -> None:
        self._pluggy = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pluggy.add_hookspecs(hookspecs)
        self._pluggy.register(_DefaultPowerMeterSelection(self), name=_DEFAULT_SELECTION)
        #: entry-point names of the built-in distribution: no other plugin may take them
        self.reserved_names: set[str] = set()
        self.plugins: dict[str, PluginRecord] = {}
        self.accelerators: dict[str, Registered[Accelerator]] = {}
        self.workloads: dict[str, Registered[Workload]] = {}
        self.power_meters: dict[str, Registered[PowerMeterFactory]] = {}
        #: sub-commands of ``core`` that plugins add (core_register_commands)
        self.commands: dict[str, Registered[Command]] = {}
        self.precisions: dict[str, Registered[type[PrecisionPolicy]]] = {
            policy.name: Registered(policy, CORE_ITSELF) for policy in BUILTIN_POLICIES.values()
        }
        #: the machine profiles plugins ship (``--machine NAME``), by name
        self.machines: dict[str, Registered[MachineProfile]] = {}
        #: the Python distributions whose versions a result records, by canonical name
        self.packages: dict[str, Registered[str]] = {}

    @property
    def hook(self) -> Any:
        return self._pluggy.hook

    # --- loading -------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        allow = _names_from_env(ENV_ALLOW)
        block = _names_from_env(ENV_BLOCK) or set()
        autoload = not _env_flag(ENV_NO_AUTOLOAD)
        entry_points = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
        # Built-ins first: whatever a third party registers, `cpu` stays the built-in CPU.
        entry_points.sort(key=lambda e: (not _is_builtin(e), e.name))
        self.reserved_names |= {e.name for e in entry_points if _is_builtin(e)}
        for entry_point in entry_points:
            name = entry_point.name
            distribution = getattr(entry_point, "dist", None)
            record = PluginRecord(
                name=name,
                state=PluginState.loaded,
                module=entry_point.value,
                distribution=distribution.metadata["Name"] if distribution else None,
                version=distribution.version if distribution else None,
                builtin=_is_builtin(entry_point),
                entry_point=True,
            )
            if not record.builtin and name in self.reserved_names:
                record.state = PluginState.failed
                record.error = (
                    f'Plugin "{name}" from {entry_point.value} was not loaded: "{name}" is the name of '
                    "a built-in plugin; rename the entry point"
                )
                record.name = f"{name} ({entry_point.value})"
                self.plugins[record.name] = record
                continue
            wanted = (allow is None or name in allow) and (autoload or (allow is not None and name in allow))
            if name in block or not wanted:
                record.state = PluginState.blocked
                record.error = f"not loaded: blocked by {ENV_BLOCK}, {ENV_ALLOW} or {ENV_NO_AUTOLOAD}"
                self.plugins[name] = record
                continue
            try:
                plugin = entry_point.load()
                if not record.builtin:
                    # Here, so that a warning made an error (python -W error) fails this plugin alone.
                    _warn_internal_imports(record, sys.modules.get(getattr(entry_point, "module", "")))
            except BaseException as exc:  # a plugin may raise anything at import, SystemExit included
                if isinstance(exc, KeyboardInterrupt):
                    raise
                record.state = PluginState.failed
                record.error = f'Error importing plugin "{name}": {type(exc).__name__}: {exc}'
                record.traceback = traceback.format_exc()
                self.plugins[name] = record
                continue
            self._add(plugin, record)

    def register_plugin(self, plugin: object, name: str, version: str | None = None) -> PluginRecord:
        """Register a plugin object or module directly (tests, programmatic use). A module's source
        is read for imports of core's internals, as an entry point's is."""
        module = getattr(plugin, "__name__", type(plugin).__name__)
        record = PluginRecord(name=name, state=PluginState.loaded, module=module, version=version)
        if isinstance(plugin, ModuleType):
            _warn_internal_imports(record, plugin)
        return self._add(plugin, record)

    def _add(self, plugin: object, record: PluginRecord) -> PluginRecord:
        if record.name in self.plugins:
            # Two plugins under one name: keep the first, report the second beside it.
            first = self.plugins[record.name]
            record.state = PluginState.failed
            record.error = (
                f'Plugin "{record.name}" from {record.module} was not loaded: the name is taken by {first.module}'
            )
            record.name = f"{record.name} ({record.module})"
            self.plugins[record.name] = record
            return record
        self.plugins[record.name] = record
        try:
            self._pluggy.register(plugin, name=record.name)
            # A hook implementation whose name matches no spec (a typo) is an error, not silence.
            self._pluggy.check_pending()
        except pluggy.PluginValidationError as exc:
            self._unregister(record.name)
            record.state = PluginState.failed
            record.error = f'Plugin "{record.name}" failed validation: {exc}'
            return record
        except ValueError as exc:  # pluggy: this name or this object is registered already
            record.state = PluginState.failed
            record.error = f'Plugin "{record.name}" could not be registered: {exc}'
            return record
        record.hooks = sorted(caller.name for caller in self._pluggy.get_hookcallers(plugin) or [])
        try:
            collected = self._collect_registrations(record.name, record.builtin)
        except Exception as exc:
            self._unregister(record.name)
            record.state = PluginState.failed
            record.error = f'Plugin "{record.name}" failed to register: {type(exc).__name__}: {exc}'
            return record
        # Commit only once the whole plugin registered cleanly, so a failure leaves nothing half-added.
        for registry_name, items in collected.items():
            registry = getattr(self, registry_name)
            for item in items:
                registry.setdefault(_key(item), Registered(item, record.name))
            record.registered[registry_name] = [_key(item) for item in items]
        return record

    def loads_in_every_process(self) -> bool:
        """Whether a fresh process loads the same plugins: every plugin loaded here came from an
        entry point, none was registered in this process only (``register_plugin``)."""
        return all(record.entry_point for record in self.plugins.values() if record.state is PluginState.loaded)

    def _owner(self, plugin: str) -> str:
        """Who registered something, as an error says it: core itself, a built-in plugin or a plugin."""
        if plugin == CORE_ITSELF and plugin not in self.plugins:
            return "core itself"
        builtin = self.plugins.get(plugin, PluginRecord(plugin, PluginState.loaded)).builtin
        return f"{'built-in plugin' if builtin else 'plugin'} {plugin!r}"

    def is_registered(self, plugin: object) -> bool:
        return self._pluggy.is_registered(plugin)

    def _unregister(self, name: str) -> None:
        plugin = self._pluggy.get_plugin(name)
        if plugin is not None:
            self._pluggy.unregister(plugin)

    def _collect_registrations(self, plugin_name: str, builtin: bool = False) -> dict[str, list[Any]]:
        collected: dict[str, list[Any]] = {}
        for hook_name, registration in _REGISTRATION_HOOKS.items():
            items: list[Any] = []

            def register(item: Any, _registration: _Registration = registration, _items: list[Any] = items) -> None:
                if self._check_registration(item, _registration, _items, builtin):
                    _items.append(item)

            for impl in getattr(self._pluggy.hook, hook_name).get_hookimpls():
                if impl.plugin_name == plugin_name:
                    impl.function(**{arg: register for arg in impl.argnames if arg == "register"})
            if items:
                collected[registration.registry] = items
        return collected

    def _check_registration(self, item: Any, registration: _Registration, items: list[Any], builtin: bool) -> bool:
        """Whether ``item`` is new to this plugin's registrations (False: a shared name it registered
        already); RegistrationError for anything a plugin may not register."""
        kind = registration.kind
        wrong_type = _type_problem(item, kind)
        if wrong_type:
            raise RegistrationError(wrong_type)
        name = _key(item)
        if not isinstance(name, str) or not name:
            raise RegistrationError(_registration_problem(item, registration) or f"{kind.__name__} has no name")
        missing = _missing_method(item, kind)
        if missing:
            raise RegistrationError(f"{kind.__name__} {name!r} {missing}")
        problem = _registration_problem(item, registration)
        if problem:
            raise RegistrationError(problem)
        again = any(_key(existing) == name for existing in items)
        if registration.shared:
            return not again  # another plugin's registration of it stands; this record lists it too
        registry: dict[str, Registered[Any]] = getattr(self, registration.registry)
        if name in registry:
            raise RegistrationError(
                f"{kind.__name__} {name!r} is already registered by {self._owner(registry[name].plugin)}"
            )
        if again:
            raise RegistrationError(f"{kind.__name__} {name!r} registered twice")
        if not builtin and kind is Accelerator and name in self.reserved_names:
            raise RegistrationError(f"{kind.__name__} {name!r} is the name of a built-in plugin; choose another name")
        return True

    # --- look-ups ------------------------------------------------------------------------

    def accelerator(self, name: str) -> Accelerator:
        if name not in self.accelerators:
            raise ConfigError("accelerator", name, _unknown("accelerator", name, self.accelerators))
        return self.accelerators[name].item

    def workload(self, name: str) -> Workload:
        if name not in self.workloads:
            raise ConfigError("workload", name, _unknown("workload", name, self.workloads))
        return self.workloads[name].item

    def precision_policy(self, name: str) -> type[PrecisionPolicy] | None:
        """The registered policy of precision ``name``; None where no plugin (nor core) has one."""
        registered = self.precisions.get(str(name))
        return registered.item if registered is not None else None

    def power_meter_factory(self, accelerator: Accelerator, config: RunConfig) -> PowerMeterFactory | None:
        """The meter for a run: by name, none, or chosen through core_select_power_meter."""
        if config.power_meter == "none":
            return None
        if config.power_meter != "auto":
            if config.power_meter not in self.power_meters:
                raise ConfigError(
                    "power_meter",
                    config.power_meter,
                    f"unknown power meter{did_you_mean(config.power_meter, ['auto', 'none', *self.power_meters])}; "
                    "allowed: auto, none, " + (", ".join(sorted(self.power_meters)) or "(none registered)"),
                )
            chosen = self.power_meters[config.power_meter].item
            if not self.meter_reads(chosen, accelerator.name):
                readers = [
                    name
                    for name, registered in sorted(self.power_meters.items())
                    if self.meter_reads(registered.item, accelerator.name)
                ]
                raise ConfigError(
                    "power_meter",
                    config.power_meter,
                    f"meter {config.power_meter!r} does not read accelerator {accelerator.name!r}; "
                    f"allowed: auto, none{''.join(', ' + name for name in readers)}",
                )
            return chosen
        candidates = [registered.item for registered in self.power_meters.values()]
        return self._select_power_meter(accelerator, config, candidates)

    def _select_power_meter(
        self, accelerator: Accelerator, config: RunConfig, candidates: list[PowerMeterFactory]
    ) -> PowerMeterFactory | None:
        """core_select_power_meter, one implementation at a time in pluggy's order (firstresult):
        an implementation that raises, or answers something that is not a factory, is passed over
        and its fault recorded against its plugin."""
        chosen: object = None
        for impl in reversed(self.hook.core_select_power_meter.get_hookimpls()):
            try:
                with self.plugin_named(impl.plugin_name, "the core_select_power_meter hook"):
                    chosen = impl.function(
                        **{
                            name: {"accelerator": accelerator, "config": config, "candidates": candidates}[name]
                            for name in impl.argnames
                        }
                    )
            except PluginFault:
                continue
            if chosen is not None:
                break
        return chosen if isinstance(chosen, PowerMeterFactory) else None

    # --- calling plugin code -----------------------------------------------------------------

    def plugin_of(self, item: object) -> str:
        """The plugin that registered ``item``: an accelerator, workload, meter factory, precision or command."""
        registries: tuple[dict[str, Registered[Any]], ...] = (
            self.accelerators,
            self.workloads,
            self.power_meters,
            self.precisions,
            self.commands,
            self.machines,
        )
        for registry in registries:
            for registered in registry.values():
                if registered.item is item:
                    return registered.plugin
        return f"{type(item).__module__}.{type(item).__qualname__}"

    def plugin_code(self, item: object, call: str) -> contextlib.AbstractContextManager[None]:
        """Run a call into plugin code: what it raises becomes a PluginFault naming the plugin.

        ConfigError passes through unchanged (a plugin refusing an option is doing its job), and so
        does KeyboardInterrupt. The fault is also kept on the plugin's record for ``core plugins``.
        """
        return self.plugin_named(self.plugin_of(item), call)

    def implementations(self, hook_name: str) -> list[tuple[str, Callable[..., Any]]]:
        """(plugin, call) for each implementation of a hook, in pluggy's calling order: for core to
        call them one at a time, each under :meth:`plugin_named`, so that one that raises loses its
        own answer only. ``call`` takes the hook's arguments by keyword and passes on those the
        implementation names."""
        found = []
        for impl in reversed(getattr(self.hook, hook_name).get_hookimpls()):

            def call(_impl: Any = impl, **arguments: Any) -> Any:
                return _impl.function(**{name: arguments[name] for name in _impl.argnames})

            found.append((impl.plugin_name, call))
        return found

    @contextmanager
    def plugin_named(self, plugin: str, call: str) -> Iterator[None]:
        """As :meth:`plugin_code`, for code of the plugin registered under ``plugin``."""
        try:
            yield
        except (ConfigError, PluginFault):
            raise
        except Exception as exc:
            fault = PluginFault(plugin, call, exc)
            record = self.plugins.get(plugin)
            if record is not None:
                record.faults.append(fault)
            raise fault from exc

    def availability(self, item: Accelerator | PowerMeterFactory) -> Availability:
        """``item.availability()``; a plugin that raises or answers nonsense is unavailable, with why."""
        try:
            with self.plugin_code(item, f"{type(item).__name__}.availability()"):
                answer = item.availability()
        except PluginFault as fault:
            return Availability.no(str(fault))
        if not isinstance(answer, Availability):
            return Availability.no(
                f"plugin {self.plugin_of(item)!r}: availability() returned {type(answer).__name__}, not an Availability"
            )
        if not answer.available and not (isinstance(answer.reason, str) and answer.reason.strip()):
            # Printed as "unavailable: <reason>": a missing one must not read "None".
            return Availability.no(f"plugin {self.plugin_of(item)!r} says it is unavailable and gives no reason")
        return answer

    def meter_reads(self, meter: PowerMeterFactory, accelerator_name: str) -> bool:
        """Whether ``meter`` declares it reads ``accelerator_name`` (its ``accelerators``, checked
        when it registered). A meter class that still overrides ``reads`` is asked that instead,
        with a DeprecationWarning; one whose ``reads`` raises reads nothing."""
        if not overrides_old_form(meter, "accelerators", "reads"):
            return accelerator_name in meter.accelerators
        try:
            with self.plugin_code(meter, f"{type(meter).__name__}.reads()"):
                return bool(meter.reads(accelerator_name))
        except PluginFault:
            return False

    def meters_reading(self, accelerator_name: str) -> list[PowerMeterFactory]:
        """Every registered meter that reads ``accelerator_name``, in registration order."""
        meters = [registered.item for registered in self.power_meters.values()]
        return [meter for meter in meters if self.meter_reads(meter, accelerator_name)]

    def machine_profiles(self) -> dict[str, MachineProfile]:
        """The machine profiles the plugins registered, by name (``core machines``, ``--machine NAME``)."""
        return {name: registered.item for name, registered in sorted(self.machines.items())}

    def package_names(self) -> list[str]:
        """The Python distributions whose versions a run's result records, as the plugins named them."""
        return [registered.item for registered in self.packages.values()]


_manager: PluginManager | None = None
_manager_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, loading entry points on first use."""
    global _manager
    with _manager_lock:
        if _manager is None:
            manager = PluginManager()
            manager.load_entry_points()
            _manager = manager
        return _manager


def set_plugin_manager(manager: PluginManager | None) -> PluginManager | None:
    """Replace (or with None, forget) the process-wide manager; returns the previous one."""
    global _manager
    with _manager_lock:
        previous, _manager = _manager, manager
        return previous


def _is_builtin(entry_point: metadata.EntryPoint) -> bool:
    distribution = getattr(entry_point, "dist", None)
    return distribution is not None and distribution.metadata["Name"] == BUILTIN_DISTRIBUTION


def _warn_internal_imports(record: PluginRecord, module: ModuleType | None) -> None:
    """A DeprecationWarning at each import of core's internals in the plugin's source, kept on its
    record for ``core plugins`` too: the plugin surface is what keeps working across releases."""
    if module is None:
        return
    try:
        found = internal_imports(module)
    except Exception:  # reading a plugin's source is advice, never a reason for it not to load
        return
    for found_import in found:
        message = found_import.message(record.name)
        record.warnings.append(message)
        warn_deprecated_at(
            message, removed_in=None, filename=found_import.path, lineno=found_import.line, module=found_import.importer
        )


def call_observers(notify: Callable[[], None], what: str) -> None:
    """Run an observer hook; an observer's failure is a warning, never a changed result."""
    try:
        notify()
    except Exception as exc:  # observers must not break a run
        print(f"core: warning: a {what} observer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
