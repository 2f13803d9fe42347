"""The `core` command end to end on the CPU: run, replicas, TensorFlow, listings, a killed worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import SMALL_FCNN, start_long_run

from core.base.results import SCHEMA_VERSION, RunResult

SMALL = SMALL_FCNN


def core(*arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "core.cli", *arguments], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_run_prints_a_summary_and_writes_the_versioned_result(tmp_path: Path) -> None:
    output = tmp_path / "out" / "result.json"
    completed = core(
        "run", "fcnn", "--accelerator", "cpu", "--steps", "3", "--batch-size", "8", *SMALL, "--output", str(output)
    )
    assert completed.returncode == 0, completed.stderr
    assert "fcnn on cpu (torch, fp32): ok" in completed.stdout and "throughput" in completed.stdout
    result = RunResult.model_validate_json(output.read_text())
    assert result.schema_version == SCHEMA_VERSION and result.status.ok
    assert result.samples_per_update == 8 and result.window_samples == 24
    assert result.throughput_per_second == pytest.approx(24 / result.window_seconds)
    assert result.flops_per_second == pytest.approx(result.flops_per_sample * result.throughput_per_second)
    assert result.environment.python_version and result.environment.framework_version.startswith(
        result.environment.library_versions["torch"][:4]
    )
    assert result.environment.host_threads["intra_op_threads"] >= 1
    assert result.devices and result.devices[0].kind == "cpu"
    assert result.workload_details["weights"] == result.parameter_count
    document = json.loads(output.read_text())
    for field in (
        "setup_seconds",
        "first_step_seconds",
        "warmup_seconds",
        "window_seconds",
        "step_seconds_median",
        "step_seconds_p90",
        "energy_joules",
        "samples_per_watt_hour",
        "throughput_per_second",
    ):
        assert field in document
    if document["energy_joules"] is None:
        assert document["energy_unavailable_reason"]


@pytest.mark.slow
def test_torch_replicas_run_under_torchrun_and_report_one_global_figure() -> None:
    completed = core("run", "fcnn", "--replicas", "2", "--batch-size", "8", "--steps", "3", *SMALL, "--json")
    assert completed.returncode == 0, completed.stderr
    result = RunResult.model_validate_json(completed.stdout)
    assert result.status.ok and result.world_size == 2
    assert result.samples_per_update == 16 and result.window_samples == 48
    assert result.executor_details["ddp"] is True and result.executor_details["distributed_backend"] == "gloo"


@pytest.mark.slow
@pytest.mark.parametrize("replicas", ["1", "2"])
def test_tensorflow_runs_on_the_cpu(replicas: str) -> None:
    pytest.importorskip("tensorflow")
    completed = core(
        "run",
        "fcnn",
        "--framework",
        "tensorflow",
        "--replicas",
        replicas,
        "--batch-size",
        "8",
        "--gradient-accumulation",
        "2",
        "--steps",
        "3",
        *SMALL,
        "--json",
    )
    assert completed.returncode == 0, completed.stderr
    result = RunResult.model_validate_json(completed.stdout)
    assert result.status.ok and result.framework == "tensorflow"
    assert result.samples_per_update == 16 * int(replicas)
    assert result.executor_details["replicas_in_process"] == int(replicas)


def test_workloads_json() -> None:
    completed = core("workloads", "--json")
    rows = {row["name"]: row for row in json.loads(completed.stdout)}
    fcnn = rows["fcnn"]
    assert fcnn["frameworks"] == ["torch", "tensorflow"] and fcnn["task"] == "classification"
    assert fcnn["sample_unit"] == "samples" and fcnn["parameter_count"] == 512**2 * 3 + 512 * 2200


def test_devices_json() -> None:
    listing = json.loads(core("devices", "--json").stdout)
    assert listing["cpu"][0]["details"]["usable_cores"] >= 1
    assert "unavailable" in listing["nvidia"]


def _worker_pids(launcher_pid: int) -> list[int]:
    """PIDs of core.running.worker processes below the launcher, found through /proc."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def descends(pid: int) -> bool:
        while pid in parents and pid > 1:
            if pid == launcher_pid:
                return True
            pid = parents[pid]
        return False

    return sorted(
        pid
        for pid, command in commands.items()
        if "core.running.worker" in command and "torch.distributed" not in command and descends(pid)
    )


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_killed_worker_is_reported_and_earlier_phases_kept() -> None:
    launcher = start_long_run()
    try:
        deadline = time.monotonic() + 240
        workers: list[int] = []
        result_file: Path | None = None
        while time.monotonic() < deadline:
            workers = _worker_pids(launcher.pid)
            if len(workers) == 2:
                command = Path(f"/proc/{workers[0]}/cmdline").read_bytes().split(b"\0")
                result_file = Path(command[command.index(b"core.running.worker") + 2].decode())
                if result_file.exists() and json.loads(result_file.read_text()).get("warmup_seconds") is not None:
                    break
            time.sleep(0.2)
        assert result_file is not None and result_file.exists(), "the run never reached its window"
        time.sleep(0.5)  # well inside the (very long) window
        os.kill(workers[-1], signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1, stderr
    result = RunResult.model_validate_json(stdout)
    assert result.status.state.value == "killed" and result.status.phase == "window", result.status
    assert (
        result.setup_seconds is not None and result.first_step_seconds is not None and result.warmup_seconds is not None
    )
    assert result.throughput_per_second is None


def test_every_run_config_field_has_a_run_flag_that_sets_it() -> None:
    # The run command's flags are generated from RunConfig: a new field cannot be forgotten.
    from core.base.config import RunConfig
    from core.cli import _OWN_SYNTAX, _run_options, build_parser, run_flags

    flags = run_flags()
    # Every field has a flag; the others name a part of one (the target's keys: "target.max_epochs").
    assert set(RunConfig.model_fields) <= set(flags)
    assert all(name.partition(".")[0] in RunConfig.model_fields for name in set(flags) - set(RunConfig.model_fields))
    samples = {int: "3", float: "0.25", str: "none"}
    for name, info in RunConfig.model_fields.items():
        if name in _OWN_SYNTAX:
            continue
        kind = next(
            (k for k in (bool, int, float) if k in (info.annotation, *getattr(info.annotation, "__args__", ()))), str
        )
        argv = ["run", "fcnn", flags[name]] + ([] if kind is bool else [samples[kind]])
        options = _run_options(build_parser().parse_args(argv))
        assert options == {name: True if kind is bool else kind(samples[kind])}, name
    run_parser = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    help_text = " ".join(run_parser.format_help().split())
    assert (
        "--batch-size BATCH_SIZE" in help_text
        and "core's: fp32, tf32, bf16, fp16, default, and any a plugin registers (default: fp32)" in help_text
    )
