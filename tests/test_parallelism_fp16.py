"""fp16 with dynamic loss scaling on core's device mesh (CPU/gloo): sharded (FSDP2), tensor-parallel and
pipelined replicas train the weights one process does, and an overflow on one process only makes
every process skip that step and halve its scale alike (core.executors.mesh_scaler)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from launching import torchrun_ranks

from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.executors.parallel import local_tensor
from core.executors.pytorch import TorchExecutor, TorchPlacement
from core.workloads.language import GptCaraml800m, GptOptions

# The tiny GPT-NeoX of tests/test_parallelism.py: 2 layers, hidden 64, 2 heads.
OPTIONS = {"variant": "small", "vocabulary": 96, "sequence_length": 16, "synthetic_pool_samples": 32}
UPDATES = 3
#: the update whose gradients one process makes infinite (counted from 1)
OVERFLOW_UPDATE = 2
INITIAL_SCALE = 2.0**16
#: largest difference of a weight after the updates, relative to that weight's largest value. Under
#: fp16 autocast each split rounds its own partial products to float16 (a half of a matmul, a stage's
#: activations), so the runs differ by fp16 rounding, not fp32's: measured FSDP2 8.3e-4, pipeline
#: 9.5e-4, tensor parallelism 1.75e-3 (torch 2.13, CPU; one process in fp16 against fp32: 1.3e-3),
#: a fifth or less of this. A step taken on some process only differs by far more (3.0, below).
TOLERANCE = 1e-2

#: each placement: its processes and settings, and the one process's micro-batch with the same samples
PLACEMENTS: dict[str, dict[str, Any]] = {
    "fsdp": {"replicas": 2, "sharding": "fsdp", "micro_batch_size": 4, "gradient_accumulation": 2},
    "tensor": {"devices_per_replica": 2, "tensor_parallel": 2, "micro_batch_size": 8, "gradient_accumulation": 2},
    "pipeline": {"devices_per_replica": 2, "micro_batch_size": 4, "gradient_accumulation": 4},
    # 2 stages, each split over 2 tensor-parallel processes (CARAML 13B's replica)
    "pipeline-tensor": {
        "devices_per_replica": 4,
        "tensor_parallel": 2,
        "micro_batch_size": 4,
        "gradient_accumulation": 4,
    },
}


def processes(placement: str) -> int:
    settings = PLACEMENTS[placement]
    return int(settings.get("replicas", 1)) * int(settings.get("devices_per_replica", 1))


# Runs in each process (and, with a ProcessContext of one, as the one process): ``overflow_rank`` is the
# rank whose own part of one gradient becomes inf before update OVERFLOW_UPDATE's optimizer step (None:
# none). The loss scaler's scale after each update is kept, process by process.
WORKER = textwrap.dedent("""
    import json, sys, torch
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.parallel import local_tensor
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.language import GptCaraml800m, GptOptions

    def train(process, settings, overflow_rank, placement):
        config = make_config(workload="gpt-800m", accelerator="cpu", workload_options={options!r},
                             precision="fp16", **settings)
        spec = GptCaraml800m().build_torch(GptOptions(**{options!r}), seed=0)
        spec.make_optimizer = lambda parameters: torch.optim.SGD(parameters, lr=0.5)
        executor = TorchExecutor(spec, config, placement, process)
        policy = executor.precision
        step, updates = policy.optimizer_step, [0]

        def overflowing_step(optimizer):
            updates[0] += 1
            if updates[0] == {overflow_update} and process.rank == overflow_rank:
                for parameter in executor._trained_parameters:
                    part = local_tensor(parameter.grad) if parameter.grad is not None else None
                    if part is not None and part.numel():  # a part this process holds, of this process only
                        part.view(-1)[0] = float("inf")
                        break
            step(optimizer)

        policy.optimizer_step = overflowing_step
        linear_outputs = set()  # the dtypes the linear layers compute in: float16 under autocast
        for module in executor._model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(lambda _, __, output: linear_outputs.add(str(output.dtype)))
        scales = []
        for _ in range({updates}):
            executor.step()
            scales.append(float(policy.scaler.get_scale()))
        executor.check_finite()
        return executor, {{"scales": scales, "linear_outputs": sorted(linear_outputs)}}

    if __name__ == "__main__":
        settings, overflow_rank = json.loads(open(sys.argv[1] + ".in.json").read())
        process = ProcessContext.from_environment()
        executor, seen = train(process, settings, overflow_rank,
                               TorchPlacement(device="cpu", distributed_backend="gloo"))
        every_rank = [None] * process.world_size
        torch.distributed.all_gather_object(every_rank, seen)
        state = executor.model_state()  # a collective: every rank gathers
        if process.rank == 0:
            torch.save(state, sys.argv[1])
            open(sys.argv[1] + ".json", "w").write(json.dumps(every_rank))
        executor.close()
""").format(options=OPTIONS, updates=UPDATES, overflow_update=OVERFLOW_UPDATE)


def one_process(overflow: bool) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The whole global batch of 16 in one process (fp16, loss-scaled by torch's own GradScaler)."""
    namespace: dict[str, Any] = {"__name__": "one_process"}
    exec(compile(WORKER, "worker", "exec"), namespace)
    settings = {"micro_batch_size": 16, "gradient_accumulation": 1}
    executor, seen = namespace["train"](SINGLE_PROCESS, settings, 0 if overflow else None, TorchPlacement("cpu"))
    assert seen["linear_outputs"] == ["torch.float16"]
    return executor.model_state(), seen["scales"]


