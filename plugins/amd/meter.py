"""AMD GPU energy from amdsmi, attributed per physical package.

Each package the run touches is one source of core's DeviceEnergyMeter (component
``package-<n>``):

- its counter is the sum of its GCDs' energy accumulators (ticks x resolution), each unwrapped
  on its own. On MI250/MI250X the primary die reports the whole package and the secondary reads
  0, so the sum is the package whichever die is primary; nothing depends on index parity;
- its power is the sum of the power its reporting GCDs give (``current_socket_power`` where the
  part has it, else ``average_socket_power``; "N/A" is no reading, never 0 W);
- a package of which the run holds only some GCDs is measured whole and flagged in
  ``details["shared_packages"]``: its energy includes what its other GCDs did.

Before the window (in ``create``) every package's counter is validated: read twice
``validation_seconds`` apart and compared with power x time; a counter that is off by more than
``max_counter_ratio`` (10x) either way is not used, and that package is measured by sampling
its power, with the reason recorded. During the window core's meter reads the counters every
10 s besides, so a 32-bit counter (MI100: 65.7 kJ at 15.3 uJ per tick, 110 s at 600 W) cannot
wrap unseen.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from core.plugin import (
    Availability,
    DeviceEnergyMeter,
    DeviceRecord,
    EnergyCounter,
    EnergySource,
    PowerMeter,
    PowerMeterFactory,
    RunConfig,
    RunContext,
    UnavailableMeter,
)

from ..probing import SdkProbe
from . import smi
from .accelerator import PROBE

VALIDATION_SECONDS = 0.25
MAX_COUNTER_RATIO = 10.0
MIN_VALIDATION_JOULES = 0.5  # below this power x time says too little to judge a counter


def run_bdfs(devices: list[DeviceRecord]) -> list[str]:
    """PCI addresses of the GCDs in a run's device records (GCD records or package records)."""
    bdfs: list[str] = []
    for device in devices:
        members = device.details.get("gcds")
        for bdf in [m.get("bdf") for m in members] if isinstance(members, list) else [device.details.get("bdf")]:
            if isinstance(bdf, str) and bdf not in bdfs:
                bdfs.append(bdf)
    return bdfs


def _ticks_in_joules(amdsmi: Any, handle: Any) -> tuple[int, float]:
    """One GCD's energy accumulator: (ticks, joules per tick)."""
    ticks, resolution_uj = smi.energy_ticks(amdsmi, handle)
    return ticks, resolution_uj / 1e6


def _known(gcd: smi.Gcd | None) -> smi.Gcd:
    """A GCD of a package found on the same node: every package lists its own GCDs."""
    if gcd is None:
        raise RuntimeError("amdsmi listed a package whose GCD is not on the node")
    return gcd


@dataclass
class _PackageReader:
    """One package's GCDs: their counters (unwrapped) and power readings."""

    key: str
    amdsmi: Any
    gcds: list[smi.Gcd]
    counters: list[EnergyCounter]  # one per GCD, in ``gcds`` order
    power_keys: dict[str, str]  # bdf -> the power field that GCD reports
    reporting: list[str]  # bdfs whose power counts (the secondary MI250 die reports none)

    @classmethod
    def open(cls, key: str, amdsmi: Any, gcds: list[smi.Gcd]) -> _PackageReader:
        counters = [
            EnergyCounter(functools.partial(_ticks_in_joules, amdsmi, g.handle), range_ticks=1 << g.counter_bits)
            for g in gcds
        ]
        power_keys = {}
        for gcd in gcds:
            try:  # instantaneous where the part reports it (MI300); MI100/MI200 average only
                current = smi.power_watts(amdsmi, gcd.handle, "current_socket_power")
            except Exception:  # noqa: BLE001 - an unreadable field is one the part does not offer
                current = None
            power_keys[gcd.bdf] = "current_socket_power" if current is not None else "average_socket_power"
        return cls(key, amdsmi, gcds, counters, power_keys, [g.bdf for g in gcds])

    def counter_joules(self) -> float:
        return sum(counter.read_joules() for counter in self.counters)

    def die_watts(self, gcd: smi.Gcd) -> float | None:
        return smi.power_watts(self.amdsmi, gcd.handle, self.power_keys[gcd.bdf])

    def die_watts_or_none(self, gcd: smi.Gcd) -> float | None:
        try:
            return self.die_watts(gcd)
        except Exception:  # noqa: BLE001 - for validation an unreadable power is no power
            return None

    def power_watts(self) -> float | None:
        total = 0.0
        for gcd in self.gcds:
            if gcd.bdf in self.reporting:
                watts = self.die_watts(gcd)
                if watts is None:
                    return None  # "N/A" from a die that reports power: no reading, not 0 W
                total += watts
        return total


