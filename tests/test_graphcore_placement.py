"""Graphcore placement rules and batch arithmetic (pure: no SDK, no fake needed), and the split of a
model into pipeline stages."""

from __future__ import annotations

import pytest

from core import ConfigError
from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.contract.manager import get_plugin_manager
from core.machines import load_machine
from core.running.planning import plan_run
from core_plugins.graphcore.pipeline import balance, pipeline_layers, plan_stages, split_at
from core_plugins.graphcore.placement import (
    IpuPlacement,
    PoprunProcess,
    check_steps_per_execution,
    format_command,
    is_power_of_two,
    keras_steps_per_execution,
    next_power_of_two,
    plan_placement,
    poprun_command,
    tensorflow_ipus_per_instance,
)


def place(**overrides: object) -> IpuPlacement:
    settings: dict = dict(
        micro_batch_size=4, gradient_accumulation=1, replicas=1, ipus_per_replica=1, device_iterations=1, instances=1
    )
    settings.update(overrides)
    return plan_placement(**settings)  # type: ignore[arg-type]


# --- batch arithmetic: the ACES paper (PEARC '22), Table 3 ------------------------------------

# ResNet-50 in TensorFlow, mixed precision, one IPU per replica, gradient accumulation 24 (section
# 3.3.1). The paper's columns, in its own terms: BN_span, the IPUs over which batch-norm statistics
# are gathered ("distributing batch norm across 2 IPUs"); batch size, the micro-batch of one IPU;
# num-instances and num-replicas, poprun's; total IPUs.
ACES_TABLE_3 = [
    (1, 2, 1, 1, 1),
    (1, 4, 1, 1, 1),
    (1, 8, 1, 1, 1),
    (1, 14, 1, 1, 1),
    (1, 16, 1, 1, 1),
    (1, 18, 1, 1, 1),
    (1, 20, 1, 1, 1),
    (2, 20, 1, 2, 2),
    (2, 20, 2, 4, 4),
    (2, 20, 4, 8, 8),
    (2, 20, 8, 16, 16),
    (2, 20, 32, 64, 64),
]
ACES_GRADIENT_ACCUMULATION = 24


def aces_table_3_settings(bn_span: int, batch: int, instances: int, replicas: int) -> dict:
    """One Table 3 row as a core run of the TensorFlow path."""
    return {
        "framework": "tensorflow",
        "precision": "fp16",
        "micro_batch_size": batch,
        "gradient_accumulation": ACES_GRADIENT_ACCUMULATION,
        "replicas": replicas,
        "devices_per_replica": 1,
        "accelerator_options": {"instances": instances, "batch_norm_span": bn_span},
    }


@pytest.mark.parametrize("bn_span,batch,instances,replicas,total_ipus", ACES_TABLE_3)
def test_aces_table_3_rows(bn_span: int, batch: int, instances: int, replicas: int, total_ipus: int) -> None:
    from core.base.precision import BUILTIN_POLICIES
    from core_plugins.graphcore.accelerator import GraphcoreOptions
    from core_plugins.graphcore.tensorflow_settings import ipu_keras_settings

    placement = place(
        micro_batch_size=batch,
        gradient_accumulation=ACES_GRADIENT_ACCUMULATION,
        replicas=replicas,
        instances=instances,
        framework="tensorflow",
    )
    assert placement.total_ipus == total_ipus == placement.reserved_ipus  # powers of two: nothing idle
    assert placement.ipus_per_instance <= 64 and placement.notes() == []
    # "a total effective batch size of 20 x 24 or 480 per IPU for gradient updates"
    assert placement.samples_per_update == batch * ACES_GRADIENT_ACCUMULATION * total_ipus
    # BN_span counts IPUs, and each replica is one IPU: the span is a group of replicas, which must
    # divide them. "a micro-batch size of 40 for normalization purposes" is batch x BN_span.
    options = GraphcoreOptions(instances=instances, batch_norm_span=bn_span)
    config = make_config(
        workload="resnet50", accelerator="graphcore", **aces_table_3_settings(bn_span, batch, instances, replicas)
    )
    settings = ipu_keras_settings(config, options, placement, policy=BUILTIN_POLICIES[config.precision])
    assert settings.batch_norm_span * placement.ipus_per_replica == bn_span
    assert replicas % settings.batch_norm_span == 0
    assert batch * bn_span == (40 if bn_span == 2 else batch)


