"""Where a roofline's roofs come from: the run's datasheet figures, a machine profile's (a paper's
table), or those measured on the run's host (``core roofs``), as ``core report --roofs`` chooses.

``auto`` (the default) takes, for each cell, the first source that has both roofs:

1. **measured** on the cell's own host and device: what that machine did, not what its model
   should do (a CPU that no datasheet names has no other figures);
2. **datasheet**: the vendor's figures, the ones each run's MFU is computed against, so the
   roofline and the tables agree;
3. **machine**: a shipped profile of the same device model: a paper's own figures for its node,
   which describe someone else's machine, so they come last (ask for them with ``--roofs machine``
   to draw a paper's roofline as the paper did).

An explicit source is the only one used: a cell it has no figures for is left off the roofline,
and the report says why. Every roof says where it came from.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace

from core.base.machine import MachineProfile
from core.base.results import RunResult
from core.base.roofs import MeasuredRoofs, RoofSource, parse_roofs_option
from core.roofs.names import compute_dtype_of
from core.storage.summary import CellSummary

#: The accelerator whose device is the host processor: the only one the report probes on demand
#: (``--roofs measured``), on torch's "cpu" device. Others are measured with ``core roofs``.
HOST_PROCESSOR_ACCELERATOR = "cpu"
#: probed on demand: core's own precisions, whose compute dtypes the probe measures where torch runs them
PROBED_PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class RoofRequest:
    """What the report's rooflines are drawn from."""

    source: RoofSource = RoofSource.auto
    profiles: tuple[MachineProfile, ...] = ()  # those a cell's device is matched against (with roofs)
    chosen_profile: MachineProfile | None = None  # machine:NAME: used for every cell of its accelerator
    measured: tuple[MeasuredRoofs, ...] = ()  # from the databases (core roofs recorded them)
    # This host's cache is read for its own CPU cells (auto, measured); with --roofs measured, a
    # probe runs where the cache has none, so a roofline draws on any CPU.
    probe_here: bool = False
    notes: list[str] = field(default_factory=list, compare=False)  # probes run, caches ignored
    _here: dict[str, MeasuredRoofs | None] = field(default_factory=dict, compare=False)

    def this_host(self, cell: CellSummary, result: RunResult, model: str) -> MeasuredRoofs | None:
        """This host's measured roofs of ``model`` where the cell ran here on its processor: the
        cache's, else (``probe_here``) probed now, once per report."""
        here = result.environment is not None and result.environment.hostname == socket.gethostname()
        if self.source not in (RoofSource.auto, RoofSource.measured) or not here:
            return None
        if str(cell.config.accelerator) != HOST_PROCESSOR_ACCELERATOR:
            return None
        if model not in self._here:
            self._here[model] = self._look_here(model)
        return self._here[model]

    def _look_here(self, model: str) -> MeasuredRoofs | None:
        from core.roofs import host_key, host_roofs
        from core.roofs.cache import load_cached

        if not self.probe_here:
            cached, warnings = load_cached(host_key(model))
            self.notes.extend(warnings)
            return cached
        found = host_roofs(HOST_PROCESSOR_ACCELERATOR, model, PROBED_PRECISIONS)
        self.notes.extend(found.warnings)
        if not found.cached:
            self.notes.append(
                f"measured this host's roofs for {model} now ({found.roofs.probe_seconds:.1f} s; cached for later "
                "reports; `core roofs` records them in a database)"
            )
        return found.roofs


_request: ContextVar[RoofRequest | None] = ContextVar("roof_request", default=None)


@contextmanager
def roofs_in_force(request: RoofRequest) -> Iterator[None]:
    """The request the rooflines of a report being built use (the report's sections take no options)."""
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


def make_request(source: RoofSource = RoofSource.auto, chosen_profile: MachineProfile | None = None) -> RoofRequest:
    """A request matching cells against the loaded plugins' profiles that have roofs; ``--roofs
    measured`` probes this host where nothing measured it yet."""
    from core.machines import shipped_machines

    profiles = tuple(profile for profile in shipped_machines().values() if profile.roofs is not None)
    return RoofRequest(source, profiles, chosen_profile, probe_here=source is RoofSource.measured)


