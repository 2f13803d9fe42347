"""The Graphcore plugin's PopTorch path, driven end to end against the fakes of poptorch, popdist and
gcipuinfo (tests/fakes/graphcore): Options as graphcore/examples builds them, pipelining, the data
layout, compilation in the first step, validation before anything compiles, poprun instances, the
IPU Model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from core import ConfigError, run
from core.base.distributed import SINGLE_PROCESS
from core.contract.manager import get_plugin_manager
from core.running.planning import plan_run
from core.testing import TINY_FCNN, registered_plugins, run_context
from core_plugins.graphcore.executor import host_call_indices
from core_plugins.graphcore.launcher import PoprunLauncher
from core_plugins.graphcore.placement import plan_placement

pytestmark = pytest.mark.usefixtures("fake_sdk")

FCNN = {"layers": 4, "hidden_width": 16, "input_width": 8, "output_width": 4, "synthetic_pool_samples": 64}


def build(**options: Any) -> tuple[Any, Any]:
    """(executor, plan) for fcnn on graphcore, as the runner's setup phase would build them."""
    settings: dict[str, Any] = {"workload_options": FCNN, "power_meter": "none"}
    settings.update(options)
    plan = plan_run(get_plugin_manager(), "fcnn", "graphcore", settings)
    return plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS)), plan


def is_subsequence(expected: list, calls: list) -> bool:
    remaining = iter(calls)
    return all(any(call == item for call in remaining) for item in expected)


# --- Options against graphcore/examples ---------------------------------------------------------


def test_options_for_micro_20_ga_24_four_replicas_match_graphcore_examples(fake_sdk: Any) -> None:
    # graphcore/examples 3cc8f81, vision/cnns/pytorch/train/train.py create_training_opts() for a run of
    # 4 replicas (1 IPU each), gradient accumulation 24, device iterations 1, seed 42 (the resnet50
    # config's): replicationFactor(4), deviceIterations(1),
    # Training.accumulationAndReplicationReductionType(Mean), Training.gradientAccumulation(24),
    # randomSeed(42). Micro-batch 20 x GA 24 x 4 replicas is the ResNet-50 M2000 benchmark of
    # applications/tensorflow/cnns/training/README_Benchmarks.md (b30108f).
    poptorch = fake_sdk.poptorch
    executor, plan = build(micro_batch_size=20, gradient_accumulation=24, replicas=4, seed=42)
    opts = executor.options
    examples = [
        ("replicationFactor", (4,)),
        ("deviceIterations", (1,)),
        ("Training.accumulationAndReplicationReductionType", (poptorch.ReductionType.Mean,)),
        ("Training.gradientAccumulation", (24,)),
        ("randomSeed", (42,)),
    ]
    assert is_subsequence(examples, opts.calls), opts.calls
    assert (opts.replication_factor, opts.device_iterations, opts.Training.gradient_accumulation, opts.random_seed) == (
        4,
        1,
        24,
        42,
    )
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Mean
    assert not any(name == "setExecutionStrategy" for name, _ in opts.calls)  # no pipelining
    assert not opts.exists("use_model")  # hardware, not the IPU Model
    # One host call: poptorch.DataLoader's combined batch = 20 x 1 x 4 x 24.
    assert executor.details()["host_call_samples"] == 1920 == plan.config.samples_per_host_call
    assert executor.updates_per_step == 1


