"""The real pynvml (nvidia-ml-py) over a simulated native NVML: tests/native/simnvml.c.

The C library is compiled here at test time (`cc -shared -fPIC`) and handed to pynvml as its
`nvmlLib`. pynvml's `_LoadNvmlLibrary` loads the driver's library only while `nvmlLib` is None
(`if (nvmlLib == None): ... nvmlLib = CDLL("libnvidia-ml.so.1")` on Linux, nvidia-ml-py 11.525 to
13.615), and every call then goes through `_nvmlGetFunctionPointer(name)`, i.e.
`getattr(nvmlLib, name)`, raising NVMLError_FunctionNotFound for a symbol the library lacks. So
everything from the Python layer down to the C call is NVIDIA's; only the C library is ours.
tests/test_nvidia_native.py also loads it the unpatched way, by LD_LIBRARY_PATH in a subprocess.

The node is written to a file the library reads at nvmlInit ($SIM_NVML_NODE). What a test changes
while the plugin runs (a GPU falling off the bus) and what it counts (nvmlInit/nvmlShutdown calls) go
through functions the library exports beside NVML's, all named simnvml_*: see `lose_gpu` and
`init_and_shutdown_calls`.

Every test runs on each nvidia-ml-py release at hand: the one installed (the dev extra's pin, the
newest) and those scripts/fetch-bindings.sh unpacked under .bindings/nvidia-ml-py/<version>/ (the
oldest release the `nvidia` extra allows, and one from the 12 series); a release that is not
unpacked is skipped, saying so.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from core.testing import SimulatedClock

SOURCE = Path(__file__).parent / "native" / "simnvml.c"
UNPACKED = Path(__file__).resolve().parent.parent / ".bindings" / "nvidia-ml-py"
# The releases scripts/fetch-bindings.sh unpacks; "installed" is the one pip installed.
RELEASES = ("installed", "11.525.150", "12.535.77")

# NVML_DEVICE_ARCH_* values (nvml.h)
PASCAL, VOLTA, AMPERE, HOPPER = 4, 5, 7, 9

# how the simulated driver answers NVML_FI_DEV_POWER_INSTANT (INSTANT_FAILS_LATER: the first read,
# the meter's probe, succeeds and every later one fails)
INSTANT_ABSENT, INSTANT_UINT, INSTANT_DOUBLE, INSTANT_FAILS_LATER = 0, 1, 2, 3


@dataclass
class SimMig:
    uuid: str  # "MIG-<uuid>" as NVML R470+ reports it
    gpu_instance: int
    compute_instance: int
    memory_bytes: int
    name: str


@dataclass
class SimGpu:
    uuid: str
    name: str
    compute_capability: tuple[int, int]
    architecture: int
    memory_bytes: int
    power_watts: float  # at driver load (the first nvmlInit)
    power_limit_watts: float | None  # None: nvmlDeviceGetEnforcedPowerLimit answers NotSupported
    bus_id: str
    energy_at_load_joules: float = 123_456.0
    instant: int = INSTANT_UINT
    #: power rises (or falls) this fast from driver load on; the counter follows its integral
    power_ramp_watts_per_second: float = 0.0
    #: the energy counter's rate over the power's integral: 1.2 is a counter running 20 % fast
    counter_scale: float = 1.0
    migs: list[SimMig] = field(default_factory=list)


def h200(uuid: str, power_watts: float, bus: int) -> SimGpu:
    return SimGpu(uuid, "NVIDIA H200", (9, 0), HOPPER, 150_754_820_096, power_watts, 700.0, f"00000000:{bus:02X}:00.0")


def a100(uuid: str, power_watts: float, bus: int) -> SimGpu:
    return SimGpu(
        uuid, "NVIDIA A100-SXM4-80GB", (8, 0), AMPERE, 85_899_345_920, power_watts, 400.0, f"00000000:{bus:02X}:00.0"
    )


def v100(uuid: str, power_watts: float, bus: int) -> SimGpu:
    return SimGpu(
        uuid, "Tesla V100-SXM2-16GB", (7, 0), VOLTA, 17_179_869_184, power_watts, 300.0, f"00000000:{bus:02X}:00.0"
    )


def p100(uuid: str, power_watts: float, bus: int) -> SimGpu:
    """Pascal: no total-energy counter (Volta and newer only), no tf32 or bf16."""
    return SimGpu(
        uuid, "Tesla P100-PCIE-16GB", (6, 0), PASCAL, 17_071_734_784, power_watts, 250.0, f"00000000:{bus:02X}:00.0"
    )


@dataclass
class SimNode:
    gpus: list[SimGpu]
    driver: str = "535.104.05"
    cuda_version: int = 12020

    def text(self) -> str:
        lines = [f"driver {self.driver} {self.cuda_version}"]
        for g in self.gpus:
            limit_mw = 0 if g.power_limit_watts is None else round(g.power_limit_watts * 1000)
            lines.append(
                f"gpu {g.uuid} {g.compute_capability[0]} {g.compute_capability[1]} {g.architecture} "
                f"{g.memory_bytes} {round(g.power_watts * 1000)} {limit_mw} "
                f"{round(g.energy_at_load_joules * 1000)} {g.instant} {g.power_ramp_watts_per_second * 1000!r} "
                f"{g.counter_scale!r} {g.bus_id} {g.name}"
            )
        for index, g in enumerate(self.gpus):
            lines += [
                f"mig {index} {m.uuid} {m.gpu_instance} {m.compute_instance} {m.memory_bytes} {m.name}" for m in g.migs
            ]
        return "\n".join(lines) + "\n"


def lose_gpu(pynvml: Any, index: int) -> None:
    """The GPU at this NVML index falls off the bus: NVML answers NVML_ERROR_GPU_IS_LOST for it from now on."""
    pynvml.nvmlLib.simnvml_lose_gpu(index)


def simulated_time(pynvml: Any) -> SimulatedClock:
    """A clock for the meter that the simulated library follows: power and energy change only as
    the test moves it (``advance``, ``run_for``), so what the meter reads does not depend on how
    busy the machine is. Call it after installing the node (installing resets the library's time)."""
    library = pynvml.nvmlLib
    library.simnvml_set_time.argtypes = [ctypes.c_double]
    return SimulatedClock(1000.0, on_change=library.simnvml_set_time)


def init_and_shutdown_calls(pynvml: Any) -> tuple[int, int]:
    """Successful nvmlInit and nvmlShutdown calls the C library has had since the node was installed."""
    return int(pynvml.nvmlLib.simnvml_init_calls()), int(pynvml.nvmlLib.simnvml_shutdown_calls())


def compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@pytest.fixture(scope="session")
def simnvml_libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The simulated libnvidia-ml.so.1, compiled once per session: a current driver and one
    old enough to lack nvmlDeviceGetArchitecture)."""
    cc = compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the simulated libnvidia-ml.so.1")
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install -e '.[dev]')")
    built: dict[str, Path] = {}
    for variant, flags in (("current", []), ("no-architecture", ["-DSIM_NO_ARCHITECTURE"])):
        folder = tmp_path_factory.mktemp(f"simnvml-{variant}")
        library = folder / "libnvidia-ml.so.1"
        subprocess.run([cc, "-shared", "-fPIC", "-O1", *flags, "-o", str(library), str(SOURCE)], check=True)
        built[variant] = library
    return built


def _reset(pynvml: Any, library: Any) -> None:
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


@pytest.fixture(params=RELEASES)
def pynvml_folder(request: pytest.FixtureRequest) -> Path | None:
    """The folder holding the nvidia-ml-py release under test, or None for the installed one."""
    release = str(request.param)
    if release == "installed":
        return None
    folder = UNPACKED / release
    if not (folder / ".complete").is_file():
        pytest.skip(f"nvidia-ml-py {release} is not unpacked under {UNPACKED} (run scripts/fetch-bindings.sh)")
    return folder


def installed_pynvml_file() -> Path:
    return Path(str(importlib.metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")))


@pytest.fixture
def sim_nvml(
    simnvml_libraries: dict[str, Path],
    pynvml_folder: Path | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Iterator[Callable[..., Any]]:
    """``install(node, driver="current"|"no-architecture")`` -> the real pynvml module over that node.

    Any pynvml already imported (another release) is removed from sys.modules first, so
    `import pynvml` anywhere (the plugin's import_pynvml, a benchmark's) gets the release under test.
    """
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    if pynvml_folder is not None:
        monkeypatch.syspath_prepend(str(pynvml_folder))
    import pynvml

    expected = pynvml_folder / "pynvml.py" if pynvml_folder else installed_pynvml_file()
    if Path(pynvml.__file__ or "").resolve() != expected.resolve():
        pytest.fail(f"pynvml came from {pynvml.__file__}, not from the release under test ({expected})")

    def install(node: SimNode, driver: str = "current") -> Any:
        node_file = tmp_path / "node.txt"
        node_file.write_text(node.text())
        monkeypatch.setenv("SIM_NVML_NODE", str(node_file))
        # Two builds share one process; ctypes keeps each loaded under its own path.
        library = ctypes.CDLL(str(simnvml_libraries[driver]))
        library.simnvml_reset()
        _reset(pynvml, library)
        return pynvml

    yield install
    _reset(pynvml, None)
    # The next test may want another release under the same name.
    sys.modules.pop("pynvml", None)


def measure_nvml(clock: SimulatedClock, devices: list[Any], window_seconds: float) -> Any:
    """The NVIDIA plugin's meter over ``devices`` for ``window_seconds`` of the simulated library's
    time (``clock``, made right after the node was installed): its figures do not depend on how
    busy the machine is."""
    from core import make_config
    from core.testing import run_context
    from core_plugins.nvidia.meter import NvmlMeterFactory

    config = make_config(workload="fcnn", accelerator="nvidia", power_sample_interval_seconds=0.01)
    meter = NvmlMeterFactory(clock=clock).meter_for(devices, run_context(config))
    try:
        meter.start()
        clock.wait_for_waiters(1)  # the power sampler
        clock.run_for(window_seconds, config.power_sample_interval_seconds)
        return meter.stop()
    finally:
        meter.close()
