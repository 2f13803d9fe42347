"""Overhead of core's inference loop against a plain ``torch.inference_mode`` loop, same process, same work.

One CPU thread; the two sides alternate in pairs so drift in the machine hits both alike. Models
(``--model``): ``mlp``, the tiny MLP of overhead_cpu.py (32-64-10, batch 16: where per-step Python
shows most); ``cnn``, a small CNN (two 3x3 convolutions of 16 and 32 channels with pooling, then a
linear layer, on 3x32x32 images, batch 32); ``resnet50``, core's small ResNet-50 (32x32 images,
batch 8: a model where the overhead should not show).

    .venv/bin/python benchmarks/inference_overhead.py [--model mlp|cnn|resnet50] [--case loop|offline|single-stream|all]

- ``loop``: core's own steady window over a plain loop timed at its two ends (target >= 0.97).
- ``offline``: core under LoadGen's Offline scenario over a plain ~30-line system under test
  (``PlainOfflineSut``) with the same LoadGen settings, each side's samples over its own window
  (samples loaded to last answer; target >= 0.97).
- ``single-stream``: LoadGen's p50 query latency (one sample per query) minus the plain loop's
  median time of one forward pass on one sample (target <= 50 us): what core and LoadGen add to
  each query.

Each ratio is the median of the pairs' ratios, with their quartiles and range, and the ratio of the
best runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from core import Workload, run
from core.api import run_here
from core.contract.workload import TorchTrainingSpec
from core.workloads.fcnn import Fcnn
from core.workloads.vision.resnet import ResNet50

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


@dataclass(frozen=True)
class Model:
    """What both sides run: a workload core runs by name (or instance), and its batch."""

    workload: Workload
    batch: int
    options: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> TorchTrainingSpec:
        options_model = getattr(self.workload, "options_model", None)
        options = options_model(**self.options) if options_model is not None else None
        return self.workload.build_torch(options, seed=0)


MODELS = {
    "mlp": Model(Fcnn(), 16, {"layers": 1, "hidden_width": 64, "input_width": 32, "output_width": 10}),
    "cnn": Model(SmallCnn(), BATCH),
    "resnet50": Model(ResNet50(), 8, {"variant": "small", "image_size": 32}),
}


def _model_and_pool(model: Model) -> tuple[Any, torch.Tensor]:
    spec = model.spec()
    return spec.model.eval(), spec.inputs.clone()


def plain_samples_per_second(model: Model, steps: int, warmup: int) -> float:
    """A plain loop: the same model on the same batch, back to back, timed at its two ends."""
    network, pool = _model_and_pool(model)
    inputs = pool[: model.batch].clone()
    with torch.inference_mode():
        for _ in range(warmup):
            network(inputs)
        started = time.perf_counter()
        for _ in range(steps):
            network(inputs)
        elapsed = time.perf_counter() - started
    return steps * model.batch / elapsed


def plain_sample_latency_seconds(model: Model, samples: int, warmup: int) -> float:
    """A plain loop's per-sample latency: the median time of one forward pass on one sample, going
    round the same pool of samples LoadGen draws its queries from (a CNN's time on a CPU depends on
    the data: on this model one sample can be 1.5x faster than the pool's median)."""
    network, pool = _model_and_pool(model)
    seconds = []
    with torch.inference_mode():
        for index in range(warmup):
            network(pool[index % len(pool)].unsqueeze(0))
        for index in range(samples):
            sample = pool[index % len(pool)].unsqueeze(0)
            started = time.perf_counter()
            network(sample)
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


class PlainOfflineSut:
    """A plain system under test for LoadGen's Offline scenario, as one writes it by hand: the
    query's samples in batches, indexed from the pool, each batch completed in one call."""

    def __init__(self, model: Model) -> None:
        import mlperf_loadgen as lg

        self.lg, self.batch = lg, model.batch
        self.network, self.pool = _model_and_pool(model)
        self.samples = 0
        self.window: list[float] = []

    def load(self, indices: list[int]) -> None:
        self.window.append(time.perf_counter())

    def unload(self, indices: list[int]) -> None:
        self.window.append(time.perf_counter())

    def issue(self, query: list[Any]) -> None:
        lg = self.lg
        with torch.inference_mode():
            for start in range(0, len(query), self.batch):
                part = query[start : start + self.batch]
                self.network(self.pool[[sample.index for sample in part]])
                lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0) for sample in part])
        self.samples += len(query)

    def samples_per_second(self, settings: dict[str, Any], log_dir: str) -> float:
        lg = self.lg
        test = lg.TestSettings()
        test.scenario, test.mode = lg.TestScenario.Offline, lg.TestMode.PerformanceOnly
        test.min_duration_ms = round(settings["min_duration_seconds"] * 1000)
        test.min_query_count = settings["min_query_count"]
        test.offline_expected_qps = settings["offline_expected_samples_per_second"]
        logs = lg.LogSettings()
        logs.log_output.outdir, logs.log_output.copy_summary_to_stdout = log_dir, False
        logs.enable_trace = False
        sut = lg.ConstructSUT(self.issue, lambda: None)
        qsl = lg.ConstructQSL(len(self.pool), len(self.pool), self.load, self.unload)
        lg.StartTestWithLogSettings(sut, qsl, test, logs)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        return self.samples / (self.window[-1] - self.window[0])


