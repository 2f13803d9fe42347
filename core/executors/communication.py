"""The time a training update spends in collectives, as PyTorch's profiler attributes it.

One extra update runs under ``torch.profiler`` after the timed window (outside every timed and
metered span: the profiler slows what it watches). Its collectives are found where the process
group records them:

- on a GPU, the collective kernels on the device's timeline (NCCL's and RCCL's kernels are named
  ``nccl...``): the time the device spent communicating;
- otherwise, the host spans the process group opens around each collective (``gloo:all_reduce``,
  ``nccl:all_reduce``; torch's ``ProcessGroupGloo``/``ProcessGroupNCCL`` record them), which include
  the wait for the slowest peer.

Collectives overlap each other (FSDP prefetches while it reduces) and, on a GPU, computation: the
communication time is the union of their intervals, never more than the update, and the fraction
is that over the profiled update's wall time. It is the process's own: ranks differ (a pipeline's
stages wait on each other), so every rank's figure is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: host spans of a collective, as torch's process groups name them ("gloo:all_reduce")
HOST_COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
#: what a collective kernel's name holds on the device timeline (NCCL's; RCCL keeps the names)
DEVICE_COLLECTIVE_MARK = "nccl"


@dataclass(frozen=True)
class CommunicationProfile:
    """One process's profiled update: its wall time, the union of its collectives' intervals, and
    each kind's count and summed time (summed: overlapping ones count each)."""

    update_seconds: float
    communication_seconds: float
    #: "device kernels" or "host collective spans"
    source: str
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.communication_seconds / self.update_seconds if self.update_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "update_seconds": round(self.update_seconds, 9),
            "communication_seconds": round(self.communication_seconds, 9),
            "fraction": round(self.fraction, 6),
            "source": self.source,
            "collectives": self.collectives,
        }


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals in microseconds, in seconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total / 1e6


def collective_kind(name: str) -> str:
    """``gloo:all_reduce`` -> ``all_reduce``; ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` -> ``AllReduce``."""
    for prefix in HOST_COLLECTIVE_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    parts = name.split("_")
    return parts[1] if len(parts) > 1 and parts[0].lower().startswith(DEVICE_COLLECTIVE_MARK) else name


def profile_update(
    run_update: Callable[[], None], synchronize: Callable[[], None], device: torch.device
) -> CommunicationProfile:
    """Run one update under the profiler and attribute its collectives (see the module docstring)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiler:
        synchronize()
        started = time.perf_counter()
        run_update()
        synchronize()
        wall = time.perf_counter() - started
    events = profiler.events()
    on_device = [
        event
        for event in events
        if event.device_type == DeviceType.CUDA and DEVICE_COLLECTIVE_MARK in event.name.lower()
    ]
    on_host = [event for event in events if event.name.startswith(HOST_COLLECTIVE_PREFIXES)]
    chosen, source = (on_device, "device kernels") if on_device else (on_host, "host collective spans")
    collectives: dict[str, dict[str, float]] = {}
    for event in chosen:
        kind = collectives.setdefault(collective_kind(event.name), {"count": 0, "seconds": 0.0})
        kind["count"] += 1
        kind["seconds"] += (event.time_range.end - event.time_range.start) / 1e6
    for kind in collectives.values():
        kind["seconds"] = round(kind["seconds"], 9)
    busy = union_seconds([(event.time_range.start, event.time_range.end) for event in chosen])
    # The profiler's clock and the wall clock differ by its overhead: never more than the update.
    return CommunicationProfile(wall, min(busy, wall), source, collectives)
