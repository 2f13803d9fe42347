"""core against plain PyTorch loops on one NVIDIA GPU, same process, same model, same data.

    python benchmarks/nvidia_vs_plain.py [--case resnet50|resnet50-compile|fcnn|meter] [--steps N]

Cases (the NVIDIA issue's checks):
- resnet50: torchvision ResNet-50, synthetic 224x224 batch 256 on the device, bf16 autocast,
  channels_last, SGD momentum; core / plain (target >= 0.99).
- resnet50-compile: core with compile=True over the plain *eager* loop (target >= 1.40), with
  core's first-step (compilation) time reported apart.
- fcnn: D_H 8192, 8 layers, batch 16384, bf16; core / plain (target >= 0.98), and core's
  FLOP/s against 6 Phi bs / time.
- meter: core with the NVML meter on and off (target: < 1 % apart).
Each ratio alternates core and plain runs and takes medians. Needs torchvision for ResNet-50.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, ClassVar

import torch

from core import Workload, hookimpl, run
from core.testing import registered_plugins
from core.workload import TorchTrainingSpec
from core.workloads.fcnn import Fcnn, FcnnOptions

FCNN = {"layers": 8, "hidden_width": 8192, "input_width": 8192, "output_width": 1024, "synthetic_pool_samples": 16384}


class TorchvisionResNet50(Workload):
    """Benchmark-only stand-in until the workload zoo lands: torchvision's ResNet-50, random weights."""

    name: ClassVar[str] = "bench-resnet50"
    prefers_channels_last: ClassVar[bool] = True
    default_micro_batch_size: ClassVar[int] = 256

    def build_torch(self, options: Any, seed: int) -> TorchTrainingSpec:
        import torchvision

        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed + 1)
        return TorchTrainingSpec(
            model=torchvision.models.resnet50(),
            loss_fn=torch.nn.CrossEntropyLoss(),
            make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            inputs=torch.randn(256, 3, 224, 224, generator=generator),
            targets=torch.randint(0, 1000, (256,), generator=generator),
        )

    def flops_per_sample(self, options: Any) -> float:
        return 3 * 4.09e9 * 2  # 4.09 GMACs forward; backward ~2x forward


class TorchvisionResNet50Plugin:
    @hookimpl
    def core_register_workloads(self, register: Callable[[Workload], None]) -> None:
        register(TorchvisionResNet50())


def plain_loop(spec: TorchTrainingSpec, batch: int, steps: int, warmup: int, compile_model: bool,
               channels_last: bool) -> float:
    """Samples/s of a hand-written loop doing the same work as core's executor."""
    torch.backends.cudnn.benchmark = True
    model = spec.model.cuda()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    inputs = spec.inputs[:batch].cuda()
    if channels_last:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    targets = spec.targets[:batch].cuda()
    optimizer = spec.make_optimizer(model.parameters())
    step_model: Callable[..., Any] = torch.compile(model) if compile_model else model

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = spec.loss_fn(step_model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - started)


def core_run(workload: str, batch: int, steps: int, warmup: int, **options: Any) -> Any:
    result = run(workload, "nvidia", micro_batch_size=batch, steps=steps, warmup_steps=warmup,
                 precision="bf16", **options)
    assert result.status.ok, result.status
    return result


def alternate(core_fn: Callable[[], float], plain_fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    core_rates, plain_rates = [], []
    for _ in range(repeats):
        core_rates.append(core_fn())
        plain_rates.append(plain_fn())
    return statistics.median(core_rates), statistics.median(plain_rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["resnet50", "resnet50-compile", "fcnn", "meter"], required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with registered_plugins(TorchvisionResNet50Plugin()):
        if args.case.startswith("resnet50"):
            compiled = args.case.endswith("compile")
            workload = TorchvisionResNet50()
            results: list[Any] = []

            def core_rate() -> float:
                results.append(core_run(workload.name, 256, args.steps, args.warmup, compile=compiled, power_meter="none"))
                return results[-1].throughput_per_second

            core_median, plain_median = alternate(
                core_rate, lambda: plain_loop(workload.build_torch(None, 0), 256, args.steps, args.warmup, False, True),
                args.repeats)
            print(f"ResNet-50 bf16 bs256: core{' (compiled)' if compiled else ''} {core_median:.0f} img/s, "
                  f"plain eager {plain_median:.0f} img/s, ratio {core_median / plain_median:.3f}")
            print(f"core first step (compilation) {results[-1].first_step_seconds:.1f} s, "
                  f"warnings: {results[-1].warnings}")
        elif args.case == "fcnn":
            spec_options = FcnnOptions(**FCNN)
            results = []

            def core_rate() -> float:
                results.append(core_run("fcnn", 16384, args.steps, args.warmup, power_meter="none",
                                        workload_options=FCNN))
                return results[-1].throughput_per_second

            core_median, plain_median = alternate(
                core_rate, lambda: plain_loop(Fcnn().build_torch(spec_options, 0), 16384, args.steps, args.warmup,
                                              False, False), args.repeats)
            phi = Fcnn().parameter_count(spec_options)
            last = results[-1]
            print(f"FCNN bf16 bs16384: core {core_median:.0f} samples/s, plain {plain_median:.0f}, "
                  f"ratio {core_median / plain_median:.3f}")
            print(f"core FLOP/s {last.flops_per_second / 1e12:.1f} T; 6*Phi*bs/time "
                  f"{6 * phi * last.window_samples / last.window_seconds / 1e12:.1f} T; MFU {last.model_flops_utilization}")
        else:
            on, off = alternate(
                lambda: core_run("fcnn", 16384, args.steps, args.warmup, power_meter="nvml",
                                 workload_options=FCNN).throughput_per_second,
                lambda: core_run("fcnn", 16384, args.steps, args.warmup, power_meter="none",
                                 workload_options=FCNN).throughput_per_second, args.repeats)
            print(f"meter on {on:.0f}, off {off:.0f} samples/s: difference {abs(on - off) / off * 100:.2f} %")


if __name__ == "__main__":
    main()