def split(tmp_path: Path, placement: str, overflow_rank: int | None) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """The weights the processes trained, and each process's loss scale after each update."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "state.pt"
    Path(f"{out}.in.json").write_text(json.dumps([PLACEMENTS[placement], overflow_rank]))
    ranks = processes(placement)
    completed = torchrun_ranks(script, out, tmp_path / "torchelastic", ranks)
    assert completed.returncode == 0, completed.stderr[-4000:]
    every_rank = json.loads(Path(f"{out}.json").read_text())
    # every process computed its linear layers in float16 (a stage's forward too: autocast reaches it)
    assert [seen["linear_outputs"] for seen in every_rank] == [["torch.float16"]] * ranks
    return torch.load(out), [seen["scales"] for seen in every_rank]


def largest_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max()) for k in b)


def test_the_one_process_reference_trains_in_fp16_on_the_cpu() -> None:
    """CPU autocast to float16 and GradScaler("cpu") run in torch 2.13: the reference is real fp16."""
    with torch.autocast("cpu", dtype=torch.float16):
        product = torch.ones(2, 2) @ torch.ones(2, 2)
    assert product.dtype == torch.float16
    config = make_config(
        workload="gpt-800m", accelerator="cpu", workload_options=OPTIONS, precision="fp16", micro_batch_size=4
    )
    spec = GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0)
    executor = TorchExecutor(spec, config, TorchPlacement("cpu"), SINGLE_PROCESS)
    assert type(executor.precision.scaler).__name__ == "GradScaler"  # one process: torch's own, unsharded


@pytest.mark.slow
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_fp16_on_the_mesh_trains_as_one_process(tmp_path: Path, placement: str) -> None:
    state, scales = split(tmp_path, placement, overflow_rank=None)
    whole, whole_scales = one_process(overflow=False)
    assert whole_scales == [INITIAL_SCALE] * UPDATES and scales == [whole_scales] * processes(placement)  # no skip
    initial = GptCaraml800m().build_torch(GptOptions(**OPTIONS), seed=0).model.state_dict()
    moved = max(float((whole[name] - initial[name]).abs().max()) for name in initial)
    assert moved > 1e-2  # the updates moved the weights far beyond the tolerance
    difference = largest_relative_difference(state, whole)
    print(f"fp16 {placement}: largest relative difference {difference:.2e}")
    assert difference < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_an_overflow_on_one_process_skips_the_step_on_every_process(tmp_path: Path, placement: str) -> None:
    # the last rank: FSDP2's second shard, the second half of the split layers (or a copy of the
    # whole norms only it sees as inf), the last pipeline stage (the first stage's gradients are
    # finite), the last stage's second tensor rank
    state, scales = split(tmp_path, placement, overflow_rank=processes(placement) - 1)
    skipped, skipped_scales = one_process(overflow=True)
    halved = [INITIAL_SCALE, INITIAL_SCALE / 2, INITIAL_SCALE / 2]
    assert skipped_scales == halved and scales == [halved] * processes(placement)  # all skipped update 2 alone
    assert largest_relative_difference(state, skipped) < TOLERANCE
    # taking the step on some process would have shown: the run that took it is far from this one
    stepped, _ = one_process(overflow=False)
    assert largest_relative_difference(state, stepped) > 10 * TOLERANCE  # measured 3.0


def test_the_mesh_scaler_unscales_each_local_part_and_keeps_the_engines_logic(tmp_path: Path) -> None:
    """One process (a world of one, gloo): the scaler's own arithmetic on a plain gradient."""
    from core.executors.mesh_scaler import MeshGradScaler

    assert local_tensor(torch.ones(1)).shape == (1,)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        weight = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([weight], lr=1.0)
        scaler = MeshGradScaler(torch.device("cpu"))
        assert scaler.get_scale() == INITIAL_SCALE  # made at once: a stage that never scales has it
        scaler.scale(weight.sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        assert weight.tolist() == [0.0, 0.0, 0.0] and scaler.get_scale() == INITIAL_SCALE  # unscaled: 1 each
        scaler.scale(weight.sum() * float("inf")).backward()
        scaler.step(optimizer)
        scaler.update()
        assert weight.tolist() == [0.0, 0.0, 0.0] and scaler.get_scale() == INITIAL_SCALE / 2  # skipped, halved
    finally:
        torch.distributed.destroy_process_group()


def test_fp16_runs_on_the_mesh_but_not_with_offloaded_shards() -> None:
    from core.base.errors import ConfigError
    from core.running.replica_checks import check_torch_replica

    workload, options = GptCaraml800m(), GptOptions(**OPTIONS)
    layout = workload.pipeline_layout(options)

    def config(**settings: object) -> Any:
        return make_config(
            workload="gpt-800m", accelerator="cpu", workload_options=OPTIONS, precision="fp16", **settings
        )

    for settings in PLACEMENTS.values():
        assert check_torch_replica(config(**settings), workload, options, layout) == []
    offloaded = config(replicas=2, sharding="fsdp-offload", micro_batch_size=4)
    with pytest.raises(ConfigError) as refused:
        check_torch_replica(offloaded, workload, options, layout)
    assert refused.value.field == "precision"
    (warning,) = check_torch_replica(offloaded, workload, options, layout, planned_elsewhere=True)
    assert "planned, not runnable" in warning and "precision" in warning
