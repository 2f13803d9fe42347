"""The install is reproducible: every requirement core declares is pinned in constraints.txt."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# Chosen elsewhere on purpose: PyTorch by TORCH_SPEC (a CPU or CUDA build), torch-xla by its own
# environment (it pins one PyTorch release exactly).
NOT_PINNED_HERE = {"torch", "torch-xla"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (NAME==VERSION)"
            pins[_canonical(name)] = version
    return pins


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _canonical(match.group(1))


def test_every_declared_requirement_is_pinned() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements.extend(extra)
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pins = _pins()
    missing = sorted({_requirement_name(r) for r in [*requirements, *build]} - NOT_PINNED_HERE - set(pins))
    assert not missing, f"add exact pins to constraints.txt for: {', '.join(missing)}"


def test_the_setup_script_installs_through_the_constraints() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'CONSTRAINTS="${CORE_CONSTRAINTS:-constraints.txt}"' in setup
    assert '--constraint "$CONSTRAINTS"' in setup
    # The build backend comes from the pinned environment, not a fresh isolated one.
    assert "--no-build-isolation" in setup
    test = (ROOT / "scripts" / "test.sh").read_text()
    assert "./scripts/setup.sh dev" in test


def _installed_name(folder: Path) -> str:
    """The import name a package folder installs as (pyproject's package-dir maps plugins/ to core_plugins)."""
    parts = folder.relative_to(ROOT).parts
    return ".".join(("core_plugins", *parts[1:]) if parts[0] == "plugins" else parts)


def test_the_package_list_names_every_package_folder() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"core_plugins": "plugins"}
    folders = [init.parent for top in ("core", "plugins") for init in (ROOT / top).rglob("__init__.py")]
    assert sorted(setuptools["packages"]) == sorted(_installed_name(folder) for folder in folders)


def test_the_built_in_plugins_install_under_a_namespaced_name() -> None:
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["core"]
    assert {name: target for name, target in entry_points.items() if name != "workloads"} == {
        vendor: f"core_plugins.{vendor}" for vendor in ("cpu", "nvidia", "amd", "graphcore", "xla")
    }