def _validate(
    readers: list[_PackageReader],
    seconds: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    max_ratio: float,
) -> dict[str, dict[str, Any]]:
    """Read every counter and power twice, ``seconds`` apart; decide which counters to trust."""

    def snapshot() -> tuple[float, dict[str, Any]]:
        now = clock()
        state: dict[str, Any] = {}
        for reader in readers:
            try:
                energy: Any = reader.counter_joules()
            except Exception as exc:  # noqa: BLE001 - a failed read must never become a number
                energy = exc
            state[reader.key] = (
                energy,
                {g.bdf: reader.die_watts_or_none(g) for g in reader.gcds},
                [c.last_ticks for c in reader.counters],
            )
        return now, state

    t0, first = snapshot()
    sleep(seconds)
    t1, second = snapshot()
    verdicts: dict[str, dict[str, Any]] = {}
    for reader in readers:
        (e0, p0, ticks0), (e1, p1, ticks1) = first[reader.key], second[reader.key]
        # A die reports when its counter moved or it shows power; the secondary MI250 die does neither.
        moved = [g.bdf for g, a, b in zip(reader.gcds, ticks0, ticks1) if a is not None and b is not None and b != a]
        shows = [bdf for bdf in p0 if (p0[bdf] or 0) > 0 or (p1[bdf] or 0) > 0]
        reporting = [g.bdf for g in reader.gcds if g.bdf in moved or g.bdf in shows] or [g.bdf for g in reader.gcds]
        reader.reporting = reporting
        verdict: dict[str, Any] = {
            "reporting_gcds": reporting,
            "silent_gcds": [g.bdf for g in reader.gcds if g.bdf not in reporting],
        }
        verdicts[reader.key] = verdict
        if isinstance(e0, Exception) or isinstance(e1, Exception):
            error = e0 if isinstance(e0, Exception) else e1
            verdict.update(use_counter=False, counter=f"unreadable: {smi.describe_error(error)}")
            continue
        watts = [sum(p[b] for b in reporting) for p in (p0, p1) if all(p[b] is not None for b in reporting)]
        measured = e1 - e0
        verdict.update(counter_joules=measured, seconds=t1 - t0)
        if not watts:
            verdict.update(use_counter=True, counter="not validated: power reads N/A")
            continue
        expected = sum(watts) / len(watts) * (t1 - t0)
        verdict["power_x_time_joules"] = expected
        if expected < MIN_VALIDATION_JOULES:
            verdict.update(use_counter=True, counter=f"not validated: power x time is only {expected:.3g} J")
            continue
        ratio = measured / expected
        verdict["ratio"] = ratio
        if ratio > max_ratio or ratio < 1.0 / max_ratio:
            verdict.update(
                use_counter=False,
                counter=(
                    f"rejected: the counter gave {measured:.4g} J in {t1 - t0:.3g} s where power x time gave "
                    f"{expected:.4g} J (ratio {ratio:.3g}, more than {max_ratio:g}x off); power is sampled instead"
                ),
            )
        else:
            verdict.update(use_counter=True, counter=f"validated (counter / power x time = {ratio:.3g})")
    return verdicts


class AmdsmiMeter(DeviceEnergyMeter):
    """core's device meter over amdsmi packages; holds the amdsmi session until close()."""

    def __init__(
        self,
        readers: list[_PackageReader],
        verdicts: dict[str, dict[str, Any]],
        session: Any,
        sample_interval_seconds: float,
        details: dict[str, Any],
        timeline_points: int,
    ) -> None:
        self._session = session
        self._readers = readers
        sources = [
            EnergySource(
                key=r.key,
                counters=tuple(r.counters) if verdicts[r.key]["use_counter"] else (),
                read_power_watts=r.power_watts,
            )
            for r in readers
        ]
        super().__init__(
            "amdsmi",
            sources,
            sample_interval_seconds,
            sample_power=True,
            details=details,
            timeline_points=timeline_points,
        )

    @property
    def poll_seconds(self) -> float | None:
        """How often the window's counters are read (core's poller: no wrap goes unseen)."""
        return self.poll_interval_seconds

    def close(self) -> None:
        try:
            super().close()
        finally:
            session, self._session = self._session, None
            if session is not None:
                session.__exit__(None, None, None)


