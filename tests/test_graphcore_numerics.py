"""Mixed precision and the memory knobs on the PopTorch path, as Graphcore's configurations set them:
fp16 weights and activations with float32 optimizer state, automatic or static loss scaling,
stochastic rounding, partials type, available memory proportion and recomputation; options that
mean nothing for a run are refused while planning."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from core import ConfigError
from core.base.distributed import SINGLE_PROCESS
from core.contract.manager import get_plugin_manager
from core.machines import load_machine
from core.running.planning import plan_run
from core_plugins.graphcore.executor import poptorch_optimizer
from core_plugins.graphcore.options import OptionSettings
from core_plugins.graphcore.precision import PopTorchFp16Policy

pytestmark = pytest.mark.usefixtures("fake_sdk")

FCNN = {"layers": 4, "hidden_width": 16, "input_width": 8, "output_width": 4, "synthetic_pool_samples": 64}


def build(**settings: Any) -> Any:
    settings = {"workload_options": FCNN, "power_meter": "none", "micro_batch_size": 4, **settings}
    plan = plan_run(get_plugin_manager(), "fcnn", "graphcore", settings)
    return plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS))


def calls(executor: Any, name: str) -> list[tuple]:
    return [args for called, args in executor.options.calls if called == name]


def test_fp16_training_defaults_as_graphcore_runs_it(fake_sdk: Any) -> None:
    executor = build(precision="fp16", gradient_accumulation=2)
    try:
        assert calls(executor, "Training.setAutomaticLossScaling") == [(True,)]
        assert calls(executor, "Precision.enableStochasticRounding") == [(True,)]
        assert calls(executor, "Precision.setPartialsType") == []  # PopTorch's default: float partials
        assert {p.dtype for p in executor._user_model.parameters()} == {torch.float16}
        assert isinstance(executor.training_model._optimizer, torch.optim.SGD)  # PopTorch keeps its state fp32
        assert executor.details()["numerics"] == {
            "weights": "float16",
            "activations": "float16",
            "partials": "float",
            "available_memory_proportion": None,
            "optimizer_state": "float32",
            "loss_scaling": "automatic",
            "stochastic_rounding": True,
            "recomputation": False,
        }
        executor.step()
    finally:
        executor.close()


def test_static_loss_scale_partials_memory_and_recomputation_reach_poptorch(fake_sdk: Any) -> None:
    # Graphcore's EfficientNet configuration: loss_scaling 128, half_partial, available memory 0.15.
    poptorch = fake_sdk.poptorch
    executor = build(
        precision="fp16",
        devices_per_replica=2,
        gradient_accumulation=4,
        accelerator_options={
            "loss_scaling": 128.0,
            "partials_type": "half",
            "available_memory_proportion": 0.15,
            "recomputation": True,
        },
    )
    try:
        assert calls(executor, "Training.setAutomaticLossScaling") == []
        assert calls(executor, "Precision.setPartialsType") == [(torch.half,)]
        assert executor.options._popart.options["partialsTypeMatMuls"] == "half"
        assert calls(executor, "setAvailableMemoryProportion") == [({"IPU0": 0.15, "IPU1": 0.15},)]
        assert executor.options.available_memory_proportion == {0: 0.15, 1: 0.15}
        assert executor.options._popart.options["autoRecomputation"] == 3  # RecomputationType.Pipeline
        optimizer = executor.training_model._optimizer
        assert isinstance(optimizer, poptorch.optim.SGD) and optimizer.loss_scaling == 128.0
        assert optimizer.accum_type == optimizer.velocity_accum_type == torch.float32
        assert optimizer.defaults["lr"] == 0.01 and optimizer.defaults["momentum"] == 0.9  # the workload's
        assert executor.details()["numerics"]["loss_scaling"] == 128.0
        executor.step()
        executor.check_finite()
    finally:
        executor.close()


def test_recomputation_on_one_ipu_is_popart_standard(fake_sdk: Any) -> None:
    executor = build(accelerator_options={"recomputation": True})
    try:
        assert executor.options._popart.options["autoRecomputation"] == 1
    finally:
        executor.close()


def test_cores_full_recomputation_is_the_ipus_own(fake_sdk: Any) -> None:
    # recompute = "full" means what the plugin's recomputation does: PopART's recomputation, per
    # pipeline stage from its stashed input (Pipeline) or on one IPU (Standard)
    pipelined = build(recompute="full", devices_per_replica=2, gradient_accumulation=4)
    try:
        assert pipelined.options._popart.options["autoRecomputation"] == 3
    finally:
        pipelined.close()
    single = build(recompute="full")
    try:
        assert single.options._popart.options["autoRecomputation"] == 1
    finally:
        single.close()
    plain = build()
    try:
        assert plain.options._popart.options.get("autoRecomputation") in (None, 0)
    finally:
        plain.close()


def test_adamw_keeps_its_hyperparameters_as_poptorchs_own(fake_sdk: Any) -> None:
    weights = [torch.nn.Parameter(torch.zeros(3))]
    torch_adamw = torch.optim.AdamW(weights, lr=6e-5, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01)
    settings = OptionSettings(seed=0, precision=PopTorchFp16Policy, loss_scaling=64.0)
    converted = poptorch_optimizer(fake_sdk.poptorch, torch_adamw, settings)
    assert isinstance(converted, fake_sdk.poptorch.optim.AdamW) and converted.loss_scaling == 64.0
    assert converted.defaults["betas"] == (0.8, 0.95) and converted.defaults["weight_decay"] == 0.01
    assert converted.first_order_momentum_accum_type == converted.second_order_momentum_accum_type == torch.float32
    assert converted.param_groups[0]["params"] == weights
    # Without a static scale the torch optimizer goes to PopTorch as it is.
    half = OptionSettings(seed=0, precision=PopTorchFp16Policy)
    assert poptorch_optimizer(fake_sdk.poptorch, torch_adamw, half) is torch_adamw


@pytest.mark.parametrize(
    "settings,field",
    [
        ({"accelerator_options": {"loss_scaling": 128.0}}, "accelerator_options.loss_scaling"),  # fp32
        (
            {"mode": "inference", "precision": "fp16", "accelerator_options": {"loss_scaling": 128.0}},
            "accelerator_options.loss_scaling",
        ),
        ({"mode": "inference", "accelerator_options": {"recomputation": True}}, "accelerator_options.recomputation"),
        (
            {"accelerator_options": {"available_memory_proportion": 1.5}},
            "accelerator_options.available_memory_proportion",
        ),
        ({"accelerator_options": {"partials_type": "bf16"}}, "accelerator_options.partials_type"),
        ({"accelerator_options": {"recomputation": 1}}, "accelerator_options.recomputation"),  # no int for a bool
        ({"recompute": "selective"}, "recompute"),  # Megatron's selective has no PopART counterpart
        ({"mode": "inference", "recompute": "full"}, "recompute"),
        ({"tensor_parallel": 2, "devices_per_replica": 2}, "tensor_parallel"),
    ],
)
def test_options_that_mean_nothing_here_are_refused_naming_the_field(settings: dict, field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        plan_run(get_plugin_manager(), "fcnn", "graphcore", {"workload_options": FCNN, **settings})
    assert refused.value.field == field


def test_aces_table_2_efficientnet_b4_as_graphcore_configures_it_plans_for_an_ipu_pod16() -> None:
    # graphcore/examples vision/cnns/pytorch/train/configs.yml efficientnet-b4-g16-gn-pod16 up to the SDK
    # 2.6 release (09b7c67; later ones run it on 2 IPUs): the G16-GN model, 4 replicas of 4 IPUs,
    # micro-batch 6, gradient accumulation 32, device iterations 4, precision 16.32 (fp16 compute), half
    # partials, available memory 0.15, loss scaling 128; the published pipeline split by default.
    plan = plan_run(
        get_plugin_manager(),
        "efficientnet-b4-g16-gn",
        "graphcore",
        {
            "precision": "fp16",
            "replicas": 4,
            "devices_per_replica": 4,
            "micro_batch_size": 6,
            "gradient_accumulation": 32,
            "device_iterations": 4,
            "accelerator_options": {
                "partials_type": "half",
                "available_memory_proportion": 0.15,
                "loss_scaling": 128.0,
            },
        },
        machine=load_machine("ipu-pod16"),
    )
    assert plan.config.samples_per_update == 6 * 32 * 4
    assert plan.pipeline_layout is not None and plan.pipeline_layout.recommended[4].split_points[0].endswith("blocks.3")
