"""A replica over several devices planned before a machine is booked (issue 32): the workloads'
transformer shapes, CARAML's GPT sizes counted exactly, the rules of a split (each refusal naming its
field) and each device's memory, activations included (Korthikanti et al. 2022)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from core.base.config import make_config
from core.base.errors import ConfigError
from core.cli import main
from core.contract.manager import get_plugin_manager
from core.contract.shape import TransformerShape
from core.machines import load_machine
from core.running.planning import RunPlan, plan_run
from core.running.replica_plan import layer_activation_bytes, micro_batches_in_flight, replica_memory, split_layers
from core.sweep import load_sweep, plan_sweep

ROOT = Path(__file__).resolve().parent.parent
GIB = 1024**3
#: CARAML's 13B as its seed file places it: TP2 PP2 on the 4 GPUs of each of 44 nodes
CARAML_13B = {
    "nodes": 44,
    "replicas": 44,
    "devices_per_replica": 4,
    "tensor_parallel": 2,
    "micro_batch_size": 2,
    "gradient_accumulation": 64,
    "precision": "fp16",
    "recompute": "selective",
    "sharding": "fsdp",
}
CARAML_175B = {
    "nodes": 16,
    "replicas": 1,
    "devices_per_replica": 64,
    "tensor_parallel": 8,
    "micro_batch_size": 2,
    "gradient_accumulation": 64,
    "precision": "bf16",
    "recompute": "selective",
}


def plan(workload: str, machine: str, **options: Any) -> RunPlan:
    return plan_run(get_plugin_manager(), workload, "nvidia", dict(options), machine=load_machine(machine))


def megatron_gpt_parameters(layers: int, hidden: int, vocabulary: int) -> int:
    """Narayanan et al. 2021 (Megatron-LM), section 5.1: 12lh^2 (1 + 13/(12h) + (V + s)/(12lh)), with
    rotary positions (no position table: no s term), plus the final layer norm's 2h that it leaves out."""
    return 12 * layers * hidden**2 + 13 * layers * hidden + vocabulary * hidden + 2 * hidden


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads", "count"),
    [
        ("gpt-800m", 16, 2048, 8, 908_759_040),
        ("gpt-13b", 40, 5120, 32, 12_843_141_120),
        ("gpt-175b", 96, 12288, 96, 174_579_671_040),
    ],
)
def test_carramls_gpts_have_megatrons_exact_parameter_counts_from_their_shape(
    name: str, layers: int, hidden: int, heads: int, count: int
) -> None:
    workload = get_plugin_manager().workload(name)
    options = workload.parse_options({})
    shape = workload.transformer_shape(options)
    assert shape == TransformerShape(layers, hidden, heads, 2048, 4 * hidden, 50304, fused_attention=True)
    assert workload.parameter_count(options) == count == megatron_gpt_parameters(layers, hidden, 50304)
    # what lies outside the layers: the tied token embeddings and the final norm
    assert count - layers * shape.layer_parameters() == 50304 * hidden + 2 * hidden


