"""Overhead of core's training loop against a plain hand-written loop, same process, same work.

One CPU thread. Each case trains the same model on the same batch with the same optimizer and
precision through ``core.run`` and through a plain loop; the two alternate in pairs, so drift in
the machine hits both alike. Cases (issue 34's targets, core / plain throughput):

- ``tiny``: a tiny MLP (32-64-10: the FCNN with one hidden layer of 64), batch 16, fp32: the
  case where any per-step overhead shows most (>= 1 / 1.03: core's time per step <= 1.03 x plain)
- ``fcnn-bf16``: the FCNN 4 x 512 (input 2000, output 200), batch 64, bf16 autocast (>= 0.99)
- ``resnet50-fp32``, ``resnet50-bf16``: the zoo's small ResNet-50 at 32 x 32, batch 2 (>= 0.99)
- ``tf-fcnn``: the FCNN 4 x 512, batch 64, fp32, with TensorFlow: core's Keras executor against a
  plain ``tf.function`` loop (GradientTape, apply_gradients)

    .venv/bin/python benchmarks/overhead_cpu.py [--case tiny|...|all] [--pairs N] [--steps N] [--json F]

Prints, per case, core / plain throughput: the median of the per-pair ratios with their
quartiles and range (min-max), and each side's median step time. Core's figure is its steady window's (setup, first
step and warm-up apart); the plain loop times its own window the same way, after as many warm-up
steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from core import run
from core.contract.manager import get_plugin_manager
from core.contract.workload import TorchTrainingSpec


@dataclass(frozen=True)
class Case:
    """One comparison: the workload, its sizes and precision, and how long each side runs."""

    workload: str
    batch: int
    options: dict[str, Any]
    precision: str
    steps: int
    warmup: int
    pairs: int
    target: float  # core / plain throughput at least this
    framework: str = "torch"


TINY_MLP = {"layers": 1, "hidden_width": 64, "input_width": 32, "output_width": 10}
FCNN = {"layers": 4, "hidden_width": 512, "input_width": 2000, "output_width": 200}
SMALL_RESNET50 = {"variant": "small", "image_size": 32}

CASES: dict[str, Case] = {
    "tiny": Case("fcnn", 16, TINY_MLP, "fp32", steps=1000, warmup=100, pairs=21, target=1 / 1.03),
    # bf16 matmuls crawl on a CPU without bf16 units (a third of a second a step here): fewer steps.
    "fcnn-bf16": Case("fcnn", 64, FCNN, "bf16", steps=20, warmup=3, pairs=9, target=0.99),
    "resnet50-fp32": Case("resnet50", 2, SMALL_RESNET50, "fp32", steps=6, warmup=1, pairs=7, target=0.99),
    # bf16 convolutions crawl on a CPU without bf16 units (seconds a step here): fewer steps.
    "resnet50-bf16": Case("resnet50", 2, SMALL_RESNET50, "bf16", steps=3, warmup=1, pairs=5, target=0.99),
    "tf-fcnn": Case("fcnn", 64, FCNN, "fp32", steps=100, warmup=10, pairs=9, target=0.99, framework="tensorflow"),
}
#: toy sizes for tests/test_benchmarks.py: the code paths only, figures meaningless
SMOKE = {"steps": 2, "warmup": 1, "pairs": 1}
SMOKE_OPTIONS = {
    "fcnn": {"layers": 1, "hidden_width": 8, "input_width": 8, "output_width": 4},
    "resnet50": {"variant": "small", "image_size": 32},
}


def core_seconds_per_step(case: Case) -> float:
    result = run(
        case.workload,
        "cpu",
        framework=case.framework,
        micro_batch_size=case.batch,
        precision=case.precision,
        threads_per_replica=1,
        steps=case.steps,
        warmup_steps=case.warmup,
        power_meter="none",
        workload_options=case.options,
    )
    assert result.status.ok and result.window_seconds is not None, result.status
    return result.window_seconds / case.steps


def _timed(step: Callable[[], None], case: Case, synchronize: Callable[[], None] = lambda: None) -> float:
    step()  # the first step apart, as core's
    for _ in range(case.warmup):
        step()
    synchronize()
    started = time.perf_counter()
    for _ in range(case.steps):
        step()
    synchronize()
    return (time.perf_counter() - started) / case.steps


def plain_torch_seconds_per_step(case: Case) -> float:
    return _timed(plain_torch_step(case), case)


def plain_torch_step(case: Case) -> Callable[[], None]:
    """The plain loop's update: a model of its own, built from the same seed as core's."""
    workload = get_plugin_manager().workload(case.workload)
    spec: TorchTrainingSpec = workload.build_torch(workload.parse_options(dict(case.options)), 0)
    model, loss_fn = spec.model, spec.loss_fn
    optimizer = spec.make_optimizer(model.parameters())
    indices = torch.arange(case.batch) % len(spec.inputs)  # the samples core's synthetic data takes
    inputs, targets = spec.inputs.index_select(0, indices), spec.targets.index_select(0, indices)
    autocast = case.precision == "bf16"

    def one_step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return one_step


def plain_tensorflow_seconds_per_step(case: Case) -> float:
    """A plain ``tf.function`` loop: core's Keras executor's work for one replica, no distribution
    strategy, no accumulation, no check."""
    import numpy as np
    import tensorflow as tf

    workload = get_plugin_manager().workload(case.workload)
    spec = workload.build_keras(workload.parse_options(dict(case.options)), 0)
    model, loss_fn, optimizer = spec.make_model(), spec.make_loss(), spec.make_optimizer()
    indices = np.arange(case.batch) % len(spec.inputs)
    inputs = tf.constant(np.take(np.asarray(spec.inputs), indices, axis=0))
    targets = tf.constant(np.take(np.asarray(spec.targets), indices, axis=0))
    variables = model.trainable_variables

    @tf.function
    def train_step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(loss_fn(targets, model(inputs, training=True)), tf.float32)) / case.batch
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    def synchronize() -> None:
        variables[0].numpy()  # a read waits for the queued updates, as core's synchronise does

    return _timed(train_step, case, synchronize)


def measure(name: str, case: Case) -> dict[str, Any]:
    """``case.pairs`` pairs. Core goes first in the first pair (TensorFlow's thread pools are then
    core's, one thread), and the order turns in each pair after it, so neither side always runs
    right after the other's teardown."""
    plain = plain_tensorflow_seconds_per_step if case.framework == "tensorflow" else plain_torch_seconds_per_step
    core_times, plain_times = [], []
    for pair in range(case.pairs):
        if pair % 2 == 0:
            core_times.append(core_seconds_per_step(case))
            plain_times.append(plain(case))
        else:
            plain_times.append(plain(case))
            core_times.append(core_seconds_per_step(case))
    ratios = sorted(p / c for c, p in zip(core_times, plain_times))  # core / plain throughput
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "case": name,
        "pairs": case.pairs,
        "steps": case.steps,
        "core_seconds_per_step_median": statistics.median(core_times),
        "plain_seconds_per_step_median": statistics.median(plain_times),
        "core_over_plain_throughput_median": statistics.median(ratios),
        "core_over_plain_throughput_quartiles": [quartiles[0], quartiles[2]],
        "core_over_plain_throughput_min": ratios[0],
        "core_over_plain_throughput_max": ratios[-1],
        "core_over_plain_throughput_of_medians": statistics.median(plain_times) / statistics.median(core_times),
        # Each side's fastest window: the host's other tenants only ever slow a window down, so the
        # best of many is the estimate least moved by them (timeit's rule); the pairs' median and
        # quartiles say how far the windows scatter.
        "core_over_plain_throughput_of_best": min(plain_times) / min(core_times),
        "core_seconds_per_step_best": min(core_times),
        "plain_seconds_per_step_best": min(plain_times),
        "core_seconds_per_step_all": core_times,
        "plain_seconds_per_step_all": plain_times,
        "target_at_least": case.target,
    }


