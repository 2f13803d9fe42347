"""The tensor-parallel plans of the BERT, ViT and GPT-2 families: each names modules of the model it
is for, divides the sizes it must, is refused where the degree does not divide them, and trains on
two CPU/gloo processes the same weights as one process (GPT-2's fused, transposed attention too)."""

from __future__ import annotations

import fnmatch
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from launching import torchrun_ranks

from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.contract.parallel import TensorParallelPlan
from core.contract.workload import TorchTrainingSpec, Workload
from core.executors.pytorch import TorchExecutor, TorchPlacement
from core.executors.tensor_styles import deinterleaved, interleaved

# Tiny models (the small variants: 2 layers, hidden 64, 2 heads, MLP 256) with short inputs.
FAMILIES: dict[str, dict[str, Any]] = {
    "bert-base": {"variant": "small", "sequence_length": 16, "synthetic_pool_samples": 32},
    "bert-base-squad": {"variant": "small", "sequence_length": 16, "synthetic_pool_samples": 32},
    "vit-l16": {"variant": "small", "num_classes": 10, "synthetic_pool_samples": 32},  # 32 px: 4 patches
    "gpt2-124m": {"variant": "small", "vocabulary": 96, "sequence_length": 16, "synthetic_pool_samples": 32},
}
UPDATES = 3
#: largest difference of a weight after the updates, relative to that weight's largest value (as
#: tests/test_parallelism.py: the all-reduce sums in another order, so fp32 rounding differs); measured
#: on torch 2.13, CPU: bert-base 1.9e-7, bert-base-squad 2.0e-7, vit-l16 2.6e-7, gpt2-124m 3.3e-7
TOLERANCE = 1e-5


def get_workload(name: str) -> Workload:
    from core.contract.manager import get_plugin_manager

    return get_plugin_manager().workload(name)


def training_spec(workload: str, seed: int = 0) -> TorchTrainingSpec:
    """The workload's spec with plain SGD (as test_parallelism: the comparison stays linear) and no
    dropout: one process and two draw their masks over tensors of other shapes."""
    chosen = get_workload(workload)
    spec = chosen.build_torch(chosen.parse_options(FAMILIES[workload]), seed=seed)
    spec.make_optimizer = lambda parameters: torch.optim.SGD(parameters, lr=0.5)
    for module in spec.model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return spec


def single_process_state(workload: str) -> dict[str, torch.Tensor]:
    config = make_config(
        workload=workload,
        accelerator="cpu",
        workload_options=FAMILIES[workload],
        micro_batch_size=8,
        gradient_accumulation=2,
    )
    executor = TorchExecutor(training_spec(workload), config, TorchPlacement(device="cpu"), SINGLE_PROCESS)
    for _ in range(UPDATES):
        executor.step()
    return executor.model_state()


WORKER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_tensor_parallel_plans import FAMILIES, training_spec
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    process = ProcessContext.from_environment()
    config = make_config(workload={workload!r}, accelerator="cpu", workload_options=FAMILIES[{workload!r}],
                         devices_per_replica=2, tensor_parallel=2, **{settings!r})
    executor = TorchExecutor(training_spec({workload!r}), config,
                             TorchPlacement(device="cpu", distributed_backend="gloo"), process)
    for _ in range({updates}):
        executor.step()
    executor.check_finite()
    state = executor.model_state()  # a collective: every rank gathers
    if process.rank == 0:
        torch.save(state, sys.argv[1])
        details = executor.details()
        torch.save({{"device_mesh": details["device_mesh"], "sharding": details["sharding"]}}, sys.argv[1] + ".details")
    executor.close()
