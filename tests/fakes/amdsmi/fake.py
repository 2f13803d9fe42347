"""The simulated node behind the fake amdsmi, and how tests install it.

Not part of the real package: tests import ``amdsmi.fake`` to build a node of GCDs (each an
amdsmi processor handle) and to drive it; the plugin sees only the amdsmi API.

What the model reproduces, with its source:
- energy: a per-GCD accumulator in ticks of ``counter_resolution`` uJ (15.3 in rocm_smi's
  rsmi_dev_energy_count_get), as wide as the firmware's field (64 bits on MI200/MI300, 32 bits
  on MI100, whose SMU field EnergyAccumulator is uint32 in the kernel's arcturus_ppt.c), wrapping
  at 2**bits;
- MI250/MI250X: the package's power and energy are reported by its primary die only; the
  secondary reports energy 0 and average power 0 (aldebaran_ppt.c: "Valid power data is
  available only from primary die"); current_socket_power is not in gpu_metrics v1.3, so it
  reads 0xFFFF, "N/A";
- XGMI: rsmi_minmax_bandwidth_get answers only for a direct XGMI link, with the KFD io-link
  bandwidth; on Aldebaran max = links x 16 lanes x 25 GT/s / 8 = links x 50000 MB/s and
  min = one link (amdgpu_amdkfd_get_xgmi_bandwidth_mbytes); two GCDs of one MI250 are joined
  by four links, GCDs of different packages by one or two (ROCm docs, MI250 architecture);
- versions: what changed in the Python bindings between ROCm 6.0 and 7.0 (see ``install``).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field

from . import amdsmi_wrapper

LINK_MBPS = 50_000  # one Aldebaran XGMI link as KFD reports it


def c_float(value: float) -> float:
    """What a ctypes c_float turns a Python float into (15.3 -> 15.300000190734863)."""
    return ctypes.c_float(value).value


@dataclass
class FakeGcd:
    bdf: str  # "0000:c1:00.0", as amdsmi_get_gpu_device_bdf formats it
    kfd_node: int  # KFD topology node id; HIP numbers GPUs in this order
    unique_id: int  # the KFD/sysfs unique_id behind asic_serial and the "GPU-<hex>" UUID
    market_name: str = "AMD Instinct MI250X / MI250"  # libdrm amdgpu.ids names device 0x740c so
    device_id: int = 0x740C
    compute_units: int = 110
    gfx: str = "gfx90a"
    vram_bytes: int = 68_702_699_520
    package: str | None = None  # physical package label (ground truth; amdsmi does not report it)
    draw_watts: float = 0.0  # what this die really draws
    reports_power: bool = True  # False for the secondary die of an MI250 package
    current_power_supported: bool = False  # MI300 reports current_socket_power; MI200 does not
    power_na: bool = False  # every power field reads 0xFFFF ("N/A")
    counter_resolution: float = 15.3  # uJ per tick
    counter_bits: int = 64
    accumulator: int = 0
    counter_scale: float = 1.0  # a broken counter accumulates this multiple of the true energy
    energy_supported: bool = True
    failing: dict[str, int] = field(default_factory=dict)  # interface function -> status it returns

    @property
    def uuid(self) -> str:
        return f"GPU-{self.unique_id:016x}"


@dataclass
class FakeNode:
    gcds: list[FakeGcd] = field(default_factory=list)
    links: dict[frozenset[str], int] = field(default_factory=dict)  # XGMI links between two BDFs
    version: tuple[int, int, int] = (7, 0, 2)
    init_status: int = amdsmi_wrapper.AMDSMI_STATUS_SUCCESS  # e.g. DRIVER_NOT_LOADED
    driver_version: str = "6.10.5"
    timestamp_ns: int = 1_712_024_507_665
    initialized: bool = False
    calls: list[str] = field(default_factory=list)

    def link(self, a: FakeGcd, b: FakeGcd, count: int) -> None:
        self.links[frozenset((a.bdf, b.bdf))] = count

    def links_between(self, a: FakeGcd, b: FakeGcd) -> int:
        return self.links.get(frozenset((a.bdf, b.bdf)), 0)

    def package_watts(self, gcd: FakeGcd) -> float:
        if gcd.package is None:
            return gcd.draw_watts
        return sum(g.draw_watts for g in self.gcds if g.package == gcd.package)

    def reported_watts(self, gcd: FakeGcd) -> float:
        return self.package_watts(gcd) if gcd.reports_power else 0.0

    def advance(self, seconds: float) -> None:
        """Let time pass at the current draw: every reporting die's counter moves."""
        self.timestamp_ns += int(seconds * 1e9)
        for gcd in self.gcds:
            if gcd.reports_power:
                ticks = round(
                    self.reported_watts(gcd) * seconds * 1e6 / c_float(gcd.counter_resolution) * gcd.counter_scale
                )
                gcd.accumulator = (gcd.accumulator + ticks) % (1 << gcd.counter_bits)

    def energy_joules(self, gcd: FakeGcd) -> float:
        return gcd.accumulator * c_float(gcd.counter_resolution) / 1e6


def mi250_node(*, primary_first: bool = True, version: tuple[int, int, int] = (7, 0, 2)) -> FakeNode:
    """Two MI250X packages seen as four GCDs. HIP order (KFD node order) interleaves the packages
    (GCDs 0 and 2 share package A, 1 and 3 package B), so pairing by index parity would be wrong."""
    a0 = FakeGcd("0000:c1:00.0", kfd_node=2, unique_id=0x5A1F00000000AA01, package="A")
    b0 = FakeGcd("0000:c9:00.0", kfd_node=3, unique_id=0x5A1F00000000BB01, package="B")
    a1 = FakeGcd("0000:c6:00.0", kfd_node=4, unique_id=0x5A1F00000000AA02, package="A")
    b1 = FakeGcd("0000:ce:00.0", kfd_node=5, unique_id=0x5A1F00000000BB02, package="B")
    if primary_first:
        a1.reports_power = b1.reports_power = False
    else:  # which die is primary is not tied to the order
        a0.reports_power = b1.reports_power = False
    node = FakeNode(gcds=[a0, a1, b0, b1], version=version)  # amdsmi lists handles in BDF order
    node.link(a0, a1, 4)
    node.link(b0, b1, 4)
    node.link(a0, b0, 2)
    node.link(a1, b1, 2)
    node.link(a0, b1, 1)
    node.link(a1, b0, 1)
    return node


# Functions that appeared in the Python bindings after 6.0, and the first version with them.
_INTRODUCED = {
    "amdsmi_get_gpu_kfd_info": (6, 3, 0),
    "amdsmi_get_gpu_enumeration_info": (6, 4, 0),
}


def install(node: FakeNode) -> FakeNode:
    """Make ``node`` the library's state and shape the module's API like that version's."""
    from . import amdsmi_interface

    package = sys.modules["amdsmi"]
    amdsmi_wrapper.node = node
    package.__version__ = ".".join(str(part) for part in node.version)
    for name, introduced in _INTRODUCED.items():
        function = getattr(amdsmi_interface, f"_{name}")
        for module in (package, amdsmi_interface):
            if node.version >= introduced:
                setattr(module, name, function)
            elif hasattr(module, name):
                delattr(module, name)
    return node
