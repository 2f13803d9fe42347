"""core against plain PyTorch loops on one GPU, same process, same model, same data.

    python benchmarks/nvidia_vs_plain.py --case all [--json results.json]
    python benchmarks/nvidia_vs_plain.py --case resnet50|resnet50-compile|fcnn|meter [--steps N]
    python benchmarks/nvidia_vs_plain.py --case all --accelerator cpu --smoke   # code paths only

Cases (the NVIDIA issue's checks):
- resnet50: core's zoo ResNet-50, synthetic 224x224 images on the device, batch 256, bf16
  autocast, channels_last, SGD with momentum; core / a plain loop on the same model (>= 0.99).
  A plain loop on torchvision's ResNet-50 is timed beside it, where torchvision loads, to place
  the model against the issue's reference figure.
- resnet50-compile: core with compile=True over the plain *eager* loop (>= 1.40), with core's
  first step (compilation) reported apart; a plain compiled loop for reference.
- fcnn: D_H 8192, 8 layers, batch 16384, bf16; core / plain (>= 0.98), and core's FLOP/s
  against 6 Phi bs / window time.
- meter: core with the accelerator's meter on and off (< 1 % apart); core's window joules against
  counter reads taken independently around the same window (within 1 %), and the sampled integral.

Runs alternate core and plain so drift hits both alike; figures are medians. ``--smoke`` shrinks
every case to seconds so CI can run the script on a CPU: its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from core import RunResult, Workload, run
from core.contract.manager import get_plugin_manager
from core.contract.workload import TorchTrainingSpec
from core.energy.meters import DeviceEnergyMeter

CASES = ("resnet50", "resnet50-compile", "fcnn", "meter")


@dataclass(frozen=True)
class Shape:
    """One case's workload and sizes."""

    workload: str
    batch: int
    options: dict[str, Any]


FULL = {
    "resnet50": Shape("resnet50", 256, {}),
    "fcnn": Shape(
        "fcnn",
        16384,
        {"layers": 8, "hidden_width": 8192, "input_width": 8192, "output_width": 1024, "synthetic_pool_samples": 16384},
    ),
}
#: a smoke run's timed steps: it checks the code paths, and bf16 convolutions crawl on a CPU
#: without bf16 units (about a second a step for the small ResNet-50)
SMOKE_STEPS = 1
SMOKE = {
    "resnet50": Shape("resnet50", 2, {"variant": "small", "image_size": 32}),
    "fcnn": Shape("fcnn", 32, {"layers": 2, "hidden_width": 64, "input_width": 32, "output_width": 10}),
}


def workload_named(name: str) -> Workload:
    return get_plugin_manager().workload(name)  # the registered workload core's runs use