@pytest.mark.parametrize("bn_span,batch,instances,replicas,total_ipus", ACES_TABLE_3)
def test_aces_table_3_rows_validate_for_their_machines(
    bn_span: int, batch: int, instances: int, replicas: int, total_ipus: int
) -> None:
    # The paper's IPU-POD16 for up to 16 IPUs; the 64-IPU row needs an IPU-POD64.
    machine = load_machine("ipu-pod16" if total_ipus <= 16 else "ipu-pod64")
    plan = plan_run(
        get_plugin_manager(),
        "resnet50",
        "graphcore",
        aces_table_3_settings(bn_span, batch, instances, replicas),
        machine=machine,
    )
    summary = plan.accelerator.placement_summary(plan.context(SINGLE_PROCESS))
    assert summary["instances"] == instances and summary["total_ipus"] == total_ipus
    assert (plan.launcher is not None) == (instances > 1)
    assert not [w for w in plan.warnings if "NUMA" in w]  # never more instances than NUMA nodes
    if total_ipus > 16:
        with pytest.raises(ConfigError, match="at most 16 on 'ipu-pod16'"):
            plan_run(
                get_plugin_manager(),
                "resnet50",
                "graphcore",
                aces_table_3_settings(bn_span, batch, instances, replicas),
                machine=load_machine("ipu-pod16"),
            )


def test_aces_table_2_ipus_per_replica() -> None:
    # (model, IPUs per replica, replicas): EfficientNet-B0 2x2, EfficientNet-B4 4x4, MobileNet 1x4 and
    # 1x16, BERT-Base 4x1. Pipelined rows need GA >= 2 x stages - 1.
    for ipus_per_replica, replicas, total in [(2, 2, 4), (4, 4, 16), (1, 4, 4), (1, 16, 16), (4, 1, 4)]:
        placement = place(
            ipus_per_replica=ipus_per_replica, replicas=replicas, gradient_accumulation=2 * ipus_per_replica - 1
        )
        assert placement.total_ipus == total == placement.reserved_ipus


def test_samples_per_update_and_per_host_call() -> None:
    # graphcore/examples applications/tensorflow/cnns/training/README_Benchmarks.md: ResNet-50 on an
    # IPU-M2000, micro-batch 20 (mk2_resnet50_mlperf_pod16_bs20), GA 24, 4 replicas over 2 instances.
    placement = place(micro_batch_size=20, gradient_accumulation=24, replicas=4, instances=2, device_iterations=3)
    assert placement.samples_per_update == 20 * 4 * 24 == 1920  # the POD16 config's global batch (20x16x6)
    assert placement.samples_per_host_call == 1920 * 3
    assert placement.samples_per_instance_host_call == 20 * 2 * 24 * 3
    summary = placement.summary()
    assert summary["samples_per_update"] == 1920 and summary["samples_per_host_call"] == 5760


# --- powers of two ------------------------------------------------------------------------------


def test_power_of_two_helpers() -> None:
    assert [next_power_of_two(n) for n in (1, 2, 3, 4, 5, 9, 16, 17, 33)] == [1, 2, 4, 4, 8, 16, 16, 32, 64]
    assert [is_power_of_two(n) for n in (0, 1, 2, 3, 6, 8)] == [False, True, True, False, False, True]


def test_rounded_up_and_said_so() -> None:
    placement = place(replicas=3)
    assert placement.total_ipus == 3 and placement.reserved_ipus == 4 and placement.idle_ipus == 1
    assert "rounded up to a power of two" in placement.notes()[0]
    assert "reserves 4" in placement.notes()[0]
    # Per instance: 3 replicas x 2 IPUs on each of 2 instances reserve 8 each.
    placement = place(replicas=6, ipus_per_replica=2, gradient_accumulation=3, instances=2)
    assert placement.ipus_per_instance == 6 and placement.reserved_ipus == 16


