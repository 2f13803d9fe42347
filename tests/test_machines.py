"""Machine profiles: a run or a sweep checked for a machine that is not here (--dry-run --machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core import ConfigError
from core.cli import main
from core.config import Precision
from core.contract.manager import get_plugin_manager
from core.machines import MachineProfile, load_machine, machine_names
from core.machines.catalog import MACHINES
from core.running.planning import plan_run
from core.testing import TINY_FCNN

PAPERS_MACHINES = {
    "a100-80gb-x1",
    "a100-80gb-x4",
    "gh200",
    "mi250-x4",
    "ipu-pod4",
    "ipu-pod16",
    "t4",
    "a100-80gb-pcie-x2",
}


def plan(workload: str, accelerator: str, machine: str, **options: object):  # type: ignore[no-untyped-def]
    return plan_run(get_plugin_manager(), workload, accelerator, dict(options), machine=load_machine(machine))


def test_the_papers_machines_are_shipped_with_their_sources() -> None:
    assert PAPERS_MACHINES <= set(machine_names())
    for profile in MACHINES.values():
        assert profile.source and profile.devices >= 1 and profile.precisions
    assert MACHINES["ipu-pod16"].numa_nodes == 8  # ACES section 2.3
    assert MACHINES["mi250-x4"].devices == 8  # two GCDs per MI250
    assert Precision.bf16 not in MACHINES["t4"].precisions  # compute capability 7.5


def test_a_precision_the_machine_lacks_is_refused_naming_the_device() -> None:
    with pytest.raises(ConfigError) as refused:
        plan("fcnn", "nvidia", "t4", precision="bf16", workload_options=TINY_FCNN)
    assert refused.value.field == "precision" and "Tesla T4" in refused.value.allowed
    assert plan(
        "fcnn", "nvidia", "a100-80gb-x1", precision="bf16", workload_options=TINY_FCNN
    ).config.precision.value == ("bf16")


def test_replicas_beyond_the_machine_s_devices_are_refused() -> None:
    planned = plan("fcnn", "nvidia", "a100-80gb-x4", replicas=4, workload_options=TINY_FCNN)
    assert planned.launcher is not None and planned.launcher.name == "torchrun"
    with pytest.raises(ConfigError, match="at most 4 on 'a100-80gb-x4'") as refused:
        plan("fcnn", "nvidia", "a100-80gb-x4", replicas=5, workload_options=TINY_FCNN)
    assert refused.value.field == "replicas"


def test_the_machine_s_accelerator_must_be_the_run_s() -> None:
    with pytest.raises(ConfigError, match="driven by accelerator 'graphcore'") as refused:
        plan("fcnn", "nvidia", "ipu-pod4", workload_options=TINY_FCNN)
    assert refused.value.field == "accelerator"


def test_more_poprun_instances_than_numa_nodes_warns_as_aces_saw() -> None:
    sixteen = plan(
        "fcnn", "graphcore", "ipu-pod16", replicas=16, precision="fp16", accelerator_options={"instances": 16}
    )
    assert any("8 NUMA nodes" in w and "ACES" in w for w in sixteen.warnings)
    assert sixteen.launcher is not None and sixteen.launcher.name == "poprun"
    eight = plan("fcnn", "graphcore", "ipu-pod16", replicas=16, precision="fp16", accelerator_options={"instances": 8})
    assert not eight.warnings
    with pytest.raises(ConfigError, match=r"at most 1 on 'ipu-pod4' \(4 devices, 4 per replica\)"):
        plan("fcnn", "graphcore", "ipu-pod4", replicas=2, devices_per_replica=4, precision="fp16")


def test_amd_package_mode_needs_whole_mi250s() -> None:
    plan("fcnn", "amd", "mi250-x4", replicas=4, accelerator_options={"mode": "package"}, workload_options=TINY_FCNN)
    with pytest.raises(ConfigError, match="a multiple of 2 on 'mi250-x4'"):
        plan("fcnn", "amd", "mi250-x4", replicas=3, accelerator_options={"mode": "package"}, workload_options=TINY_FCNN)


def test_memory_fit_refuses_weights_that_cannot_fit_and_warns_for_adam() -> None:
    wide = {"layers": 4, "hidden_width": 65536, "input_width": 16, "output_width": 8}
    with pytest.raises(ConfigError, match="fp32 weights and gradients alone") as refused:
        plan("fcnn", "nvidia", "a100-80gb-x1", workload_options=wide)
    assert refused.value.field == "workload"
    adam = plan("fcnn", "nvidia", "t4", workload_options={**wide, "hidden_width": 20000})
    assert any("with Adam's state" in w and "activations not counted" in w for w in adam.warnings)


def test_a_profile_file_and_bad_profiles(tmp_path: Path) -> None:
    profile = tmp_path / "node.toml"
    profile.write_text(
        'name = "our-node"\ndescription = "two H100"\nsource = "our inventory"\naccelerator = "nvidia"\n'
        'device = "NVIDIA H100"\ndevices = 2\nmemory_gib_per_device = 80.0\nprecisions = ["fp32", "bf16"]\n'
    )
    assert load_machine(str(profile)) == MachineProfile(
        name="our-node",
        description="two H100",
        source="our inventory",
        accelerator="nvidia",
        device="NVIDIA H100",
        devices=2,
        memory_gib_per_device=80.0,
        precisions=(Precision.fp32, Precision.bf16),
    )
    profile.write_text(profile.read_text().replace("devices = 2", "devices = true"))
    with pytest.raises(ConfigError) as typed:
        load_machine(str(profile))
    assert typed.value.field == "machine.devices" and typed.value.value is True
    with pytest.raises(ConfigError, match="a shipped profile") as unknown:
        load_machine("a100-x9")
    assert unknown.value.field == "machine" and "ipu-pod16" in unknown.value.allowed


def test_the_cli_dry_runs_a_run_for_a_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "run",
                "fcnn",
                "--accelerator",
                "nvidia",
                "--dry-run",
                "--machine",
                "a100-80gb-x4",
                "--replicas",
                "4",
                "--json",
            ]
        )
        == 0
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["planned for"] == "a100-80gb-x4" and shown["launcher"] == "torchrun"
    assert main(["run", "fcnn", "--accelerator", "nvidia", "--machine", "t4"]) == 2
    assert "use it with --dry-run" in capsys.readouterr().err
    assert main(["machines", "--json"]) == 0
    assert {row["name"] for row in json.loads(capsys.readouterr().out)} == set(machine_names())


def test_a_sweep_dry_run_for_a_machine_shows_the_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "pod.toml"
    sweep.write_text(
        'name = "pod"\n[grid]\nworkload = "fcnn"\naccelerator = "graphcore"\nprecision = "fp16"\nreplicas = 16\n'
        "[grid.accelerator_options]\ninstances = [8, 16]\n"
    )
    code = main(["sweep", str(sweep), "--dry-run", "--machine", "ipu-pod16", "--database", str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "planned for machine 'ipu-pod16'" in out
    assert out.count("warning: 16 poprun instances") == 1
