"""core's training step against the plain step, interleaved one step at a time in one process.

``overhead_cpu.py`` compares whole windows, as a user sees them; on a shared host the windows
scatter by +-5 % or more (quartiles), so no median of theirs resolves the 1 % issue 34 asks about.
This script takes the host's drift out: it builds core's executor for the case (as ``core.run``
plans it: the workload, the CPU plugin's placement, the precision policy) and the plain loop's own
model, optimizer and batch, warms both, then times them alternately, one update each, thousands
of times, the order turning each pair. A slow spell of the host slows both halves of a pair alike,
so the per-pair ratios are tight where the windows' are not.

core's half is what its steady window runs per update: ``executor.step()`` and the step clock's
mark. It leaves out what the window does once (a synchronise at each end, the meter), which
``overhead_cpu.py`` includes.

    .venv/bin/python benchmarks/step_interleaved.py [--case tiny|fcnn-bf16|resnet50-fp32|resnet50-bf16|all]
        [--pairs N] [--json F] [--smoke]

Prints, per case, core / plain throughput per update: the median of the per-pair ratios (plain
seconds / core seconds) with quartiles, the ratio of the two sides' median step times, and core's
median extra time per update.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from overhead_cpu import Case, cases_to_run, plain_torch_step  # noqa: E402  (the same cases as the window benchmark)

from core.base.distributed import SINGLE_PROCESS  # noqa: E402
from core.base.precision import policy_in_force  # noqa: E402
from core.contract.accelerator import executor_for  # noqa: E402
from core.contract.manager import get_plugin_manager  # noqa: E402
from core.executors.base import HostStepClock  # noqa: E402
from core.running.planning import plan_run  # noqa: E402

#: interleaved pairs per case: enough for quartiles of the per-pair ratio to settle
PAIRS = {"tiny": 4000, "fcnn-bf16": 300, "resnet50-fp32": 150, "resnet50-bf16": 40}
TORCH_CASES = ("tiny", "fcnn-bf16", "resnet50-fp32", "resnet50-bf16")


def core_step(case: Case, policies: contextlib.ExitStack) -> tuple[Any, Any]:
    """core's executor for the case, planned as ``core.run`` plans it, and its per-update call."""
    plan = plan_run(
        get_plugin_manager(),
        case.workload,
        "cpu",
        {
            "micro_batch_size": case.batch,
            "precision": case.precision,
            "threads_per_replica": 1,
            "steps": 1,
            "warmup_steps": 0,
            "power_meter": "none",
            "workload_options": case.options,
        },
    )
    context = plan.context(SINGLE_PROCESS)
    # For the executor's lifetime (``policies`` closes it after): its precision is looked up by name.
    policies.enter_context(policy_in_force(context.precision_policy))
    executor = executor_for(plan.accelerator, plan.workload, context)
    clock = HostStepClock()

    def step() -> None:
        executor.step()
        clock.mark()

    return executor, step


def measure(name: str, case: Case, pairs: int) -> dict[str, Any]:
    policies = contextlib.ExitStack()
    executor, core = core_step(case, policies)
    plain = plain_torch_step(case)
    for _ in range(max(3, case.warmup + 1)):  # first steps (allocations, lazy imports) apart
        core()
        plain()
    now = time.perf_counter
    core_seconds: list[float] = []
    plain_seconds: list[float] = []
    for pair in range(pairs):
        first, second = (core, plain) if pair % 2 == 0 else (plain, core)
        started = now()
        first()
        middle = now()
        second()
        ended = now()
        a, b = middle - started, ended - middle
        core_seconds.append(a if first is core else b)
        plain_seconds.append(b if first is core else a)
    executor.check_finite()  # the run's own end-of-phase check: the steps trained finite weights
    executor.close()
    policies.close()
    ratios = [p / c for c, p in zip(core_seconds, plain_seconds)]
    quartiles = statistics.quantiles(ratios, n=4)
    extra = [c - p for c, p in zip(core_seconds, plain_seconds)]
    return {
        "case": name,
        "pairs": pairs,
        "core_over_plain_throughput_median": statistics.median(ratios),
        "core_over_plain_throughput_quartiles": [quartiles[0], quartiles[2]],
        "core_over_plain_throughput_of_medians": statistics.median(plain_seconds) / statistics.median(core_seconds),
        "core_seconds_per_step_median": statistics.median(core_seconds),
        "plain_seconds_per_step_median": statistics.median(plain_seconds),
        "core_extra_seconds_per_step_median": statistics.median(extra),
        "target_at_least": case.target,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", default="all", choices=[*TORCH_CASES, "all"])
    parser.add_argument("--pairs", type=int, help="interleaved pairs (default: the case's)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes and 3 pairs: the code paths only")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}", flush=True)
    names = list(TORCH_CASES) if args.case == "all" else [args.case]
    figures = []
    for name, case in cases_to_run(names, args.smoke, None, None).items():
        f = measure(name, case, 3 if args.smoke else args.pairs or PAIRS[name])
        figures.append(f)
        print(
            f"{name:14s} core / plain per update {f['core_over_plain_throughput_median']:.4f} "
            f"(quartiles {f['core_over_plain_throughput_quartiles'][0]:.4f}-"
            f"{f['core_over_plain_throughput_quartiles'][1]:.4f}, {f['pairs']} interleaved pairs); "
            f"of medians {f['core_over_plain_throughput_of_medians']:.4f}; "
            f"core {f['core_seconds_per_step_median'] * 1e3:.3f} ms, "
            f"plain {f['plain_seconds_per_step_median'] * 1e3:.3f} ms, core's extra "
            f"{f['core_extra_seconds_per_step_median'] * 1e6:+.1f} us per update; target >= {f['target_at_least']:.3f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
