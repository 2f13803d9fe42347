"""The host CPU's peak FLOP/s and memory bandwidth: derived from what the machine says of itself.

No datasheet names "the CPU this run used" (a cloud VM may call it just "AMD EPYC"), so the figures
are derivations, and each result's source says how it was derived:

- **FLOP/s** = physical cores usable by the run x FMA units per core x fp32 lanes per unit x 2
  (an FMA is two FLOPs) x clock. Cores are the distinct (socket, core) pairs of /proc/cpuinfo
  among the CPUs this process may run on; the clock is cpufreq's ``cpuinfo_max_freq`` or, where
  there is none (virtual machines), /proc/cpuinfo's ``cpu MHz``. The lanes and units come from
  :data:`MICROARCHITECTURES` where the CPU's family and model are listed (AMD's Zen 4 accepts
  AVX-512 but executes it on 256-bit datapaths, which no flag shows); otherwise from the widest
  vector extension in the flags (avx512f: 16 lanes, avx2: 8, else 4) with 2 FMA units assumed.
- **bf16/fp16**: twice the fp32 rate where the ISA has native dot products (``avx512_bf16``,
  ``avx512_fp16``: two 16-bit products per fp32 lane), else the fp32 rate (the frameworks widen
  16-bit values to fp32 lanes). CPUs with AMX tiles get no 16-bit peak: their tile rate is not
  modelled, and an MFU against the vector rate could pass 100 %.
- **Memory bandwidth** = memory channels x transfer rate (MT/s) x 8 bytes per transfer, per
  socket, from the platform's datasheet (:data:`MICROARCHITECTURES`); unknown elsewhere. It is
  the socket's: a virtual machine given a few of its cores shares it with the rest.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from core.plugin import GIGA, MemoryBandwidth, Precision

CPUINFO = "/proc/cpuinfo"
MAX_FREQUENCY = "/sys/devices/system/cpu/cpu{cpu}/cpufreq/cpuinfo_max_freq"  # kHz
BYTES_PER_TRANSFER = 8  # a DDR channel is 64 bits wide
FLOPS_PER_FMA = 2
ASSUMED_FMA_UNITS = 2


@dataclass(frozen=True)
class Microarchitecture:
    """A server CPU generation: its FMA datapaths and its platform's memory, with the sources."""

    name: str
    vendor: str  # /proc/cpuinfo vendor_id
    family: int
    models: range
    fma_units: int  # per core
    fma_bits: int  # width of one FMA unit's datapath
    core_source: str
    memory_channels: int  # per socket
    transfers_per_second_millions: int  # MT/s of the fastest memory the platform supports
    memory: str
    memory_source: str

    @property
    def bandwidth_bytes_per_second(self) -> float:
        return self.memory_channels * self.transfers_per_second_millions * 1e6 * BYTES_PER_TRANSFER