def test_options_for_four_ipus_per_replica_four_replicas_match_graphcore_examples(fake_sdk: Any) -> None:
    # graphcore/examples 3cc8f81, vision/cnns/pytorch/train/configs.yml efficientnet-b4-g1-gn-pod16
    # (the ACES paper's Table 2 EfficientNet-B4: 4 IPUs per replica x 4 replicas): micro-batch 4,
    # replicas 4, gradient_accumulation 48, device_iterations 4 and seed 0 (inherited), three
    # pipeline_splits -> 4 IPUs per replica (train.py: ipus_per_replica = len(pipeline_splits) + 1);
    # models/models.py puts poptorch.BeginBlock(ipu_id=1 + split index) at each split.
    poptorch = fake_sdk.poptorch
    executor, _ = build(
        micro_batch_size=4,
        gradient_accumulation=48,
        replicas=4,
        devices_per_replica=4,
        device_iterations=4,
        seed=0,
        accelerator_options={"pipeline_splits": "2,4,6"},
    )
    opts = executor.options
    examples = [
        ("replicationFactor", (4,)),
        ("deviceIterations", (4,)),
        ("Training.accumulationAndReplicationReductionType", (poptorch.ReductionType.Mean,)),
        ("Training.gradientAccumulation", (48,)),
        ("randomSeed", (0,)),
    ]
    assert is_subsequence(examples, opts.calls), opts.calls
    strategy = opts._execution_strategy
    assert isinstance(strategy, poptorch.PipelinedExecution) and not isinstance(strategy, poptorch.ShardedExecution)
    assert strategy.auto_stage == poptorch.AutoStage.SameAsIpu
    hooks = {
        name: hook
        for name, module in executor._user_model.named_modules()
        for hook in module._forward_pre_hooks.values()
        if isinstance(hook, poptorch._BlockHook)
    }
    # The splits begin IPUs 1, 2, 3 as in graphcore/examples; the first stage is marked IPU 0 explicitly.
    assert {name: hook._ipu_id for name, hook in hooks.items()} == {"0": 0, "2": 1, "4": 2, "6": 3}
    executor.training_model.compile(executor._inputs, executor._targets)  # the fake compiler's checks pass
    assert executor.training_model._executable["num_ipus"] == 16
    assert executor.training_model._executable["stages"] == 4
    assert executor.details()["host_call_samples"] == 4 * 4 * 48 * 4
    executor.close()


# --- running -------------------------------------------------------------------------------------


def test_run_reports_batch_arithmetic_and_compiles_in_the_first_step(fake_sdk: Any) -> None:
    result = run(
        "fcnn",
        "graphcore",
        micro_batch_size=4,
        gradient_accumulation=3,
        replicas=2,
        devices_per_replica=2,
        device_iterations=3,
        steps=2,
        warmup_steps=1,
        power_meter="none",
        workload_options=FCNN,
    )
    assert result.status.ok, result.status
    assert result.samples_per_update == 4 * 3 * 2 == 24
    assert result.samples_per_host_call == 24 * 3
    assert result.window_steps == 2 and result.window_updates == 6 and result.window_samples == 144
    details = result.executor_details
    assert 0 < details["compile_seconds"] <= result.first_step_seconds
    assert details["pipeline_stages"] == 3 and len(details["pipeline_stage_plan"]) == 2
    assert details["poptorch_options"]["replication_factor"] == 2
    assert result.environment is not None and "poptorch 3.3.0" in (result.environment.framework_version or "")
    assert fake_sdk.poptorch.fake_hardware.attached == []  # destroy() released the IPUs


def test_weights_follow_the_cpu_placement_of_the_same_global_batch(fake_sdk: Any) -> None:
    # GA 4 x 2 replicas x micro 4, 3 updates per host call, 2 host calls = 6 updates of the same 32
    # samples; on the CPU: GA 8 x micro 4, 6 updates. The mean gradient is the same, so are the weights.
    ipu, _ = build(micro_batch_size=4, gradient_accumulation=4, replicas=2, devices_per_replica=2, device_iterations=3)
    for _ in range(2):
        ipu.step()
    cpu_plan = plan_run(
        get_plugin_manager(),
        "fcnn",
        "cpu",
        {
            "workload_options": FCNN,
            "power_meter": "none",
            "micro_batch_size": 4,
            "gradient_accumulation": 8,
            "threads_per_replica": 1,
        },
    )
    cpu = cpu_plan.accelerator.executor_for(cpu_plan.workload, cpu_plan.context(SINGLE_PROCESS))
    for _ in range(6):
        cpu.step()
    ipu_state, cpu_state = ipu.model_state(), cpu.model_state()
    assert ipu_state.keys() == cpu_state.keys()
    for name in ipu_state:
        assert torch.allclose(ipu_state[name], cpu_state[name], atol=1e-6), name
    ipu.close()


