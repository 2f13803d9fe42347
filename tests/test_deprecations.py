"""Compatibility kept for code written against older releases goes when it promised to.

Every ``DeprecationWarning`` core raises goes through ``core.base.deprecation.warn_deprecated`` with the
release that removes what it warns about; this test reads core's version from pyproject.toml and
fails once that release is reached with the shim still in core's sources (the 0.1 module paths of
core/_moved.py, the 0.1 and 0.2 forms of the plugin methods, the old names of core.energy and
core.data.torch_datasets).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.base.deprecation import REMOVED_IN

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core"


@dataclass(frozen=True)
class Shim:
    path: str
    line: int
    removed_in: str | None  # None: a warning no release removes (a plugin importing core's internals)


def release(version: str) -> tuple[int, ...]:
    """``0.2.0`` -> (0, 2, 0); a pre-release (``0.3.0rc1``) counts as its release."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def core_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"])


def _removed_in(call: ast.Call, constants: dict[str, str]) -> str | None:
    (keyword,) = [k for k in call.keywords if k.arg == "removed_in"]  # required by its signature
    value = keyword.value
    if isinstance(value, ast.Constant):
        assert value.value is None or isinstance(value.value, str)
        return value.value
    assert isinstance(value, ast.Name) and value.id in constants, ast.dump(value)
    return constants[value.id]


_WARNERS = ("warn_deprecated", "warn_deprecated_at")


@functools.cache
def shims() -> list[Shim]:
    """Every call of warn_deprecated / warn_deprecated_at in core's sources, with its release, and
    every DeprecationWarning a built-in plugin raises (it imports core.plugin only), with the
    release its message names."""
    constants = {"REMOVED_IN": REMOVED_IN}
    found = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in _WARNERS:
                found.append(Shim(path.relative_to(ROOT).as_posix(), node.lineno, _removed_in(node, constants)))
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and any(
                getattr(arg, "id", None) == "DeprecationWarning" for arg in node.args
            ):
                strings = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                named = re.search(r"removed in core (\d+\.\d+)", " ".join(strings))
                assert named, f"{path.relative_to(ROOT)}:{node.lineno}: a deprecation says 'removed in core X.Y'"
                found.append(Shim(path.relative_to(ROOT).as_posix(), node.lineno, named.group(1)))
    return found


def due(version: str) -> list[Shim]:
    return [s for s in shims() if s.removed_in is not None and release(version) >= release(s.removed_in)]


def test_no_compatibility_shim_outlives_its_release() -> None:
    version = core_version()
    overdue = due(version)
    assert not overdue, f"core is {version}: remove these shims, and what they keep working, as promised: " + ", ".join(
        f"{s.path}:{s.line} (removed in {s.removed_in})" for s in overdue
    )


def test_in_0_3_the_0_1_shims_are_overdue() -> None:
    # What the test above will say when pyproject.toml reaches 0.3 with the shims still here.
    overdue = {shim.path for shim in due("0.3.0")}
    assert {
        "core/_moved.py",  # core.results, core.gpu, plugins.nvidia, ...
        "core/contract/context.py",  # create_executor, validate, create, max_replicas, devices_for, reads
        "core/energy/__init__.py",  # core.energy.DeviceEnergyMeter
        "core/data/torch_datasets.py",  # make_dataset
    } <= overdue
    assert not due("0.2.9")
    assert "plugins/graphcore/accelerator.py" in {shim.path for shim in due("0.4")}  # pipeline_split_points


@pytest.mark.parametrize("version,expected", [("0.2.0", (0, 2, 0)), ("0.3", (0, 3)), ("0.3.0rc1", (0, 3, 0))])
def test_versions_compare_as_releases(version: str, expected: tuple[int, ...]) -> None:
    assert release(version) == expected


def test_every_deprecation_in_core_names_its_release() -> None:
    # A DeprecationWarning raised any other way would escape the version check above.
    elsewhere = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(CORE.rglob("*.py"))
        if path != CORE / "base" / "deprecation.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Name) and node.id == "DeprecationWarning"
    ]
    assert not elsewhere, f"raise these through core.base.deprecation.warn_deprecated(..., removed_in=...): {elsewhere}"


def old_forms_still_there() -> list[str]:
    """The older forms of the plugin methods that the base classes still carry, and the old module
    paths: what removing the 0.3 shims means beyond the warnings themselves."""
    import importlib.util

    from core.contract.context import ACCELERATOR_OLD_FORMS, METER_OLD_FORMS
    from core.plugin import Accelerator, PowerMeterFactory, TorchGpuAccelerator

    present = [
        f"{base.__name__}.{old}"
        for base, forms in (
            (Accelerator, ACCELERATOR_OLD_FORMS),
            (TorchGpuAccelerator, ACCELERATOR_OLD_FORMS),
            (PowerMeterFactory, METER_OLD_FORMS),
        )
        for _, old in forms
        if old in vars(base)
    ]
    return present + (["core._moved"] if importlib.util.find_spec("core._moved") else [])


def test_the_old_forms_go_with_their_warnings() -> None:
    present = old_forms_still_there()
    if release(core_version()) >= release(REMOVED_IN):
        assert not present, f"core is {core_version()}: remove {present} (see ACCELERATOR_OLD_FORMS, METER_OLD_FORMS)"
    else:  # what 0.3 removes
        assert {"Accelerator.create_executor", "Accelerator.max_replicas", "PowerMeterFactory.reads"} <= set(present)
        assert {"TorchGpuAccelerator.configure_torch", "TorchGpuAccelerator.devices_for", "core._moved"} <= set(present)
