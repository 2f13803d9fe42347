"""Activation recomputation (``recompute``) in core's PyTorch executor: the same weights as without it,
fewer activations kept for the backward, the recomputation really run, on one process and on the
device mesh; and the run's result and report carry HFU beside MFU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from launching import ROOT
from test_parallelism import OPTIONS, TOLERANCE, UPDATES, largest_relative_difference, run_split, sgd
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.base.errors import ConfigError
from core.executors.pytorch import TorchExecutor, TorchPlacement
from core.executors.recompute import RecomputeCounts, apply_recompute
from core.workloads.language import GptCaraml800m, GptOptions

CHOICES = ("none", "selective", "full")
#: the tiny GPT's micro-batch in these tests
MICRO_BATCH = 8


def trained(recompute: str, optimizer: str = "sgd") -> tuple[dict[str, torch.Tensor], RecomputeCounts | None]:
    """The tiny GPT's weights after ``UPDATES`` updates of two micro-steps, and what recomputation ran."""
    config = make_config(
        workload="gpt-800m",
        accelerator="cpu",
        workload_options=OPTIONS,
        micro_batch_size=MICRO_BATCH,
        gradient_accumulation=2,
        recompute=recompute,
    )
    spec = GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0)
    if optimizer == "sgd":
        spec = sgd(spec)
    executor = TorchExecutor(spec, config, TorchPlacement(device="cpu"), SINGLE_PROCESS)
    for _ in range(UPDATES):
        executor.step()
    executor.check_finite()
    return executor.model_state(), executor.recompute_counts


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_trains_the_same_weights(recompute: str, optimizer: str) -> None:
    # The recomputed forward runs the same kernels on the same inputs (dropout's generator state is
    # restored by the checkpoint): the gradients are the same bits, so the weights are, exactly.
    plain, _ = trained("none", optimizer)
    recomputed, counts = trained(recompute, optimizer)
    initial = GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0).model.state_dict()
    assert max(float((plain[name] - initial[name]).abs().max()) for name in initial) > 1e-4  # they moved
    assert largest_relative_difference(recomputed, plain) == 0.0
    assert counts is not None and counts.layers == 2


