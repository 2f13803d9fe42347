"""Built-in workloads, registered through the same entry point group as third-party plugins."""

from __future__ import annotations

from typing import Callable

from core.hookspecs import hookimpl
from core.workload import Workload
from core.workloads.fcnn import Fcnn


@hookimpl
def core_register_workloads(register: Callable[[Workload], None]) -> None:
    register(Fcnn())