def test_host_call_layout_is_device_iterations_ga_replicas_micro() -> None:
    placement = plan_placement(
        micro_batch_size=2, gradient_accumulation=3, replicas=2, ipus_per_replica=1, device_iterations=2
    )
    indices = host_call_indices(placement, 0, pool=1000).view(2, 3, 2, 2)  # [D, GA, R, micro]
    assert torch.equal(indices[0], indices[1])  # every update trains on the same global batch
    assert sorted(indices[0].reshape(-1).tolist()) == list(range(12))
    assert indices[0, :, 1].reshape(-1).tolist() == [6, 7, 8, 9, 10, 11]  # replica 1's block of the update


def test_fp16_halves_the_model_and_turns_on_automatic_loss_scaling(fake_sdk: Any) -> None:
    executor, _ = build(micro_batch_size=4, precision="fp16")
    assert all(p.dtype == torch.float16 for p in executor._user_model.parameters())
    assert executor._inputs.dtype == torch.float16
    assert ("Training.setAutomaticLossScaling", (True,)) in executor.options.calls


def test_executable_cache_and_rounding_are_set_and_said(fake_sdk: Any, tmp_path: Any) -> None:
    executor, _ = build(micro_batch_size=4, replicas=3, accelerator_options={"executable_cache_dir": str(tmp_path)})
    opts = executor.options
    assert opts._Popart.options["cachePath"] == str(tmp_path) and opts._Popart.options["enableEngineCaching"]
    assert opts.auto_round_num_ipus is True
    assert "reserves 4" in executor.details()["placement_notes"][0]
    executor.step()
    assert executor.training_model._executable["num_ipus"] == 4  # the fake compiler rounded up too
    executor.close()


def test_ipu_model_runs_without_ipus(fake_sdk: Any) -> None:
    fake_sdk.poptorch.fake_hardware.ipus = 0
    fake_sdk.gcipuinfo.reset()  # no IPU listed
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "graphcore", workload_options=TINY_FCNN, micro_batch_size=4, power_meter="none")
    assert caught.value.field == "accelerator_options.ipu_model" and "IPU Model" in caught.value.allowed
    result = run(
        "fcnn",
        "graphcore",
        workload_options=TINY_FCNN,
        micro_batch_size=4,
        replicas=2,
        steps=2,
        warmup_steps=0,
        accelerator_options={"ipu_model": True},
    )
    assert result.status.ok, result.status
    assert result.executor_details["poptorch_options"]["use_ipu_model"] is True
    assert [d.name for d in result.devices] == ["IPU Model", "IPU Model"]
    assert "IPU Model" in (result.energy_unavailable_reason or "")


def test_a_poptorch_error_while_compiling_fails_the_first_step(fake_sdk: Any) -> None:
    fake_sdk.poptorch.fake_hardware.ipus = 2  # gcipuinfo lists 16, but only 2 can be attached
    result = run(
        "fcnn", "graphcore", workload_options=TINY_FCNN, micro_batch_size=4, replicas=4, steps=2, power_meter="none"
    )
    assert result.status.state.value == "error" and result.status.phase == "first_step"
    assert result.status.error_type == "Error" and "Failed to acquire 4 IPU(s)" in (result.status.message or "")
    assert result.setup_seconds is not None and result.window_seconds is None


# --- refused before anything compiles ---------------------------------------------------------------