def roof_request(option: str) -> RoofRequest:
    """The request ``--roofs OPTION`` asks for; ValueError, or ConfigError for an unknown profile."""
    try:
        source, machine = parse_roofs_option(option)
    except ValueError as problem:
        raise ValueError(f"--roofs {option!r}: {problem}") from None
    if machine is None:
        return make_request(source)
    from core.machines import load_machine

    profile = load_machine(machine)
    if profile.roofs is None:
        raise ValueError(f"--roofs {option}: machine profile {profile.name} has no roofs (its [roofs] table)")
    return make_request(source, profile)


def with_measured(request: RoofRequest, measured: Iterable[Iterable[MeasuredRoofs]]) -> RoofRequest:
    """``request`` with the measured records of each database added."""
    return replace(request, measured=request.measured + tuple(roofs for each in measured for roofs in each))


def request_in_force() -> RoofRequest:
    """The report's request; outside one, auto with the loaded plugins' profiles and nothing measured."""
    request = _request.get()
    return make_request() if request is None else request


# --- the figures of one cell, from each source ------------------------------------------------------


@dataclass(frozen=True)
class CellRoofs:
    """A cell's roofs from one source, summed over the devices it used."""

    peak_flops_per_second: float
    bandwidth_bytes_per_second: float
    memory: str
    flops_source: str
    bandwidth_source: str
    origin: str  # "datasheet", "machine profile t4", "measured on host h on 2026-05-01"
    caches_bytes_per_second: tuple[tuple[str, float], ...] = ()


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def first_result(cell: CellSummary) -> RunResult | None:
    return next(iter(cell.ok_results), None)


def device_model(result: RunResult) -> str | None:
    """The one device model a run used; None where it used none or several models."""
    names = {device.name for device in result.devices}
    return next(iter(names)) if len(names) == 1 else None


def _tokens(name: str) -> set[str]:
    return set(name.casefold().split())


def same_model(one: str, other: str) -> bool:
    """Names of one device model, as a profile and a driver spell it ("NVIDIA Tesla T4", "Tesla T4"):
    the words of one are all among the other's."""
    first, second = _tokens(one), _tokens(other)
    return bool(first) and bool(second) and (first <= second or second <= first)


def datasheet_roofs(cell: CellSummary) -> CellRoofs | None:
    """The figures the run recorded (its accelerator's datasheet, or a CPU's derivation)."""
    result = next(
        (
            r
            for r in cell.ok_results
            if _positive(r.peak_flops_per_second) and _positive(r.memory_bandwidth_bytes_per_second)
        ),
        None,
    )
    if result is None or result.peak_flops_per_second is None or result.memory_bandwidth_bytes_per_second is None:
        return None
    return CellRoofs(
        peak_flops_per_second=result.peak_flops_per_second,
        bandwidth_bytes_per_second=result.memory_bandwidth_bytes_per_second,
        memory=result.memory_kind or "memory",
        flops_source=f"datasheet: {result.peak_flops_source or 'the accelerator plugin'}",
        bandwidth_source=f"datasheet: {result.memory_bandwidth_source or 'the accelerator plugin'}",
        origin="datasheet",
        caches_bytes_per_second=tuple(
            (name, value)
            for name, value in sorted(result.cache_bandwidths_bytes_per_second.items())
            if _positive(value)
        ),
    )


def _profile_for(cell: CellSummary, result: RunResult, request: RoofRequest) -> MachineProfile | None:
    if request.chosen_profile is not None:
        same_accelerator = request.chosen_profile.accelerator == str(cell.config.accelerator)
        return request.chosen_profile if same_accelerator else None
    model = device_model(result)
    if model is None:
        return None
    return next((p for p in sorted(request.profiles, key=lambda p: p.name) if same_model(p.device, model)), None)


def machine_roofs(cell: CellSummary, request: RoofRequest) -> CellRoofs | None:
    """A machine profile's per-device figures times the devices the cell used."""
    result = first_result(cell)
    if result is None or not result.devices:
        return None
    profile = _profile_for(cell, result, request)
    roofs = None if profile is None else profile.roofs
    if profile is None or roofs is None:
        return None
    peak = roofs.peak_for(str(cell.option("precision")))
    bandwidth = roofs.memory_bandwidth_bytes_per_second
    if peak is None or bandwidth is None:
        return None
    devices = len(result.devices)
    where = f"machine profile {profile.name}: {roofs.source}" + (f", x {devices} devices" if devices > 1 else "")
    return CellRoofs(peak * devices, bandwidth * devices, roofs.memory, where, where, f"machine profile {profile.name}")


