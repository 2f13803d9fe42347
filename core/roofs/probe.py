"""The roof probe: a host's memory bandwidth and matmul peaks, measured in a few seconds with torch.

- **Memory bandwidth**: a STREAM triad, ``a = b + s x c`` over float32 arrays much larger than the
  last-level cache. It moves 3 arrays per pass (reads b and c, writes a; STREAM's count, which
  leaves out the write-allocate read of a, so it is the bandwidth a program sees).
- **Peak FLOP/s**: a square matmul at each compute dtype the device can run (2 n^3 FLOPs each),
  the faster of ``torch.matmul`` and the ``linear`` layer's kernel (:func:`_kernels`).

Timing: a warm-up call apart (allocation, thread pools, kernel selection), then windows of as many
calls as fill ``window_seconds``, each window closed by a device synchronisation at both ends (a
GPU's calls are asynchronous); the figure is the median window's rate over ``repeats`` windows.
Every matmul or triad reuses its buffers (``out=``), so the windows time the operation, not malloc.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

TRIAD_ARRAYS = 3  # b and c read, a written
TRIAD_FLOPS_PER_ELEMENT = 2  # a multiply and an add
DEFAULT_TRIAD_ELEMENTS = 1 << 25  # 128 MiB per float32 array: 384 MiB moved a pass, well past any L3
DEFAULT_MATMUL_SIZE = 1024
DEFAULT_REPEATS = 5
DEFAULT_WINDOW_SECONDS = 0.25  # a matmul of side 1024 at a CPU's 10-20 GFLOP/s of bf16 fits half of it
MATMUL_DTYPES = ("float32", "bfloat16", "float16")


def triad_bytes(elements: int, item_bytes: int) -> int:
    """Bytes one triad pass moves to and from memory: three arrays of ``elements``."""
    return TRIAD_ARRAYS * elements * item_bytes


def triad_flops(elements: int) -> int:
    return TRIAD_FLOPS_PER_ELEMENT * elements


def matmul_flops(size: int) -> int:
    """FLOPs of an (n x n) @ (n x n) matmul: n^2 outputs, each n multiplies and n adds."""
    return 2 * size**3


@dataclass(frozen=True)
class Timing:
    seconds_per_call: float  # the median window's
    calls_per_window: int
    windows: int


def time_calls(
    call: Callable[[], object],
    synchronise: Callable[[], object],
    repeats: int = DEFAULT_REPEATS,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """The median seconds per call over ``repeats`` windows, after one warm-up call that is not
    timed; the first timed window also sizes the others (calls enough to fill ``window_seconds``)."""
    if repeats < 1:
        raise ValueError(f"repeats = {repeats}: at least 1 is required")
    call()  # warm-up: allocation, thread start-up, kernel choice
    synchronise()

    def window(calls: int) -> float:
        synchronise()
        start = clock()
        for _ in range(calls):
            call()
        synchronise()
        return (clock() - start) / calls

    first = window(1)
    calls = max(1, int(window_seconds / first)) if first > 0 else 1
    per_call = [window(calls) for _ in range(repeats)]
    return Timing(statistics.median(per_call), calls, repeats)


@dataclass(frozen=True)
class ProbeFigures:
    bandwidth_bytes_per_second: float
    peak_flops_per_second: dict[str, float]  # by compute dtype
    seconds: float  # the probe's whole run time
    method: str


def _synchroniser(torch: Any, device: Any) -> Callable[[], object]:
    """Waits for the device's queued work; the CPU runs each call to its end."""
    if device.type == "cpu":
        return lambda: None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        return lambda: accelerator.synchronize(device)
    return lambda: getattr(torch, device.type).synchronize(device)


def runnable_dtypes(torch: Any, device: Any, dtypes: Sequence[str]) -> list[str]:
    """The dtypes a small matmul runs in on the device (a CPU without fp16 kernels raises)."""
    runnable = []
    for name in dtypes:
        dtype = getattr(torch, name)
        try:
            tiny = torch.ones((4, 4), dtype=dtype, device=device)
            torch.matmul(tiny, tiny)
        except (RuntimeError, TypeError):
            continue
        runnable.append(name)
    return runnable


SMALLEST_MATMUL = 256


@dataclass(frozen=True)
class _Matmul:
    size: int
    kernel: str  # "matmul" or "linear"
    call: Callable[[], object]