REFUSED = [
    (dict(replicas=3, accelerator_options={"auto_round_num_ipus": False}), "replicas", "not a power of two"),
    (
        dict(devices_per_replica=4, gradient_accumulation=4),
        "gradient_accumulation",
        ">= 2 x devices_per_replica - 1 = 7",
    ),
    (dict(replicas=4, accelerator_options={"instances": 3}), "accelerator_options.instances", "must divide replicas"),
    (
        dict(replicas=4, accelerator_options={"instances": 2}),
        "accelerator_options.instances",
        "poprun --num-instances 2 --num-replicas 4 --ipus-per-replica 1",
    ),
    (dict(replicas=128, accelerator_options={"ipu_model": True}), "replicas", "at most 64 IPUs"),
    (dict(precision="bf16"), "precision", "supports: fp32, fp16"),
    (dict(compile=True), "compile", "always compiled by Poplar"),
    (dict(devices_per_replica=65), "devices_per_replica", "at most 64 device(s) per replica"),
    (dict(replicas=17), "replicas", "can place at most 16 here"),
    (dict(accelerator_options={"pipeline_splitz": "2"}), "accelerator_options.pipeline_splitz", "allowed: ipu_model"),
]


@pytest.mark.parametrize("options,field,rule", REFUSED, ids=[c[1] + "-" + str(i) for i, c in enumerate(REFUSED)])
def test_invalid_runs_are_refused_before_anything_compiles(fake_sdk: Any, options: dict, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "graphcore", workload_options=TINY_FCNN, micro_batch_size=4, power_meter="none", **options)
    assert caught.value.field == field, caught.value
    assert rule in str(caught.value), caught.value
    assert fake_sdk.poptorch.fake_hardware.attached == []


def test_a_dataset_poptorch_cannot_feed_is_refused_not_ignored(fake_sdk: Any, tmp_path: Any) -> None:
    # COCO's boxes differ per image; a compiled IPU program takes one shape: refused while planning.
    from core.base.config import RunConfig

    accelerator = get_plugin_manager().accelerator("graphcore")
    config = RunConfig(
        workload="resnet50",
        accelerator="graphcore",
        data=str(tmp_path),
        data_format="coco",
        micro_batch_size=4,
        accelerator_options={"ipu_model": True},
    )
    with pytest.raises(ConfigError) as caught:
        accelerator.validate_run(run_context(config, accelerator))
    assert caught.value.field == "data" and "PopTorch compiles one shape per input" in str(caught.value)
    accelerator.validate_run(run_context(config.model_copy(update={"data": "synthetic-host"}), accelerator))
    accelerator.validate_run(run_context(config.model_copy(update={"data_format": "image-folder"}), accelerator))


def test_a_run_larger_than_the_host_is_refused(fake_sdk: Any) -> None:
    fake_sdk.gcipuinfo.reset(fake_sdk.gcipuinfo.FakeMachine.with_ipus(12))
    with pytest.raises(ConfigError, match="reserves 16 IPUs .12 used.; this host sees 12"):
        run(
            "fcnn",
            "graphcore",
            workload_options=TINY_FCNN,
            micro_batch_size=4,
            replicas=6,
            devices_per_replica=2,
            gradient_accumulation=3,
            power_meter="none",
        )


def test_tensorflow_needs_the_ipu_build(fake_sdk: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "graphcore", framework="tensorflow", workload_options=TINY_FCNN, power_meter="none")
    assert caught.value.field == "framework" and "+gc" in caught.value.allowed


def test_bad_split_points_are_refused_in_setup_before_compiling(fake_sdk: Any) -> None:
    result = run(
        "fcnn",
        "graphcore",
        workload_options=FCNN,
        micro_batch_size=4,
        devices_per_replica=2,
        gradient_accumulation=3,
        power_meter="none",
        accelerator_options={"pipeline_splits": "nope"},
    )
    assert result.status.phase == "setup" and result.status.error_type == "ConfigError"
    assert "not a module of the model" in (result.status.message or "")


