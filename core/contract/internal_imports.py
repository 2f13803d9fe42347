"""Which of core's internal modules a third-party plugin imports, found by reading its source.

A plugin imports from ``core.plugin`` (the stable surface), ``core.testing`` (its tests) and
``core`` itself; every other ``core.*`` module may change in any release. The plugin manager reads
the sources of each third-party plugin it loads from an entry point, once per file and process,
and warns (``DeprecationWarning``, and a line in ``core plugins``) for each import that reaches
further, naming the file and line and where the names are on the surface.

Reading the source rather than watching imports as they run is what makes this cheap and whole:
it catches an import inside a function that has not run yet, and it costs nothing when core
imports its own modules (core's modules are never read), nor for ``core --help``, which loads no
plugin.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: the modules a plugin may import: the plugin surface, the test helpers, and the package itself
ALLOWED = frozenset({"core", "core.plugin", "core.testing"})
#: packages never read: core's own, and its built-in plugins (tests/test_plugin_surface.py checks those)
_NOT_PLUGINS = ("core", "core_plugins")
# A plugin's package with more files than this is read only this far: the check must stay cheap.
_MAX_FILES = 500


@dataclass(frozen=True)
class InternalImport:
    """One import of an internal module of core in a plugin's source."""

    path: str
    line: int
    module: str  # the internal module, e.g. "core.executors.pytorch"
    names: tuple[str, ...]  # the names imported from it (``from m import a, b``); () for ``import m``
    importer: str  # the plugin module whose file holds the import

    def message(self, plugin: str) -> str:
        return (
            f"plugin {plugin!r} imports {self.module}, an internal module of core that may change in any release, "
            f"at {self.path}:{self.line}: {_instead(self.names)} (docs/writing-a-plugin.md#import-from-coreplugin-only)"
        )


def _instead(names: tuple[str, ...]) -> str:
    # At call time: the plugin surface re-exports every layer, the contract among them; it is read
    # only once a plugin has been found reaching past it.
    import core.plugin

    surface = [name for name in names if name in core.plugin.__all__]
    missing = [name for name in names if name not in core.plugin.__all__ and name != "*"]
    if not names or not surface:
        what = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not" if missing else "it is not"
        return f"import from core.plugin instead; {what} on the plugin surface: ask for what you need there"
    text = f"import {', '.join(surface)} from core.plugin instead"
    return text + (f"; {', '.join(missing)} not on the plugin surface" if missing else "")


_seen: dict[tuple[str, int, int], list[tuple[int, str, tuple[str, ...]]]] = {}


def internal_imports(module: ModuleType) -> list[InternalImport]:
    """Every import of an internal core module in the package of ``module`` (a plugin's entry
    point): its own file, and every file of the package it belongs to, imported yet or not."""
    found = []
    for path, importer in _plugin_files(module):
        for line, imported, names in _imports_in(path):
            found.append(InternalImport(str(path), line, imported, names, importer))
    return found


def _plugin_files(module: ModuleType) -> list[tuple[Path, str]]:
    """(file, module name) of each Python source of the package holding ``module``."""
    name = module.__name__
    package = name if hasattr(module, "__path__") else name.rpartition(".")[0] or name
    if package.split(".")[0] in _NOT_PLUGINS:
        return []
    root_module = sys.modules.get(package, module)
    roots = list(getattr(root_module, "__path__", None) or [])
    if getattr(root_module, "__file__", None) is None and root_module is not module:
        # A namespace package (acme.*) holds other distributions too: read the plugin's own module,
        # or its own package.
        roots = list(getattr(module, "__path__", None) or [])
        package = name
    if not roots:  # a plugin that is one module, not a package
        source = getattr(module, "__file__", None)
        return [(Path(source), name)] if source and source.endswith(".py") else []
    files: list[tuple[Path, str]] = []
    for root in roots:
        for folder, subfolders, names in os.walk(root):
            # Subpackages only: no __pycache__, no .venv or build copies inside the package folder.
            subfolders[:] = sorted(d for d in subfolders if d.isidentifier() and d != "__pycache__")
            relative = Path(folder).relative_to(root)
            for file_name in sorted(n for n in names if n.endswith(".py")):
                stem = file_name[:-3]
                parts = [*relative.parts, *([] if stem == "__init__" else [stem])]
                files.append((Path(folder) / file_name, ".".join([package, *parts])))
                if len(files) >= _MAX_FILES:
                    return files
    return files


def _imports_in(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, internal module, names) of each import of one in ``path``; remembered per file
    version, so a process that loads plugins twice reads each file once."""
    try:
        status = path.stat()
        key = (str(path), status.st_mtime_ns, status.st_size)
        if key not in _seen:
            _seen[key] = _parse(path.read_text(encoding="utf-8"), str(path))
        return _seen[key]
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []  # what cannot be read is not this check's to report: importing it would fail first


def _parse(source: str, filename: str) -> list[tuple[int, str, tuple[str, ...]]]:
    if "core" not in source:
        return []
    found: list[tuple[int, str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = tuple(alias.name for alias in node.names)
            if node.module == "core":  # from core import plugin, executors: the modules are what is imported
                found += [(node.lineno, f"core.{n}", ()) for n in names if _internal(f"core.{n}")]
            elif _internal(node.module):
                found.append((node.lineno, node.module, names))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names if _internal(alias.name)]
    return sorted(found)


def _internal(module: str) -> bool:
    """Whether ``module`` is a core module outside what a plugin may import."""
    return (module == "core" or module.startswith("core.")) and module not in ALLOWED and _is_module(module)


def _is_module(module: str) -> bool:
    """``from core import run`` imports a name, not a module: only a submodule of core counts."""
    if module.count(".") > 1 or module == "core":
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
