"""Overhead of core's training loop against a plain PyTorch loop, same process, same work.

A tiny MLP (32-64-10: the FCNN with one hidden layer of 64), batch 16, one CPU thread: the
case where any per-step overhead shows most. Both loops train the same model on the same
batch with the same optimizer; the runs alternate so drift in the machine hits both alike.

    .venv/bin/python benchmarks/overhead_cpu.py [--steps 2000] [--repeats 7]

Prints core's steady-window seconds per step over the plain loop's (target <= 1.10).
"""

from __future__ import annotations

import argparse
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
    result = run("fcnn", "cpu", micro_batch_size=BATCH, threads_per_replica=1, steps=steps,
                 warmup_steps=warmup, power_meter="none", workload_options=OPTIONS)
    assert result.status.ok and result.window_seconds is not None, result.status
    return result.window_seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    core_times, plain_times = [], []
    for _ in range(args.repeats):
        core_times.append(core_seconds_per_step(args.steps, args.warmup))
        plain_times.append(plain_loop_seconds_per_step(args.steps, args.warmup))
    core_median, plain_median = statistics.median(core_times), statistics.median(plain_times)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.repeats} alternating repeats "
          f"of {args.steps} steps")
    print(f"plain loop : {plain_median * 1e6:8.1f} us/step (min {min(plain_times) * 1e6:.1f})")
    print(f"core       : {core_median * 1e6:8.1f} us/step (min {min(core_times) * 1e6:.1f})")
    print(f"ratio core/plain (median): {core_median / plain_median:.3f}   target <= 1.10")


if __name__ == "__main__":
    main()