class AmdsmiMeterFactory(PowerMeterFactory):
    name: ClassVar[str] = "amdsmi"
    description: ClassVar[str] = (
        "AMD GPU energy per physical package from amdsmi's energy counter, validated "
        "against power; sampled power where the counter is off"
    )
    accelerators: ClassVar[tuple[str, ...]] = ("amd",)

    def __init__(
        self,
        probe: SdkProbe = PROBE,
        *,
        validation_seconds: float = VALIDATION_SECONDS,
        max_counter_ratio: float = MAX_COUNTER_RATIO,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        kfd_topology: Any = smi.KFD_TOPOLOGY,
    ) -> None:
        self.probe = probe
        self.validation_seconds = validation_seconds
        self.max_counter_ratio = max_counter_ratio
        self._clock = clock
        self._sleep = sleep
        self._kfd_topology = kfd_topology

    def availability(self) -> Availability:
        # Cheap and import-free: whether libamd_smi.so loads is known only at create().
        reasons = [r for r in self.probe.missing() if r != self.probe.install_hint]
        if importlib.util.find_spec("amdsmi") is None:
            reasons.append(smi.INSTALL_HINT)
        return Availability.no("; ".join(reasons)) if reasons else Availability.yes()

    def meter_for(self, devices: list[DeviceRecord], context: RunContext) -> PowerMeter:
        config = context.config
        session = smi.amdsmi_session()
        try:
            amdsmi = session.__enter__()
        except smi.AmdsmiUnavailable as exc:
            return UnavailableMeter(self.name, str(exc))
        try:
            meter = self._meter(amdsmi, session, devices, config)
        except BaseException:
            session.__exit__(None, None, None)
            raise
        if isinstance(meter, UnavailableMeter):
            session.__exit__(None, None, None)
        return meter

    def _meter(self, amdsmi: Any, session: Any, devices: list[DeviceRecord], config: RunConfig) -> PowerMeter:
        node = smi.discover(amdsmi, self._kfd_topology)
        wanted = run_bdfs(devices)
        unknown = [bdf for bdf in wanted if node.gcd(bdf) is None]
        if not wanted or unknown:
            return UnavailableMeter(
                self.name,
                "the run's devices carry no PCI address amdsmi knows" + (f" ({', '.join(unknown)})" if unknown else ""),
            )
        packages = []
        for bdf in wanted:
            package = node.package_of(bdf)
            if package is None:
                return UnavailableMeter(self.name, f"energy is per package and {node.package_error}")
            if package not in packages:
                packages.append(package)
        readers = [_PackageReader.open(p.key, amdsmi, [node.gcd(b) for b in p.bdfs]) for p in packages]  # type: ignore[misc]
        verdicts = _validate(readers, self.validation_seconds, self._clock, self._sleep, self.max_counter_ratio)
        layout: dict[str, Any] = {}
        shared: dict[str, str] = {}
        for package, reader in zip(packages, readers):
            held = [b for b in package.bdfs if b in wanted]
            others = [b for b in package.bdfs if b not in wanted]
            if others:
                shared[package.key] = (
                    f"the run holds {', '.join(held)} but not {', '.join(others)}: the package's "
                    "energy includes whatever its other GCD(s) did"
                )
            layout[package.key] = {
                "product": _known(node.gcd(package.bdfs[0])).product,
                "gcds": {
                    b: {
                        "hip_index": _known(node.gcd(b)).hip_index,
                        "in_run": b in wanted,
                        "power_field": reader.power_keys[b],
                        "counter_bits": gcd.counter_bits,
                        "counter_resolution_uj": c.joules_per_tick * 1e6 if c.joules_per_tick is not None else None,
                    }
                    for b, gcd, c in zip(package.bdfs, reader.gcds, reader.counters)
                },
                "rule": package.rule,
                **verdicts[package.key],
            }
        details: dict[str, Any] = {
            "attribution": "per physical package (the sum of its GCDs' counters); see shared_packages",
            "packages": layout,
            "shared_packages": shared,
            "validation_seconds": self.validation_seconds,
            "amdsmi_version": node.amdsmi_version,
        }
        counters_off = {key: v["counter"] for key, v in verdicts.items() if not v["use_counter"]}
        if counters_off:
            details["counters_not_used"] = counters_off
        return AmdsmiMeter(
            readers, verdicts, session, config.power_sample_interval_seconds, details, config.power_timeline_points
        )
