"""Machine profiles: a run or a sweep checked for a machine that is not here (--dry-run --machine)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel

from core import ConfigError, hookimpl
from core.base.config import Framework, Precision
from core.cli import main
from core.contract.manager import PluginState, get_plugin_manager
from core.contract.workload import Workload
from core.machines import MachineProfile, load_machine, machine_names
from core.running.planning import check_machine, plan_run
from core.testing import TINY_FCNN, registered_plugins

PAPERS_MACHINES = {
    "a100-80gb-x1",
    "a100-80gb-x4",
    "gh200",
    "mi250-x4",
    "ipu-pod4",
    "ipu-pod16",
    "t4",
    "a100-80gb-pcie-x2",
    "dgx-a100-40gb",
    "v100-sxm2-32gb-x4",
    "rtx6000-x2",
}


def plan(workload: str, accelerator: str, machine: str, **options: object):  # type: ignore[no-untyped-def]
    return plan_run(get_plugin_manager(), workload, accelerator, dict(options), machine=load_machine(machine))


def test_the_papers_machines_are_shipped_with_their_sources() -> None:
    MACHINES = get_plugin_manager().machine_profiles()
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


def test_memory_fit_refuses_weights_that_cannot_fit_and_warns_for_the_optimizer_state() -> None:
    wide = {"layers": 4, "hidden_width": 65536, "input_width": 16, "output_width": 8}
    with pytest.raises(ConfigError, match="fp32 weights and gradients alone") as refused:
        plan("fcnn", "nvidia", "a100-80gb-x1", workload_options=wide)
    assert refused.value.field == "workload_options"  # the options that made the model that large
    assert refused.value.value == wide
    # ~1.59e9 parameters: 11.8 GiB of weights and gradients fit a T4's 14.8 GiB; with the FCNN's
    # SGD momentum (one fp32 value per parameter) 17.7 GiB do not. Adam's two would be assumed for
    # a workload that declares nothing, and it would warn from a smaller model.
    sgd = plan("fcnn", "nvidia", "t4", workload_options={**wide, "hidden_width": 23000})
    assert any("(1 value(s) per parameter)" in w and "activations not counted" in w for w in sgd.warnings), sgd.warnings
    fits_with_momentum = plan("fcnn", "nvidia", "t4", workload_options={**wide, "hidden_width": 20000})
    assert not fits_with_momentum.warnings  # 13.4 GiB: would not fit with Adam's 17.9 GiB

    class Undeclared(Workload):
        """A third party's workload that declares its size but not its optimizer."""

        name: ClassVar[str] = "undeclared"
        parameters: ClassVar[int] = 1_000_000_000

        def parameter_count(self, options: BaseModel) -> int:
            return self.parameters

    t4 = load_machine("t4")
    assumed = plan_run(get_plugin_manager(), Undeclared(), "nvidia", {}, machine=t4)
    assert any("like Adam's (the workload does not declare its own)" in w for w in assumed.warnings)
    Undeclared.parameters = 3_000_000_000
    with pytest.raises(ConfigError, match="fp32 weights and gradients alone") as too_large:
        plan_run(get_plugin_manager(), Undeclared(), "nvidia", {}, machine=t4)
    assert too_large.value.field == "workload"  # no options sized it: the workload itself is too large