# --- the rules match the (fake) compiler's ------------------------------------------------------------


def _fake_compile(poptorch: Any, replicas: int, ipus_per_replica: int, accumulation: int, auto_round: bool) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(ipus_per_replica)])
    for ipu in range(ipus_per_replica):
        poptorch.BeginBlock(model[ipu], ipu_id=ipu)

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return poptorch.identity_loss(self.model(x).sum(), reduction="none")

    opts = poptorch.Options().replicationFactor(replicas).autoRoundNumIPUs(auto_round)
    opts.Training.gradientAccumulation(accumulation)
    poptorch.trainingModel(WithLoss(), opts).compile(torch.zeros(replicas * accumulation, 2))


def test_placement_rules_refuse_exactly_what_the_compiler_refuses(fake_sdk: Any) -> None:
    poptorch = fake_sdk.poptorch
    poptorch.fake_hardware.ipus = 64
    for replicas in (1, 2, 3, 5, 8, 16, 17):
        for ipus_per_replica in (1, 2, 3, 4):
            for accumulation in (1, 3, 5, 7):
                for auto_round in (True, False):
                    try:
                        plan_placement(
                            micro_batch_size=1,
                            gradient_accumulation=accumulation,
                            replicas=replicas,
                            ipus_per_replica=ipus_per_replica,
                            device_iterations=1,
                            auto_round_num_ipus=auto_round,
                        )
                        ours = None
                    except ConfigError as exc:
                        ours = exc
                    try:
                        _fake_compile(poptorch, replicas, ipus_per_replica, accumulation, auto_round)
                        theirs = None
                    except poptorch.Error as exc:
                        theirs = exc
                    case = (replicas, ipus_per_replica, accumulation, auto_round)
                    assert (ours is None) == (theirs is None), (case, ours, theirs)
                    poptorch.fake_hardware.attached.clear()


