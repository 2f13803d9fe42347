"""The plugin manager: loads entry-point plugins, validates what they register, reports failures.

Built-in plugins (the CPU, NVIDIA, AMD and Graphcore accelerators, the workload zoo) load
through the same ``core`` entry-point group as a third party's. A plugin that fails to import,
to validate against the hook specs, or to register is recorded with its error and unloaded;
every other plugin keeps working.

Environment switches, for the day a plugin breaks an install:
``CORE_PLUGINS=a,b``              load only these entry points;
``CORE_DISABLE_PLUGINS=a,b``      skip these;
``CORE_DISABLE_PLUGIN_AUTOLOAD=1`` load no entry point except those named in ``CORE_PLUGINS``.
"""

from __future__ import annotations

import os
import threading
import traceback
from dataclasses import dataclass, field
from enum import Enum
from importlib import metadata
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

import pluggy

from core import hookspecs
from core.accelerator import Accelerator
from core.config import RunConfig
from core.errors import ConfigError, RegistrationError
from core.hookspecs import hookimpl
from core.power import PowerMeterFactory
from core.workload import Workload

ENTRY_POINT_GROUP = "core"
ENV_ALLOW = "CORE_PLUGINS"
ENV_BLOCK = "CORE_DISABLE_PLUGINS"
ENV_NO_AUTOLOAD = "CORE_DISABLE_PLUGIN_AUTOLOAD"

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


@dataclass(frozen=True)
class Registered(Generic[T]):
    item: T
    plugin: str


# What each registration hook accepts, and the registry it fills.
_REGISTRATION_HOOKS: dict[str, tuple[str, type]] = {
    "core_register_accelerators": ("accelerators", Accelerator),
    "core_register_workloads": ("workloads", Workload),
    "core_register_power_meters": ("power_meters", PowerMeterFactory),
}


