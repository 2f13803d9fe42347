"""A thin, lazy layer over amdsmi (ROCm's AMD SMI Python bindings): the node's GCDs, the physical
packages they belong to, and their energy and power readings.

Facts this relies on, checked against ROCm/amdsmi ``py-interface`` 6.0.2 to 7.0.2 and the sources
named below:

- ``import amdsmi`` loads libamd_smi.so at import; when it is missing the module prints the
  loader's error and a hint to stdout and raises ``KeyError: 'libamd_smi.so'`` (6.2.1 could raise
  ``KeyError: 'ROCM_PATH'`` instead). Both are turned into one clear reason here.
- ``amdsmi_init`` is not reference counted (amd_smi.cc: a second init is a no-op, one shut-down
  ends the library), so sessions are counted here.
- HIP numbers GPUs in KFD topology order. ``amdsmi_get_gpu_enumeration_info(h)["hip_id"]`` (6.4+)
  is that order (KFD node id minus the smallest one); 6.3 has ``amdsmi_get_gpu_kfd_info(h)
  ["node_id"]``; before, the KFD topology in sysfs is read and matched by PCI address.
- Energy: ``amdsmi_get_energy_count(h)``: accumulator ticks x ``counter_resolution`` uJ; the
  accumulator's key is ``power`` up to ROCm 6.2, both keys in 6.3, ``energy_accumulator`` from 6.4.
  The firmware field is 64 bits wide on MI200/MI300 and 32 bits on MI100 (kernel arcturus_ppt.c).
- Power: ``amdsmi_get_power_info(h)``: ``current_socket_power`` / ``average_socket_power`` in whole
  watts; "N/A" where unsupported (the raw 0xFFFF in 6.0), and 0xFFFFFFFF (the field's maximum, which
  the Python layer does not map) from newer native libraries.
- MI250/MI250X (PCI device 0x740c): each OAM package holds two GCDs, each its own PCIe device
  with its own bus address (ROCm docs, MI250 architecture), so PCI addresses say nothing about
  packages. The two GCDs of a package are joined by four XGMI links, GCDs of different packages
  by one or two (same document); ``amdsmi_get_minmax_bandwidth_between_processors`` returns the
  KFD io-link bandwidth of a direct XGMI link, links x 50000 MB/s on Aldebaran
  (amdgpu_amdkfd_get_xgmi_bandwidth_mbytes). That is the first sibling rule used here.
- Where the kernel leaves the link count unset every bandwidth reads 0, and the KFD io-link weight
  (15 x hops) is 15 for every directly linked die, the sibling and the dies of other packages alike:
  it pairs only where it is unique and mutual. Then a board serial two dies share (the OAM's FRU,
  amdsmi_get_gpu_board_info), then the silent secondary die (0 W, energy 0: aldebaran_ppt.c) matched
  to the only directly linked reporting die it can have. Every rule but the bandwidth is checked
  against the silent die; what none tells is refused, never guessed (``_packages``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.plugin import SharedLibrarySession

from .visibility import visible_order

INSTALL_HINT = (
    "amdsmi is not installed (pip install 'core[amd]', or the amdsmi matching your ROCm, "
    "e.g. pip install amdsmi==6.2.4 for ROCm 6.2.4)"
)
KFD_TOPOLOGY = Path("/sys/class/kfd/kfd/topology/nodes")

# PCI device ids of the dual-GCD parts: MI250X and MI250 share 0x740c (AMD Instinct docs).
DUAL_GCD_DEVICE_IDS = frozenset({0x740C})
# gfx90a GCD compute units tell the two apart (ROCm docs, GPU hardware specifications).
_MI250_BY_COMPUTE_UNITS = {110: "AMD Instinct MI250X", 104: "AMD Instinct MI250"}
# MI100 (Arcturus): the SMU's EnergyAccumulator is a uint32 (kernel arcturus_ppt.c).
_COUNTER_BITS_BY_DEVICE_ID = {0x738C: 32, 0x738E: 32}
# "Not available" as the native library marks it: 0xFFFF in 6.x (amdsmi 6.0 returned it raw, later
# Python layers say "N/A"), the field's own maximum in newer ones (amd_smi.cc fills a missing uint32
# with std::numeric_limits<uint32_t>::max(), which amdsmi_interface.py passes through as a number).
_NOT_AVAILABLE = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
# No package draws this much (MI355X: 1.4 kW); a larger "reading" is a marker, not power.
MAX_PLAUSIBLE_WATTS = 5000.0


class AmdsmiUnavailable(RuntimeError):
    """amdsmi cannot be used here; the message says why and what to do."""


def _printed(buffer: io.StringIO) -> str:
    return " ".join(buffer.getvalue().split())


def import_amdsmi() -> Any:
    """The amdsmi module, imported here so that `core plugins` never loads it."""
    loaded = sys.modules.get("amdsmi")
    if loaded is not None:
        return loaded
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):  # it prints its loader errors to stdout
            return importlib.import_module("amdsmi")
    except ModuleNotFoundError as exc:
        if exc.name != "amdsmi":
            raise AmdsmiUnavailable(f"amdsmi failed to import: {exc}") from exc
        raise AmdsmiUnavailable(INSTALL_HINT) from exc
    except Exception as exc:  # noqa: BLE001 - KeyError, OSError, AttributeError: all mean "unusable"
        said = _printed(printed)
        if "libamd_smi" in f"{exc} {said}" or "ROCM_PATH" in str(exc):
            raise AmdsmiUnavailable(
                "amdsmi is installed but cannot load ROCm's libamd_smi.so"
                + (f" (it printed: {said})" if said else f" ({type(exc).__name__}: {exc})")
                + "; install ROCm's amd-smi-lib, or set ROCM_PATH to the ROCm installation that has "
                "lib/libamd_smi.so"
            ) from exc
        raise AmdsmiUnavailable(
            f"amdsmi failed to import ({type(exc).__name__}: {exc}"
            + (f"; it printed: {said}" if said else "")
            + "); the amdsmi package must match the installed ROCm version"
        ) from exc


def describe_error(exc: BaseException) -> str:
    info = getattr(exc, "get_error_info", None)
    if callable(info):
        try:
            return f"{type(exc).__name__}: {info()}"
        except Exception:  # noqa: BLE001
            pass
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _start_amdsmi() -> Any:
    amdsmi = import_amdsmi()
    try:
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except amdsmi.AmdSmiException as exc:
        raise AmdsmiUnavailable(
            f"amdsmi_init failed ({describe_error(exc)}): is the amdgpu driver "
            "loaded and /dev/kfd readable by this user?"
        ) from exc
    return amdsmi


# amdsmi_init / amdsmi_shut_down, counted across the process: discovery and meters overlap.
amdsmi_session = SharedLibrarySession(_start_amdsmi, lambda amdsmi: amdsmi.amdsmi_shut_down())
# Readings come from the meter's sampling thread and the caller's thread at once.
call_lock = threading.RLock()


# --- readings -------------------------------------------------------------------------------


def energy_ticks(amdsmi: Any, handle: Any) -> tuple[int, float]:
    """(accumulator ticks, uJ per tick) of one GCD."""
    with call_lock:
        reading = amdsmi.amdsmi_get_energy_count(handle)
    ticks = reading["energy_accumulator"] if "energy_accumulator" in reading else reading["power"]
    return int(ticks), float(reading["counter_resolution"])


def power_watts(amdsmi: Any, handle: Any, key: str) -> float | None:
    """One power field of amdsmi_get_power_info in watts, or None where it reads "N/A"."""
    with call_lock:
        value = amdsmi.amdsmi_get_power_info(handle).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value in _NOT_AVAILABLE:
        return None
    if not 0 <= value <= MAX_PLAUSIBLE_WATTS:
        return None
    return float(value)


# --- the node -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gcd:
    """One GPU as HIP shows it (on MI250 one GCD; on other parts the whole device)."""

    handle: Any  # valid only inside the session that discovered it
    hip_index: int  # position in the node's HIP order, before any visibility variable
    bdf: str
    uuid: str  # "GPU-<16 hex>", how ROCR/HIP_VISIBLE_DEVICES name it
    market_name: str
    product: str  # "AMD Instinct MI250X" where the market name is ambiguous and the CUs tell
    device_id: int | None
    compute_units: int | None
    gfx_target: str | None
    memory_bytes: int | None

    @property
    def counter_bits(self) -> int:
        return _COUNTER_BITS_BY_DEVICE_ID.get(self.device_id or 0, 64)

    @property
    def dual(self) -> bool:
        return self.device_id in DUAL_GCD_DEVICE_IDS


@dataclass(frozen=True)
class Package:
    key: str  # "package-0": numbered by the lowest HIP index among its GCDs
    bdfs: tuple[str, ...]  # its GCDs, in HIP order
    rule: str  # how its membership was established


@dataclass(frozen=True)
class Node:
    gcds: tuple[Gcd, ...]  # HIP order
    packages: tuple[Package, ...]
    package_error: str | None  # why the packages of dual-GCD parts are unknown, if they are
    hip_order: str  # which source gave the HIP order
    amdsmi_version: str

    def gcd(self, bdf: str) -> Gcd | None:
        return next((g for g in self.gcds if g.bdf == bdf), None)

    def package_of(self, bdf: str) -> Package | None:
        return next((p for p in self.packages if bdf in p.bdfs), None)

    def visible(self, environment: Mapping[str, str]) -> list[Gcd]:
        """This process's GPUs in PyTorch's order (cuda:0 first)."""
        return [self.gcds[i] for i in visible_order(environment, [g.uuid for g in self.gcds])]


def _number(value: Any) -> int | None:
    """amdsmi ids come as ints or hex strings ("0x740c") depending on the version; "N/A" is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"(0[xX])?[0-9a-fA-F]+", value.strip()):
        return int(value.strip(), 16)
    return None


