"""Overhead of core's inference loop against a plain ``torch.inference_mode`` loop, same process, same work.

A small CNN (two 3x3 convolutions of 16 and 32 channels with pooling, then a linear layer, on
3x32x32 images), batch 32, one CPU thread. Both loops run the same eval-mode model on the same
batch; the runs alternate so drift in the machine hits both alike.

    .venv/bin/python benchmarks/inference_overhead.py [--case loop|offline|single-stream|all]

- ``loop`` and ``offline``: core's throughput (its own steady window; LoadGen's Offline scenario)
  over the plain loop's (target >= 0.97): the median of the ratios of alternating pairs (each
  pair sees the same machine state), and the ratio of the best runs.
- ``single-stream``: LoadGen's p50 query latency (one sample per query) minus the plain loop's
  median time of one forward pass on one sample (target <= 50 us): what core and LoadGen add to
  each query.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, ClassVar

import torch

from core import Workload, run
from core.contract.workload import TorchTrainingSpec

BATCH = 32
IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10


class SmallCnn(Workload):
    name: ClassVar[str] = "small-cnn"
    default_micro_batch_size: ClassVar[int] = BATCH

    def build_torch(self, options: Any, seed: int) -> TorchTrainingSpec:
        from torch import nn

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(32 * 8 * 8, CLASSES),
            )
        generator = torch.Generator().manual_seed(seed + 1)
        return TorchTrainingSpec(
            model=model,
            loss_fn=nn.CrossEntropyLoss(),
            make_optimizer=lambda params: torch.optim.SGD(params, lr=0.01),
            inputs=torch.randn(BATCH, *IMAGE_SHAPE, generator=generator),
            targets=torch.randint(0, CLASSES, (BATCH,), generator=generator),
        )


def _model_and_batch(batch: int) -> tuple[Any, torch.Tensor]:
    spec = SmallCnn().build_torch(None, seed=0)
    return spec.model.eval(), spec.inputs[:batch].clone()


def plain_samples_per_second(steps: int, warmup: int) -> float:
    """A plain loop: the same model on the same batch, back to back, timed at its two ends."""
    model, inputs = _model_and_batch(BATCH)
    with torch.inference_mode():
        for _ in range(warmup):
            model(inputs)
        started = time.perf_counter()
        for _ in range(steps):
            model(inputs)
        elapsed = time.perf_counter() - started
    return steps * BATCH / elapsed


def plain_sample_latency_seconds(samples: int, warmup: int) -> float:
    """A plain loop's per-sample latency: the median time of one forward pass on one sample, going
    round the same pool of samples LoadGen draws its queries from (a CNN's time on a CPU depends on
    the data: on this model one sample can be 1.5x faster than the pool's median)."""
    model, pool = _model_and_batch(BATCH)
    seconds = []
    with torch.inference_mode():
        for index in range(warmup):
            model(pool[index % BATCH].unsqueeze(0))
        for index in range(samples):
            sample = pool[index % BATCH].unsqueeze(0)
            started = time.perf_counter()
            model(sample)
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def core_run(scenario: str, steps: int, warmup: int, loadgen_seconds: float) -> Any:
    loadgen = {"min_duration_seconds": loadgen_seconds, "min_query_count": 100} if scenario != "loop" else {}
    result = run(
        SmallCnn(),
        "cpu",
        mode="inference",
        scenario=scenario,
        loadgen=loadgen,
        micro_batch_size=BATCH,
        threads_per_replica=1,
        steps=steps,
        warmup_steps=warmup,
        power_meter="none",
    )
    assert result.status.ok and result.throughput_per_second is not None, result.status
    assert scenario == "loop" or result.loadgen.valid, result.loadgen.invalid_reason
    return result


def throughput_case(scenario: str, args: argparse.Namespace) -> dict[str, float]:
    core_rates, plain_rates = [], []
    for _ in range(args.repeats):
        core_rates.append(core_run(scenario, args.steps, args.warmup, args.loadgen_seconds).throughput_per_second)
        plain_rates.append(plain_samples_per_second(args.steps, args.warmup))
    pair_ratios = [c / p for c, p in zip(core_rates, plain_rates)]
    quartiles = statistics.quantiles(pair_ratios, n=4) if len(pair_ratios) > 1 else [pair_ratios[0]] * 3
    print(f"[{scenario}] throughput, batch {BATCH}, {args.repeats} alternating pairs")
    print(f"  plain loop : median {statistics.median(plain_rates):9.1f} samples/s, max {max(plain_rates):.1f}")
    print(f"  core       : median {statistics.median(core_rates):9.1f} samples/s, max {max(core_rates):.1f}")
    print(
        f"  core/plain : median of pair ratios {statistics.median(pair_ratios):.3f} "
        f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}), ratio of maxima "
        f"{max(core_rates) / max(plain_rates):.3f}   target >= 0.97"
    )
    return {"median_pair_ratio": statistics.median(pair_ratios), "ratio_of_maxima": max(core_rates) / max(plain_rates)}


def single_stream_case(args: argparse.Namespace) -> dict[str, float]:
    differences = []
    for _ in range(args.repeats):
        figures = core_run("single-stream", args.steps, args.warmup, args.loadgen_seconds).loadgen
        plain = plain_sample_latency_seconds(args.steps, args.warmup)
        differences.append(figures.latency_p50_seconds - plain)
        print(
            f"  LoadGen p50 {figures.latency_p50_seconds * 1e6:8.1f} us, plain per-sample {plain * 1e6:8.1f} us, "
            f"difference {(figures.latency_p50_seconds - plain) * 1e6:6.1f} us"
        )
    median = statistics.median(differences)
    print(
        f"[single-stream] core's p50 minus the plain loop's per-sample latency: median {median * 1e6:.1f} us"
        "   target <= 50 us"
    )
    return {"median_difference_seconds": median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("loop", "offline", "single-stream", "all"), default="all")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--loadgen-seconds", type=float, default=2.0, help="LoadGen's min_duration_seconds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        # One core for both loops: a migration between cores is noise neither loop caused.
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    cases = ("loop", "offline", "single-stream") if args.case == "all" else (args.case,)
    for case in cases:
        if case == "single-stream":
            single_stream_case(args)
        else:
            throughput_case(case, args)


if __name__ == "__main__":
    main()
