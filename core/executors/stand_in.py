"""The CPU standing in for a device type this host lacks, in core's PyTorch executors.

``core.testing.run_on_cpu_as("hpu")`` turns it on for a plugin's tests: a
:class:`~core.executors.pytorch.TorchPlacement` on an ``hpu`` device is placed on the CPU, and a
``torch.compile`` backend this host does not have (Gaudi's ``hpu_backend``) is replaced by one that
compiles nothing, while every hook of the plugin's placement is still called where the real device
would have it called. So a vendor's tests run core's own training loop, not a copy of it. Off (the
default), each function here returns what it was given after one comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CpuStandIn:
    """What ran on the CPU in place of ``device_type``, for a test to look at."""

    device_type: str
    #: the placements' device strings that were placed on the CPU instead ("hpu:0")
    placed: list[str] = field(default_factory=list)
    #: the torch.compile backends asked for, by name, in order
    compile_backends: list[str] = field(default_factory=list)
    #: graphs a stand-in backend was handed (Dynamo traced the model and called "the compiler")
    graphs_compiled: int = 0


_active: CpuStandIn | None = None


def activate(stand_in: CpuStandIn | None) -> CpuStandIn | None:
    """Make ``stand_in`` the one in force (None: none); returns the previous one."""
    global _active
    previous, _active = _active, stand_in
    return previous


def device_for(device: str) -> str:
    """The device to place on: ``device``, or "cpu" where the CPU stands in for its type."""
    if _active is None or device.split(":", 1)[0] != _active.device_type:
        return device
    _active.placed.append(device)
    return "cpu"


def compile_backend_for(backend: str | Callable[..., Any]) -> str | Callable[..., Any]:
    """The backend to hand torch.compile: ``backend``, or where the CPU stands in and the name is
    not one Dynamo knows here, a backend that runs the traced graph as it is and counts it."""
    stand_in = _active
    if stand_in is None or not isinstance(backend, str):
        return backend
    stand_in.compile_backends.append(backend)
    from torch._dynamo import list_backends

    if backend in list_backends(exclude_tags=()):
        return backend

    def compiles_nothing(graph: Any, example_inputs: Any) -> Callable[..., Any]:
        stand_in.graphs_compiled += 1
        return graph.forward

    return compiles_nothing
