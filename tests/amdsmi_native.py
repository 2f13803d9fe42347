"""A simulated libamd_smi.so under the *real* amdsmi Python package (its ``amdsmi_interface.py`` and
``amdsmi_wrapper.py``, from the wheels unpacked by scripts/fetch-bindings.sh).

``amdsmi_wrapper`` loads the library with ``ctypes.CDLL`` and takes every C function from it as an
attribute, setting ``restype``/``argtypes`` (amdsmi_wrapper.py, ``_libraries['libamd_smi.so']``).
Here ``ctypes.CDLL`` hands it a :class:`NativeLibrary` whose attributes are Python callables: the
interface calls them with the same ctypes objects it would pass to C (``ctypes.byref`` out-pointers,
arrays, ``amdsmi_processor_handle``) and they fill those out-structures as amd_smi.cc would, then
return an ``amdsmi_status_t``. Only the C library is simulated; every key, unit, conversion and
"N/A" rule is the real package's.

Behaviour simulated, with its source in ROCm/amdsmi (``src/amd_smi/amd_smi.cc``,
``include/amd_smi/amdsmi.h``) and the kernel:

- size queries: ``amdsmi_get_socket_handles``/``amdsmi_get_processor_handles`` with a NULL array
  set only the count (amdsmi.h: "If @p socket_handles is NULL, then the socket count is written").
- status codes: ``AMDSMI_STATUS_SUCCESS`` 0, ``AMDSMI_STATUS_NOT_SUPPORTED`` 2 (amdsmi.h).
- energy: ``amdsmi_get_energy_count(h, &accumulator, &resolution_float, &timestamp_ns)``; on
  MI250/MI250X the package's energy accumulates on one GCD and its sibling reads 0 and never moves.
- power: ``amdsmi_power_info_t``; a field the part lacks is set to the width's maximum by newer
  libraries (``std::numeric_limits<uint32_t>::max()`` in amd_smi.cc's ``amdsmi_get_power_info``),
  0xFFFF by the 6.x ones: :attr:`SimNode.not_available` picks which.
- topology: ``amdsmi_get_minmax_bandwidth_between_processors`` returns the KFD io-link
  bandwidth; the kernel leaves it 0 where it does not know the link count (kfd_crat.c,
  ``kfd_fill_gpu_xgmi_link_to_gpu``), and the call still succeeds with 0. Where it knows it, an
  Aldebaran link is 16 lanes x 25 GT/s, 50000 MB/s, and the maximum is links x that
  (``amdgpu_amdkfd_get_xgmi_bandwidth_mbytes``): :func:`xgmi_bandwidth`.
  ``amdsmi_topo_get_link_weight`` returns the io-link weight, ``KFD_CRAT_XGMI_WEIGHT`` (15) x the
  XGMI hop count from the PSP topology (same function; ``amdgpu_xgmi_get_hops_count``). Every
  directly linked die is one hop away, and MI250X dies of different packages are directly linked
  (one or two XGMI links, ROCm docs, MI250 architecture), so on a real node the weight is 15 for
  the sibling and for the other directly linked dies alike (RCCL's rocm_smi_wrap.cc reads weight 15
  as "one hop"): :func:`mi250x_node` gives 15 for every pair unless a test gives hops.
- the secondary die: aldebaran_ppt.c (``aldebaran_get_gpu_metrics``: "Valid power data is available
  only from primary die") gives it ``average_socket_power`` 0 and ``energy_accumulator`` 0.
- board serial: ``amdsmi_get_gpu_board_info``'s ``product_serial`` is sysfs ``serial_number``
  (amd_smi.cc via ``smi_amdgpu_get_board_info``): the FRU EEPROM's serial where the kernel reads
  one (amdgpu_fru_eeprom.c), else the die's own unique id printed "%016llx" (aldebaran_ppt.c,
  ``aldebaran_get_unique_id``), which is the default here; a test gives boards their serials.
- ``target_graphics_version`` of ``amdsmi_asic_info_t`` differs by library release: the 6.3
  library joins the KFD ``gfx_target_version`` (90010 for gfx90a) into the decimal 9010
  (rocm_smi_utils.cc ``rsmi_get_gfx_target_version`` and rocm_smi.cc
  ``rsmi_dev_target_graphics_version_get`` parsing it with ``std::stoull(version)``), which
  amdsmi 6.3's Python layer turns back into "gfx90a" for MI200 only; the 7.0 library writes the
  stepping in hex ("gfx90a") and parses it base 16 (``std::stoull(version, nullptr, 16)``), 0x90a,
  which 7.0's Python layer prints with ``hex()``. 6.0 and 6.2 do not read the field.
- ``asic_serial``/``hip_uuid``: the GCD's sysfs ``unique_id`` (amd_smi.cc
  ``amdsmi_get_gpu_asic_info``; ``amdsmi_get_gpu_enumeration_info`` formats it "GPU-%016x").
- the KFD topology in sysfs (:func:`kfd_topology`), which amdsmi 6.0-6.2 do not read themselves.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

VERSIONS_DIR = Path(__file__).resolve().parent.parent / ".bindings" / "amdsmi"
VERSIONS = ("6.0.2", "6.2.4", "6.3.0", "7.0.2")
SUCCESS, NOT_SUPPORTED = 0, 2
DRIVER_NOT_LOADED = 34  # AMDSMI_STATUS_DRIVER_NOT_LOADED (amdsmi.h; amdsmi_wrapper.py 6.0.2 to 7.0.2)
UINT32_MAX, UINT64_MAX = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
RESOLUTION_UJ = 15.3
XGMI_WEIGHT = 15  # KFD_CRAT_XGMI_WEIGHT, kfd_crat.h


@dataclass
class SimGcd:
    bdf: str  # "0000:c1:00.0"
    serial: int
    kfd_node: int
    draw_watts: float = 0.0
    primary: bool = True  # the die that reports its package's energy and power
    device_id: int = 0x740C
    compute_units: int = 110
    market_name: str = "AMD Instinct MI250X / MI250"
    # The KFD node's gfx_target_version property: major * 10000 + minor * 100 + stepping.
    kfd_gfx_version: int = 90010  # gfx90a
    accumulator: int = 0
    # The SMU's EnergyAccumulator: 64 bits on MI200/MI300, 32 on MI100 (kernel arcturus_ppt.c,
    # aldebaran_ppt.c); it wraps at its width.
    counter_bits: int = 64
    # A broken counter accumulates this multiple of the true energy: 0 is the frozen counter of
    # ROCm/amdsmi issue #38.
    counter_scale: float = 1.0
    # MI300 fills current_socket_power; MI200 leaves it "not available" (amd_smi.cc's
    # amdsmi_get_power_info reads it only where the SMU metrics table has it).
    current_power: bool = False
    # sysfs serial_number: the board's FRU serial, or "" for the die's own unique id ("%016llx").
    board_serial: str = ""
    # C function name -> the amdsmi_status_t it returns for this GCD.
    failing: dict[str, int] = field(default_factory=dict)


@dataclass
class SimNode:
    gcds: list[SimGcd]
    packages: list[tuple[int, int]]  # indices into gcds
    bandwidth_mbs: Callable[[int, int], int]
    hops: Callable[[int, int], int]
    not_available: int = UINT32_MAX
    now_ns: int = 1_700_000_000_000_000_000
    calls: list[str] = field(default_factory=list)
    initialized: int = 0
    init_status: int = 0  # what amdsmi_init returns, e.g. DRIVER_NOT_LOADED
    driver_version: str = "6.8.5"  # amdsmi_get_gpu_driver_info: the amdgpu module's version

    def package_of(self, index: int) -> tuple[int, int]:
        return next(p for p in self.packages if index in p)

    def advance(self, seconds: float) -> None:
        self.now_ns += int(seconds * 1e9)
        for package in self.packages:
            watts = sum(self.gcds[i].draw_watts for i in package)
            primary = next(self.gcds[i] for i in package if self.gcds[i].primary)
            ticks = round(watts * seconds * 1e6 / RESOLUTION_UJ * primary.counter_scale)
            primary.accumulator = (primary.accumulator + ticks) % (1 << primary.counter_bits)

    def package_watts(self, index: int) -> int:
        gcd = self.gcds[index]
        return round(sum(self.gcds[i].draw_watts for i in self.package_of(index))) if gcd.primary else 0


LINK_MBS = 50_000  # one Aldebaran XGMI link: 16 lanes x 25 GT/s / 8


def xgmi_bandwidth(links: dict[tuple[int, int], int]) -> Callable[[int, int], int]:
    """The KFD io-link maximum bandwidth between two GCDs (indices into ``SimNode.gcds``) joined by
    ``links[(a, b)]`` XGMI links: links x 50000 MB/s on Aldebaran (kernel amdgpu_amdkfd.c,
    ``amdgpu_amdkfd_get_xgmi_bandwidth_mbytes``); 0 where no link is given."""

    def bandwidth(a: int, b: int) -> int:
        return LINK_MBS * links.get((a, b), links.get((b, a), 0))

    return bandwidth


def mi250x_node(boards: tuple[str, str] | None = None, **kwargs: Any) -> SimNode:
    """Two MI250X packages, four GCDs, in PCI order A0 A1 B0 B1; KFD (HIP) order interleaves them
    (A0 B0 A1 B1). A1 and B1 are the silent siblings. Every XGMI bandwidth reads 0 by default, and
    every link weight 15: all four dies are directly linked (``hops`` 1), as on a real node.
    Unique ids: 0x5A1F00000000AA01/AA02 for package A's GCDs, BB01/BB02 for B's; the board serial
    is each die's own unique id unless ``boards`` gives the two boards' FRU serials."""
    bdfs = ["0000:c1:00.0", "0000:c6:00.0", "0000:c9:00.0", "0000:ce:00.0"]
    nodes = [2, 4, 3, 5]
    serials = [0x5A1F00000000AA01, 0x5A1F00000000AA02, 0x5A1F00000000BB01, 0x5A1F00000000BB02]
    gcds = [
        SimGcd(bdf, serials[i], nodes[i], draw_watts=w, primary=i in (0, 2))
        for i, (bdf, w) in enumerate(zip(bdfs, (250.0, 200.0, 300.0, 150.0)))
    ]
    packages = [(0, 1), (2, 3)]
    if boards is not None:
        for i, gcd in enumerate(gcds):
            gcd.board_serial = boards[i // 2]
    kwargs.setdefault("bandwidth_mbs", lambda a, b: 0)
    kwargs.setdefault("hops", lambda a, b: 1)  # every die directly linked to every other: weight 15
    return SimNode(gcds, packages, **kwargs)


def mi100_node(accumulator: int = 0, draw_watts: float = 290.0) -> SimNode:
    """One MI100 (Arcturus): its own package, a 32-bit energy counter."""
    gcd = SimGcd(
        "0000:03:00.0",
        0x100,
        kfd_node=1,
        draw_watts=draw_watts,
        device_id=0x738C,
        compute_units=120,
        market_name="AMD Instinct MI100",
        kfd_gfx_version=90008,  # gfx908
        accumulator=accumulator,
        counter_bits=32,
    )
    return SimNode([gcd], [(0,)], bandwidth_mbs=lambda a, b: 0, hops=lambda a, b: 0)


def mi300x_node(draw_watts: float = 700.0) -> SimNode:
    """One MI300X in SPX mode: one processor, its own package, current_socket_power filled."""
    gcd = SimGcd(
        "0000:05:00.0",
        0x300,
        kfd_node=2,
        draw_watts=draw_watts,
        device_id=0x74A1,
        compute_units=304,
        market_name="MI300X-O",
        kfd_gfx_version=90402,  # gfx942
        current_power=True,
    )
    return SimNode([gcd], [(0,)], bandwidth_mbs=lambda a, b: 0, hops=lambda a, b: 0)


def _out(pointer: Any) -> Any:
    """The object behind a ``ctypes.byref`` argument."""
    return pointer._obj


def _set(struct: Any, **values: Any) -> None:
    for name, value in values.items():
        if any(f[0] == name for f in type(struct)._fields_):
            setattr(struct, name, value)


class NativeFunction:
    """One C symbol: ``restype``/``argtypes`` are accepted and ignored, as a ctypes function's would be."""

    def __init__(self, name: str, call: Callable[..., int]) -> None:
        self.__name__ = name
        self.call = call
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> int:
        return self.call(*args)


