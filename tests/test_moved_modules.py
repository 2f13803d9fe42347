"""Modules that moved in 0.2 stay importable at their old paths for a release, with a warning.

Third-party plugins and scripts written before the move imported ``core.results``, ``core.gpu`` or
``plugins.nvidia``; they must keep working, and get the very same module (a second copy would
hold a second plugin registry, a second set of classes).
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import core  # noqa: F401  (installs the finder)
from core._moved import MOVED_MODULES, new_name


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_is_the_moved_module_with_a_warning(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED_MODULES[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED_MODULES[old])


def test_every_old_path_points_at_a_module_that_exists() -> None:
    for new in MOVED_MODULES.values():
        assert importlib.util.find_spec(new) is not None, new


def test_the_old_energy_module_names_resolve_with_a_warning() -> None:
    import core.energy
    from core.energy.meters import DeviceEnergyMeter

    with pytest.warns(DeprecationWarning, match="core.energy.meters.DeviceEnergyMeter"):
        assert core.energy.DeviceEnergyMeter is DeviceEnergyMeter
    with pytest.raises(AttributeError):
        core.energy.NoSuchName  # noqa: B018


def test_the_old_dataset_function_name_resolves_with_a_warning() -> None:
    # The graphcore plugin imported core.data.torch_datasets.make_dataset before core.plugin
    # exported it as torch_dataset; a third-party plugin may have copied that import.
    import core.data.torch_datasets as torch_datasets
    from core.plugin import torch_dataset

    with pytest.warns(DeprecationWarning, match="core.plugin.torch_dataset"):
        assert torch_datasets.make_dataset is torch_dataset
    with pytest.raises(AttributeError):
        torch_datasets.no_such_function  # noqa: B018


def test_the_built_in_plugins_old_package_name_is_the_new_package(tmp_path: Path) -> None:
    # Outside the repository (whose plugins/ folder would be found on the path first).
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import core, core_plugins.nvidia.nvml as new\n"
        "try:\n    import plugins.nvidia.nvml\nexcept DeprecationWarning as warning:\n    print(warning)\n"
        "warnings.simplefilter('ignore')\n"
        "import plugins.nvidia.nvml as old\n"
        "print(old is new)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("plugins moved to core_plugins in core 0.2")
    assert lines[-1] == "True"


def test_another_distributions_plugins_package_is_not_shadowed(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "__init__.py").write_text("OWNER = 'someone else'\n")
    code = "import core, plugins\nprint(plugins.OWNER)\n"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "someone else"


def test_names_that_did_not_move_are_left_alone() -> None:
    # core.config moved (to core.base, the bottom layer); core.api and core.storage.store did not.
    assert new_name("core.api") is None
    assert new_name("core.base.config") is None
    assert new_name("pluginsx") is None
    assert new_name("core.storage.store") is None
    assert new_name("plugins.cpu.rapl") == "core_plugins.cpu.rapl"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("core.api")
        importlib.import_module("core.base.config")


def test_an_old_path_leads_straight_to_where_the_module_lives_now() -> None:
    # core.results moved to core.storage.results in 0.2 and on to core.base.results: one warning
    # naming where it is, not a chain of aliases each warning about a place it has left.
    chained = {old: new for old, new in MOVED_MODULES.items() if new_name(new) is not None}
    assert not chained, f"point these old paths at the module's present place: {chained}"
    sys.modules.pop("core.results", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module("core.results")
    assert [str(w.message).split(";")[0] for w in caught] == ["core.results moved to core.base.results in core 0.2"]


# core.machines.profile was split: the profile type went down to core.base.machine, looking a name up
# among the plugins' profiles stayed above the plugin manager in core.machines, its old path's alias.
MACHINE_PROFILE_NAMES = (
    "GIB",
    "MAX_DEVICES",
    "MAX_HOST_CORES",
    "MAX_MEMORY_GIB_PER_DEVICE",
    "MAX_NUMA_NODES",
    "MachineProfile",
    "check_detail",
    "detail_type_name",
    "load_machine",
    "machine_names",
    "shipped_machines",
)


def test_the_split_machine_profile_module_keeps_every_name_at_its_old_path() -> None:
    from core.base.machine import MachineProfile

    sys.modules.pop("core.machines.profile", None)
    with pytest.warns(DeprecationWarning, match="core.machines.profile moved to core.machines"):
        profile = importlib.import_module("core.machines.profile")
    assert [name for name in MACHINE_PROFILE_NAMES if not hasattr(profile, name)] == []
    assert profile.MachineProfile is MachineProfile
    with pytest.raises(core.ConfigError, match="machine"):
        profile.load_machine("no-such-machine", shipped={})


def test_a_script_written_against_the_paths_before_the_layers_runs(tmp_path: Path) -> None:
    # What a third-party plugin or a user's script imported before core.base existed, in a fresh
    # interpreter: the same classes as the surfaces', each old path warning once.
    code = (
        "import warnings\nwarnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    from core.config import RunConfig\n"
        "    from core.errors import ConfigError\n"
        "    from core import precision\n"
        "    from core.storage.results import RunResult\n"
        "    from core.storage import files\n"
        "    import core.running.distributed as distributed\n"
        "    from core.energy.meter import PowerMeterFactory\n"
        "    from core.contract.gpu import TorchGpuAccelerator\n"
        "    from core.contract.peaks import PeakTable\n"
        "    from core.machines.profile import MachineProfile, load_machine\n"
        "    from core.storage.environment import processor_name\n"
        "    from core.energy.units import watt_hours\n"
        "    from core.storage.epochs import DEFAULT_EPOCH_DEFINITION\n"
        "    from core.deprecation import warn_deprecated\n"
        "import core.plugin as surface\n"
        "same = [RunConfig is surface.RunConfig, ConfigError is surface.ConfigError, RunResult is surface.RunResult,\n"
        "        precision.Precision is surface.Precision, distributed.ProcessContext is surface.ProcessContext,\n"
        "        PowerMeterFactory is surface.PowerMeterFactory, TorchGpuAccelerator is surface.TorchGpuAccelerator,\n"
        "        PeakTable is surface.PeakTable, MachineProfile is surface.MachineProfile,\n"
        "        processor_name is surface.processor_name, files.write_atomically.__module__ == 'core.base.files']\n"
        "print(same.count(True), len(same))\n"
        "print(sorted({str(w.message).split(' moved')[0] for w in caught if w.category is DeprecationWarning}))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr
    same, warned = completed.stdout.splitlines()
    assert same == "11 11"
    assert eval(warned) == sorted(  # noqa: S307 - the list the script printed
        [
            "core.config",
            "core.errors",
            "core.precision",
            "core.storage.results",
            "core.storage.files",
            "core.running.distributed",
            "core.energy.meter",
            "core.contract.gpu",
            "core.contract.peaks",
            "core.machines.profile",
            "core.storage.environment",
            "core.energy.units",
            "core.storage.epochs",
            "core.deprecation",
        ]
    )


ROOT = Path(__file__).resolve().parent.parent
# Files that name old paths on purpose: the table of them, their tests, plugins written against them.
NAMES_OLD_PATHS = {
    "core/_moved.py",
    "tests/test_moved_modules.py",
    "tests/test_plugin_surface.py",
    "tests/test_layers.py",
}


def _old_path(dotted: str) -> str | None:
    """The old module path ``dotted`` (a module, or a name in one) starts with, if any."""
    parts = dotted.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in MOVED_MODULES), None)


def _old_paths_in_python(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"core(\.\w+)+", node.value)
        ):
            names = [node.value]  # monkeypatch.setattr("core.x.y.name", ...), importlib.import_module("core.x")
        else:
            continue
        for old in {_old_path(name) for name in names} - {None}:
            yield node.lineno, str(old)


def test_core_its_plugins_tests_docs_and_scripts_use_the_present_paths() -> None:
    # An old path still works (with a warning), so nothing else would notice a new use of one.
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    old_in_text = re.compile(r"(?<![\w.])(" + "|".join(re.escape(old) for old in MOVED_MODULES) + r")(?![\w])")
    found = []
    for name in sorted(set(tracked) - NAMES_OLD_PATHS - {"docs/changes.md"}):
        path = ROOT / name
        if name.endswith(".py") and path.is_file():
            for line, old in _old_paths_in_python(ast.parse(path.read_text(encoding="utf-8"))):
                found.append(f"{name}:{line}: {old} (now {MOVED_MODULES[old]})")
        elif name.endswith(".md") and path.is_file():
            for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                # A line about core/_moved.py names old paths as examples of what it keeps working.
                for old in [] if "_moved" in text else old_in_text.findall(text):
                    found.append(f"{name}:{line}: {old} (now {MOVED_MODULES[old]})")
    assert not found, "old module paths in use:\n" + "\n".join(found)