def test_poptorch_error_classes_mirror_the_real_ones(fake_sdk: Any) -> None:
    poptorch = fake_sdk.poptorch
    assert issubclass(poptorch.RecoverableError, poptorch.Error) and issubclass(
        poptorch.UnrecoverableError, poptorch.Error
    )
    assert poptorch.Error is poptorch.poptorch_core.Error
    model = torch.nn.Linear(2, 2)
    poptorch.BeginBlock(model, ipu_id=0)
    with pytest.raises(poptorch.Error, match="module has already been assigned to a block"):
        poptorch.BeginBlock(model, ipu_id=1)
    opts = poptorch.Options()
    poptorch.DataLoader(opts, torch.utils.data.TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(2)


# --- poprun instances --------------------------------------------------------------------------------


def test_an_instance_under_poprun_takes_its_share(fake_sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    executor, plan = build(micro_batch_size=2, gradient_accumulation=3, replicas=4, device_iterations=2)
    opts = executor.options
    assert opts.replication_factor == 2  # the replicas of this instance
    assert ("Distributed.configureProcessId", (1, 2)) in opts.calls
    placement = plan.accelerator.placement(plan.config, plan.accelerator_options)
    assert placement.instances == 2 and placement.replicas_per_instance == 2
    from core.workloads.fcnn import Fcnn

    spec = Fcnn().build_torch(Fcnn().parse_options(FCNN), 0)
    expected = spec.inputs.index_select(0, host_call_indices(placement, 1, len(spec.inputs)))
    assert torch.equal(executor._inputs, expected)  # the DataLoader gave instance 1 its replicas' samples
    assert "poprun --num-instances 2" in executor.details()["poprun_command"]


def test_under_popdist_the_options_come_from_popdist(fake_sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    fake_sdk.popdist.environment = {"instances": 2, "instance_index": 0, "total_replicas": 4, "ipus_per_replica": 1}
    executor, _ = build(micro_batch_size=2, replicas=4)
    assert executor.options.calls[0] == ("popdist.poptorch.Options", (1,))
    assert executor.options.replication_factor == 2
    fake_sdk.popdist.environment = {"instances": 2, "instance_index": 0, "total_replicas": 8, "ipus_per_replica": 1}
    with pytest.raises(ConfigError, match="poprun was started with --num-replicas 8"):
        build(micro_batch_size=2, replicas=4)


def test_open_mpi_instances_with_the_instances_option(fake_sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="one of 4 started together"):
        build(micro_batch_size=2, replicas=4, accelerator_options={"instances": 2})
    assert os.environ["OMPI_COMM_WORLD_SIZE"] == "4"


# --- core starts the instances with poprun (PoprunLauncher) -----------------------------------------


def _poprun_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake poprun first on PATH, and the fake SDK importable in the processes it starts."""
    fakes = Path(__file__).parent / "fakes" / "graphcore"
    monkeypatch.setenv("PATH", f"{fakes / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fakes), os.environ.get("PYTHONPATH")])))


@pytest.mark.slow
def test_core_starts_the_instances_with_poprun(fake_sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _poprun_on_path(monkeypatch)
    options = {"micro_batch_size": 2, "replicas": 4, "accelerator_options": {"instances": 2, "ipu_model": True}}
    plan = plan_run(get_plugin_manager(), "fcnn", "graphcore", {"workload_options": FCNN, **options})
    assert isinstance(plan.launcher, PoprunLauncher)
    result = run("fcnn", "graphcore", workload_options=FCNN, steps=3, warmup_steps=1, power_meter="none", **options)
    assert result.status.ok, result.status
    assert result.world_size == 2  # instance 0's result, which knows it was one of two
    assert result.executor_details["instance_index"] == 0
    assert result.samples_per_update == 2 * 4  # the global batch: every instance's replicas


# A meter as a third party would write it: each poprun instance reads 10 J x (its index + 1).
INSTANCE_METER = """
import os
from core import Availability, PowerMeterFactory, hookimpl
from core.plugin import EnergyMeasurement, PowerMeter

class InstanceMeter(PowerMeter):
    name = "instance-meter"
    def start(self):
        pass
    def stop(self):
        index = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
        return EnergyMeasurement(meter=self.name, energy_joules=10.0 * (index + 1))

class InstanceMeterFactory(PowerMeterFactory):
    name = "instance-meter"
    def reads(self, accelerator_name):
        return accelerator_name == "graphcore"
    def availability(self):
        return Availability.yes()
    def meter_for(self, devices, context):
        return InstanceMeter()

@hookimpl
def core_register_power_meters(register):
    register(InstanceMeterFactory())
"""


@pytest.mark.slow
def test_samples_and_energy_count_every_instances_ipus(
    fake_sdk: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The window's samples are every instance's; so must its energy be (each instance's meter reads
    its own IPUs). Before, instance 0's energy alone stood for the run: samples/Wh twice too high."""
    _poprun_on_path(monkeypatch)
    (tmp_path / "instance_meter.py").write_text(INSTANCE_METER)
    info = tmp_path / "instance_meter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: instance_meter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[core]\ninstance_meter = instance_meter\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}")  # the instances'
    monkeypatch.syspath_prepend(str(tmp_path))  # this process's: planning chooses the meter here
    options = {"micro_batch_size": 2, "replicas": 4, "accelerator_options": {"instances": 2, "ipu_model": True}}
    with registered_plugins():
        result = run(
            "fcnn", "graphcore", workload_options=FCNN, steps=3, warmup_steps=1, power_meter="instance-meter", **options
        )
    assert result.status.ok, result.status
    assert result.energy_joules == 30.0  # 10 J from instance 0's IPUs, 20 J from instance 1's
    assert result.energy is not None and result.energy.components_joules == {"instance0": 10.0, "instance1": 20.0}
    assert [node.node_rank for node in result.nodes] == [0, 1]
    assert result.samples_per_watt_hour == pytest.approx(result.window_samples / (30.0 / 3600.0))


@pytest.mark.slow
def test_an_instance_that_dies_fails_the_launch_naming_poprun(
    fake_sdk: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _poprun_on_path(monkeypatch)
    # Instance 1 is SIGKILLed as it starts; mpirun (the fake poprun) stops instance 0 and names the rank.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, signal\n"
        "if os.environ.get('OMPI_COMM_WORLD_RANK') == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}")
    result = run(
        "fcnn",
        "graphcore",
        workload_options=FCNN,
        steps=3,
        micro_batch_size=2,
        replicas=4,
        power_meter="none",
        accelerator_options={"instances": 2, "ipu_model": True},
    )
    assert not result.status.ok
    assert result.status.state.value == "killed", result.status
    assert "poprun" in result.status.message


def test_several_instances_without_poprun_are_refused_with_the_command(
    fake_sdk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="poprun, which is not on PATH") as refused:
        build(micro_batch_size=2, replicas=4, accelerator_options={"instances": 2, "ipu_model": True})
    assert "poprun --num-instances 2 --num-replicas 4" in str(refused.value)


def test_the_poprun_launcher_reads_open_mpi_s_variables() -> None:
    environ = {
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    process = PoprunLauncher().process_context(environ)
    assert (process.rank, process.local_rank, process.world_size, process.local_world_size) == (3, 1, 4, 2)
    # Each instance reads the IPUs it attached: every one reads a meter, and the run sums them.
    assert not process.is_main and process.reads_node_meter and process.meter_per_process
    with pytest.raises(RuntimeError, match="OMPI_COMM_WORLD"):
        PoprunLauncher().process_context({})


def test_inference_runs_an_inference_model_of_every_iteration_and_replica(fake_sdk: Any) -> None:
    from core_plugins.graphcore.executor import PopTorchInferenceExecutor

    executor, plan = build(mode="inference", micro_batch_size=2, replicas=2, device_iterations=3)
    assert isinstance(executor, PopTorchInferenceExecutor)
    assert executor.inference_model._training is False and executor.options.Training.gradient_accumulation == 1
    assert not executor._user_model.training  # eval() before wrapping: the wrapped copy is in eval mode too
    executor.step()
    outputs = executor._last_outputs
    # OutputMode.All: every device iteration's outputs of every replica, one per input sample.
    assert outputs is not None and outputs.shape == (3 * 2 * 2, FCNN["output_width"])
    with torch.no_grad():
        assert torch.allclose(outputs, executor._user_model(executor._inputs))
    executor.check_finite()
    executor.close()
    assert fake_sdk.poptorch.fake_hardware.attached == []


def test_an_inference_run_on_ipus_counts_every_device_iteration(fake_sdk: Any) -> None:
    result = run(
        "fcnn",
        "graphcore",
        mode="inference",
        micro_batch_size=4,
        replicas=2,
        devices_per_replica=2,
        device_iterations=2,
        steps=2,
        warmup_steps=1,
        power_meter="none",
        workload_options=FCNN,
    )
    assert result.status.ok, result.status
    assert result.mode == "inference" and result.window_updates == 4 and result.window_samples == 4 * 4 * 2
    assert result.executor_details["pipeline_stages"] == 2  # forward stages only: no backward in inference
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "graphcore", mode="inference", devices_per_replica=2, power_meter="none", workload_options=FCNN)
    assert caught.value.field == "device_iterations"  # a 2-stage pipeline needs 2 device iterations


def test_the_fake_inference_model_wraps_a_shallow_copy(fake_sdk: Any) -> None:
    """As poptorch's inferenceModel: an eval() on the original after wrapping misses the copy."""
    poptorch = fake_sdk.poptorch
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    wrapped = poptorch.inferenceModel(model)
    model.eval()
    assert wrapped.model is not model and wrapped.model.training
    assert wrapped.model[0] is model[0]  # parameters and submodules are shared