@pytest.mark.parametrize("name", ["gpt-800m", "gpt-13b", "gpt2-124m", "bert-base", "bert-base-squad", "vit-l32"])
def test_a_shape_is_what_the_built_model_has(name: str) -> None:
    """The small variant built on the meta device: its layers, widths, a layer's parameters and the
    fused attention kernel the shape claims (the 13B and 175B share the 800M's code; never built whole)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    workload = get_plugin_manager().workload(name)
    options = workload.parse_options({"variant": "small"})
    shape = workload.transformer_shape(options)
    with torch.device("meta"):
        model = workload.torch_model(options)
    config = model.model.config
    assert (shape.layers, shape.hidden, shape.attention_heads, shape.intermediate) == (
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        getattr(config, "n_inner", None) or config.intermediate_size,  # GPT-2's configuration names it n_inner
    )
    assert shape.fused_attention == (config._attn_implementation == "sdpa")
    modules = dict(model.named_modules())
    layers = [name for name in modules if re.search(r"\.(h|layer|layers)\.\d+$", name)]
    assert len(layers) == shape.layers
    assert sum(p.numel() for p in modules[layers[0]].parameters()) == shape.layer_parameters()


def test_the_activation_formulas_are_korthikantis() -> None:
    s, b, h, a = 2048, 2, 12288, 96
    shape = TransformerShape(96, h, a, s, 4 * h, 50304)
    sbh = s * b * h
    assert layer_activation_bytes(shape, b, 1, "none", 2) == sbh * (34 + 5 * a * s / h)
    assert layer_activation_bytes(shape, b, 8, "none", 2) == pytest.approx(sbh * (34 / 8 + 5 * a * s / (h * 8)))
    assert layer_activation_bytes(shape, b, 8, "selective", 2) == pytest.approx(34 * sbh / 8)
    assert layer_activation_bytes(shape, b, 8, "full", 2) == pytest.approx(2 * sbh / 8)
    assert layer_activation_bytes(shape, b, 8, "selective", 4) == pytest.approx(2 * 34 * sbh / 8)  # fp32
    fused = TransformerShape(96, h, a, s, 4 * h, 50304, fused_attention=True)
    assert layer_activation_bytes(fused, b, 8, "none", 2) == layer_activation_bytes(shape, b, 8, "selective", 2)
    # Table 2's rows without sequence parallelism: the norms', dropouts' and residuals' 10sbh whole
    assert layer_activation_bytes(shape, b, 8, "none", 2, sequence_parallel=False) == pytest.approx(
        sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    )
    assert layer_activation_bytes(shape, b, 8, "full", 2, sequence_parallel=False) == pytest.approx(2 * sbh)
    assert layer_activation_bytes(shape, b, 1, "none", 2, sequence_parallel=False) == pytest.approx(
        layer_activation_bytes(shape, b, 1, "none", 2)
    )


def test_a_tensor_plan_without_sequence_parallelism_is_planned_with_whole_activations_between_layers() -> None:
    from core.running.planning import memory_estimate
    from core.workloads.language import GptCaraml13b, GptOptions

    workload, options = GptCaraml13b(), GptOptions()
    config = make_config(
        workload="gpt-13b", accelerator="nvidia", devices_per_replica=2, tensor_parallel=2, micro_batch_size=1
    )
    split = memory_estimate(workload, options, config)
    plan = workload.tensor_parallel_plan(options)
    assert split is not None and plan.sequence_parallel is not None
    workload.tensor_parallel_plan = lambda _: dataclasses.replace(plan, sequence_parallel=None)  # type: ignore[method-assign]
    whole = memory_estimate(workload, options, config)
    assert whole is not None and whole.activation_bytes is not None and split.activation_bytes is not None
    shape = workload.transformer_shape(options)
    assert shape is not None
    # 10 + 24/2 against 34/2 per sbh: 5 sbh more per layer, at 4 bytes (fp32 activations)
    extra = whole.activation_bytes - split.activation_bytes
    assert extra == pytest.approx(shape.layers * 5 * shape.sequence * shape.hidden * 2, rel=1e-6)


def test_a_pipelines_first_stage_holds_the_most_micro_batches_under_1f1b() -> None:
    config = make_config(workload="gpt-175b", accelerator="nvidia", devices_per_replica=64, tensor_parallel=8)
    config = config.model_copy(update={"gradient_accumulation": 64, "micro_batch_size": 2})
    assert [micro_batches_in_flight(config, stage) for stage in range(8)] == [8, 7, 6, 5, 4, 3, 2, 1]
    gpipe = config.model_copy(update={"pipeline_schedule": "gpipe"})
    assert micro_batches_in_flight(gpipe, 7) == 64
    assert split_layers(40, 3) == (13, 13, 14) and split_layers(96, 8) == (12,) * 8


def test_sharding_divides_the_model_state_over_the_data_replicas() -> None:
    shape = TransformerShape(40, 5120, 32, 2048, 20480, 50304, fused_attention=True)
    base = make_config(workload="gpt-13b", accelerator="nvidia", replicas=44, micro_batch_size=2)
    plain = replica_memory(12_843_141_120, shape, base, 2, 2)
    sharded = replica_memory(12_843_141_120, shape, base.model_copy(update={"sharding": "fsdp"}), 2, 2)
    offloaded = replica_memory(12_843_141_120, shape, base.model_copy(update={"sharding": "fsdp-offload"}), 2, 2)
    assert plain.weights_bytes == 4 * 12_843_141_120 and plain.optimizer_state_bytes == 2 * 4 * 12_843_141_120
    gathered = 2 * (4 * 5120**2 + 2 * 5120 * 20480 + 3 * 5120 + 20480 + 6 * 5120)  # two whole layers
    assert sharded.optimizer_state_bytes == int(12_843_141_120 / 44 * 8)
    assert sharded.weights_bytes == int((12_843_141_120 / 44 + gathered) * 4)
    assert offloaded.weights_bytes == int(gathered * 4) and offloaded.optimizer_state_bytes == 0
    assert plain.activations_by_recompute == sharded.activations_by_recompute


@pytest.mark.parametrize(
    ("workload", "options", "field"),
    [
        # 32 heads: tensor parallelism 3 cannot hold whole heads
        ("gpt-13b", {"devices_per_replica": 3, "tensor_parallel": 3}, "tensor_parallel"),
        # 44 pipeline stages for 40 layers
        ("gpt-13b", {"devices_per_replica": 44, "nodes": 11, "gradient_accumulation": 64}, "devices_per_replica"),
        # 2 stages need 2 micro-batches in flight
        (
            "gpt-13b",
            {"devices_per_replica": 4, "tensor_parallel": 2, "gradient_accumulation": 1},
            "gradient_accumulation",
        ),
        # 8 devices of one replica on one node of 4
        ("gpt-13b", {"devices_per_replica": 8, "tensor_parallel": 2, "gradient_accumulation": 8}, "nodes"),
        # a model without a transformer shape has no known tensor-parallel split
        ("resnet50", {"devices_per_replica": 2, "tensor_parallel": 2}, "tensor_parallel"),
        # 13B on four A100 40GB without sharding: its weights, gradients and Adam's state alone exceed them
        ("gpt-13b", {**CARAML_13B, "sharding": "none"}, "sharding"),
        # 175B at micro-batch 8: the activations of 8 micro-batches do not fit unless each layer is recomputed
        ("gpt-175b", {**CARAML_175B, "micro_batch_size": 8}, "recompute"),
    ],
)
def test_a_split_the_model_or_machine_cannot_take_is_refused_naming_its_field(
    workload: str, options: dict[str, Any], field: str
) -> None:
    machine = "h100-sxm-x4" if workload == "gpt-175b" else "a100-40gb-x4"
    with pytest.raises(ConfigError) as refused:
        plan(workload, machine, **options)
    assert refused.value.field == field, str(refused.value)


def test_the_memory_refusal_says_what_would_fit() -> None:
    with pytest.raises(ConfigError) as refused:
        plan("gpt-175b", "h100-sxm-x4", **{**CARAML_175B, "micro_batch_size": 8})
    assert refused.value.value == "selective" and refused.value.allowed.startswith("'full' (which fits")
    assert "activations" in refused.value.allowed and "94.0 GiB per device" in refused.value.allowed


def test_an_uneven_pipeline_split_is_said() -> None:
    uneven = plan(
        "gpt-13b",
        "a100-40gb-x4",
        **{**CARAML_13B, "nodes": 33, "replicas": 11, "devices_per_replica": 12, "tensor_parallel": 4},
    )
    assert any("13, 13, 14 layers" in warning for warning in uneven.warnings), uneven.warnings


def test_caramls_13b_and_175b_fit_their_machines_and_not_without_recomputation_or_sharding() -> None:
    from core.running.planning import memory_estimate

    for workload, machine, options in (
        ("gpt-13b", "a100-40gb-x4", CARAML_13B),
        ("gpt-175b", "h100-sxm-x4", CARAML_175B),
    ):
        planned = plan(workload, machine, **options)
        profile = load_machine(machine)
        estimate = memory_estimate(
            planned.workload, planned.workload_options, planned.config, planned.precision_policy, profile
        )
        assert estimate is not None and estimate.activation_bytes is not None
        assert estimate.total_bytes <= profile.memory_bytes_per_device  # type: ignore[operator]
        assert estimate.stage == 0  # the first stage: the embeddings and the most micro-batches in flight
    assert estimate.micro_batches_in_flight == 8 and estimate.layers_per_stage == (12,) * 8
    # 175B: 10.4 GiB of fp32 weights on its first stage's devices (12 layers and the embeddings over 8)
    assert estimate.weights_bytes / GIB == pytest.approx(10.42, abs=0.01)


def test_a_dry_run_prints_the_memory_table_for_the_caraml_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("caraml-gpt-13b-a100", "caraml-gpt-175b-h100", "caraml-gpt-nvidia"):
        assert main(["sweep", str(ROOT / "examples" / "seeds" / f"{name}.toml"), "--dry-run"]) == 0
        shown = capsys.readouterr().out
        assert "heaviest device of" in shown and "activations by recompute: none" in shown, shown
    assert "44 replicas x 4 devices: tensor parallel 2 x 2 pipeline stages" not in shown  # the 800M's is its own
    assert "4 replicas x 1 device: tensor parallel 1 x 1 pipeline stage" in shown
    run = ["run", "gpt-175b", "--accelerator", "nvidia", "--machine", "h100-sxm-x4", "--dry-run", "--json"]
    flags = ["--nodes", "16", "--devices-per-replica", "64", "--tensor-parallel", "8", "--batch-size", "2"]
    assert main([*run, *flags, "--gradient-accumulation", "64", "--recompute", "selective"]) == 0
    described = json.loads(capsys.readouterr().out)
    memory = described["memory_per_device"]
    assert described["placement"]["pipeline_stages"] == 8 and described["placement"]["tensor_parallel"] == 8
    assert memory["layers_per_stage"] == [12] * 8 and memory["micro_batches_in_flight"] == 8
    assert set(memory["total_gib_by_recompute"]) == {"none", "selective", "full"}
    assert memory["total_gib"] < memory["device_memory_gib"] == 94.0


def test_a_toy_of_a_split_replica_stays_a_toy() -> None:
    for name in ("caraml-gpt-13b-a100", "caraml-gpt-175b-h100"):
        (cell,) = plan_sweep(load_sweep(ROOT / "examples" / "seeds" / f"{name}.toml"), toy=True).cells
        assert cell.valid, cell.invalid_reason
        config = cell.config
        assert config is not None and (config.devices_per_replica, config.tensor_parallel, config.nodes) == (1, 1, 1)
        assert (config.sharding, config.recompute, config.pipeline_schedule) == ("none", "none", None)
        assert config.workload_options["variant"] == "small"


def test_a_run_here_recomputes_only_a_model_with_a_layer_stack() -> None:
    # Planning for this host (no machine profile): core's executor recomputes a transformer's layers
    # (core.executors.recompute); a model that names none is refused before running.
    planned = plan_run(
        get_plugin_manager(), "gpt-800m", "cpu", {"recompute": "selective", "workload_options": {"variant": "small"}}
    )
    assert planned.config.recompute == "selective"
    with pytest.raises(ConfigError) as refused:
        plan_run(get_plugin_manager(), "fcnn", "cpu", {"recompute": "selective"})
    assert refused.value.field == "recompute"


def narayanan_training_flops_per_sample(layers: int, hidden: int, sequence: int, vocabulary: int, factor: int) -> float:
    """Narayanan et al. 2021, equation 3, per sequence: 24 x factor x s l h^2 (1 + s/(6h)) and the
    output layer's 6 s h V, counted three times (forward, two backward) whatever the recomputation."""
    return (
        24 * factor * sequence * layers * hidden**2 * (1 + sequence / (6 * hidden)) + 6 * sequence * hidden * vocabulary
    )


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_hfu_counts_the_recomputed_forward_and_mfu_the_models_flops(recompute: str) -> None:
    from core.base.results import DeviceRecord, RunResult
    from core.running.runner import _record_device_figures

    options = {**CARAML_175B, "recompute": recompute}
    planned = plan("gpt-175b", "h100-sxm-x4", **options)
    model_flops = planned.workload.flops_per_sample(planned.workload_options)
    assert model_flops == pytest.approx(narayanan_training_flops_per_sample(96, 12288, 2048, 50304, 3))

    class Datasheet:
        """Every device at 1 PFLOP/s, no bandwidth known."""

        def peak_flops_per_second(self, device: DeviceRecord, precision: object) -> tuple[float, str]:
            return 1e15, "test datasheet"

        def memory_bandwidth(self, device: DeviceRecord) -> None:
            return None

    stub = dataclasses.replace(planned, accelerator=Datasheet(), machine=None)  # type: ignore[arg-type]
    devices = [DeviceRecord(index=index, name=f"gpu {index}", kind="nvidia") for index in range(64)]
    result = RunResult.of_config(
        planned.config, 64, devices=devices, flops_per_sample=model_flops, throughput_per_second=100.0
    )
    _record_device_figures(result, stub)
    assert result.model_flops_utilization == pytest.approx(model_flops * 100.0 / 64e15)
    if recompute == "none":
        assert result.hardware_flops_per_sample is None and result.hardware_flops_utilization is None
        return
    assert result.hardware_flops_per_sample is not None and result.hardware_flops_utilization is not None
    assert result.hardware_flops_utilization == pytest.approx(result.hardware_flops_per_sample * 100.0 / 64e15)
    assert result.hardware_flops_utilization > result.model_flops_utilization
    if recompute == "full":  # Megatron's TFLOPs/GPU: equation 3 with its factor 4
        expected = narayanan_training_flops_per_sample(96, 12288, 2048, 50304, 4)
        assert result.hardware_flops_per_sample == pytest.approx(expected)
    else:  # the attention scores and weighted values of every layer, once more: 4 s^2 h per layer
        assert result.hardware_flops_per_sample - model_flops == pytest.approx(96 * 4 * 2048**2 * 12288)