class PlainLoop:
    """A hand-written loop doing what core's executor does for this case, nothing more."""

    def __init__(
        self,
        spec: TorchTrainingSpec,
        batch: int,
        device: torch.device,
        channels_last: bool,
        compile_model: bool = False,
    ) -> None:
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        self.device = device
        model = spec.model.to(device)
        indices = torch.arange(batch) % len(spec.inputs)  # the same samples core's synthetic data takes
        inputs = spec.inputs.index_select(0, indices).to(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        self.inputs, self.targets = inputs, spec.targets.index_select(0, indices).to(device)
        self.loss_fn = spec.loss_fn
        self.optimizer = spec.make_optimizer(model.parameters())
        self.model: Callable[..., Any] = torch.compile(model) if compile_model else model
        self.batch = batch

    def step(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.loss_fn(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def synchronize(self) -> None:
        if self.device.type != "cpu":
            getattr(torch, self.device.type).synchronize(self.device)

    def first_step_seconds(self) -> float:
        started = time.perf_counter()
        self.step()
        self.synchronize()
        return time.perf_counter() - started

    def samples_per_second(self, steps: int, warmup: int) -> float:
        for _ in range(warmup):
            self.step()
        self.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.synchronize()
        return self.batch * steps / (time.perf_counter() - started)


def build_spec(shape: Shape) -> TorchTrainingSpec:
    workload = workload_named(shape.workload)
    return workload.build_torch(workload.parse_options(dict(shape.options)), 0)


def torchvision_spec(batch: int) -> TorchTrainingSpec | None:
    """torchvision's ResNet-50 on the same kind of data, or None where torchvision does not load."""
    try:
        import torchvision
    except Exception:  # absent, or built for another torch
        return None
    generator = torch.Generator().manual_seed(1)
    return TorchTrainingSpec(
        model=torchvision.models.resnet50(),
        loss_fn=torch.nn.CrossEntropyLoss(),
        make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        inputs=torch.randn(min(batch, 64), 3, 224, 224, generator=generator),
        targets=torch.randint(0, 1000, (min(batch, 64),), generator=generator),
    )


@dataclass
class Bench:
    accelerator: str
    steps: int
    warmup: int
    repeats: int
    shapes: dict[str, Shape]

    @property
    def device(self) -> torch.device:
        return torch.device("cpu" if self.accelerator == "cpu" else "cuda")

    def core(self, shape: Shape, **options: Any) -> RunResult:
        result = run(
            shape.workload,
            self.accelerator,
            micro_batch_size=shape.batch,
            steps=self.steps,
            warmup_steps=self.warmup,
            precision="bf16",
            workload_options=shape.options,
            **options,
        )
        if not result.status.ok:
            raise RuntimeError(f"core run failed: {result.status}")
        return result

    def plain_loop(self, shape: Shape, like: RunResult, compile_model: bool = False) -> PlainLoop:
        """A plain loop on a fresh copy of the model, with the memory format core's run chose."""
        return PlainLoop(
            build_spec(shape), shape.batch, self.device, bool(like.executor_details.get("channels_last")), compile_model
        )

    def plain(self, shape: Shape, like: RunResult) -> float:
        return self.plain_loop(shape, like).samples_per_second(self.steps, self.warmup)

    def alternate(
        self, core_fn: Callable[[], RunResult], other_fn: Callable[[RunResult], float]
    ) -> tuple[list[RunResult], list[float]]:
        """core, then the other side given core's result, ``repeats`` times."""
        results, others = [], []
        for _ in range(self.repeats):
            results.append(core_fn())
            others.append(other_fn(results[-1]))
        return results, others


def median_rate(results: list[RunResult]) -> float:
    return statistics.median(r.throughput_per_second for r in results if r.throughput_per_second is not None)


def case_resnet50(bench: Bench) -> dict[str, Any]:
    shape = bench.shapes["resnet50"]
    results, plain = bench.alternate(
        lambda: bench.core(shape, power_meter="none"), lambda like: bench.plain(shape, like)
    )
    figures: dict[str, Any] = {
        "core_images_per_second": median_rate(results),
        "plain_images_per_second": statistics.median(plain),
        "core_runs": [r.throughput_per_second for r in results],
        "plain_runs": plain,
        "channels_last": results[-1].executor_details.get("channels_last"),
        "autocast_dtype": results[-1].executor_details.get("autocast_dtype"),
    }
    figures["ratio_core_over_plain"] = figures["core_images_per_second"] / figures["plain_images_per_second"]
    reference = torchvision_spec(shape.batch) if bench.shapes is FULL else None
    if reference is not None:
        loop = PlainLoop(reference, shape.batch, bench.device, channels_last=True)
        figures["plain_torchvision_images_per_second"] = loop.samples_per_second(bench.steps, bench.warmup)
    return figures


def case_resnet50_compile(bench: Bench) -> dict[str, Any]:
    shape = bench.shapes["resnet50"]
    results, plain = bench.alternate(
        lambda: bench.core(shape, power_meter="none", compile=True), lambda like: bench.plain(shape, like)
    )
    compiled_loop = bench.plain_loop(shape, results[-1], compile_model=True)
    plain_compile_seconds = compiled_loop.first_step_seconds()
    figures = {
        "core_compiled_images_per_second": median_rate(results),
        "plain_eager_images_per_second": statistics.median(plain),
        "core_first_step_seconds": [r.first_step_seconds for r in results],
        "core_warnings": results[-1].warnings,
        "plain_compiled_images_per_second": compiled_loop.samples_per_second(bench.steps, bench.warmup),
        "plain_compiled_first_step_seconds": plain_compile_seconds,
    }
    figures["ratio_core_compiled_over_plain_eager"] = (
        figures["core_compiled_images_per_second"] / figures["plain_eager_images_per_second"]
    )
    figures["ratio_core_compiled_over_plain_compiled"] = (
        figures["core_compiled_images_per_second"] / figures["plain_compiled_images_per_second"]
    )
    return figures


def case_fcnn(bench: Bench) -> dict[str, Any]:
    shape = bench.shapes["fcnn"]
    results, plain = bench.alternate(
        lambda: bench.core(shape, power_meter="none"), lambda like: bench.plain(shape, like)
    )
    workload = workload_named("fcnn")
    phi = workload.parameter_count(workload.parse_options(dict(shape.options)))
    last = results[-1]
    assert last.window_seconds and last.flops_per_second
    six_phi_bs_over_time = 6 * phi * last.window_samples / last.window_seconds
    figures = {
        "core_samples_per_second": median_rate(results),
        "plain_samples_per_second": statistics.median(plain),
        "core_runs": [r.throughput_per_second for r in results],
        "plain_runs": plain,
        "phi": phi,
        "core_flops_per_second": last.flops_per_second,
        "six_phi_bs_over_window_seconds": six_phi_bs_over_time,
        "flops_ratio": last.flops_per_second / six_phi_bs_over_time,
        "model_flops_utilization": last.model_flops_utilization,
    }
    figures["ratio_core_over_plain"] = figures["core_samples_per_second"] / figures["plain_samples_per_second"]
    return figures


def benchmark_gpu_uuids() -> list[str]:
    """The GPU the benchmark's runs use (cuda:0), named by PyTorch rather than by core's plugin."""
    return [f"GPU-{torch.cuda.get_device_properties(0).uuid}"]


@contextmanager
def independent_counter_reads(accelerator: str, uuids: list[str] | None = None) -> Iterator[list[float]]:
    """Total-energy counter reads of the run's GPUs taken right outside core's meter's own start
    and stop, through a separate NVML session: joules[k] for window k."""
    windows: list[float] = []
    if accelerator != "nvidia":
        yield windows
        return
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByUUID(uuid) for uuid in (uuids or benchmark_gpu_uuids())]
    start_reads: list[int] = []
    original_start, original_stop = DeviceEnergyMeter.start, DeviceEnergyMeter.stop

    def total_millijoules() -> int:
        return sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles)

    def start(self: Any) -> None:
        start_reads.append(total_millijoules())
        original_start(self)

    def stop(self: Any) -> Any:
        measurement = original_stop(self)
        windows.append((total_millijoules() - start_reads[-1]) / 1000.0)
        return measurement

    DeviceEnergyMeter.start, DeviceEnergyMeter.stop = start, stop  # type: ignore[method-assign]
    try:
        yield windows
    finally:
        DeviceEnergyMeter.start, DeviceEnergyMeter.stop = original_start, original_stop  # type: ignore[method-assign]
        pynvml.nvmlShutdown()


def case_meter(bench: Bench) -> dict[str, Any]:
    shape = bench.shapes["fcnn"]
    with independent_counter_reads(bench.accelerator) as independent_joules:
        on, off = bench.alternate(
            lambda: bench.core(shape, power_meter="auto"),
            lambda _: bench.core(shape, power_meter="none").throughput_per_second or 0.0,
        )
    on_rate, off_rate = median_rate(on), statistics.median(off)
    figures: dict[str, Any] = {
        "meter_on_samples_per_second": on_rate,
        "meter_off_samples_per_second": off_rate,
        "difference_fraction": abs(on_rate - off_rate) / off_rate,
        "energy": [
            {
                "core_joules": r.energy_joules,
                "method": r.energy.method if r.energy else None,
                "unavailable_reason": r.energy_unavailable_reason,
                "counter_over_sampled": (r.energy.details.get("counter_over_sampled") if r.energy else None),
                "sampled_joules": (r.energy.details.get("sampled_joules") if r.energy else None),
                "window_seconds": r.window_seconds,
                "samples_per_watt_hour": r.samples_per_watt_hour,
            }
            for r in on
        ],
    }
    if independent_joules:
        figures["core_over_independent_counter"] = [
            (r.energy_joules or 0.0) / joules for r, joules in zip(on, independent_joules) if joules
        ]
    return figures


RUNNERS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "resnet50": case_resnet50,
    "resnet50-compile": case_resnet50_compile,
    "fcnn": case_fcnn,
    "meter": case_meter,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], required=True)
    parser.add_argument("--accelerator", default="nvidia", help="nvidia (default), amd, or cpu with --smoke")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and steps: checks the code paths only")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    bench = Bench(args.accelerator, args.steps, args.warmup, args.repeats, FULL)
    if args.smoke:
        bench = Bench(args.accelerator, SMOKE_STEPS, 1, 1, SMOKE)
    cases = CASES if args.case == "all" else (args.case,)
    report: dict[str, Any] = {
        "accelerator": args.accelerator,
        "smoke": args.smoke,
        "steps": bench.steps,
        "warmup": bench.warmup,
        "repeats": bench.repeats,
        "torch": torch.__version__,
    }
    if bench.device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(0)
    for case in cases:
        started = time.perf_counter()
        report[case] = RUNNERS[case](bench)
        report[case]["case_seconds"] = time.perf_counter() - started
        print(json.dumps({case: report[case]}, indent=1, default=str), flush=True)
        if args.json:  # after every case, so a later case's failure loses nothing measured
            with open(args.json, "w") as handle:
                json.dump(report, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