def _optional(call: Callable[[], Any], amdsmi: Any) -> Any:
    try:
        with call_lock:
            return call()
    except amdsmi.AmdSmiException:
        return None


def read_kfd_topology(root: Path = KFD_TOPOLOGY) -> dict[str, int]:
    """PCI address -> KFD node id of every GPU node (those with SIMDs), from the KFD sysfs."""
    nodes: dict[str, int] = {}
    try:
        entries = sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    except OSError:
        return nodes
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "properties").read_text()
        except OSError:
            continue
        props = dict(line.split(None, 1) for line in text.splitlines() if len(line.split(None, 1)) == 2)
        try:
            if int(props.get("simd_count", "0")) == 0:
                continue
            location, domain = int(props["location_id"]), int(props.get("domain", "0"))
        except (KeyError, ValueError):
            continue
        bus, device, function = (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7
        nodes[f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"] = int(entry.name)
    return nodes


def _hip_order(
    amdsmi: Any, handles: list[Any], bdfs: list[str], kfd_root: Path
) -> tuple[list[int], list[str | None], str]:
    """(hip index per handle, HIP uuid per handle or None, the source of the order)."""
    enumeration = getattr(amdsmi, "amdsmi_get_gpu_enumeration_info", None)
    if enumeration is not None:
        infos = [_optional(functools.partial(enumeration, h), amdsmi) for h in handles]
        hip_ids = [info.get("hip_id") if info else None for info in infos]
        if all(isinstance(i, int) for i in hip_ids) and len(set(hip_ids)) == len(hip_ids):
            uuids = [info.get("hip_uuid") if info else None for info in infos]
            return [int(i) for i in hip_ids], uuids, "amdsmi_get_gpu_enumeration_info hip_id"  # type: ignore[arg-type]
    kfd = getattr(amdsmi, "amdsmi_get_gpu_kfd_info", None)
    node_ids: list[Any] = []
    if kfd is not None:
        infos = [_optional(functools.partial(kfd, h), amdsmi) for h in handles]
        node_ids = [info.get("node_id") if info else None for info in infos]
        source = "amdsmi_get_gpu_kfd_info node_id"
    if not node_ids or not all(isinstance(i, int) for i in node_ids):
        topology = read_kfd_topology(kfd_root)
        node_ids = [topology.get(bdf) for bdf in bdfs]
        source = f"KFD topology ({kfd_root}) matched by PCI address"
    if all(isinstance(i, int) for i in node_ids) and len(set(node_ids)) == len(node_ids):
        ranks = {node: rank for rank, node in enumerate(sorted(node_ids))}
        return [ranks[n] for n in node_ids], [None] * len(handles), source
    return (
        list(range(len(handles))),
        [None] * len(handles),
        ("amdsmi handle order (PCI address), unverified: neither amdsmi nor the KFD topology gave the HIP order"),
    )


def _product(market_name: str, device_id: int | None, compute_units: int | None) -> str:
    if device_id in DUAL_GCD_DEVICE_IDS and compute_units in _MI250_BY_COMPUTE_UNITS:
        return _MI250_BY_COMPUTE_UNITS[compute_units]
    return market_name


def pair_siblings(bdfs: list[str], links: Callable[[str, str], float]) -> tuple[list[tuple[str, str]], list[str]]:
    """Pairs of GCDs that share a package: each is the other's unique strongest XGMI peer.

    :param links: XGMI strength between two GCDs (max bandwidth, or 1 / link weight; 0 where unknown).
    :returns: the pairs, and the GCDs left without a sibling.
    """
    strength = {(a, b): links(a, b) for a in bdfs for b in bdfs if a != b}
    best: dict[str, str | None] = {}
    for a in bdfs:
        ranked = sorted(((strength[(a, b)], b) for b in bdfs if b != a), reverse=True)
        unique = ranked and ranked[0][0] > 0 and (len(ranked) == 1 or ranked[0][0] > ranked[1][0])
        best[a] = ranked[0][1] if unique else None
    pairs: list[tuple[str, str]] = []
    for a in bdfs:
        b = best[a]
        if b is not None and best.get(b) == a and (b, a) not in pairs:
            pairs.append((a, b))
    paired = {bdf for pair in pairs for bdf in pair}
    return pairs, [bdf for bdf in bdfs if bdf not in paired]


def pair_by_serial(bdfs: list[str], serials: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """Pairs of GCDs that share a board serial no other GCD has; "" or None tells nothing.

    A serial held by one GCD (the kernel's per-die fallback) or by more than two (a blank or shared
    FRU) pairs nothing, so this cannot pair two packages' dies unless their boards share a serial
    that no third die has.
    """
    holders: dict[str, list[str]] = {}
    for bdf in bdfs:
        serial = (serials.get(bdf) or "").strip()
        if serial and serial.upper() != "N/A":
            holders.setdefault(serial, []).append(bdf)
    return [(group[0], group[1]) for group in holders.values() if len(group) == 2]


def pair_silent_with_reporting(
    bdfs: list[str], reports: Mapping[str, bool | None], direct: Callable[[str, str], bool]
) -> list[tuple[str, str]]:
    """Pairs (reporting, silent) where only one way exists to give every silent die a directly
    linked reporting die of its own; none where there are none or several.

    Each package has one reporting die and one silent one, and its two dies are directly linked,
    so the true pairing is always one of the ways counted here: when it is the only one, it is the
    truth. ``reports``: True for a die that shows power or energy, False for one that shows none,
    None where unknown (then nothing is paired).
    """
    if any(reports.get(bdf) is None for bdf in bdfs):
        return []
    reporting = [bdf for bdf in bdfs if reports[bdf]]
    silent = [bdf for bdf in bdfs if not reports[bdf]]
    if not silent or len(reporting) != len(silent):
        return []
    found: list[list[tuple[str, str]]] = []

    def assign(i: int, taken: frozenset[str], chosen: list[tuple[str, str]]) -> None:
        if len(found) > 1:
            return
        if i == len(silent):
            found.append(list(chosen))
            return
        for primary in reporting:
            if primary not in taken and direct(primary, silent[i]):
                assign(i + 1, taken | {primary}, [*chosen, (primary, silent[i])])

    assign(0, frozenset(), [])
    return found[0] if len(found) == 1 else []


def _reports(amdsmi: Any, gcd: Gcd) -> bool | None:
    """Whether a GCD reports its package's power: True where it shows power or energy, False where
    both read 0, None where either cannot be read.

    On Aldebaran only the primary die reports: aldebaran_ppt.c (``aldebaran_get_gpu_metrics``,
    "Valid power data is available only from primary die") sets the secondary's
    ``average_socket_power`` and ``energy_accumulator`` to 0, and ``aldebaran_get_smu_metrics_data``
    gives it 0 for METRICS_AVERAGE_SOCKETPOWER (hwmon's power1_average), which is what
    ``amdsmi_get_energy_count`` and ``amdsmi_get_power_info`` read. A primary's accumulator counts
    from boot and its package never draws 0 W, so it shows one or the other.
    """
    try:
        ticks, _ = energy_ticks(amdsmi, gcd.handle)
        watts = [power_watts(amdsmi, gcd.handle, key) for key in ("average_socket_power", "current_socket_power")]
    except (amdsmi.AmdSmiException, KeyError, TypeError, ValueError):
        return None
    if ticks > 0 or any(w is not None and w > 0 for w in watts):
        return True
    return False if watts[0] == 0 and ticks == 0 else None


_RULES = {
    "bandwidth": (
        "MI250 sibling: the GCD it shares four XGMI links with (the most to any GCD, mutually), "
        "from amdsmi_get_minmax_bandwidth_between_processors"
    ),
    "weight": (
        "MI250 sibling: every XGMI bandwidth read 0, so the GCD with the unique, mutual lowest KFD "
        "io-link weight, from amdsmi_topo_get_link_weight"
    ),
    "serial": (
        "MI250 sibling: the one other GCD with its board serial (amdsmi_get_gpu_board_info "
        "product_serial), one of the two showing power and the other none"
    ),
    "silent": (
        "MI250 sibling: the package's silent die (0 W, energy 0) matched to the only directly "
        "linked reporting die it can have (lowest amdsmi_topo_get_link_weight), the only such matching"
    ),
}


class _Evidence:
    """What amdsmi says about pairs of MI250 dies, each reading taken once and only when asked."""

    def __init__(self, amdsmi: Any, gcds: list[Gcd]) -> None:
        self.amdsmi, self.by_bdf = amdsmi, {g.bdf: g for g in gcds}
        self.weights: dict[tuple[str, str], int | None] = {}
        self.reports: dict[str, bool | None] = {}

    def bandwidth(self, a: str, b: str) -> int:
        handles = self.by_bdf[a].handle, self.by_bdf[b].handle
        result = _optional(lambda: self.amdsmi.amdsmi_get_minmax_bandwidth_between_processors(*handles), self.amdsmi)
        return int(result.get("max_bandwidth", 0)) if result else 0

    def weight(self, a: str, b: str) -> int | None:
        if (a, b) not in self.weights:
            handles = self.by_bdf[a].handle, self.by_bdf[b].handle
            result = _optional(lambda: self.amdsmi.amdsmi_topo_get_link_weight(*handles), self.amdsmi)
            ok = isinstance(result, int) and not isinstance(result, bool) and result > 0
            self.weights[(a, b)] = result if ok else None
        return self.weights[(a, b)]

    def closeness(self, a: str, b: str) -> float:
        weight = self.weight(a, b)
        return 1.0 / weight if weight else 0.0

    def reporting(self, bdf: str) -> bool | None:
        if bdf not in self.reports:
            self.reports[bdf] = _reports(self.amdsmi, self.by_bdf[bdf])
        return self.reports[bdf]

    def one_of_each(self, pair: tuple[str, str]) -> bool:
        """A package has one reporting die and one silent one (aldebaran_ppt.c): two reporting or
        two silent dies are not one package. Unknown readings refute nothing."""
        a, b = (self.reporting(bdf) for bdf in pair)
        return a is None or b is None or a != b

    def serial(self, bdf: str) -> str | None:
        call = functools.partial(self.amdsmi.amdsmi_get_gpu_board_info, self.by_bdf[bdf].handle)
        info = _optional(call, self.amdsmi)
        return str(info.get("product_serial") or "") if isinstance(info, dict) else None


def _packages(amdsmi: Any, gcds: list[Gcd]) -> tuple[list[Package], str | None]:
    """The node's packages: each GCD of a single-GCD part alone, the MI250 dies paired by the first
    rule that tells, each later rule applied only to the dies the earlier ones left and its pairs
    checked against the silent secondary die. Nothing is guessed: dies no rule pairs are named."""
    by_bdf = {g.bdf: g for g in gcds}
    dual = [g.bdf for g in gcds if g.dual]
    evidence = _Evidence(amdsmi, gcds)
    found: list[tuple[tuple[str, str], str]] = []
    left = list(dual)
    refuted: list[str] = []

    def keep(pairs: list[tuple[str, str]], how: str) -> None:
        nonlocal left
        for pair in pairs:
            if pair[0] not in left or pair[1] not in left:
                continue
            if how != "bandwidth" and not evidence.one_of_each(pair):
                refuted.append(f"{how} paired {pair[0]} with {pair[1]}, but both show power or both none")
                continue
            found.append((pair, how))
            left = [bdf for bdf in left if bdf not in pair]

    keep(pair_siblings(dual, evidence.bandwidth)[0] if dual else [], "bandwidth")
    # Kernels or firmware that leave the XGMI link count unset give 0 bandwidth for every pair
    # (kfd_crat.c, kfd_fill_gpu_xgmi_link_to_gpu; amdgpu_xgmi_get_num_links is 0 without the PSP's
    # link info). The same io-link's weight is KFD_CRAT_XGMI_WEIGHT (15) x the PSP's hop count:
    # 15 for every directly linked die, and on MI250X dies of different packages are directly
    # linked, so the lowest weight is rarely unique (RCCL's rocm_smi_wrap.cc reads weight 15 as
    # "one hop" and the link count only from the bandwidth). It is used only where it is unique
    # and mutual among all the node's MI250 dies, never among the left-overs alone.
    if len(left) > 1:
        keep(pair_siblings(dual, evidence.closeness)[0], "weight")
    if len(left) > 1:
        # The board serial (sysfs serial_number, amd_smi.cc amdsmi_get_gpu_board_info via
        # smi_amdgpu_get_board_info) is the FRU EEPROM's where the kernel reads it
        # (amdgpu_fru_eeprom.c: every Aldebaran SKU has an FRU), else the die's own unique id
        # (aldebaran_ppt.c, aldebaran_get_unique_id): a serial two dies share is their board's.
        keep(pair_by_serial(dual, {bdf: evidence.serial(bdf) for bdf in dual}), "serial")
    if len(left) > 1:
        # The two dies of a package are directly linked (four XGMI links, ROCm docs, MI250
        # architecture), so their weight is the smallest any pair has (15 x 1 hop).
        known = [w for a in left for b in left if a != b and (w := evidence.weight(a, b)) is not None]
        if known:
            reports = {bdf: evidence.reporting(bdf) for bdf in left}
            direct = functools.partial(lambda smallest, a, b: evidence.weight(a, b) == smallest, min(known))
            keep(pair_silent_with_reporting(left, reports, direct), "silent")
    groups: list[tuple[tuple[str, ...], str]] = [((g.bdf,), "one GPU per package") for g in gcds if not g.dual]
    for pair, how in found:
        groups.append((tuple(sorted(pair, key=lambda bdf: by_bdf[bdf].hip_index)), _RULES[how]))
    groups.sort(key=lambda group: min(by_bdf[bdf].hip_index for bdf in group[0]))
    packages = [Package(f"package-{n}", bdfs, how) for n, (bdfs, how) in enumerate(groups)]
    error = None
    if left:
        error = (
            f"cannot tell which MI250 GCDs share a package: {', '.join(left)} "
            "have no unique strongest XGMI peer (amdsmi_get_minmax_bandwidth_between_processors), "
            "no unique lowest link weight (amdsmi_topo_get_link_weight), no board serial shared with "
            "exactly one other GCD (amdsmi_get_gpu_board_info), and no single way to match each silent "
            "die (0 W, energy 0) with a directly linked die that shows power"
            + (f"; refused: {'; '.join(refuted)}" if refuted else "")
        )
    return packages, error


def discover(amdsmi: Any, kfd_root: Path = KFD_TOPOLOGY) -> Node:
    """Every GPU of the node with its package; call inside an amdsmi_session."""
    with call_lock:
        handles = list(amdsmi.amdsmi_get_processor_handles())
        bdfs = [str(amdsmi.amdsmi_get_gpu_device_bdf(h)) for h in handles]
    hip_indices, hip_uuids, order_source = _hip_order(amdsmi, handles, bdfs, kfd_root)
    memory_type = getattr(getattr(amdsmi, "AmdSmiMemoryType", None), "VRAM", None)
    gcds = []
    for handle, bdf, hip_index, hip_uuid in zip(handles, bdfs, hip_indices, hip_uuids):
        asic = _optional(functools.partial(amdsmi.amdsmi_get_gpu_asic_info, handle), amdsmi) or {}
        serial = _number(asic.get("asic_serial"))
        uuid = (
            hip_uuid
            if isinstance(hip_uuid, str) and hip_uuid.startswith("GPU-")
            else (f"GPU-{serial:016x}" if serial else "GPU-XX")
        )
        device_id = _number(asic.get("device_id"))
        units = asic.get("num_compute_units")
        compute_units = units if isinstance(units, int) and not isinstance(units, bool) else None
        market = str(asic.get("market_name") or "AMD GPU")
        memory = (
            _optional(functools.partial(amdsmi.amdsmi_get_gpu_memory_total, handle, memory_type), amdsmi)
            if memory_type is not None
            else None
        )
        gfx = asic.get("target_graphics_version")
        gcds.append(
            Gcd(
                handle=handle,
                hip_index=hip_index,
                bdf=bdf,
                uuid=uuid,
                market_name=market,
                product=_product(market, device_id, compute_units),
                device_id=device_id,
                compute_units=compute_units,
                gfx_target=gfx if isinstance(gfx, str) else None,
                memory_bytes=memory if isinstance(memory, int) else None,
            )
        )
    gcds.sort(key=lambda g: g.hip_index)
    packages, package_error = _packages(amdsmi, gcds)
    return Node(
        gcds=tuple(gcds),
        packages=tuple(packages),
        package_error=package_error,
        hip_order=order_source,
        amdsmi_version=str(getattr(amdsmi, "__version__", "unknown")),
    )


def driver_versions(amdsmi: Any, node: Node) -> dict[str, str]:
    versions = {"amdsmi": node.amdsmi_version}
    if node.gcds:
        info = _optional(lambda: amdsmi.amdsmi_get_gpu_driver_info(node.gcds[0].handle), amdsmi) or {}
        if info.get("driver_version") not in (None, "N/A"):
            versions["amdgpu_driver"] = str(info["driver_version"])
    return versions