# --- each invalid placement refused with its rule -----------------------------------------------

INVALID = [
    # (overrides, field, fragment of the rule)
    (dict(replicas=3, auto_round_num_ipus=False), "replicas", "not a power of two; PopTorch must reserve 4"),
    (
        dict(replicas=5, ipus_per_replica=3, gradient_accumulation=5, auto_round_num_ipus=False),
        "replicas",
        "15 IPUs per instance, not a power of two",
    ),
    (
        dict(ipus_per_replica=4, gradient_accumulation=6),
        "gradient_accumulation",
        "must be >= 2 x devices_per_replica - 1 = 7",
    ),
    (dict(ipus_per_replica=2, gradient_accumulation=2), "gradient_accumulation", ">= 2 x devices_per_replica - 1 = 3"),
    (dict(replicas=4, instances=3), "accelerator_options.instances", "must divide replicas (4)"),
    (dict(replicas=128), "replicas", "one process can reserve at most 64 IPUs"),
    (dict(replicas=32, ipus_per_replica=4, gradient_accumulation=7, instances=1), "replicas", "at most 64"),
    (dict(instances=0), "accelerator_options.instances", "must be >= 1"),
    (dict(training=False, gradient_accumulation=2), "gradient_accumulation", "must be 1"),
    (
        dict(training=False, ipus_per_replica=4, device_iterations=3),
        "device_iterations",
        "needs device_iterations >= 4",
    ),
    (dict(replicas=3, framework="tensorflow"), "replicas", "must be a power of two"),
    (
        dict(replicas=3, ipus_per_replica=3, gradient_accumulation=5, framework="tensorflow"),
        "replicas",
        "3 replica(s) x 4 IPU(s)",
    ),
]