def measured_for(cell: CellSummary, request: RoofRequest) -> MeasuredRoofs | None:
    """The latest record measured on the cell's host for its device model: the databases', else
    this host's own (see :meth:`RoofRequest.this_host`)."""
    result = first_result(cell)
    model = None if result is None else device_model(result)
    if result is None or result.environment is None or model is None:
        return None
    hostname = result.environment.hostname
    found = [roofs for roofs in request.measured if roofs.host == hostname and roofs.device == model]
    latest = max(found, key=lambda roofs: roofs.measured_at, default=None)
    return latest if latest is not None else request.this_host(cell, result, model)


def measured_roofs(cell: CellSummary, request: RoofRequest) -> CellRoofs | None:
    roofs = measured_for(cell, request)
    result = first_result(cell)
    dtype = compute_dtype_of(str(cell.option("precision")))
    peak = None if roofs is None or dtype is None else roofs.peak_flops_per_second.get(dtype)
    if roofs is None or result is None or peak is None:
        return None
    devices = len(result.devices)
    times = f", x {devices} devices" if devices > 1 else ""
    flops = f"{roofs.label}: {dtype} matmul peak{times} ({roofs.method}; probe {roofs.probe_seconds:.1f} s)"
    bandwidth = f"{roofs.label}: STREAM-like triad{times} ({roofs.method})"
    return CellRoofs(
        peak * devices,
        roofs.memory_bandwidth_bytes_per_second * devices,
        "memory, triad",
        flops,
        bandwidth,
        roofs.label,
    )


_ORDER = {
    RoofSource.auto: (RoofSource.measured, RoofSource.datasheet, RoofSource.machine),
    RoofSource.datasheet: (RoofSource.datasheet,),
    RoofSource.machine: (RoofSource.machine,),
    RoofSource.measured: (RoofSource.measured,),
}


def cell_roofs(cell: CellSummary, request: RoofRequest) -> CellRoofs | None:
    """The cell's roofs from the first source of the request's order that has both."""
    for source in _ORDER[request.source]:
        if source is RoofSource.measured:
            found = measured_roofs(cell, request)
        elif source is RoofSource.machine:
            found = machine_roofs(cell, request)
        else:
            found = datasheet_roofs(cell)
        if found is not None:
            return found
    return None


def why_no_roofs(cells: Sequence[CellSummary], request: RoofRequest) -> str:
    """Why no cell got roofs from the request's sources, in the report's words."""
    results = [result for cell in cells if (result := first_result(cell)) is not None]
    hosts = sorted({result.environment.hostname for result in results if result.environment is not None})
    devices = ", ".join(sorted({model for result in results if (model := device_model(result))})) or "these devices"
    on = f"{devices} on host {', '.join(hosts) or 'unknown'}"
    measure = "measure them there with `core roofs` and report with --roofs measured (or auto)"
    if request.source is RoofSource.measured:
        return f"no measured roofs for {on} in the databases or this host's cache: {measure}"
    if request.source is RoofSource.machine:
        if request.chosen_profile is not None:
            return (
                f"machine profile {request.chosen_profile.name} has no roofs for these cells' accelerator and precision"
            )
        return f"no shipped machine profile with roofs names {devices} (give one: --roofs machine:FILE.toml)"
    if not any(_positive(cell.peak_flops_per_second) for cell in cells):
        return f"no peak FLOP/s is known for {on} (no datasheet figure for it); {measure}"
    if results and all(_older_than_roofs(result.schema_version) for result in results):
        return f"no memory bandwidth is recorded: these results were written before schema 1.6; {measure}"
    return f"no memory bandwidth is known for {on} (no datasheet figure for it); {measure}"


def _older_than_roofs(version: str) -> bool:
    major, _, minor = version.partition(".")
    return major.isdigit() and minor.isdigit() and (int(major), int(minor)) < (1, 6)
