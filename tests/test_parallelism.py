"""A replica over several processes (tensor, pipeline parallelism) and sharded replicas (FSDP2) on
CPU/gloo train the same weights as one process with the whole global batch."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from launching import torchrun_ranks

from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.contract.workload import TorchTrainingSpec
from core.executors.pytorch import TorchExecutor, TorchPlacement
from core.workloads.language import GptCaraml800m, GptOptions

# A tiny GPT-NeoX (CARAML's GPT, small variant): 2 layers, hidden 64, 2 heads, MLP 256.
OPTIONS = {"variant": "small", "vocabulary": 96, "sequence_length": 16, "synthetic_pool_samples": 32}
UPDATES = 3
#: largest difference of a weight after the updates, relative to that weight's largest value: the
#: split runs sum the same products in another order (all-reduce, reduce-scatter), so fp32 rounding
#: differs; every placement measured 4.8e-7 to 5.4e-7 (torch 2.13, CPU), a twentieth of this
TOLERANCE = 1e-5


def single_process_state(micro_batch_size: int, gradient_accumulation: int) -> dict[str, torch.Tensor]:
    config = make_config(
        workload="gpt-800m",
        accelerator="cpu",
        workload_options=OPTIONS,
        micro_batch_size=micro_batch_size,
        gradient_accumulation=gradient_accumulation,
    )
    spec = sgd(GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0))
    executor = TorchExecutor(spec, config, TorchPlacement(device="cpu"), SINGLE_PROCESS)
    for _ in range(UPDATES):
        executor.step()
    return executor.model_state()


def sgd(spec: TorchTrainingSpec) -> TorchTrainingSpec:
    """The spec with plain SGD: AdamW divides each gradient by its running size, so rounding in a
    gradient near zero would move a weight by a whole learning rate; SGD keeps the comparison linear."""
    spec.make_optimizer = lambda parameters: torch.optim.SGD(parameters, lr=0.5)
    return spec


def largest_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max()) for k in b)


WORKER = textwrap.dedent("""
    import json, sys, torch
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.language import GptCaraml800m, GptOptions
    options = {options!r}
    settings = {settings!r}
    process = ProcessContext.from_environment()
    config = make_config(workload="gpt-800m", accelerator="cpu", workload_options=options, **settings)
    spec = GptCaraml800m().build_torch(GptOptions(**options), seed=0)
    spec.make_optimizer = lambda parameters: torch.optim.SGD(parameters, lr=0.5)
    executor = TorchExecutor(spec, config,
                             TorchPlacement(device="cpu", distributed_backend="gloo"), process)
    norm_tokens = set()  # the sequence lengths the layer norms see: a slice under sequence parallelism
    for name, module in executor._model.named_modules():
        if name.endswith("input_layernorm"):
            # after the style's own hook: a DTensor, whose local part is what this process holds
            module.register_forward_pre_hook(
                lambda _, args: norm_tokens.add(getattr(args[0], "to_local", lambda: args[0])().shape[1]))
    for _ in range({updates}):
        executor.step()
    executor.check_finite()
    state = executor.model_state()  # a collective: every rank gathers
    if process.rank == 0:
        torch.save(state, sys.argv[1])
        kept = ("device_mesh", "sharding", "pipeline", "parameter_bytes_per_rank", "sequence_parallel")
        details = {{k: v for k, v in executor.details().items() if k in kept}}
        details["norm_tokens"] = sorted(norm_tokens)
        sys.argv[1] and open(sys.argv[1] + ".json", "w").write(json.dumps(details))
    executor.close()
