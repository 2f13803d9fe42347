"""How busy the host is: its load average and the CPU time a hypervisor steals, read from /proc at
the timed window's two ends (Linux; where /proc lacks them the figures stay None).

A cell whose repeats disagree is often a cell that shared its host: a load average above the CPU
count (tasks waiting for a CPU) or stolen time (a virtual machine whose host lent its CPUs to other
guests) says so, and the report says it beside the flag.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from core.base.results import HostLoad

PROC = Path("/proc")
# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice, in ticks.
# guest and guest_nice are already counted in user and nice, so the total is the first eight.
_STEAL_FIELD = 7
_COUNTED_FIELDS = 8


@dataclass(frozen=True)
class HostSample:
    """One reading of /proc: the 1-minute load average and the CPU time counters (ticks)."""

    load_average: float | None
    steal_ticks: int | None
    total_ticks: int | None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _load_average(text: str | None) -> float | None:
    try:
        return float(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def _cpu_ticks(text: str | None) -> tuple[int | None, int | None]:
    """(steal, total) of /proc/stat's first line, all CPUs together; None where it lacks them."""
    first = (text or "").splitlines()[:1]
    fields = first[0].split() if first else []
    if not fields or fields[0] != "cpu":
        return None, None
    try:
        ticks = [int(value) for value in fields[1 : 1 + _COUNTED_FIELDS]]
    except ValueError:
        return None, None
    if len(ticks) <= _STEAL_FIELD:  # kernels before 2.6.11 had no steal column
        return None, sum(ticks)
    return ticks[_STEAL_FIELD], sum(ticks)


def sample_host(proc: Path = PROC) -> HostSample:
    """The host now: never raises (a host without /proc has None figures)."""
    steal, total = _cpu_ticks(_read(proc / "stat"))
    return HostSample(_load_average(_read(proc / "loadavg")), steal, total)


def host_load(start: HostSample, end: HostSample, cpu_count: int | None = None) -> HostLoad | None:
    """What the two readings say about the span between them; None where neither read anything."""
    steal = None
    if None not in (start.steal_ticks, end.steal_ticks, start.total_ticks, end.total_ticks):
        elapsed = end.total_ticks - start.total_ticks  # type: ignore[operator]
        stolen = end.steal_ticks - start.steal_ticks  # type: ignore[operator]
        steal = min(max(stolen / elapsed, 0.0), 1.0) if elapsed > 0 else 0.0
    if start.load_average is None and end.load_average is None and steal is None:
        return None
    return HostLoad(
        cpu_count=cpu_count if cpu_count is not None else os.cpu_count(),
        load_average_start=start.load_average,
        load_average_end=end.load_average,
        steal_fraction=steal,
    )
