"""Modules that moved in 0.2 stay importable at their old paths for a release, with a warning.

Third-party plugins and scripts written before the move imported ``core.results``, ``core.gpu`` or
``plugins.nvidia``; they must keep working, and get the very same module (a second copy would
hold a second plugin registry, a second set of classes).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
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
    assert new_name("core.config") is None
    assert new_name("pluginsx") is None
    assert new_name("core.storage.store") is None
    assert new_name("plugins.cpu.rapl") == "core_plugins.cpu.rapl"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("core.config")