def _kernels(torch: Any, x: Any, y: Any, out: Any) -> list[tuple[str, Callable[[], object]]]:
    """The two ways a model multiplies matrices: ``torch.matmul`` and the ``linear`` layer's kernel.
    They are not equally fast: on a CPU without bf16 instructions, a bf16 matmul runs at about
    1 GFLOP/s while a bf16 linear goes through oneDNN at about 15 (measured on this project's
    2-core EPYC), and a model's Linear layers run at the second. The peak is the faster."""
    return [
        ("matmul", functools.partial(torch.matmul, x, y, out=out)),
        ("linear", functools.partial(torch.nn.functional.linear, x, y)),  # x @ y.T: the same FLOPs
    ]


def _matmul_of(
    torch: Any, device: Any, dtype: Any, largest: int, window_seconds: float, synchronise: Callable[[], object]
) -> _Matmul:
    """A matmul of ``dtype``: of the sides from 256 doubling up to ``largest`` and the kernels of
    :func:`_kernels`, the fastest (FLOP/s of one warm call) among those whose call takes at most half
    a window. Sizes grow until a call takes longer, so a kernel the device only emulates stays small
    and the probe keeps to seconds, while a busy host, where a small matmul's time is mostly waiting
    for its threads, still reaches a size that measures the peak."""
    size = min(SMALLEST_MATMUL, largest)
    best: tuple[float, _Matmul] | None = None
    slow: set[str] = set()  # kernels past half a window: a larger side would only take longer
    while True:
        x = torch.rand((size, size), device=device).to(dtype)
        y = torch.rand((size, size), device=device).to(dtype)
        out = torch.empty((size, size), dtype=dtype, device=device)
        for kernel, call in _kernels(torch, x, y, out):
            if kernel in slow:
                continue
            matmul = _Matmul(size, kernel, call)
            matmul.call()  # warm-up: the first call at a size picks its kernel
            synchronise()
            start = time.perf_counter()
            matmul.call()
            synchronise()
            seconds = time.perf_counter() - start
            rate = matmul_flops(size) / seconds if seconds > 0 else float("inf")
            if seconds > window_seconds / 2:
                slow.add(kernel)
            elif best is None or rate > best[0]:
                best = (rate, matmul)
            if best is None:  # even the smallest side is slow: measure it all the same
                best = (rate, matmul)
        if len(slow) == 2 or size * 2 > largest:
            assert best is not None  # the smallest side's kernels always set it
            return best[1]
        size *= 2


def _triad_bandwidth(
    torch: Any, device: Any, elements: int, synchronise: Callable[[], object], repeats: int, window_seconds: float
) -> float:
    """Bytes per second of the triad over float32 arrays of ``elements`` (freed on return)."""
    b = torch.rand(elements, dtype=torch.float32, device=device)
    c = torch.rand(elements, dtype=torch.float32, device=device)
    a = torch.empty_like(b)
    timing = time_calls(functools.partial(torch.add, b, c, alpha=3.0, out=a), synchronise, repeats, window_seconds)
    return triad_bytes(elements, b.element_size()) / timing.seconds_per_call


def probe(
    torch_device: str = "cpu",
    dtypes: Sequence[str] = MATMUL_DTYPES,
    triad_elements: int = DEFAULT_TRIAD_ELEMENTS,
    matmul_size: int = DEFAULT_MATMUL_SIZE,
    repeats: int = DEFAULT_REPEATS,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
) -> ProbeFigures:
    """Measure the triad bandwidth and the matmul peak at each of ``dtypes`` the device runs."""
    import torch

    began = time.perf_counter()
    device = torch.device(torch_device)
    synchronise = _synchroniser(torch, device)
    with torch.no_grad():
        bandwidth = _triad_bandwidth(torch, device, triad_elements, synchronise, repeats, window_seconds)
        peaks: dict[str, float] = {}
        sizes: dict[str, str] = {}
        for name in runnable_dtypes(torch, device, dtypes):
            matmul = _matmul_of(torch, device, getattr(torch, name), matmul_size, window_seconds, synchronise)
            timing = time_calls(matmul.call, synchronise, repeats, window_seconds)
            peaks[name] = matmul_flops(matmul.size) / timing.seconds_per_call
            sizes[name] = f"{matmul.size} ({matmul.kernel})"
    seconds = time.perf_counter() - began
    shown = ", ".join(f"{name} {size}" for name, size in sizes.items())
    method = (
        f"torch {torch.__version__} on {torch_device}, {torch.get_num_threads()} threads: triad a = b + s x c over "
        f"{triad_elements:,} float32 elements ({triad_bytes(triad_elements, 4) / 1e6:.0f} MB moved a pass); "
        f"square matmuls of side {shown}; warm-up apart, median of {repeats} windows of "
        f"{window_seconds:g} s, synchronised at both ends"
    )
    return ProbeFigures(bandwidth, peaks, seconds, method)
