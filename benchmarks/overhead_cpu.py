"""Overhead of core's training loop against a plain PyTorch loop, same process, same work.

A tiny MLP (32-64-10: the FCNN with one hidden layer of 64), batch 16, one CPU thread: the
case where any per-step overhead shows most. Both loops train the same model on the same
batch with the same optimizer; the runs alternate so drift in the machine hits both alike.

    .venv/bin/python benchmarks/overhead_cpu.py [--steps 1000] [--repeats 21]

Prints core's steady-window seconds per step over the plain loop's (target <= 1.10): the median
of the ratios of alternating pairs (each pair sees the same machine state), and the ratio of the
fastest runs of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from core import run
from core.workloads.fcnn import Fcnn, FcnnOptions

OPTIONS = {"layers": 1, "hidden_width": 64, "input_width": 32, "output_width": 10}
BATCH = 16


def plain_loop_seconds_per_step(steps: int, warmup: int) -> float:
    spec = Fcnn().build_torch(FcnnOptions(**OPTIONS), seed=0)
    model, loss_fn = spec.model, spec.loss_fn
    optimizer = spec.make_optimizer(model.parameters())
    inputs, targets = spec.inputs[:BATCH].clone(), spec.targets[:BATCH].clone()

    def one_step() -> None:
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        one_step()
    started = time.perf_counter()
    for _ in range(steps):
        one_step()
    return (time.perf_counter() - started) / steps


def core_seconds_per_step(steps: int, warmup: int) -> float:
    result = run(
        "fcnn",
        "cpu",
        micro_batch_size=BATCH,
        threads_per_replica=1,
        steps=steps,
        warmup_steps=warmup,
        power_meter="none",
        workload_options=OPTIONS,
    )
    assert result.status.ok and result.window_seconds is not None, result.status
    return result.window_seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        # One core for both loops: a migration between cores is noise neither loop caused.
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    core_times, plain_times = [], []
    for _ in range(args.repeats):
        core_times.append(core_seconds_per_step(args.steps, args.warmup))
        plain_times.append(plain_loop_seconds_per_step(args.steps, args.warmup))
    pair_ratios = [c / p for c, p in zip(core_times, plain_times)]
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.repeats} alternating pairs "
        f"of {args.steps} steps"
    )
    print(f"plain loop : median {statistics.median(plain_times) * 1e6:8.1f} us/step, min {min(plain_times) * 1e6:.1f}")
    print(f"core       : median {statistics.median(core_times) * 1e6:8.1f} us/step, min {min(core_times) * 1e6:.1f}")
    print(
        f"core/plain : median of pair ratios {statistics.median(pair_ratios):.3f} "
        f"(quartiles {statistics.quantiles(pair_ratios, n=4)[0]:.3f}-{statistics.quantiles(pair_ratios, n=4)[2]:.3f}), "
        f"ratio of minima {min(core_times) / min(plain_times):.3f}   target <= 1.10"
    )


if __name__ == "__main__":
    main()