def core_run(model: Model, scenario: str, steps: int, warmup: int, loadgen: dict[str, Any]) -> Any:
    # LoadGen scenarios in this process (core.run would start a child for them), as the plain SUT runs.
    runner = run if scenario == "loop" else run_here
    result = runner(
        model.workload,
        "cpu",
        mode="inference",
        scenario=scenario,
        loadgen=loadgen if scenario != "loop" else {},
        micro_batch_size=model.batch,
        threads_per_replica=1,
        steps=steps,
        warmup_steps=warmup,
        power_meter="none",
        workload_options=model.options,
    )
    assert result.status.ok and result.throughput_per_second is not None, result.status
    assert scenario == "loop" or result.loadgen.valid, result.loadgen.invalid_reason
    return result


def offline_settings(model: Model, args: argparse.Namespace) -> dict[str, Any]:
    """LoadGen settings both sides take: the expected rate twice the plain loop's (core's default rule)."""
    # The rate from a loop long enough to be steady (a few hundred steps at least): from a few steps
    # it came out slow, and LoadGen, expecting too few samples, called the whole test invalid
    # ("Increase expected QPS") when the run outpaced it.
    expected = 2 * plain_samples_per_second(model, max(args.steps, 300), max(args.warmup, 30))
    return {
        "min_duration_seconds": args.loadgen_seconds,
        "min_query_count": 1,
        "offline_expected_samples_per_second": expected,
    }


def spread(values: list[float]) -> str:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, range {min(values):.3f}-{max(values):.3f}"


def throughput_case(scenario: str, model: Model, args: argparse.Namespace) -> dict[str, float]:
    import tempfile

    core_rates, plain_rates = [], []
    settings = offline_settings(model, args) if scenario == "offline" else {}

    def plain_rate() -> float:
        if scenario == "loop":
            return plain_samples_per_second(model, args.steps, args.warmup)
        with tempfile.TemporaryDirectory() as log_dir:
            return PlainOfflineSut(model).samples_per_second(settings, log_dir)

    for pair in range(args.repeats):
        # The order turns each pair, so neither side always runs right after the other's teardown.
        if pair % 2:
            plain_rates.append(plain_rate())
        core_rates.append(core_run(model, scenario, args.steps, args.warmup, settings).throughput_per_second)
        if pair % 2 == 0:
            plain_rates.append(plain_rate())
    pair_ratios = [c / p for c, p in zip(core_rates, plain_rates)]
    plain_side = "plain loop" if scenario == "loop" else "plain SUT "
    print(f"[{scenario}] throughput, {args.model}, batch {model.batch}, {args.repeats} alternating pairs")
    print(f"  {plain_side} : median {statistics.median(plain_rates):9.1f} samples/s, max {max(plain_rates):.1f}")
    print(f"  core       : median {statistics.median(core_rates):9.1f} samples/s, max {max(core_rates):.1f}")
    print(
        f"  core/plain : median of pair ratios {statistics.median(pair_ratios):.3f} ({spread(pair_ratios)}), "
        f"ratio of maxima {max(core_rates) / max(plain_rates):.3f}   target >= 0.97"
    )
    return {"median_pair_ratio": statistics.median(pair_ratios), "ratio_of_maxima": max(core_rates) / max(plain_rates)}


def single_stream_case(model: Model, args: argparse.Namespace) -> dict[str, float]:
    differences = []
    loadgen = {"min_duration_seconds": args.loadgen_seconds, "min_query_count": 100}
    for _ in range(args.repeats):
        figures = core_run(model, "single-stream", args.steps, args.warmup, loadgen).loadgen
        plain = plain_sample_latency_seconds(model, args.steps, args.warmup)
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
    parser.add_argument("--model", choices=tuple(MODELS), default="mlp")
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
            single_stream_case(MODELS[args.model], args)
        else:
            throughput_case(case, MODELS[args.model], args)


if __name__ == "__main__":
    main()
