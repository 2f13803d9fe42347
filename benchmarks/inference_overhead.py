"""Overhead of core's inference loop against a plain ``torch.inference_mode`` loop, same process, same work.

A small CNN (two 3x3 convolutions of 16 and 32 channels with pooling, then a linear layer, on
3x32x32 images), batch 32, one CPU thread. Both loops run the same eval-mode model on the same
batch; the runs alternate so drift in the machine hits both alike.

    .venv/bin/python benchmarks/inference_overhead.py [--steps 300] [--repeats 11]

Prints core's steady-window throughput over the plain loop's (target >= 0.97): the median of the
ratios of alternating pairs (each pair sees the same machine state), and the ratio of the best runs.
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


def plain_samples_per_second(steps: int, warmup: int) -> float:
    spec = SmallCnn().build_torch(None, seed=0)
    model = spec.model.eval()
    inputs = spec.inputs[:BATCH].clone()
    with torch.inference_mode():
        for _ in range(warmup):
            model(inputs)
        started = time.perf_counter()
        for _ in range(steps):
            model(inputs)
        elapsed = time.perf_counter() - started
    return steps * BATCH / elapsed


def core_samples_per_second(steps: int, warmup: int) -> float:
    result = run(
        SmallCnn(),
        "cpu",
        mode="inference",
        micro_batch_size=BATCH,
        threads_per_replica=1,
        steps=steps,
        warmup_steps=warmup,
        power_meter="none",
    )
    assert result.status.ok and result.throughput_per_second is not None, result.status
    return result.throughput_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        # One core for both loops: a migration between cores is noise neither loop caused.
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    core_rates, plain_rates = [], []
    for _ in range(args.repeats):
        core_rates.append(core_samples_per_second(args.steps, args.warmup))
        plain_rates.append(plain_samples_per_second(args.steps, args.warmup))
    pair_ratios = [c / p for c, p in zip(core_rates, plain_rates)]
    quartiles = statistics.quantiles(pair_ratios, n=4) if len(pair_ratios) > 1 else [pair_ratios[0]] * 3
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {BATCH}, {args.repeats} alternating "
        f"pairs of {args.steps} steps"
    )
    print(f"plain loop : median {statistics.median(plain_rates):9.1f} samples/s, max {max(plain_rates):.1f}")
    print(f"core       : median {statistics.median(core_rates):9.1f} samples/s, max {max(core_rates):.1f}")
    print(
        f"core/plain : median of pair ratios {statistics.median(pair_ratios):.3f} "
        f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}), ratio of maxima "
        f"{max(core_rates) / max(plain_rates):.3f}   target >= 0.97"
    )


if __name__ == "__main__":
    main()