""")


#: the scale a weight smaller than this is compared against: a few weights have a gradient of zero in
#: exact arithmetic (a key's bias, which the softmax over keys ignores; SQuAD's answer bias and the
#: last norm's bias before it, which the softmax over positions ignores), so they hold rounding noise
#: of 1e-11 to 1e-9 that is its own scale, and a norm's bias starts at zero
SMALLEST_SCALE = 1e-2


def largest_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest difference of a weight, relative to that weight's largest value (at least
    ``SMALLEST_SCALE``)."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / max(float(b[k].abs().max()), SMALLEST_SCALE)) for k in b)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "replicas", "sharding"),
    [(name, 1, "none") for name in sorted(FAMILIES)]
    # GPT-2's own styles under FSDP2 too: data 2 x tensor 2, four processes
    + [("gpt2-124m", 2, "fsdp")],
)
def test_tensor_parallel_two_equals_one_process(tmp_path: Path, workload: str, replicas: int, sharding: str) -> None:
    settings = {
        "replicas": replicas,
        "sharding": sharding,
        "micro_batch_size": 8 // replicas,
        "gradient_accumulation": 2,
    }
    script = tmp_path / "worker.py"
    script.write_text(
        WORKER.format(tests=str(Path(__file__).parent), workload=workload, settings=settings, updates=UPDATES)
    )
    out = tmp_path / "state.pt"
    completed = torchrun_ranks(script, out, tmp_path / "torchelastic", 2 * replicas)
    assert completed.returncode == 0, completed.stderr[-4000:]
    split = torch.load(out)
    assert torch.load(f"{out}.details") == {
        "device_mesh": {"data": replicas, "pipeline": 1, "tensor": 2},
        "sharding": sharding,
    }
    whole = single_process_state(workload)
    initial = training_spec(workload).model.state_dict()
    moved = max(float((whole[name] - initial[name]).abs().max()) for name in initial)
    assert moved > 1e-3  # the updates moved the weights far beyond the tolerance
    difference = largest_relative_difference(split, whole)
    print(f"{workload}: largest relative difference {difference:.2e}")
    assert difference < TOLERANCE


def plan_of(workload: str) -> TensorParallelPlan:
    chosen = get_workload(workload)
    plan = chosen.tensor_parallel_plan(chosen.parse_options(FAMILIES[workload]))
    assert plan is not None
    return plan


@pytest.mark.parametrize("workload", sorted(FAMILIES))
def test_each_pattern_names_modules_of_the_model_and_each_module_one_pattern(workload: str) -> None:
    plan = plan_of(workload)
    model = training_spec(workload).model
    names = [name for name, _ in model.named_modules()]
    layers = 2
    matched: list[str] = []
    for pattern, style in plan.styles.items():
        found = fnmatch.filter(names, pattern)
        assert len(found) == layers, (pattern, found)  # one module per layer
        matched += found
        for name in found:
            module = model.get_submodule(name)
            weight = module.weight
            out_dim = 1 if pattern in plan.transposed else 0
            # colwise splits the output features, whose count the degree must divide
            features = weight.shape[out_dim] if style == "colwise" else weight.shape[1 - out_dim]
            assert features in (64, 3 * 64, 256)  # the hidden width, q k v fused, or the MLP's
    assert len(matched) == len(set(matched))  # no module split twice
    for pattern, attributes in plan.head_count_attributes.items():
        found = fnmatch.filter(names, pattern)
        assert len(found) == layers
        for name in found:
            for attribute in attributes:
                assert isinstance(getattr(model.get_submodule(name), attribute), int)
    assert dict(plan.divided) == {"attention heads": 2, "MLP width": 256}


def test_gpt2_splits_its_fused_transposed_attention_part_by_part() -> None:
    plan = plan_of("gpt2-124m")
    attention = "model.transformer.h.*.attn.c_attn"
    assert plan.fused_parts == {attention: 3} and set(plan.transposed) == set(plan.styles)
    assert plan.head_count_attributes == {"model.transformer.h.*.attn": ("num_heads", "split_size")}


def test_interleaving_gives_each_device_its_heads_query_key_and_value() -> None:
    # [q | k | v] of 4 features each, 2 devices: device 0 holds q0 q1 k0 k1 v0 v1
    fused = torch.arange(12).reshape(1, 12)
    order = interleaved(fused, 1, parts=3, devices=2)
    assert order.tolist() == [[0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]]
    assert torch.equal(deinterleaved(order, 1, parts=3, devices=2), fused)


def test_a_fused_part_count_on_a_rowwise_module_is_refused() -> None:
    with pytest.raises(ValueError, match="fused_parts"):
        TensorParallelPlan(styles={"a": "rowwise"}, fused_parts={"a": 3})
    with pytest.raises(ValueError, match="transposed"):
        TensorParallelPlan(styles={"a": "colwise"}, transposed=("b",))


@pytest.mark.parametrize("workload", sorted(FAMILIES))
def test_a_degree_that_does_not_divide_the_heads_is_refused_naming_the_field(workload: str) -> None:
    from core.api import run_here
    from core.base.errors import ConfigError

    with pytest.raises(ConfigError) as refused:  # 2 heads over 4 devices
        run_here(
            workload,
            "cpu",
            workload_options=FAMILIES[workload],
            power_meter="none",
            micro_batch_size=4,
            devices_per_replica=4,
            tensor_parallel=4,
        )
    assert refused.value.field == "tensor_parallel"
    assert "2 attention heads" in str(refused.value)  # the shape's check comes first; the plan's agrees:
    assert plan_of(workload).indivisible(4) == ["attention heads 2"]