@pytest.mark.parametrize("overrides,field,rule", INVALID, ids=[f"{c[1]}-{i}" for i, c in enumerate(INVALID)])
def test_invalid_placement_refused_with_its_rule(overrides: dict, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as caught:
        place(**overrides)
    assert caught.value.field == field
    assert rule in caught.value.allowed, caught.value.allowed


def test_valid_edges() -> None:
    assert place(ipus_per_replica=4, gradient_accumulation=7).pipeline_stages == 7
    assert place(training=False, ipus_per_replica=4, device_iterations=4).pipeline_stages == 4
    assert place(replicas=64).reserved_ipus == 64
    assert place(replicas=128, instances=2).reserved_ipus == 128  # 64 per process
    assert place(replicas=2, ipus_per_replica=3, gradient_accumulation=5, framework="tensorflow").replicas == 2


# --- TensorFlow: steps_per_execution -------------------------------------------------------------


def test_keras_steps_per_execution() -> None:
    placement = place(gradient_accumulation=6, device_iterations=5, replicas=4)
    assert keras_steps_per_execution(placement) == 30
    check_steps_per_execution(30, 6, 4)  # SDK >= 2.5: per replica, a multiple of GA
    with pytest.raises(ConfigError, match="multiple of gradient_accumulation = 6"):
        check_steps_per_execution(9, 6, 4)
    # Before SDK 2.5 steps counted over all replicas: a multiple of replicas x GA.
    check_steps_per_execution(48, 6, 4, per_replica=False)
    with pytest.raises(ConfigError, match=r"replicas x gradient_accumulation \(4 x 6\) = 24"):
        check_steps_per_execution(30, 6, 4, per_replica=False)
    assert tensorflow_ipus_per_instance(place(replicas=2, ipus_per_replica=3, gradient_accumulation=5)) == 8


# --- poprun ---------------------------------------------------------------------------------------


def test_poprun_command_for_instances() -> None:
    placement = place(micro_batch_size=20, gradient_accumulation=24, replicas=4, instances=2)
    command = poprun_command(
        placement,
        ["core", "run", "fcnn", "--accelerator", "graphcore", "--replicas", "4"],
        executable_cache_dir="/tmp/cache",
    )
    assert command[:9] == [
        "poprun",
        "--num-instances",
        "2",
        "--num-replicas",
        "4",
        "--ipus-per-replica",
        "1",
        "--numa-aware",
        "1",
    ]
    assert "--executable-cache-path=/tmp/cache" in command
    assert command[-7:] == ["core", "run", "fcnn", "--accelerator", "graphcore", "--replicas", "4"]
    hosts = poprun_command(
        place(replicas=64, instances=32), ["python3", "train.py"], hosts=["h1", "h2"], vipu_partition="p64"
    )
    assert format_command(hosts).startswith(
        "poprun --num-instances 32 --num-replicas 64 --ipus-per-replica 1 --numa-aware 1 --host h1,h2 "
        "--vipu-partition=p64 python3 train.py"
    )


def test_poprun_process_from_open_mpi_environment() -> None:
    assert PoprunProcess.from_environment({}) is None
    process = PoprunProcess.from_environment(
        {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    )
    assert process == PoprunProcess(instance_index=3, instances=4, local_index=1)


# --- pipeline stages ------------------------------------------------------------------------------


def test_balance_by_parameter_count_keeps_activations_with_their_layer() -> None:
    layers = [("0", 100), ("1", 0), ("2", 300), ("3", 0), ("4", 100), ("5", 0), ("6", 100), ("7", 0), ("8", 100)]
    plan = balance(layers, 3)
    assert [s.layers for s in plan.stages] == [("0", "1"), ("2", "3"), ("4", "5", "6", "7", "8")]
    assert [s.parameters for s in plan.stages] == [100, 300, 300]
    assert max(s.parameters for s in plan.stages) == 300  # no split does better than the 300 layer


def test_balance_minimises_the_largest_stage() -> None:
    layers = [(str(i), w) for i, w in enumerate([5, 1, 1, 1, 1, 1, 5])]
    plan = balance(layers, 3)
    assert [s.parameters for s in plan.stages] == [5, 5, 5]
    with pytest.raises(ConfigError, match="at most 7 stages"):
        balance(layers, 8)


def test_split_at_named_layers() -> None:
    layers = [(str(i), 10) for i in range(9)]
    plan = split_at(layers, ["2", "4", "6"], 4)
    assert [s.first_layer for s in plan.stages] == ["0", "2", "4", "6"] and plan.balanced_by == "split points"
    for bad, fragment in [
        (["2", "4"], r"need 3 split point\(s\)"),
        (["2", "x", "6"], "not a layer"),
        (["4", "2", "6"], "in model order"),
        (["0", "2", "4"], "after the first"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            split_at(layers, bad, 4)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
def test_every_layer_lands_in_exactly_one_stage(stages: int) -> None:
    from core.workloads.fcnn import Fcnn

    workload = Fcnn()
    model = workload.build_torch(workload.parse_options({"layers": 4, "hidden_width": 16, "input_width": 8}), 0).model
    plan = plan_stages(model, stages)
    names = [name for name, _ in pipeline_layers(model)]
    assigned = [layer for stage in plan.stages for layer in stage.layers]
    assert sorted(assigned) == sorted(names) and len(assigned) == len(set(assigned))
    assert [s.index for s in plan.stages] == list(range(stages))
    # Every parameter belongs to exactly one stage, and stages are contiguous in model order.
    modules = dict(model.named_modules())
    owners = {id(p): s.index for s in plan.stages for layer in s.layers for p in modules[layer].parameters()}
    assert len(owners) == len(list(model.parameters()))
    assert assigned == names
    assert sum(s.parameters for s in plan.stages) == sum(p.numel() for p in model.parameters())


def test_pipeline_layers_look_through_single_child_wrappers() -> None:
    import torch

    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    wrapper = torch.nn.Module()
    wrapper.body = inner
    assert [name for name, _ in pipeline_layers(wrapper)] == ["body.0", "body.1", "body.2"]