def _names_from_env(variable: str) -> set[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _env_flag(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() not in ("", "0", "false", "no")


class _DefaultPowerMeterSelection:
    """Core's fallback: the first available registered meter that reads the accelerator."""

    @hookimpl(trylast=True)
    def core_select_power_meter(
        self, accelerator: Accelerator, config: RunConfig, candidates: Sequence[PowerMeterFactory]
    ) -> PowerMeterFactory | None:
        for candidate in candidates:
            if candidate.reads(accelerator.name) and candidate.availability().available:
                return candidate
        return None


class PluginManager:
    """Loads plugins and holds everything they registered, each item tagged with its plugin."""

    def __init__(self) -> None:
        self._pluggy = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pluggy.add_hookspecs(hookspecs)
        self._pluggy.register(_DefaultPowerMeterSelection(), name="core.default-power-meter-selection")
        self.plugins: dict[str, PluginRecord] = {}
        self.accelerators: dict[str, Registered[Accelerator]] = {}
        self.workloads: dict[str, Registered[Workload]] = {}
        self.power_meters: dict[str, Registered[PowerMeterFactory]] = {}

    @property
    def hook(self) -> Any:
        return self._pluggy.hook

    # --- loading -------------------------------------------------------------------------

    def load_entry_points(self) -> None:
        allow = _names_from_env(ENV_ALLOW)
        block = _names_from_env(ENV_BLOCK) or set()
        autoload = not _env_flag(ENV_NO_AUTOLOAD)
        for entry_point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            name = entry_point.name
            distribution = getattr(entry_point, "dist", None)
            record = PluginRecord(
                name=name,
                state=PluginState.loaded,
                module=entry_point.value,
                distribution=distribution.metadata["Name"] if distribution else None,
                version=distribution.version if distribution else None,
            )
            wanted = (allow is None or name in allow) and (autoload or (allow is not None and name in allow))
            if name in block or not wanted:
                record.state = PluginState.blocked
                record.error = f"not loaded: blocked by {ENV_BLOCK}, {ENV_ALLOW} or {ENV_NO_AUTOLOAD}"
                self.plugins[name] = record
                continue
            try:
                plugin = entry_point.load()
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
        """Register a plugin object or module directly (tests, programmatic use)."""
        module = getattr(plugin, "__name__", type(plugin).__name__)
        return self._add(plugin, PluginRecord(name=name, state=PluginState.loaded, module=module, version=version))

    def _add(self, plugin: object, record: PluginRecord) -> PluginRecord:
        if record.name in self.plugins:
            # Two plugins under one name: keep the first, report the second beside it.
            first = self.plugins[record.name]
            record.state = PluginState.failed
            record.error = (f'Plugin "{record.name}" from {record.module} was not loaded: the name is taken '
                            f"by {first.module}")
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
            collected = self._collect_registrations(record.name)
        except Exception as exc:
            self._unregister(record.name)
            record.state = PluginState.failed
            record.error = f'Plugin "{record.name}" failed to register: {type(exc).__name__}: {exc}'
            return record
        # Commit only once the whole plugin registered cleanly, so a failure leaves nothing half-added.
        for registry_name, items in collected.items():
            registry = getattr(self, registry_name)
            for item in items:
                registry[item.name] = Registered(item, record.name)
            record.registered[registry_name] = [item.name for item in items]
        return record

    def is_registered(self, plugin: object) -> bool:
        return self._pluggy.is_registered(plugin)

    def _unregister(self, name: str) -> None:
        plugin = self._pluggy.get_plugin(name)
        if plugin is not None:
            self._pluggy.unregister(plugin)

    def _collect_registrations(self, plugin_name: str) -> dict[str, list[Any]]:
        collected: dict[str, list[Any]] = {}
        for hook_name, (registry_name, expected_type) in _REGISTRATION_HOOKS.items():
            items: list[Any] = []
            registry: dict[str, Registered[Any]] = getattr(self, registry_name)

            def register(item: Any, _type: type = expected_type, _items: list[Any] = items,
                         _registry: dict[str, Registered[Any]] = registry) -> None:
                if not isinstance(item, _type):
                    raise RegistrationError(f"expected a {_type.__name__} instance, got {type(item).__name__}")
                name = getattr(item, "name", None)
                if not isinstance(name, str) or not name:
                    raise RegistrationError(f"{type(item).__name__} has no name")
                if name in _registry:
                    raise RegistrationError(
                        f"{_type.__name__} {name!r} is already registered by plugin {_registry[name].plugin!r}"
                    )
                if any(existing.name == name for existing in _items):
                    raise RegistrationError(f"{_type.__name__} {name!r} registered twice")
                _items.append(item)

            for impl in getattr(self._pluggy.hook, hook_name).get_hookimpls():
                if impl.plugin_name == plugin_name:
                    impl.function(**{arg: register for arg in impl.argnames if arg == "register"})
            if items:
                collected[registry_name] = items
        return collected

    # --- look-ups ------------------------------------------------------------------------

    def accelerator(self, name: str) -> Accelerator:
        if name not in self.accelerators:
            raise ConfigError("accelerator", name, f"unknown accelerator; registered: {', '.join(sorted(self.accelerators)) or 'none'}")
        return self.accelerators[name].item

    def workload(self, name: str) -> Workload:
        if name not in self.workloads:
            raise ConfigError("workload", name, f"unknown workload; registered: {', '.join(sorted(self.workloads)) or 'none'}")
        return self.workloads[name].item

    def power_meter_factory(self, accelerator: Accelerator, config: RunConfig) -> PowerMeterFactory | None:
        """The meter for a run: by name, none, or chosen through core_select_power_meter."""
        if config.power_meter == "none":
            return None
        if config.power_meter != "auto":
            if config.power_meter not in self.power_meters:
                raise ConfigError(
                    "power_meter", config.power_meter,
                    f"unknown power meter; allowed: auto, none, {', '.join(sorted(self.power_meters)) or '(none registered)'}",
                )
            return self.power_meters[config.power_meter].item
        candidates = [registered.item for registered in self.power_meters.values()]
        return self.hook.core_select_power_meter(accelerator=accelerator, config=config, candidates=candidates)

    def failed_plugins(self) -> Iterator[PluginRecord]:
        return (record for record in self.plugins.values() if record.state is PluginState.failed)


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


def call_observers(notify: Callable[[], None], what: str) -> None:
    """Run an observer hook; an observer's failure is a warning, never a changed result."""
    try:
        notify()
    except Exception as exc:  # observers must not break a run
        import sys

        print(f"core: warning: a {what} observer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