MICROARCHITECTURES = (
    Microarchitecture(
        "AMD Zen 4 (EPYC 9004, Genoa)",
        "AuthenticAMD",
        25,
        range(0x10, 0x20),
        fma_units=2,
        fma_bits=256,
        core_source="AMD, '4th Gen AMD EPYC Processor Architecture' white paper (2022): two 256-bit FMA "
        "pipes per core; 512-bit AVX-512 instructions run over them in two halves",
        memory_channels=12,
        transfers_per_second_millions=4800,
        memory="DDR5-4800, 12 channels per socket",
        memory_source="AMD EPYC 9004 Series data sheet: 12 channels of DDR5-4800 per socket",
    ),
    Microarchitecture(
        "AMD Zen 3 (EPYC 7003, Milan)",
        "AuthenticAMD",
        25,
        range(0x00, 0x10),
        fma_units=2,
        fma_bits=256,
        core_source="AMD, Zen 3 core: two 256-bit FMA pipes (Software Optimization Guide for AMD Family 19h)",
        memory_channels=8,
        transfers_per_second_millions=3200,
        memory="DDR4-3200, 8 channels per socket",
        memory_source="AMD EPYC 7003 Series data sheet: 8 channels of DDR4-3200 per socket",
    ),
    Microarchitecture(
        "AMD Zen 2 (EPYC 7002, Rome)",
        "AuthenticAMD",
        23,
        range(0x30, 0x40),
        fma_units=2,
        fma_bits=256,
        core_source="AMD, Zen 2 core: two 256-bit FMA pipes (Software Optimization Guide for AMD Family 17h "
        "Models 30h and Greater)",
        memory_channels=8,
        transfers_per_second_millions=3200,
        memory="DDR4-3200, 8 channels per socket",
        memory_source="AMD EPYC 7002 Series data sheet: 8 channels of DDR4-3200 per socket",
    ),
    Microarchitecture(
        "Intel Sapphire Rapids (4th Gen Xeon Scalable)",
        "GenuineIntel",
        6,
        range(0x8F, 0x90),
        fma_units=2,
        fma_bits=512,
        core_source="Intel 64 and IA-32 Architectures Optimization Reference Manual: Golden Cove server "
        "core, two 512-bit FMA units",
        memory_channels=8,
        transfers_per_second_millions=4800,
        memory="DDR5-4800, 8 channels per socket",
        memory_source="Intel ARK, 4th Gen Xeon Scalable (e.g. Platinum 8480+): 8 memory channels, DDR5-4800",
    ),
    Microarchitecture(
        "Intel Ice Lake-SP (3rd Gen Xeon Scalable)",
        "GenuineIntel",
        6,
        range(0x6A, 0x6B),
        fma_units=2,
        fma_bits=512,
        core_source="Intel ARK, 3rd Gen Xeon Scalable (e.g. Platinum 8380): 2 AVX-512 FMA units",
        memory_channels=8,
        transfers_per_second_millions=3200,
        memory="DDR4-3200, 8 channels per socket",
        memory_source="Intel ARK, 3rd Gen Xeon Scalable (e.g. Platinum 8380): 8 memory channels, DDR4-3200",
    ),
)


@dataclass(frozen=True)
class CpuFacts:
    """What the machine says of its processor: /proc/cpuinfo for the CPUs this process may use."""

    vendor: str
    family: int | None
    model: int | None
    model_name: str
    flags: frozenset[str]
    cores: int  # physical cores among the usable CPUs
    sockets: int
    clock_hertz: float | None
    clock_source: str

    @property
    def microarchitecture(self) -> Microarchitecture | None:
        return next(
            (
                arch
                for arch in MICROARCHITECTURES
                if arch.vendor == self.vendor and arch.family == self.family and self.model in arch.models
            ),
            None,
        )


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def parse_cpuinfo(text: str, usable: Iterable[int], max_frequency_khz: float | None = None) -> CpuFacts | None:
    """The facts of /proc/cpuinfo ``text`` for the CPUs numbered in ``usable``; None where it lists
    none of them. ``max_frequency_khz``: cpufreq's, where the kernel has it."""
    wanted = set(usable)
    processors = []
    for block in re.split(r"\n\s*\n", text):
        fields = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        number = _int(fields.get("processor"))
        if number is not None and number in wanted:
            processors.append(fields)
    if not processors:
        return None
    first = processors[0]
    cores = {
        (fields.get("physical id", "0"), fields.get("core id", str(index))) for index, fields in enumerate(processors)
    }
    sockets = {fields.get("physical id", "0") for fields in processors}
    clock: float | None
    if max_frequency_khz:
        clock, clock_source = max_frequency_khz * 1e3, "cpufreq cpuinfo_max_freq"
    else:
        megahertz = first.get("cpu MHz")
        try:
            clock = float(megahertz) * 1e6 if megahertz else None
        except ValueError:
            clock = None
        clock_source = (
            "/proc/cpuinfo 'cpu MHz' (no cpufreq: the nominal clock a virtual machine reports; boost clocks are "
            "higher, so this peak can be below what the cores achieve)"
        )
    return CpuFacts(
        vendor=first.get("vendor_id", ""),
        family=_int(first.get("cpu family")),
        model=_int(first.get("model")),
        model_name=first.get("model name", ""),
        flags=frozenset(first.get("flags", "").split()),
        cores=len(cores),
        sockets=len(sockets),
        clock_hertz=clock,
        clock_source=clock_source,
    )