def print_figures(figures: dict[str, Any]) -> None:
    print(
        f"{figures['case']:14s} core / plain throughput {figures['core_over_plain_throughput_median']:.3f} "
        f"(quartiles {figures['core_over_plain_throughput_quartiles'][0]:.3f}-"
        f"{figures['core_over_plain_throughput_quartiles'][1]:.3f}, "
        f"pairs {figures['core_over_plain_throughput_min']:.3f}-{figures['core_over_plain_throughput_max']:.3f}, "
        f"{figures['pairs']} pairs of {figures['steps']} steps; target >= {figures['target_at_least']:.3f})   "
        f"core {figures['core_seconds_per_step_median'] * 1e3:.3f} ms/step, "
        f"plain {figures['plain_seconds_per_step_median'] * 1e3:.3f} ms/step (medians); "
        f"best windows core / plain {figures['core_over_plain_throughput_of_best']:.3f} "
        f"({figures['core_seconds_per_step_best'] * 1e3:.3f} / {figures['plain_seconds_per_step_best'] * 1e3:.3f} ms)",
        flush=True,
    )


def cases_to_run(names: list[str], smoke: bool, pairs: int | None, steps: int | None) -> dict[str, Case]:
    chosen = {}
    for name in names:
        case = CASES[name]
        if smoke:
            case = replace(case, options=SMOKE_OPTIONS[case.workload], batch=2, **SMOKE)
        case = replace(case, pairs=pairs or case.pairs, steps=steps or case.steps)
        chosen[name] = case
    return chosen


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="tiny")
    parser.add_argument("--pairs", type=int, help="alternating pairs (default: the case's)")
    parser.add_argument("--steps", type=int, help="timed steps per side and pair (default: the case's)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes: the code paths only")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if hasattr(os, "sched_setaffinity"):
        # One core for both loops: a migration between cores is noise neither loop caused.
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    names = list(CASES) if args.case == "all" else [args.case]
    import core

    print(f"core from {os.path.dirname(core.__file__)}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    results = []
    for name, case in cases_to_run(names, args.smoke, args.pairs, args.steps).items():
        results.append(measure(name, case))
        print_figures(results[-1])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return results


if __name__ == "__main__":
    main()
