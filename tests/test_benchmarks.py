"""The benchmark scripts' code paths, on the CPU at toy sizes: a benchmark that has never run would
spend a GPU session's scarce minutes on its own bugs. Their figures here mean nothing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from core import make_config
from core.testing import run_context

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_benchmark_script_runs_from_the_shell_and_writes_its_json(tmp_path: Path) -> None:
    output = tmp_path / "figures.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "nvidia_vs_plain.py"),
            "--case",
            "resnet50",
            "--accelerator",
            "cpu",
            "--smoke",
            "--json",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    figures = json.loads(output.read_text())
    resnet = figures["resnet50"]
    assert resnet["ratio_core_over_plain"] == pytest.approx(
        resnet["core_images_per_second"] / resnet["plain_images_per_second"]
    )
    assert resnet["autocast_dtype"] == "bfloat16"


def test_gpu_benchmark_fcnn_flops_and_meter_cases() -> None:
    bench_module = load_script("nvidia_vs_plain")
    bench = bench_module.Bench("cpu", 3, 1, 2, bench_module.SMOKE)
    fcnn = bench_module.case_fcnn(bench)
    # Core's FLOP/s is the workload's 6 Phi per sample times throughput: exactly 6 Phi bs / time.
    assert fcnn["flops_ratio"] == pytest.approx(1.0, rel=1e-9)
    assert len(fcnn["core_runs"]) == len(fcnn["plain_runs"]) == 2
    meter = bench_module.case_meter(bench)
    assert meter["difference_fraction"] >= 0 and len(meter["energy"]) == 2
    assert "core_over_independent_counter" not in meter  # no NVML counter to read on the CPU


@pytest.mark.slow
def test_gpu_benchmark_compile_case_reports_compilation_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    # Inductor needs minutes on this CPU; the case's bookkeeping is what is under test here.
    monkeypatch.setattr(torch, "compile", lambda model, **_: model)
    bench_module = load_script("nvidia_vs_plain")
    figures = bench_module.case_resnet50_compile(
        bench_module.Bench("cpu", bench_module.SMOKE_STEPS, 1, 1, bench_module.SMOKE)
    )
    assert figures["core_first_step_seconds"][0] > 0 and figures["plain_compiled_first_step_seconds"] > 0
    assert figures["ratio_core_compiled_over_plain_eager"] == pytest.approx(
        figures["core_compiled_images_per_second"] / figures["plain_eager_images_per_second"]
    )
    assert figures["core_warnings"] == []


def test_independent_counter_reads_bracket_the_meter_window(sim_nvml: Callable[..., Any]) -> None:
    from simnvml import SimNode, h200, simulated_time

    from core_plugins.nvidia.accelerator import NvidiaAccelerator
    from core_plugins.nvidia.meter import NvmlMeterFactory

    # Through the real pynvml over the simulated NVML library: the benchmark's own `import pynvml`
    # gets the release under test, as the plugin's does.
    climbing = h200("GPU-8c1f0d2e-0000-4000-8000-000000000001", 300.0, 0x19)
    climbing.power_ramp_watts_per_second = 200.0
    pynvml = sim_nvml(SimNode([climbing, h200("GPU-8c1f0d2e-0000-4000-8000-000000000002", 120.0, 0x3B)]))
    clock = simulated_time(pynvml)  # the library's time moves only with the window below
    bench_module = load_script("nvidia_vs_plain")
    config = make_config(workload="fcnn", accelerator="nvidia", power_sample_interval_seconds=0.01)
    devices = NvidiaAccelerator().visible_devices()
    uuids = [device.details["uuid"] for device in devices]
    with bench_module.independent_counter_reads("nvidia", uuids) as independent:
        meter = NvmlMeterFactory(clock=clock).meter_for(devices, run_context(config))
        meter.start()
        clock.wait_for_waiters(1)
        clock.run_for(0.3, 0.01)
        measurement = meter.stop()
        meter.close()
    # No time passes outside the meter's window, so the bracketing reads count its energy exactly
    # (to the counters' millijoule, one per GPU and read).
    assert independent and measurement.energy_joules == pytest.approx(independent[0], abs=0.004)


def _overhead_benchmark(case: str, tmp_path: Path) -> dict[str, Any]:
    """One case of overhead_cpu.py at toy sizes, in a process of its own (it pins itself to a core)."""
    output = tmp_path / "overhead.json"
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "overhead_cpu.py"), "--case", case, "--smoke", "--json", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "core / plain throughput" in completed.stdout
    (figures,) = json.loads(output.read_text())
    assert figures["case"] == case and figures["core_over_plain_throughput_min"] > 0
    return dict(figures)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["tiny", "fcnn-bf16"])
def test_overhead_benchmark_runs(case: str, tmp_path: Path) -> None:
    _overhead_benchmark(case, tmp_path)


@pytest.mark.slow
def test_step_interleaved_benchmark_runs(tmp_path: Path) -> None:
    output = tmp_path / "interleaved.json"
    command = [
        sys.executable,
        str(BENCHMARKS / "step_interleaved.py"),
        "--case",
        "tiny",
        "--smoke",
        "--json",
        str(output),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    (figures,) = json.loads(output.read_text())
    assert figures["case"] == "tiny" and figures["pairs"] == 3
    assert figures["core_seconds_per_step_median"] > 0 and figures["plain_seconds_per_step_median"] > 0


@pytest.mark.slow
def test_parallel_benchmark_runs_both_cases_over_two_processes(tmp_path: Path) -> None:
    output = tmp_path / "parallel.json"
    command = [sys.executable, str(BENCHMARKS / "parallel_vs_plain.py"), "--pairs", "4", "--json", str(output)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    figures = json.loads(output.read_text())
    assert [figure["case"] for figure in figures] == ["tp2", "fsdp2"]
    for figure in figures:
        assert figure["pairs"] == 4 and figure["core_update_seconds_median"] > 0
        assert figure["plain_update_seconds_median"] > 0 and figure["core_over_plain_median"] > 0


@pytest.mark.slow
@pytest.mark.tensorflow
def test_overhead_benchmark_runs_its_tensorflow_case(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    _overhead_benchmark("tf-fcnn", tmp_path)


@pytest.mark.slow
def test_inference_overhead_benchmark_runs() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "inference_overhead.py"),
            "--steps",
            "10",
            "--warmup",
            "2",
            "--repeats",
            "2",
            "--loadgen-seconds",
            "0.2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "core/plain" in completed.stdout


def test_inference_overhead_benchmark_pairs_core_with_a_plain_sut_and_loop(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mlperf_loadgen")
    import argparse

    bench = load_script("inference_overhead")
    args = argparse.Namespace(model="mlp", steps=10, warmup=2, repeats=2, loadgen_seconds=0.05)
    offline = bench.throughput_case("offline", bench.MODELS["mlp"], args)
    assert offline["median_pair_ratio"] > 0
    assert "plain SUT" in capsys.readouterr().out
    resnet = bench.throughput_case("loop", bench.MODELS["resnet50"], argparse.Namespace(**{**vars(args), "steps": 2}))
    assert resnet["ratio_of_maxima"] > 0


@pytest.mark.slow
def test_sweep_startup_benchmark_times_a_warm_sweep(tmp_path: Path) -> None:
    bench = load_script("sweep_startup")
    figures = bench.one_sweep("warm", tmp_path, 0, steps=1)
    assert figures["process_start"] == ["forked"]
    assert 0 < figures["steady_seconds_per_run"] <= figures["first_run_seconds"] + 1.0


@pytest.mark.slow
def test_sweep_startup_benchmark_measures_kept_and_cold_sweeps(tmp_path: Path) -> None:
    bench = load_script("sweep_startup")
    summary = bench.measure(1, 1, ("warm", "kept", "cold"))
    for mode in ("warm", "kept", "cold"):
        assert summary[mode]["process_start"] == ["forked"], summary[mode]
        assert summary[mode]["seconds_per_run"]["median"] > 0


def test_meter_thread_benchmark_runs() -> None:
    bench = load_script("meter_thread")
    summary = bench.measure(pairs=2, window_seconds=0.02, intervals=(0.005,))
    figures = summary["intervals"]["0.005"]
    assert figures["cost_min_max"][0] <= figures["cost_median"] <= figures["cost_min_max"][1]