def test_a_dry_run_shows_the_memory_estimate_and_the_ipus_reserved(capsys: pytest.CaptureFixture[str]) -> None:
    dry = ["--dry-run", "--json"]
    assert main(["run", "vit-l32", "--accelerator", "nvidia", "--machine", "a100-80gb-x1", *dry]) == 0
    shown = json.loads(capsys.readouterr().out)
    memory = shown["memory_per_device"]
    assert shown["parameters"] == 306_535_400 and memory["device_memory_gib"] == 80.0
    assert memory["optimizer_state_gib"] == pytest.approx(306_535_400 * 8 / 1024**3, abs=1e-3)  # AdamW
    assert memory["optimizer_state_assumed"] is False and shown["placement"]["replicas"] == 1
    pod = ["run", "fcnn", "--accelerator", "graphcore", "--machine", "ipu-pod16", "--precision", "fp16"]
    assert main([*pod, "--replicas", "3", *dry]) == 0
    placement = json.loads(capsys.readouterr().out)["placement"]
    assert placement["total_ipus"] == 3 and placement["reserved_ipus"] == 4  # PopTorch books a power of two
    assert main([*pod, "--replicas", "3", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "reserved ipus 4" in text and "3 replicas x 1 device," in text


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
    with pytest.raises(ConfigError, match=r"a profile file \(.toml\): nothing at") as absent:
        load_machine(str(tmp_path / "nodes" / "ours.toml"))
    assert absent.value.field == "machine"
    with pytest.raises(ConfigError, match="a folder at"):
        load_machine(str(tmp_path))
    profile.write_text(profile.read_text().replace('device = "NVIDIA H100"\n', "").replace("= true", "= 2"))
    with pytest.raises(ConfigError) as missing:
        load_machine(str(profile))
    assert missing.value.field == "machine.device" and missing.value.value is None
    assert (
        str(missing.value)
        == "invalid machine.device (missing): required (the device model, e.g. 'NVIDIA A100-SXM4-80GB') "
        f"(in profile {profile})"
    )


def _profile(tmp_path: Path, accelerator: str = "nvidia", details: str = "") -> MachineProfile:
    path = tmp_path / "node.toml"
    path.write_text(
        f'name = "node"\ndescription = "d"\nsource = "s"\naccelerator = "{accelerator}"\ndevice = "GPU"\n'
        f'devices = 2\nprecisions = ["fp32", "bf16"]\n{details}'
    )
    return load_machine(str(path))


def test_a_profile_is_checked_against_the_accelerator_that_drives_it(tmp_path: Path) -> None:
    def dry_run(profile: MachineProfile, accelerator: str = "nvidia") -> object:
        return plan_run(get_plugin_manager(), "fcnn", accelerator, {"workload_options": TINY_FCNN}, machine=profile)

    with pytest.raises(ConfigError) as typo:
        dry_run(_profile(tmp_path, accelerator="nvdia"))
    assert typo.value.field == "machine.accelerator" and "(did you mean 'nvidia'?)" in typo.value.allowed
    with pytest.raises(ConfigError) as unread:
        dry_run(_profile(tmp_path, details='[details]\ncompute_capabilty = "8.0"\n'))
    assert unread.value.field == "machine.details.compute_capabilty"
    assert "compute_capability (str)" in unread.value.allowed
    with pytest.raises(ConfigError, match="a string is required, got a number; a TOML string is quoted") as unquoted:
        dry_run(_profile(tmp_path, details="[details]\ncompute_capability = 8.0\n"))
    assert unquoted.value.field == "machine.details.compute_capability" and unquoted.value.value == 8.0
    # Issue 26, second tester: errors of [details] and of the accelerator name the profile's file, as
    # the errors of reading it do.
    for error in (typo, unread, unquoted):
        assert str(error.value).endswith(f"(in profile {tmp_path / 'node.toml'})"), error.value
    with pytest.raises(ConfigError, match="an integer is required, got a string"):
        dry_run(_profile(tmp_path, accelerator="amd", details='[details]\ngcds_per_package = "2"\n'), "amd")
    # Where the profile leaves the capability out, bf16 is not checked, and the dry run says so.
    unknown = plan_run(
        get_plugin_manager(),
        "fcnn",
        "nvidia",
        {"precision": "bf16", "workload_options": TINY_FCNN},
        machine=_profile(tmp_path),
    )
    assert any("gives no compute_capability" in w for w in unknown.warnings)
    with pytest.raises(ConfigError, match="compute capability 7.5"):
        plan_run(
            get_plugin_manager(),
            "fcnn",
            "nvidia",
            {"precision": "bf16", "workload_options": TINY_FCNN},
            machine=_profile(tmp_path, details='[details]\ncompute_capability = "7.5"\n'),
        )


def test_a_sweep_file_reads_its_profile_next_to_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "node.toml").write_text((_profile(tmp_path) and (tmp_path / "node.toml")).read_text())
    (folder / "sweep.toml").write_text(
        'name = "here"\nmachine = "node.toml"\n[grid]\nworkload = "fcnn"\naccelerator = "nvidia"\n'
        "[grid.workload_options]\nlayers = 1\nhidden_width = 8\n"
    )
    monkeypatch.chdir(tmp_path)  # not the sweep file's folder
    assert main(["sweep", str(folder / "sweep.toml"), "--dry-run", "--database", str(tmp_path / "r.db")]) == 0
    assert "planned for machine 'node'" in capsys.readouterr().out


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
    assert shown["planned_for"] == "a100-80gb-x4" and shown["launcher"] == "torchrun"
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


@pytest.mark.parametrize(
    ("line", "field", "says"),
    [
        ("memory_gib_per_device = inf", "machine.memory_gib_per_device", "finite number"),
        ("memory_gib_per_device = -inf", "machine.memory_gib_per_device", "finite number"),
        ("memory_gib_per_device = nan", "machine.memory_gib_per_device", "finite number"),
        ("memory_gib_per_device = 1e308", "machine.memory_gib_per_device", "less than or equal to 1048576"),
        ("host_cores = 99999999999", "machine.host_cores", "less than or equal to"),
        ("numa_nodes = 1_000_000", "machine.numa_nodes", "less than or equal to"),
        # The key is named, not the whole [details] table (third pass).
        ("[details]\ncompute_capability = inf", "machine.details.compute_capability", "= inf: a finite number"),
        ("[details]\ncompute_capability = true", "machine.details.compute_capability", "not a boolean"),
        ("[details]\nsome_fact = -inf", "machine.details.some_fact", "a finite number"),
        ("memory_gib_per_device = 0", "machine.memory_gib_per_device", "greater than 0"),
        ("memory_gib_per_device = -80", "machine.memory_gib_per_device", "greater than 0"),
        ("memory_gib_per_device = true", "machine.memory_gib_per_device", "a boolean is not a number"),
        ("host_cores = false", "machine.host_cores", "a boolean is not a number"),
        ("numa_nodes = 0", "machine.numa_nodes", "greater than or equal to 1"),
    ],
)
def test_a_profile_refuses_absurd_figures(tmp_path: Path, line: str, field: str, says: str) -> None:
    """Issue 26: inf, nan and 1e308 passed 'gt=0' and every memory check after it."""
    with pytest.raises(ConfigError, match=says) as refused:
        _profile(tmp_path, details=line + "\n")
    assert refused.value.field == field and f"(in profile {tmp_path / 'node.toml'})" in refused.value.allowed


def test_a_huge_float_for_an_integer_is_refused_without_spelling_it_out(tmp_path: Path) -> None:
    # Issue 26 (O6): "write 1000...0" quoted a 309-digit integer, past the docs' 200-character limit.
    with pytest.raises(ConfigError) as refused:
        _profile(tmp_path, details="host_cores = 1e308\n")
    assert "a float is not an integer)" in str(refused.value) and "write" not in str(refused.value)
    assert len(str(refused.value)) < 300, str(refused.value)
    with pytest.raises(ConfigError, match="a float is not an integer; write 64"):
        _profile(tmp_path, details="host_cores = 64.0\n")


def test_a_profile_refuses_a_device_count_no_node_has(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    _profile(tmp_path)
    path.write_text(path.read_text().replace("devices = 2", "devices = 1_000_000_000_000"))
    with pytest.raises(ConfigError, match="less than or equal to 65536") as refused:
        load_machine(str(path))
    assert refused.value.field == "machine.devices"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"9"', 'MAJOR.MINOR as NVML reports it, e.g. "8.0"'),
        ('"9.0.1"', "MAJOR.MINOR"),
        ('"x.y"', "MAJOR.MINOR"),
        ('" 9.0"', "MAJOR.MINOR"),
        ('"-1.0"', "MAJOR.MINOR"),
        ("-1", 'a string is required, got an integer; a TOML string is quoted: compute_capability = "-1"'),
        ("9.0", 'a string is required, got a number; a TOML string is quoted: compute_capability = "9.0"'),
    ],
)
def test_a_malformed_compute_capability_is_refused_once_naming_it(
    tmp_path: Path, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: "9" and "9.0.1" passed (float() read one, crashed on the other), "x.y" crashed the
    NVIDIA plugin's check. The form is MAJOR.MINOR as a string, as NVML reports it; a TOML number is
    refused rather than guessed (9.1 and 9.10 are one float)."""
    profile = _profile(tmp_path, details=f"[details]\ncompute_capability = {value}\n")
    with pytest.raises(ConfigError, match=re.escape(says)) as refused:
        plan_run(get_plugin_manager(), "fcnn", "nvidia", {"workload_options": TINY_FCNN}, machine=profile)
    assert refused.value.field == "machine.details.compute_capability"
    sweep = tmp_path / "s.toml"
    sweep.write_text('[grid]\nworkload = "fcnn"\naccelerator = "nvidia"\nmicro_batch_size = [8, 16]\n')
    args = ["sweep", str(sweep), "--dry-run", "--machine", str(tmp_path / "node.toml"), "--database", "x.db"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("machine.details.compute_capability") == 1 and "Traceback" not in err  # once, not per cell


@pytest.mark.parametrize("value", ["0", "-1", "65"])
def test_a_gcd_count_out_of_range_is_refused(tmp_path: Path, value: str) -> None:
    profile = _profile(tmp_path, accelerator="amd", details=f"[details]\ngcds_per_package = {value}\n")
    with pytest.raises(ConfigError, match="GPUs ROCm shows per physical package") as refused:
        plan_run(get_plugin_manager(), "fcnn", "amd", {"workload_options": TINY_FCNN}, machine=profile)
    assert refused.value.field == "machine.details.gcds_per_package"


def test_a_well_formed_compute_capability_is_read(tmp_path: Path) -> None:
    for capability in ("9.0", "10.0", "12.1"):
        profile = _profile(tmp_path, details=f'[details]\ncompute_capability = "{capability}"\n')
        planned = plan_run(
            get_plugin_manager(),
            "fcnn",
            "nvidia",
            {"precision": "bf16", "workload_options": TINY_FCNN},
            machine=profile,
        )
        assert not any("compute_capability" in warning for warning in planned.warnings)


# --- the profiles come from the plugins of their vendors (core_register_machines) ----------------


def test_each_vendor_s_machines_come_from_its_plugin() -> None:
    manager = get_plugin_manager()
    shipped = manager.machine_profiles()
    assert PAPERS_MACHINES <= set(shipped)
    for name, profile in shipped.items():
        # The vendor that drives the devices ships the profile, and its rules accept it.
        assert manager.machines[name].plugin == manager.accelerators[profile.accelerator].plugin, name
        check_machine(manager, profile)
        accelerator = manager.accelerator(profile.accelerator)
        assert set(profile.precisions) <= set(accelerator.precisions(Framework.torch)), name
    # The NVIDIA plugin derives precisions from the compute capability, as its validate_run does.
    assert shipped["t4"].precisions == (Precision.fp32, Precision.fp16, Precision.default)
    assert Precision.tf32 in shipped["gh200"].precisions and shipped["gh200"].details["compute_capability"] == "9.0"


def test_each_nvidia_profile_s_device_has_its_datasheet_peaks() -> None:
    """A profile's device name finds its own GPU's entry in the peak table, with a figure for every
    precision it computes (MFU and the roofline read them), and the compute capability gives the
    precisions the GPU has: ACES's DGX A100, Expanse V100 and Grace Quadro RTX 6000 nodes included."""
    from core_plugins.nvidia.peaks import NVIDIA_PEAKS

    shipped = get_plugin_manager().machine_profiles()
    nvidia = {name: profile for name, profile in shipped.items() if profile.accelerator == "nvidia"}
    for name, profile in nvidia.items():
        entry = NVIDIA_PEAKS.entry_for(profile.device)
        assert entry is not None and entry.bandwidth is not None, name
        assert {p for p in profile.precisions if p is not Precision.default} == set(entry.tflops), name
    expected = {
        "dgx-a100-40gb": ("A100 40GB SXM", 8, 40.0, "8.0"),
        "v100-sxm2-32gb-x4": ("V100 SXM2", 4, 32.0, "7.0"),
        "rtx6000-x2": ("Quadro RTX 6000", 2, 24.0, "7.5"),
        "a100-40gb-pcie-x2": ("A100 40GB PCIe", 2, 40.0, "8.0"),
    }
    for name, (model, devices, memory, capability) in expected.items():
        profile = nvidia[name]
        entry = NVIDIA_PEAKS.entry_for(profile.device)
        assert entry is not None and entry.model == model, name
        assert (profile.devices, profile.memory_gib_per_device) == (devices, memory), name
        assert profile.details["compute_capability"] == capability, name
    assert nvidia["v100-sxm2-32gb-x4"].precisions == (Precision.fp32, Precision.fp16, Precision.default)
    assert nvidia["dgx-a100-40gb"].host_cores == 128 and "DGX A100 datasheet" in nvidia["dgx-a100-40gb"].source


def test_without_the_vendor_plugins_there_are_no_named_machines(capsys: pytest.CaptureFixture[str]) -> None:
    import core.workloads
    import core_plugins.cpu

    with registered_plugins(core_plugins.cpu, core.workloads, entry_points=False):
        assert machine_names() == []
        assert main(["machines"]) == 0  # not a crash on an empty listing
        assert "no loaded plugin ships one" in capsys.readouterr().err
        assert main(["machines", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []
        with pytest.raises(ConfigError, match="none: no loaded plugin ships one") as refused:
            load_machine("a100-80gb-x1")
        assert refused.value.field == "machine"


def _lab_profile(name: str, accelerator: str = "cpu") -> MachineProfile:
    return MachineProfile(
        name=name,
        description="a third party's node",
        source="its vendor's datasheet",
        accelerator=accelerator,
        device="a CPU",
        devices=1,
        precisions=(Precision.fp32,),
        host_cores=2,
    )


class MachinesPlugin:
    def __init__(self, *profiles: object) -> None:
        self.profiles = profiles

    @hookimpl
    def core_register_machines(self, register: Callable[[MachineProfile], None]) -> None:
        for profile in self.profiles:
            register(profile)  # type: ignore[arg-type]


def test_a_third_party_s_profile_is_planned_for_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_plugins(MachinesPlugin(_lab_profile("lab-node"))) as manager:
        assert manager.plugins["MachinesPlugin"].registered["machines"] == ["lab-node"]
        assert "lab-node" in machine_names()
        dry = ["run", "fcnn", "--dry-run", "--machine", "lab-node", "--json"]
        assert main([*dry, "--threads", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["planned_for"] == "lab-node"
        # The profile's host has 2 cores: the CPU plugin's rule reads them from it, not this host's.
        assert main([*dry, "--threads", "3"]) == 2
        assert "must not exceed the 2 usable cores" in capsys.readouterr().err
        assert main(["machines"]) == 0
        assert re.search(r"^lab-node +cpu +a third party's node$", capsys.readouterr().out, re.M)


@pytest.mark.parametrize(
    "profile,says",
    [
        (_lab_profile("t4"), "MachineProfile 't4' is already registered by built-in plugin 'nvidia'"),
        (_lab_profile("lab.toml"), "not ending in .toml"),  # `--machine lab.toml` must stay the file
        (_lab_profile("labs/node"), "a profile's name has letters, digits"),
        (_lab_profile("../node"), "a profile's name has letters, digits"),
        (_lab_profile("-node"), "beginning with a letter or digit"),  # would read as an option
        ({"name": "lab-node", "accelerator": "cpu"}, "expected a MachineProfile instance, got dict"),
    ],
)
def test_a_profile_that_would_shadow_a_name_or_a_file_is_refused(profile: object, says: str) -> None:
    with registered_plugins(MachinesPlugin(_lab_profile("fine-node"), profile)) as manager:
        record = manager.plugins["MachinesPlugin"]
        assert record.state is PluginState.failed and says in (record.error or ""), record.error
        assert "fine-node" not in manager.machines  # all or nothing
        assert manager.machines["t4"].plugin == "nvidia"
