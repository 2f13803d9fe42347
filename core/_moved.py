"""Old import paths of modules that moved in 0.2, kept working for a release with a warning.

core's modules were siblings until 0.2; they now live in subpackages by concern (docs/layout.md),
and the built-in plugins install as ``core_plugins`` instead of a bare top-level ``plugins``. Code
written against an old path (a third-party plugin importing ``core.results``, a script importing
``plugins.nvidia`` after ``import core``, which installs this finder) still runs: importing the old
name warns (DeprecationWarning) and yields the very module object at the new path, so attributes
set through either name are seen through both.

The finder answers only for moved names, and never shadows another distribution's own top-level
``plugins`` package: it aliases ``plugins`` only when no path entry provides one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

from core.base.deprecation import REMOVED_IN, warn_deprecated

MOVED_MODULES: dict[str, str] = {
    # 0.1's flat modules (each straight to where it lives now: one warning, not one per move)
    "core.accelerator": "core.contract.accelerator",
    "core.gpu": "core.executors.gpu",
    "core.hookspecs": "core.contract.hookspecs",
    "core.peaks": "core.base.peaks",
    "core.plugins": "core.contract.manager",
    "core.sdk": "core.contract.sdk",
    "core.workload": "core.contract.workload",
    "core.power": "core.contract.meter",
    "core.sampling": "core.energy.sampling",
    "core.distributed": "core.base.distributed",
    "core.launch": "core.running.launch",
    "core.planning": "core.running.planning",
    "core.processes": "core.running.processes",
    "core.progress": "core.running.progress",
    "core.runner": "core.running.runner",
    "core.worker": "core.running.worker",
    "core.environment": "core.running.environment",
    "core.files": "core.base.files",
    "core.results": "core.base.results",
    "core.store": "core.storage.store",
    "core.summary": "core.storage.summary",
    "core.sweep_worker": "core.sweep.worker",
    # the layers (docs/layout.md#layers): plain types down to core.base, the meter interface into the
    # contract, what a run needs out of the layers above it
    "core.config": "core.base.config",
    "core.errors": "core.base.errors",
    "core.precision": "core.base.precision",
    "core.deprecation": "core.base.deprecation",
    "core.storage.results": "core.base.results",
    "core.storage.files": "core.base.files",
    "core.storage.epochs": "core.base.epochs",
    "core.energy.units": "core.base.units",
    "core.running.distributed": "core.base.distributed",
    "core.contract.peaks": "core.base.peaks",
    "core.machines.profile": "core.machines",
    "core.energy.meter": "core.contract.meter",
    "core.contract.gpu": "core.executors.gpu",
    "core.storage.environment": "core.running.environment",
}

# The built-in plugins' old top-level package: ``plugins.X`` is now ``core_plugins.X``.
MOVED_PACKAGES: dict[str, str] = {"plugins": "core_plugins"}


def new_name(old: str) -> str | None:
    """Where the module once importable as ``old`` lives now, or None if it did not move."""
    if old in MOVED_MODULES:
        return MOVED_MODULES[old]
    for old_package, new_package in MOVED_PACKAGES.items():
        if old == old_package or old.startswith(old_package + "."):
            return new_package + old[len(old_package) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module; exec_module swaps in the real one

    def exec_module(self, module: ModuleType) -> None:
        warn_deprecated(
            f"{module.__name__} moved to {self.target} in core 0.2; import it from there"
            f" (plugins: from core.plugin). The old path goes in core {REMOVED_IN}.",
            removed_in=REMOVED_IN,
        )
        # The import system returns whatever sys.modules holds for the name once the loader is
        # done, so the old name becomes the moved module itself, not a copy.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolves old module paths to their new homes (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        moved_to = new_name(fullname)
        if moved_to is None:
            return None
        if fullname in MOVED_PACKAGES:
            if importlib.machinery.PathFinder.find_spec(fullname) is not None:
                return None  # somebody else's package of that name: theirs to import
        elif fullname not in MOVED_MODULES:
            # A submodule of a moved package: alias it only under our alias of the parent, or the
            # path finder would load a second copy of core_plugins.X named plugins.X.
            parent = fullname.rpartition(".")[0]
            if sys.modules.get(parent) is not sys.modules.get(new_name(parent) or ""):
                return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(moved_to))


def install() -> None:
    """Add the finder once, first, so that submodules of an aliased package resolve to the moved ones."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
