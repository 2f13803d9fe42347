"""The plugin author's surface: ``core.plugin`` holds every name a plugin needs, and only it.

The built-in plugins and the worked example are written the way third parties are told to
write theirs (docs/writing-a-plugin.md): they import nothing from core but ``core.plugin``, so
core's internals can move without breaking a plugin.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

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