def _fma_lanes(facts: CpuFacts) -> tuple[int, int, str]:
    """(FMA units per core, fp32 lanes per unit, where they come from)."""
    arch = facts.microarchitecture
    if arch is not None:
        return arch.fma_units, arch.fma_bits // 32, f"{arch.name}: {arch.core_source}"
    bits = 512 if "avx512f" in facts.flags else 256 if "avx2" in facts.flags else 128
    widest = {512: "avx512f", 256: "avx2", 128: "no avx2"}[bits]
    return (
        ASSUMED_FMA_UNITS,
        bits // 32,
        f"{bits}-bit vectors ({widest} in /proc/cpuinfo flags), {ASSUMED_FMA_UNITS} FMA units per core assumed "
        "(the microarchitecture is not in core's table)",
    )


def _sixteen_bit_factor(facts: CpuFacts, precision: Precision) -> tuple[float, str] | None:
    """The 16-bit rate as a multiple of fp32's, and why; None where it is not modelled (AMX)."""
    native = {Precision.bf16: "avx512_bf16", Precision.fp16: "avx512_fp16"}[precision]
    if any(flag.startswith("amx") for flag in facts.flags):
        return None
    if native in facts.flags:
        return 2.0, f"{native}: two 16-bit products per fp32 lane"
    return 1.0, f"no {native}: {precision.value} is computed in fp32 lanes"


def derive_peak(facts: CpuFacts, precision: Precision) -> tuple[float, str] | None:
    """(peak FLOP/s, derivation) of the usable cores at ``precision``; None where it cannot be derived."""
    if facts.clock_hertz is None or facts.cores < 1 or precision is Precision.tf32:
        return None
    units, lanes, lanes_source = _fma_lanes(facts)
    factor, factor_source = 1.0, ""
    if precision in (Precision.bf16, Precision.fp16):
        sixteen = _sixteen_bit_factor(facts, precision)
        if sixteen is None:
            return None
        factor, factor_source = sixteen[0], f"; x {sixteen[0]:g} for {precision.value} ({sixteen[1]})"
    flops = facts.cores * units * lanes * FLOPS_PER_FMA * facts.clock_hertz * factor
    derivation = (
        f"derived: {facts.cores} cores x {units} FMA units x {lanes} fp32 lanes x {FLOPS_PER_FMA} FLOPs x "
        f"{facts.clock_hertz / 1e9:.3f} GHz{factor_source}; lanes and units: {lanes_source}; cores: "
        f"usable CPUs in {CPUINFO}; clock: {facts.clock_source}"
    )
    return flops, derivation


def derive_bandwidth(facts: CpuFacts) -> MemoryBandwidth | None:
    """The sockets' memory bandwidth where the platform is listed; None otherwise."""
    arch = facts.microarchitecture
    if arch is None:
        return None
    per_socket = arch.bandwidth_bytes_per_second
    return MemoryBandwidth(
        per_socket * facts.sockets,
        f"derived: {facts.sockets} socket(s) x {arch.memory_channels} channels x "
        f"{arch.transfers_per_second_millions} MT/s x {BYTES_PER_TRANSFER} bytes = "
        f"{per_socket * facts.sockets / GIGA:g} GB/s ({arch.name}; {arch.memory_source}); the socket's "
        "bandwidth, shared with any cores this process does not use",
        arch.memory,
    )


def _max_frequency_khz(cpus: Iterable[int]) -> float | None:
    values = []
    for cpu in cpus:
        try:
            with open(MAX_FREQUENCY.format(cpu=cpu), encoding="ascii") as file:
                values.append(float(file.read().strip()))
        except (OSError, ValueError):
            continue
    return max(values) if values else None


@functools.cache
def host_facts() -> CpuFacts | None:
    """This host's facts (read once per process); None off Linux or where /proc/cpuinfo is unreadable."""
    try:
        usable = sorted(os.sched_getaffinity(0))
        with open(CPUINFO, encoding="utf-8", errors="replace") as file:
            text = file.read()
    except (AttributeError, OSError):
        return None
    return parse_cpuinfo(text, usable, _max_frequency_khz(usable))
