"""core against a plain hand-written torch-xla loop: FCNN on one XLA device, same process, same work.

    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/xla_vs_plain.py [--json figures.json]
    PJRT_DEVICE=CPU .venv-xla/bin/python benchmarks/xla_vs_plain.py --smoke   # code paths only

Both sides train core's FCNN (its weights, its synthetic samples, SGD with momentum) at the same
micro-batch and gradient accumulation, fp32 with torch-xla's mat-mul precision "highest", one XLA
graph per update (``torch_xla.sync()`` after the optimizer step), and follow the same timing rules:
the first step (it compiles) timed apart, then warm-up steps (the optimizer's momentum makes a
second graph), then a window synchronised at its two ends only; throughput = samples / window
seconds. The loop does what core's executor does for this run and nothing more (core adds its
NaN/inf check: of the losses each update, of the weights at each phase's end, outside its timing).

Runs alternate core and the loop (which goes first alternates too) so drift in the machine hits
both alike; figures are medians, and the median of each repeat's core / plain.
The target is core / plain >= 0.97. ``--smoke`` shrinks everything to seconds: its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch_xla
import torch_xla.backends
import torch_xla.core.xla_model as xm

from core import RunResult, run
from core.contract.manager import get_plugin_manager
from core.executors.pytorch import micro_batch_indices

FULL = {"layers": 4, "hidden_width": 1024, "input_width": 2000, "output_width": 200, "synthetic_pool_samples": 4096}
SMOKE = {"layers": 2, "hidden_width": 32, "input_width": 16, "output_width": 4, "synthetic_pool_samples": 64}


@dataclass(frozen=True)
class Settings:
    options: dict[str, Any]
    micro_batch: int
    accumulation: int
    steps: int
    warmup: int
    repeats: int

    @property
    def samples_per_update(self) -> int:
        return self.micro_batch * self.accumulation


@dataclass(frozen=True)
class Timing:
    first_step_seconds: float
    window_seconds: float
    samples_per_second: float


class PlainXlaLoop:
    """FCNN on the XLA device, written as a torch-xla user would: no core code in the step."""

    def __init__(self, settings: Settings) -> None:
        workload = get_plugin_manager().workload("fcnn")
        spec = workload.build_torch(workload.parse_options(dict(settings.options)), 0)
        if torch_xla.backends.get_mat_mul_precision() != "highest":
            torch_xla.backends.set_mat_mul_precision("highest")  # fp32 as fp32, as core's run does
        device = torch_xla.device()
        self.model = spec.model.to(device)
        self.optimizer = spec.make_optimizer(self.model.parameters())
        self.loss_fn = spec.loss_fn
        self.accumulation = settings.accumulation
        pool = len(spec.inputs)
        self.batches = [
            (spec.inputs.index_select(0, indices).to(device), spec.targets.index_select(0, indices).to(device))
            for indices in micro_batch_indices(0, settings.micro_batch, settings.accumulation, pool)
        ]
        self.samples_per_update = settings.samples_per_update

    def step(self) -> None:
        for inputs, targets in self.batches:
            loss = self.loss_fn(self.model(inputs), targets)
            if self.accumulation > 1:
                loss = loss / self.accumulation
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        torch_xla.sync()  # the update is one graph

    @staticmethod
    def synchronize() -> None:
        torch_xla.sync()
        xm.wait_device_ops()

    def timed(self, steps: int, warmup: int) -> Timing:
        started = time.perf_counter()
        self.step()
        self.synchronize()
        first = time.perf_counter() - started
        for _ in range(warmup):
            self.step()
        self.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.synchronize()
        window = time.perf_counter() - started
        return Timing(first, window, self.samples_per_update * steps / window)


def core_run(settings: Settings) -> RunResult:
    result = run(
        "fcnn",
        "xla",
        micro_batch_size=settings.micro_batch,
        gradient_accumulation=settings.accumulation,
        steps=settings.steps,
        warmup_steps=settings.warmup,
        workload_options=settings.options,
        power_meter="none",
    )
    if not result.status.ok:
        raise RuntimeError(f"core run failed: {result.status}")
    return result


def compare(settings: Settings) -> dict[str, Any]:
    """core and the plain loop, alternated ``repeats`` times; medians and the ratio."""
    core_results: list[RunResult] = []
    plain: list[Timing] = []
    for repeat in range(settings.repeats):
        # Which side goes first alternates, so neither always runs on a machine the other just warmed.
        if repeat % 2 == 0:
            core_results.append(core_run(settings))
            plain.append(PlainXlaLoop(settings).timed(settings.steps, settings.warmup))
        else:
            plain.append(PlainXlaLoop(settings).timed(settings.steps, settings.warmup))
            core_results.append(core_run(settings))
    core_rates = [r.throughput_per_second or 0.0 for r in core_results]
    plain_rates = [t.samples_per_second for t in plain]
    figures: dict[str, Any] = {
        "device": core_results[-1].devices[0].name if core_results[-1].devices else None,
        "options": settings.options,
        "micro_batch": settings.micro_batch,
        "gradient_accumulation": settings.accumulation,
        "steps": settings.steps,
        "warmup_steps": settings.warmup,
        "repeats": settings.repeats,
        "core_samples_per_second": statistics.median(core_rates),
        "plain_samples_per_second": statistics.median(plain_rates),
        "core_runs": core_rates,
        "plain_runs": plain_rates,
        "core_window_seconds": [r.window_seconds for r in core_results],
        "plain_window_seconds": [t.window_seconds for t in plain],
        "core_first_step_seconds": [r.first_step_seconds for r in core_results],
        "plain_first_step_seconds": [t.first_step_seconds for t in plain],
        "core_warnings": core_results[-1].warnings,
    }
    figures["ratio_core_over_plain"] = figures["core_samples_per_second"] / figures["plain_samples_per_second"]
    # Each repeat's two runs shared the machine's state of the moment: their ratio is the steadier figure.
    figures["ratio_median_of_repeats"] = statistics.median(c / p for c, p in zip(core_rates, plain_rates))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batch", type=int, default=512)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="toy sizes: the code paths, figures meaningless")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if os.environ.get("PJRT_DEVICE") is None:
        parser.error("set PJRT_DEVICE (CPU for XLA's CPU device, TPU on a TPU VM)")
    if args.smoke:
        settings = Settings(SMOKE, micro_batch=8, accumulation=2, steps=3, warmup=2, repeats=1)
    else:
        settings = Settings(FULL, args.micro_batch, args.accumulation, args.steps, args.warmup, args.repeats)
    figures = compare(settings)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    if not args.smoke and figures["ratio_core_over_plain"] < 0.97:
        print(f"core / plain = {figures['ratio_core_over_plain']:.3f}, under the 0.97 target", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