class ActivationsKept(TorchDispatchMode):
    """Every storage an op creates in the forward, by weak reference: those still alive once the
    forward has returned (and the loss is computed) are what autograd and the checkpoints keep for
    the backward, whatever holds them (saved tensors, a checkpoint's inputs, a cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                self.created.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return out

    def alive_bytes(self, model: torch.nn.Module) -> int:
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # views of weights (w.t())
        alive = {address: size for ref, address, size in self.created if not ref.expired() and address not in weights}
        return sum(alive.values())


def kept_and_counted(recompute: str) -> tuple[int, int, int, RecomputeCounts | None]:
    """Bytes of activations one training forward of the tiny GPT keeps for its backward; the calls of
    the layers' linear layers and the attention kernel's runs, in forward and backward together."""
    workload, options = GptCaraml800m(), GptOptions(**OPTIONS)
    spec = workload.build_torch(options, seed=0)
    layout = workload.pipeline_layout(options)
    assert layout is not None
    counts = apply_recompute(spec.model, layout, recompute)
    linear_calls = [0]
    attention_kernels = [0]
    for name in layout.blocks:
        for module in spec.model.get_submodule(name).modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(lambda *_: linear_calls.__setitem__(0, linear_calls[0] + 1))

    class AttentionKernels(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if "scaled_dot_product" in func.__name__ and "backward" not in func.__name__:
                attention_kernels[0] += 1
            return func(*args, **(kwargs or {}))

    tokens = spec.inputs[:MICRO_BATCH]
    kept = ActivationsKept()
    with AttentionKernels():
        with kept:
            logits = spec.model(tokens)
        loss = spec.loss_fn(logits, tokens)
        alive = kept.alive_bytes(spec.model)
        loss.backward()
    return alive, linear_calls[0], attention_kernels[0], counts


def test_recomputation_keeps_fewer_activations_and_runs_the_forward_again() -> None:
    measured = {recompute: kept_and_counted(recompute) for recompute in CHOICES}
    kept = {recompute: figures[0] for recompute, figures in measured.items()}
    # full: only each layer's input (and what lies outside the layers: embeddings, norm, logits)
    assert kept["full"] < kept["selective"] < kept["none"], kept
    # selective drops at least each layer's attention output the fused kernel keeps (b s h fp32 values)
    hidden = GptCaraml800m().dimensions(GptOptions(**OPTIONS))[0]
    layers = 2
    assert kept["none"] - kept["selective"] >= layers * MICRO_BATCH * OPTIONS["sequence_length"] * hidden * 4
    # full keeps less than half (measured 0.14 of "none" on this GPT, logits included; selective 0.95)
    assert kept["full"] < kept["none"] / 2
    # the four linear layers of each layer run once, and once more in the backward under "full" only
    # (selective keeps their outputs)
    assert [measured[r][1] for r in CHOICES] == [4 * layers, 4 * layers, 8 * layers]
    # the attention kernel: once per layer, and once more in the backward under "selective" and "full"
    assert [measured[r][2] for r in CHOICES] == [layers, 2 * layers, 2 * layers]
    selective_counts = measured["selective"][3]
    assert selective_counts is not None
    assert (selective_counts.attention_calls, selective_counts.attention_runs) == (layers, 2 * layers)
    assert measured["none"][3] is None


def test_selective_refuses_a_layer_that_makes_no_fused_attention_call() -> None:
    # An eager attention (matmul, softmax, matmul) would be recomputed by nothing: refused, not ignored.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    from core.contract.pipeline import PipelineLayout

    apply_recompute(model, PipelineLayout(blocks=("0", "1"), unit="layer", repeated_layers=True), "selective")
    with pytest.raises(ConfigError) as refused:
        model(torch.ones(2, 4, requires_grad=True))
    assert refused.value.field == "recompute" and "'0'" in str(refused.value)
    with torch.no_grad():  # nothing kept for a backward, nothing to recompute: no refusal
        model(torch.ones(2, 4))


@pytest.mark.parametrize(
    ("workload", "options"),
    [
        ("fcnn", {"recompute": "full"}),  # no named layers
        ("resnet50", {"recompute": "full", "workload_options": {"variant": "small"}}),  # blocks, not a stack
        ("vit-l32", {"recompute": "selective", "workload_options": {"variant": "small"}}),  # no layers named
        ("gpt-800m", {"recompute": "full", "mode": "inference", "workload_options": OPTIONS}),
    ],
)
def test_recompute_without_a_layer_stack_is_refused_before_running(workload: str, options: dict[str, Any]) -> None:
    from core.api import run_here

    with pytest.raises(ConfigError) as refused:
        run_here(workload, "cpu", power_meter="none", **options)
    assert refused.value.field == "recompute"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recompute", "split"),
    [
        ("full", {"replicas": 2, "sharding": "fsdp", "micro_batch_size": 4, "gradient_accumulation": 2}),
        (
            "selective",
            {"devices_per_replica": 2, "tensor_parallel": 2, "micro_batch_size": 8, "gradient_accumulation": 2},
        ),
        ("full", {"devices_per_replica": 2, "micro_batch_size": 4, "gradient_accumulation": 4}),  # pipeline stages
    ],
)
def test_recomputation_on_the_mesh_equals_one_process(tmp_path: Path, recompute: str, split: dict[str, Any]) -> None:
    from test_parallelism import single_process_state

    state, details = run_split(tmp_path, 2, recompute=recompute, **split)
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert largest_relative_difference(state, whole) < TOLERANCE


def test_core_run_with_recomputation_reports_hfu_beside_mfu(tmp_path: Path) -> None:
    from core.base.results import RunResult
    from core.cli import main

    database = tmp_path / "core.db"
    command = [sys.executable, "-m", "core.cli", "run", "gpt-800m", "--accelerator", "cpu", "--recompute", "full"]
    command += ["--batch-size", "4", "--steps", "2", "--warmup-steps", "1", "--power-meter", "none"]
    command += ["--database", str(database), *[f"-o{key}={value}" for key, value in OPTIONS.items()]]
    completed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = RunResult.model_validate_json(completed.stdout)
    assert result.status.ok and result.config.recompute == "full"
    assert result.executor_details["recompute"] == {"choice": "full", "layers": 2}
    assert result.flops_per_sample is not None and result.hardware_flops_per_sample is not None
    # full: each layer's forward once more, about a third of a layer's training FLOPs
    assert result.hardware_flops_per_sample > result.flops_per_sample
    assert main(["report", str(database), "--output", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    header = next(line for line in table.splitlines() if line.startswith("| run |"))
    row = next(line for line in table.splitlines() if line.startswith("| 1 |"))  # the one run
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    cells = dict(zip(columns, (cell.strip() for cell in row.strip("|").split("|")), strict=True))
    if result.peak_flops_per_second is None:  # a host whose processor's peak is not derived: no utilisation
        assert result.model_flops_utilization is None and result.hardware_flops_utilization is None
        return
    assert result.model_flops_utilization is not None and result.hardware_flops_utilization is not None
    assert result.hardware_flops_utilization > result.model_flops_utilization
    # the report names both, each with its own figure
    assert cells["MFU"] != "n/a" and cells["HFU, recomputation counted"] != "n/a", cells