""")


def run_split(tmp_path: Path, ranks: int, **settings: object) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(options=OPTIONS, settings=settings, updates=UPDATES))
    out = tmp_path / "state.pt"
    completed = torchrun_ranks(script, out, tmp_path / "torchelastic", ranks)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return torch.load(out), json.loads(Path(f"{out}.json").read_text())


@pytest.mark.slow
def test_fsdp_over_two_replicas_equals_one_process(tmp_path: Path) -> None:
    state, details = run_split(tmp_path, 2, replicas=2, sharding="fsdp", micro_batch_size=4, gradient_accumulation=2)
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert details["device_mesh"] == {"data": 2, "pipeline": 1, "tensor": 1} and details["sharding"] == "fsdp"
    initial = GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0).model.state_dict()
    moved = max(float((whole[name] - initial[name]).abs().max()) for name in initial)
    assert moved > 1e-2  # the updates moved the weights far beyond the tolerance
    assert largest_relative_difference(state, whole) < TOLERANCE


@pytest.mark.slow
def test_tensor_parallel_two_equals_one_process(tmp_path: Path) -> None:
    state, details = run_split(
        tmp_path, 2, devices_per_replica=2, tensor_parallel=2, micro_batch_size=8, gradient_accumulation=2
    )
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert details["device_mesh"] == {"data": 1, "pipeline": 1, "tensor": 2}
    # sequence parallelism: the norms between the split layers see half of the 16 tokens
    assert details["sequence_parallel"] is True and details["norm_tokens"] == [8]
    assert largest_relative_difference(state, whole) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_pipeline_stages_equal_one_process(tmp_path: Path, schedule: str) -> None:
    state, details = run_split(
        tmp_path,
        2,
        devices_per_replica=2,
        pipeline_schedule=schedule,
        micro_batch_size=4,
        gradient_accumulation=4,
    )
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert details["device_mesh"] == {"data": 1, "pipeline": 2, "tensor": 1}
    pipeline = details["pipeline"]
    assert pipeline["schedule"] == schedule and pipeline["layers_per_stage"] == [1, 1]
    assert pipeline[f"bubble_fraction_{schedule}"] == pytest.approx(1 / 5)
    assert largest_relative_difference(state, whole) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_replicas_of_two_tensor_parallel_devices_equal_one_process(tmp_path: Path, sharding: str) -> None:
    # the 2 x 2 mesh: data 2 x tensor 2, four processes
    state, details = run_split(
        tmp_path,
        4,
        replicas=2,
        devices_per_replica=2,
        tensor_parallel=2,
        sharding=sharding,
        micro_batch_size=4,
        gradient_accumulation=2,
    )
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert details["device_mesh"] == {"data": 2, "pipeline": 1, "tensor": 2}
    assert details["sequence_parallel"] is True and details["norm_tokens"] == [8]
    assert largest_relative_difference(state, whole) < TOLERANCE


@pytest.mark.slow
def test_two_pipeline_stages_of_two_tensor_parallel_devices_equal_one_process(tmp_path: Path) -> None:
    # pipeline 2 x tensor 2, four processes: each stage's layer split over its two tensor ranks
    state, details = run_split(
        tmp_path, 4, devices_per_replica=4, tensor_parallel=2, micro_batch_size=4, gradient_accumulation=4
    )
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert details["device_mesh"] == {"data": 1, "pipeline": 2, "tensor": 2}
    assert details["pipeline"]["layers_per_stage"] == [1, 1]  # type: ignore[index]
    # ranks (stage, tensor rank): a stage's two tensor ranks hold equal halves of its split layer
    # and the embeddings whole (the first), the norm and the output layer whole (the last)
    held = details["parameter_bytes_per_rank"]
    model = GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0).model
    layer = 4 * sum(p.numel() for p in model.model.gpt_neox.layers[0].parameters())
    assert isinstance(held, list) and held[0] == held[1] and held[2] == held[3]
    embeddings = 4 * model.model.gpt_neox.embed_in.weight.numel()
    assert embeddings + layer / 2 < held[0] < embeddings + layer  # the layer's norms stay whole
    # rank 0's stage slices the sequence inside its layer and passes the whole of it to the next
    assert details["sequence_parallel"] is True and details["norm_tokens"] == [8]
    assert largest_relative_difference(state, whole) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_two_replicas_of_two_pipeline_stages_equal_one_process(tmp_path: Path, sharding: str) -> None:
    # data 2 x pipeline 2, four processes: each stage sharded over (fsdp) or averaged over the replicas
    state, details = run_split(
        tmp_path,
        4,
        replicas=2,
        devices_per_replica=2,
        sharding=sharding,
        micro_batch_size=4,
        gradient_accumulation=2,
    )
    whole = single_process_state(micro_batch_size=16, gradient_accumulation=1)
    assert details["device_mesh"] == {"data": 2, "pipeline": 2, "tensor": 1} and details["sharding"] == sharding
    held = details["parameter_bytes_per_rank"]
    assert isinstance(held, list) and held[0] + held[1] == held[2] + held[3]  # ranks (replica, stage)
    whole_bytes = 4 * sum(
        p.numel() for p in GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0).model.parameters()
    )
    halved = sum(held) < 2 * whole_bytes  # the two replicas hold the model once (its tied copy twice), not twice
    assert halved == (sharding == "fsdp")
    assert largest_relative_difference(state, whole) < TOLERANCE


def test_pipeline_stages_run_with_tensor_parallelism_and_fsdp_but_not_offloaded_shards() -> None:
    from core.base.errors import ConfigError
    from core.running.replica_checks import check_torch_replica

    workload, options = GptCaraml800m(), GptOptions(**OPTIONS)
    layout = workload.pipeline_layout(options)

    def config(**settings: object) -> object:
        return make_config(
            workload="gpt-800m", accelerator="cpu", workload_options=OPTIONS, micro_batch_size=4, **settings
        )

    runs = [
        {"devices_per_replica": 4, "tensor_parallel": 2, "gradient_accumulation": 2},
        {"replicas": 2, "devices_per_replica": 2, "sharding": "fsdp", "gradient_accumulation": 2},
        {"replicas": 2, "devices_per_replica": 4, "tensor_parallel": 2, "sharding": "fsdp", "gradient_accumulation": 2},
    ]
    for settings in runs:
        assert check_torch_replica(config(**settings), workload, options, layout) == []  # type: ignore[arg-type]
    offloaded = config(replicas=2, devices_per_replica=2, sharding="fsdp-offload", gradient_accumulation=2)
    with pytest.raises(ConfigError) as refused:
        check_torch_replica(offloaded, workload, options, layout)  # type: ignore[arg-type]
    assert refused.value.field == "sharding"
    (warning,) = check_torch_replica(offloaded, workload, options, layout, planned_elsewhere=True)  # type: ignore[arg-type]
    assert "planned, not runnable" in warning and "sharding" in warning


TINY_GPT = {"workload_options": OPTIONS, "power_meter": "none", "micro_batch_size": 4}


@pytest.mark.parametrize(
    ("workload", "options", "field"),
    [
        # a convolutional network has no tensor-parallel plan
        ("resnet50", {"devices_per_replica": 2, "tensor_parallel": 2}, "tensor_parallel"),
        ("gpt-800m", {"devices_per_replica": 4, "tensor_parallel": 4}, "tensor_parallel"),  # 2 heads
        ("gpt-800m", {"devices_per_replica": 2, "gradient_accumulation": 1}, "gradient_accumulation"),
        ("gpt-800m", {"devices_per_replica": 4, "gradient_accumulation": 4}, "devices_per_replica"),  # 2 layers
        ("gpt-800m", {"replicas": 2, "sharding": "fsdp-offload"}, "sharding"),  # cpu: nothing to offload to
        ("gpt-800m", {"devices_per_replica": 2, "tensor_parallel": 2, "compile": True}, "compile"),
        (
            "gpt-800m",
            {"devices_per_replica": 2, "tensor_parallel": 2, "pipeline_schedule": "gpipe"},
            "pipeline_schedule",
        ),
    ],
)
def test_what_the_mesh_cannot_apply_is_refused_naming_its_field(
    workload: str, options: dict[str, object], field: str
) -> None:
    from core.api import run_here
    from core.base.errors import ConfigError

    settings = {**TINY_GPT, **options}
    if workload != "gpt-800m":
        settings["workload_options"] = {"variant": "small"}
    with pytest.raises(ConfigError) as refused:
        run_here(workload, "cpu", **settings)
    assert refused.value.field == field


@pytest.mark.slow
def test_core_run_places_one_replica_over_two_tensor_parallel_processes() -> None:
    import subprocess
    import sys

    from launching import ROOT

    from core.base.results import RunResult

    command = [sys.executable, "-m", "core.cli", "run", "gpt-800m", "--accelerator", "cpu"]
    command += ["--devices-per-replica", "2", "--tensor-parallel", "2", "--batch-size", "4", "--steps", "2"]
    command += ["--warmup-steps", "1", *[f"-o{key}={value}" for key, value in OPTIONS.items()]]
    completed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = RunResult.model_validate_json(completed.stdout)
    assert result.status.ok and result.world_size == 2  # one process per device of the replica
    assert result.samples_per_update == 4 and result.window_samples == 8  # one replica: its batch once
    details = result.executor_details
    assert details["device_mesh"] == {"data": 1, "pipeline": 1, "tensor": 2} and details["ddp"] is False
    assert details["tensor_parallel_modules"] == 4
    # each device holds the embeddings and norms whole and half of each split layer's weights
    whole = 4 * sum(p.numel() for p in GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0).model.parameters())
    held = details["parameter_bytes_per_rank"]
    assert len(held) == 2 and held[0] == held[1] and whole / 2 < held[0] < whole
