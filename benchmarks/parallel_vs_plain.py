"""core's update on a device mesh against a plain hand-written update on the same mesh, interleaved.

Each process of a two-process run (CPU/gloo here, one GPU each under NCCL where there are GPUs)
holds two copies of the tiny GPT placed alike: core's executor (``TorchExecutor`` with the
placement a ``core run --devices-per-replica 2 --tensor-parallel 2`` or ``--replicas 2 --sharding
fsdp`` gives) and a plain model split by the same torch calls (``ReplicaPlacement.place``:
``parallelize_module`` with the workload's plan, or ``fully_shard``), driven by a hand-written
update of a dozen lines (forward each micro-batch, backward, the optimizer's step). What differs is
the step loop around the engines: core's micro-batch indexing, loss recording and checks, its
precision context and gradient reduction hooks. The two alternate one update at a time, the order
turning each pair, so the host's drift hits both.

    .venv/bin/python benchmarks/parallel_vs_plain.py [--case tp2|fsdp2|all] [--pairs N] [--json F]

It starts its own two processes (torchrun) unless it runs inside them. Prints, per case, core /
plain updates per second: the median of the per-pair ratios with quartiles (rank 0's; every
process takes part in every update).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

#: the tiny GPT of tests/test_parallelism.py, a little wider so an update is not all overhead
OPTIONS = {"variant": "small", "vocabulary": 512, "sequence_length": 64, "synthetic_pool_samples": 64}
CASES: dict[str, dict[str, Any]] = {
    "tp2": {"devices_per_replica": 2, "tensor_parallel": 2, "micro_batch_size": 8, "gradient_accumulation": 2},
    "fsdp2": {"replicas": 2, "sharding": "fsdp", "micro_batch_size": 4, "gradient_accumulation": 2},
}


def build(case: dict[str, Any]) -> tuple[Any, Any]:
    """core's executor, and the plain update over a model placed by the same torch calls."""
    import torch

    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.parallel import ReplicaPlacement
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.language import GptCaraml800m, GptOptions

    process = ProcessContext.from_environment()
    config = make_config(workload="gpt-800m", accelerator="cpu", workload_options=OPTIONS, **case)
    workload, options = GptCaraml800m(), GptOptions(**OPTIONS)
    core_spec = workload.build_torch(options, seed=0)
    executor = TorchExecutor(core_spec, config, TorchPlacement(device="cpu", distributed_backend="gloo"), process)

    spec = workload.build_torch(options, seed=0)
    placement = ReplicaPlacement(config, torch.device("cpu"), spec.tensor_parallel_plan)
    model = placement.place(spec.model)
    optimizer = spec.make_optimizer(model.parameters())
    loss_fn = spec.loss_fn
    micro, accumulation = config.micro_batch_size or 1, config.gradient_accumulation
    replica = process.rank // config.devices_per_replica
    inputs = spec.inputs[replica * micro * accumulation : (replica + 1) * micro * accumulation]
    targets = spec.targets[replica * micro * accumulation : (replica + 1) * micro * accumulation]

    def plain_update() -> None:
        for index in range(accumulation):
            placement.micro_step(last=index == accumulation - 1)
            batch = slice(index * micro, (index + 1) * micro)
            loss = loss_fn(model(inputs[batch]), targets[batch]) / accumulation
            loss.backward()
        placement.reduce_gradients(list(model.parameters()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return executor, plain_update


def measure(name: str, pairs: int) -> dict[str, Any] | None:
    import torch

    executor, plain_update = build(CASES[name])
    for _ in range(3):  # warm both
        executor.step()
        plain_update()
    ratios, core_times, plain_times = [], [], []
    for pair in range(pairs):
        sides = [("core", executor.step), ("plain", plain_update)]
        if pair % 2:
            sides.reverse()
        seconds: dict[str, float] = {}
        for side, update in sides:
            torch.distributed.barrier()
            started = time.perf_counter()
            update()
            torch.distributed.barrier()  # every process's share of the update
            seconds[side] = time.perf_counter() - started
        ratios.append(seconds["plain"] / seconds["core"])
        core_times.append(seconds["core"])
        plain_times.append(seconds["plain"])
    executor.check_finite()
    executor.close()
    if int(os.environ["RANK"]) != 0:
        return None
    quartiles = statistics.quantiles(ratios, n=4)
    return {
        "case": name,
        "pairs": pairs,
        "core_over_plain_median": round(statistics.median(ratios), 4),
        "quartiles": [round(quartiles[0], 4), round(quartiles[2], 4)],
        "core_update_seconds_median": round(statistics.median(core_times), 6),
        "plain_update_seconds_median": round(statistics.median(plain_times), 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if "RANK" in os.environ:  # one of the two processes of one case
        figure = measure(args.case, args.pairs)
        if figure is not None:
            print(
                f"{args.case}: core / plain {figure['core_over_plain_median']} (quartiles {figure['quartiles']}, "
                f"{figure['pairs']} pairs), median update {figure['core_update_seconds_median'] * 1e3:.2f} ms / "
                f"{figure['plain_update_seconds_median'] * 1e3:.2f} ms",
                flush=True,
            )
            if args.json:
                with open(args.json, "w", encoding="utf-8") as out:
                    json.dump(figure, out)
        return
    # Each case in two processes of its own: a run's process group is set up and ended once.
    figures = []
    with tempfile.TemporaryDirectory() as folder:
        for name in CASES if args.case == "all" else [args.case]:
            figure_file = os.path.join(folder, f"{name}.json")
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
            command += [__file__, "--case", name, "--pairs", str(args.pairs), "--json", figure_file]
            code = subprocess.call(command)
            if code:
                raise SystemExit(code)
            with open(figure_file, encoding="utf-8") as figure:
                figures.append(json.load(figure))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