class NativeLibrary:
    """The simulated libamd_smi.so: a symbol it does not implement answers NOT_SUPPORTED."""

    def __init__(self, node: SimNode, version: str = VERSIONS[-1]) -> None:
        self.node = node
        self.release = tuple(int(part) for part in version.split(".")[:2])

    def __getattr__(self, name: str) -> NativeFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        implementation = getattr(type(self), f"_c_{name}", None)

        def call(*args: Any) -> int:
            self.node.calls.append(name)
            return implementation(self, *args) if implementation is not None else NOT_SUPPORTED

        function = NativeFunction(name, call)
        self.__dict__[name] = function
        return function

    def _gcd(self, handle: Any) -> int:
        return int(handle.value if hasattr(handle, "value") else handle) - 0x1000

    def _target_graphics_version(self, gcd: SimGcd) -> int:
        """``amdsmi_asic_info_t.target_graphics_version`` as this release's library fills it."""
        major, minor, stepping = (
            gcd.kfd_gfx_version // 10000,
            gcd.kfd_gfx_version // 100 % 100,
            gcd.kfd_gfx_version % 100,
        )
        if self.release >= (7, 0):  # "gfx" + major minor + the stepping in hex, parsed base 16
            return int(f"{major}{minor}{stepping:x}", 16)
        return major * 100 * (10 if minor == 0 else 1) + minor * 10 + stepping  # 6.3: the decimal 9010

    # --- the functions the plugin reaches -------------------------------------------------------
    def _failing(self, handle: Any, name: str) -> int:
        return self.node.gcds[self._gcd(handle)].failing.get(name, SUCCESS)

    def _c_amdsmi_init(self, flags: Any) -> int:
        if self.node.init_status != SUCCESS:
            return self.node.init_status
        self.node.initialized += 1
        return SUCCESS

    def _c_amdsmi_shut_down(self) -> int:
        self.node.initialized = 0  # 6.x: not reference counted
        return SUCCESS

    def _c_amdsmi_get_socket_handles(self, count: Any, handles: Any) -> int:
        _out(count).value = 1
        if isinstance(handles, ctypes.Array):
            handles[0] = 0x100
        return SUCCESS

    def _c_amdsmi_get_processor_handles(self, socket: Any, count: Any, handles: Any) -> int:
        _out(count).value = len(self.node.gcds)
        if isinstance(handles, ctypes.Array):
            for i in range(len(self.node.gcds)):
                handles[i] = 0x1000 + i
        return SUCCESS

    def _c_amdsmi_get_gpu_device_bdf(self, handle: Any, out: Any) -> int:
        domain, bus, rest = self.node.gcds[self._gcd(handle)].bdf.split(":")
        device, function = rest.split(".")
        target = _out(out)
        # amdsmi.h: amdsmi_bdf_t is a union of the bit fields (function 3, device 5, bus 8, domain 48)
        # and ``as_uint``; its member's name differs between versions, ``as_uint`` does not.
        target.as_uint = int(function, 16) | int(device, 16) << 3 | int(bus, 16) << 8 | int(domain, 16) << 16
        return SUCCESS

    def _c_amdsmi_get_gpu_asic_info(self, handle: Any, out: Any) -> int:
        gcd = self.node.gcds[self._gcd(handle)]
        _set(
            _out(out),
            market_name=gcd.market_name.encode(),
            vendor_id=0x1002,
            vendor_name=b"Advanced Micro Devices Inc. [AMD/ATI]",
            device_id=gcd.device_id,
            rev_id=1,
            asic_serial=f"{gcd.serial:016X}".encode(),
            oam_id=self.node.not_available,
            num_of_compute_units=gcd.compute_units,
            target_graphics_version=self._target_graphics_version(gcd),
        )
        return SUCCESS

    def _c_amdsmi_get_gpu_board_info(self, handle: Any, out: Any) -> int:
        gcd = self.node.gcds[self._gcd(handle)]
        serial = gcd.board_serial or f"{gcd.serial:016x}"  # aldebaran_get_unique_id's fallback
        _set(_out(out), product_serial=serial.encode(), product_name=b"AMD Instinct MI250X", fru_id=b"")
        return SUCCESS

    def _c_amdsmi_get_gpu_kfd_info(self, handle: Any, out: Any) -> int:
        gcd = self.node.gcds[self._gcd(handle)]
        _set(_out(out), kfd_id=gcd.kfd_node * 100, node_id=gcd.kfd_node, current_partition_id=0)
        return SUCCESS

    def _c_amdsmi_get_gpu_enumeration_info(self, handle: Any, out: Any) -> int:
        gcd = self.node.gcds[self._gcd(handle)]
        smallest = min(g.kfd_node for g in self.node.gcds)
        _set(
            _out(out),
            drm_card=gcd.kfd_node - 1,
            drm_render=128 + gcd.kfd_node - 1,
            hsa_id=gcd.kfd_node,
            hip_id=gcd.kfd_node - smallest,
            hip_uuid=f"GPU-{gcd.serial:016x}".encode(),
        )
        return SUCCESS

    def _c_amdsmi_get_gpu_memory_total(self, handle: Any, memory_type: Any, out: Any) -> int:
        _out(out).value = 68_702_699_520
        return SUCCESS

    def _c_amdsmi_get_energy_count(self, handle: Any, accumulator: Any, resolution: Any, timestamp: Any) -> int:
        if status := self._failing(handle, "amdsmi_get_energy_count"):
            return status
        _out(accumulator).value = self.node.gcds[self._gcd(handle)].accumulator
        _out(resolution).value = RESOLUTION_UJ
        _out(timestamp).value = self.node.now_ns
        return SUCCESS

    def _c_amdsmi_get_power_info(self, handle: Any, out: Any, *_: Any) -> int:
        # MI200 reports the average only; the current field is "not available". MI300 has both.
        if status := self._failing(handle, "amdsmi_get_power_info"):
            return status
        watts = self.node.package_watts(self._gcd(handle))
        _set(
            _out(out),
            socket_power=watts,
            current_socket_power=watts if self.node.gcds[self._gcd(handle)].current_power else self.node.not_available,
            average_socket_power=self.node.package_watts(self._gcd(handle)),
            gfx_voltage=self.node.not_available,
            soc_voltage=self.node.not_available,
            mem_voltage=self.node.not_available,
            power_limit=500,
        )
        return SUCCESS

    def _c_amdsmi_get_minmax_bandwidth_between_processors(self, a: Any, b: Any, low: Any, high: Any) -> int:
        bandwidth = self.node.bandwidth_mbs(self._gcd(a), self._gcd(b))
        _out(low).value, _out(high).value = bandwidth, bandwidth
        return SUCCESS

    def _c_amdsmi_topo_get_link_weight(self, a: Any, b: Any, weight: Any) -> int:
        _out(weight).value = XGMI_WEIGHT * self.node.hops(self._gcd(a), self._gcd(b))
        return SUCCESS

    def _c_amdsmi_get_gpu_driver_info(self, handle: Any, out: Any) -> int:
        _set(
            _out(out),
            driver_name=b"amdgpu",
            driver_version=self.node.driver_version.encode(),
            driver_date=b"2015/01/01 00:00",
        )
        return SUCCESS


