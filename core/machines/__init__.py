"""Machines you do not have: descriptions that let a run or a sweep be checked for them.

A machine profile says what a paper's node was (vendor, device model and count, memory per
device, precisions, host cores, NUMA nodes). ``core sweep FILE --dry-run --machine NAME`` and
``core run ... --dry-run --machine NAME`` plan every run for that machine instead of this host:
placement, precision, memory fit where it is known, and the vendors' own rules, without touching
a device (see :mod:`core.machines.profile`). The profiles of named machines come from the plugins
of their vendors (the ``core_register_machines`` hook); any other machine is a TOML file.
"""

from core.machines.profile import MachineProfile, load_machine, machine_names

__all__ = ["MachineProfile", "load_machine", "machine_names"]
