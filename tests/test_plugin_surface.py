"""The plugin author's surface: ``core.plugin`` holds every name a plugin needs, and only it.

The built-in plugins and the worked example are written the way third parties are told to
write theirs (docs/writing-a-plugin.md): they import nothing from core but ``core.plugin``, so
core's internals can move without breaking a plugin.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import core.plugin

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_SOURCES = sorted(
    [*(ROOT / "plugins").rglob("*.py"), *(ROOT / "docs" / "example-plugin" / "core_example_plugin").rglob("*.py")]
)


def core_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of ``core`` or a ``core.*`` module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found.extend((node.lineno, m) for m in modules if m == "core" or m.startswith("core."))
    return found


def test_the_plugin_sources_are_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in PLUGIN_SOURCES}
    assert {"plugins/cpu/accelerator.py", "plugins/nvidia/meter.py", "plugins/amd/smi.py"} <= names
    assert "docs/example-plugin/core_example_plugin/__init__.py" in names


@pytest.mark.parametrize("path", PLUGIN_SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_plugins_import_only_the_plugin_surface(path: Path) -> None:
    outside = [f"line {line}: {module}" for line, module in core_imports(path) if module != "core.plugin"]
    assert not outside, f"{path.relative_to(ROOT)} imports core internals; use core.plugin: {outside}"


def test_the_check_catches_an_internal_import(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "from core.plugin import hookimpl\n\ndef f():\n    from core.contract.gpu import TorchGpuAccelerator\n"
    )
    assert core_imports(plugin) == [(1, "core.plugin"), (4, "core.contract.gpu")]


def test_every_surface_name_resolves_and_unknown_names_do_not() -> None:
    for name in core.plugin.__all__:
        assert getattr(core.plugin, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'TorchExecuter'"):
        _ = core.plugin.TorchExecuter  # type: ignore[attr-defined]


def test_every_surface_name_is_documented() -> None:
    guide = (ROOT / "docs" / "writing-a-plugin.md").read_text(encoding="utf-8")
    section = guide.split("## Import from `core.plugin` only", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(\w+)`", section))
    missing = [name for name in core.plugin.__all__ if name not in documented]
    assert not missing, f"add to docs/writing-a-plugin.md's core.plugin table: {missing}"


def test_importing_the_surface_imports_no_framework() -> None:
    heavy = ("torch", "tensorflow", "numpy", "pynvml", "amdsmi", "poptorch", "torch_xla")
    code = f"import sys, core.plugin; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout


# --- a third-party plugin that reaches into core's internals is told so -------------------------


def make_plugin_package(root: Path, name: str, files: dict[str, str]) -> None:
    """An installed distribution on ``root``: package ``name`` with ``files`` and a `core` entry point."""
    package = root / name
    for relative, text in files.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[core]\n{name} = {name}.hooks\n")


REACHING_PLUGIN = {
    "__init__.py": "",
    "hooks.py": (
        "from core import hookimpl\n"
        "from core.plugin import Accelerator\n"
        "import core.testing\n"
        "from core.executors.pytorch import TorchExecutor, compile_model\n"
    ),
    # Imported by no one yet (a lazily loaded part of the plugin): read all the same.
    "gpu/executor.py": (
        "def build():\n"
        "    import core.contract.gpu\n"
        "    from core import config\n"
        "    from core.storage.results import RunResult\n"
        "    return core.contract.gpu, config, RunResult\n"
    ),
}


def load_from(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from core.contract.manager import PluginManager

    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    manager = PluginManager()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager.load_entry_points()
    return manager, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def test_a_plugin_importing_core_internals_is_warned_at_each_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_plugin_package(tmp_path, "reaching_plugin", REACHING_PLUGIN)
    manager, deprecations = load_from(tmp_path, monkeypatch)
    record = manager.plugins["reaching_plugin"]
    assert record.state.value == "loaded", record.error  # warned, not refused
    where = sorted((Path(w.filename).relative_to(tmp_path).as_posix(), w.lineno) for w in deprecations)
    assert where == [
        ("reaching_plugin/gpu/executor.py", 2),
        ("reaching_plugin/gpu/executor.py", 3),
        ("reaching_plugin/gpu/executor.py", 4),
        ("reaching_plugin/hooks.py", 4),
    ]
    messages = {Path(w.filename).name + f":{w.lineno}": str(w.message) for w in deprecations}
    assert (
        "imports core.executors.pytorch, an internal module of core" in messages["hooks.py:4"]
        and "import TorchExecutor from core.plugin instead; compile_model not on the plugin surface"
        in messages["hooks.py:4"]
    )
    assert "imports core.config" in messages["executor.py:3"]
    assert "import RunResult from core.plugin instead" in messages["executor.py:4"]
    assert len(record.warnings) == 4 and all("docs/writing-a-plugin.md" in w for w in record.warnings)
    # Nothing for the built-in plugins, nor for core's own modules.
    assert not [r.name for r in manager.plugins.values() if r.warnings and r.name != "reaching_plugin"]


def test_core_plugins_prints_a_plugin_s_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_plugin_package(tmp_path, "reaching_plugin", REACHING_PLUGIN)
    completed = subprocess.run(
        [sys.executable, "-m", "core.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(completed.stdout)}
    assert len(rows["reaching_plugin"]["warnings"]) == 4
    assert all(row["warnings"] == [] for name, row in rows.items() if name != "reaching_plugin")


def test_warnings_made_errors_fail_that_plugin_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # python -W error::DeprecationWarning: the reaching plugin fails as an import of it would; the rest load.
    from core.contract.manager import PluginManager

    make_plugin_package(tmp_path, "reaching_plugin", REACHING_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    manager = PluginManager()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        manager.load_entry_points()
    record = manager.plugins["reaching_plugin"]
    assert record.state.value == "failed" and "DeprecationWarning" in (record.error or "")
    assert "imports core.executors.pytorch" in (record.error or "")
    assert manager.plugins["cpu"].state.value == "loaded" and "cpu" in manager.accelerators


def test_a_plugin_module_registered_directly_is_read_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A vendor's own tests register the plugin module (core.testing.registered_plugins): warned there.
    from core.testing import registered_plugins

    make_plugin_package(tmp_path, "reaching_plugin", REACHING_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    module = importlib.import_module("reaching_plugin.hooks")
    with pytest.warns(DeprecationWarning, match="imports core.executors.pytorch") as caught:
        with registered_plugins(module, entry_points=False) as manager:
            assert len(manager.plugins["reaching_plugin.hooks"].warnings) == 4
    assert {Path(w.filename).name for w in caught.list} == {"hooks.py", "executor.py"}


def test_a_plugin_on_the_surface_is_not_warned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_plugin_package(
        tmp_path,
        "polite_plugin",
        {
            "__init__.py": "",
            "hooks.py": "import core\nfrom core import hookimpl, run\nfrom core.plugin import Accelerator\n"
            "from core.testing import run_tiny\nimport core.plugin\n# from core.executors import x (a comment)\n"
            "TEXT = 'import core.config'\n",
        },
    )
    manager, deprecations = load_from(tmp_path, monkeypatch)
    assert manager.plugins["polite_plugin"].state.value == "loaded"
    assert deprecations == [] and manager.plugins["polite_plugin"].warnings == []


# --- vendor knowledge lives in the vendors' plugins ----------------------------------------------

#: vendor SDKs, their distributions and the runtimes they bind: only a plugin may name one
VENDOR_SDKS = re.compile(
    r"pynvml|nvidia-ml-py|amdsmi|poptorch|popart|gcipuinfo|popdist|torch[-_]xla|libtpu|habana", re.I
)


def code_strings_and_names(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every name and string in ``path``'s code: not its comments nor docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(node.lineno, alias.name) for alias in node.names] + [(node.lineno, getattr(node, "module", ""))]
    return found


def test_core_s_code_names_no_vendor_sdk() -> None:
    # The SDK versions a result records, the meters' accelerators, the machines' facts: each vendor's
    # plugin supplies them through a hook (docs/hooks.md), so core can move without knowing vendors.
    named = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for path in sorted((ROOT / "core").rglob("*.py"))
        for line, text in code_strings_and_names(path)
        if text and VENDOR_SDKS.search(text)
    ]
    assert not named, named