class Clock:
    """Simulated time for the meter's validation: sleeping runs the simulated node."""

    def __init__(self, node: SimNode) -> None:
        self.t, self.node = 1000.0, node

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.node.advance(seconds)


def kfd_topology(tmp_path: Path, node: SimNode) -> Path:
    """/sys/class/kfd/kfd/topology/nodes for amdsmi 6.0-6.2, which give no HIP order themselves:
    node 0 the CPU (no SIMDs), then each GCD's node with its PCI location (kernel kfd_topology.c,
    ``location_id`` = bus << 8 | device << 3 | function, and ``domain``)."""
    root = tmp_path / "nodes"
    (root / "0").mkdir(parents=True)
    (root / "0" / "properties").write_text("cpu_cores_count 64\nsimd_count 0\n")
    for gcd in node.gcds:
        domain, bus, rest = gcd.bdf.split(":")
        device, function = (int(x, 16) for x in rest.split("."))
        location = (int(bus, 16) << 8) | (device << 3) | function
        (root / str(gcd.kfd_node)).mkdir()
        (root / str(gcd.kfd_node) / "properties").write_text(
            f"simd_count 440\nlocation_id {location}\ndomain {int(domain, 16)}\n"
            f"gfx_target_version {gcd.kfd_gfx_version}\n"
        )
    return root


