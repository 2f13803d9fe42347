"""Gradient accumulation and DDP replicas through the shared PyTorch executor are exact."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from launching import torchrun_two_ranks

from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.executors.pytorch import TorchExecutor, TorchPlacement, micro_batch_indices
from core.workloads.fcnn import Fcnn, FcnnOptions

OPTIONS = {"layers": 3, "hidden_width": 32, "input_width": 20, "output_width": 10}


def one_update(**config: int) -> dict[str, torch.Tensor]:
    run_config = make_config(workload="fcnn", accelerator="cpu", workload_options=OPTIONS, **config)
    spec = Fcnn().build_torch(FcnnOptions(**OPTIONS), seed=0)
    executor = TorchExecutor(spec, run_config, TorchPlacement(device="cpu"), SINGLE_PROCESS)
    executor.step()
    executor.synchronize()
    return executor.model_state()


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max()) for k in b)


def initial_state() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in Fcnn().build_torch(FcnnOptions(**OPTIONS), seed=0).model.state_dict().items()}


def test_gradient_accumulation_is_exact() -> None:
    accumulated = one_update(micro_batch_size=8, gradient_accumulation=4)
    whole = one_update(micro_batch_size=32, gradient_accumulation=1)
    assert relative_difference(whole, initial_state()) > 1e-4  # the update really moved the weights
    assert relative_difference(accumulated, whole) < 1e-6


def test_micro_batches_of_ranks_tile_the_global_batch() -> None:
    # 2 ranks x 3 micro-steps x 4 samples cover samples 0..23 exactly once, modulo the pool.
    seen = torch.cat([torch.cat(micro_batch_indices(rank, 4, 3, pool=100)) for rank in range(2)])
    assert sorted(seen.tolist()) == list(range(24))
    wrapped = torch.cat(micro_batch_indices(0, 8, 2, pool=10))
    assert wrapped.tolist() == [i % 10 for i in range(16)]


def test_precision_flags_are_recorded() -> None:
    config = make_config(
        workload="fcnn", accelerator="cpu", precision="bf16", micro_batch_size=4, workload_options=OPTIONS
    )
    executor = TorchExecutor(
        Fcnn().build_torch(FcnnOptions(**OPTIONS), seed=0), config, TorchPlacement(device="cpu"), SINGLE_PROCESS
    )
    details = executor.details()
    assert details["autocast_dtype"] == "bfloat16" and details["matmul_allow_tf32"] is False
    assert details["cudnn_allow_tf32"] is False and details["float32_matmul_precision"] == "highest"


WORKER = textwrap.dedent("""
    import sys, torch
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.fcnn import Fcnn, FcnnOptions
    options = {options!r}
    process = ProcessContext.from_environment()
    config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=16, replicas=2, workload_options=options)
    executor = TorchExecutor(Fcnn().build_torch(FcnnOptions(**options), seed=0), config,
                             TorchPlacement(device="cpu", distributed_backend="gloo"), process)
    executor.step()
    if process.rank == 0:
        torch.save(executor.model_state(), sys.argv[1])
    executor.close()
""")


@pytest.mark.slow
def test_two_torchrun_replicas_equal_one_process_with_the_whole_batch(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(options=OPTIONS))
    out = tmp_path / "state.pt"
    completed = torchrun_two_ranks(script, out, tmp_path / "torchelastic")
    assert completed.returncode == 0, completed.stderr[-3000:]
    replicated = torch.load(out)
    whole = one_update(micro_batch_size=32, gradient_accumulation=1)
    assert relative_difference(replicated, whole) < 1e-6


def test_a_recompilation_inside_the_window_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import core.executors.pytorch as pytorch_executor

    config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=4, workload_options=OPTIONS)
    executor = TorchExecutor(
        Fcnn().build_torch(FcnnOptions(**OPTIONS), seed=0), config, TorchPlacement(device="cpu"), SINGLE_PROCESS
    )
    executor._config = config.model_copy(update={"compile": True})  # count graphs without compiling for real
    graphs = iter([3, 5])
    monkeypatch.setattr(pytorch_executor, "_compiled_graph_count", lambda: next(graphs))
    executor.begin_window()
    warnings = executor.window_warnings()
    assert len(warnings) == 1 and "compiled 2 new graph(s) inside the timed window" in warnings[0]
