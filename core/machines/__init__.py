"""Machines you do not have: descriptions that let a run or a sweep be checked for them.

A machine profile says what a paper's node was (vendor, device model and count, memory per
device, precisions, host cores, NUMA nodes). ``core sweep FILE --dry-run --machine NAME`` and
``core run ... --dry-run --machine NAME`` plan every run for that machine instead of this host:
placement, precision, memory fit where it is known, and the vendors' own rules, without touching
a device. The profile itself is a plain type (:mod:`core.base.machine`); the profiles of named
machines come from the plugins of their vendors (the ``core_register_machines`` hook), which is
why looking a name up sits here, above the plugin manager; any other machine is a TOML file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from core.base.machine import (
    GIB,
    MAX_DEVICES,
    MAX_HOST_CORES,
    MAX_MEMORY_GIB_PER_DEVICE,
    MAX_NUMA_NODES,
    MachineProfile,
    check_detail,
    detail_type_name,
    find_machine,
)
from core.contract.manager import get_plugin_manager

# Every public name of core.machines.profile, which this package stands for until 0.3 (core/_moved.py).
__all__ = [
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
]


def shipped_machines() -> dict[str, MachineProfile]:
    """The machine profiles the loaded plugins ship (core_register_machines), by name."""
    return get_plugin_manager().machine_profiles()


def machine_names() -> list[str]:
    """The names ``--machine`` takes besides a profile file: the plugins' profiles."""
    return sorted(shipped_machines())


def load_machine(
    name_or_path: str | Path, relative_to: Path | None = None, shipped: Mapping[str, MachineProfile] | None = None
) -> MachineProfile:
    """A shipped profile by name, or one read from a TOML file; ConfigError on the field ``machine``.

    :param relative_to: the folder a relative profile path is read from (a sweep file's own folder,
        so the file works from any working directory); None: the working directory.
    :param shipped: the profiles a name may select; None: those the loaded plugins registered.
    """
    return find_machine(name_or_path, shipped_machines() if shipped is None else shipped, relative_to)