def forget_amdsmi() -> None:
    for name in [name for name in sys.modules if name == "amdsmi" or name.startswith("amdsmi.")]:
        del sys.modules[name]


def unpacked(version: str) -> Path:
    """The folder holding amdsmi ``version``'s Python package; skips the test where it is not there."""
    package = VERSIONS_DIR / version
    if not (package / "amdsmi" / "amdsmi_interface.py").is_file():
        pytest.skip(f"amdsmi {version} is not unpacked under {VERSIONS_DIR} (run scripts/fetch-bindings.sh)")
    return package


@contextmanager
def real_amdsmi(version: str, node: SimNode, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """The real amdsmi ``version`` imported as ``amdsmi``, over ``node``'s simulated library."""
    package = unpacked(version)
    library = NativeLibrary(node, version)
    real_cdll = ctypes.CDLL

    def cdll(name: Any, *args: Any, **kwargs: Any) -> Any:
        return library if str(name).endswith("libamd_smi.so") else real_cdll(name, *args, **kwargs)

    (tmp_path / "rocm" / "lib").mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))  # 6.0-6.3 read os.environ["ROCM_PATH"]
    monkeypatch.delenv("ROCM_HOME", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    monkeypatch.syspath_prepend(str(package))
    forget_amdsmi()
    try:
        amdsmi = importlib.import_module("amdsmi")
        assert Path(amdsmi.__file__).parent == package / "amdsmi"
        yield amdsmi
    finally:
        forget_amdsmi()


# --- fixtures the AMD test modules share (registered in conftest.py) -----------------------------


@pytest.fixture
def amdsmi_session_closed() -> Iterator[None]:
    """Fails a test that leaves the plugin's amdsmi session open."""
    from core_plugins.amd import smi

    yield
    assert smi.amdsmi_session.users == 0, "an amdsmi session was left open"


@pytest.fixture
def probe(tmp_path: Path, amdsmi_session_closed: None) -> Any:
    """The AMD plugin's SDK probe with a stand-in for /dev/kfd (and the session check above)."""
    from core_plugins.amd import smi
    from core_plugins.probing import SdkProbe

    (tmp_path / "kfd").write_text("")
    return SdkProbe(
        module="amdsmi", install_hint=smi.INSTALL_HINT, device_globs=(str(tmp_path / "kfd"),), device_hint="no /dev/kfd"
    )
