"""Inference with no per-step Python beyond the forward pass (docs/inference.md, "Per-step cost"):
the contexts entered once per phase and once per LoadGen test, the outputs' NaN/inf check folded
into the device-side flag a group of steps at a time (a fault still reported), LoadGen's queries
served as slices of the query gathered once and completed one call per batch, in order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from core.api import run_here
from core.base.distributed import SINGLE_PROCESS
from core.base.errors import NonFiniteLossError
from core.base.queries import QueryRows
from core.base.results import RunState
from core.contract.manager import get_plugin_manager
from core.executors.base import HostStepClock
from core.executors.pytorch import NonFiniteFlag, TorchDeviceHooks
from core.executors.pytorch_inference import DeferredOutputCheck, TorchInferenceExecutor
from core.running.loadgen.sut import QueryAnswerer
from core.running.planning import plan_run
from core.testing import TINY_FCNN

BATCH = 4


def infer_here(**options: Any) -> Any:
    """An inference run of the tiny FCNN in this process (where the test's patches apply)."""
    settings = {"mode": "inference", "micro_batch_size": BATCH, "workload_options": TINY_FCNN, "power_meter": "none"}
    return run_here("fcnn", "cpu", **{**settings, **options})


def placed(**options: Any) -> TorchInferenceExecutor:
    plan = plan_run(
        get_plugin_manager(),
        "fcnn",
        "cpu",
        {
            "power_meter": "none",
            "mode": "inference",
            "micro_batch_size": BATCH,
            "workload_options": TINY_FCNN,
            **options,
        },
    )
    executor = plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS))
    assert isinstance(executor, TorchInferenceExecutor)
    return executor


class CountingNoGrad:
    """The device's no-grad context, counting how often it is entered."""

    def __init__(self) -> None:
        self.entries = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self.entries += 1
        with torch.inference_mode():
            yield


def test_a_phase_enters_the_forward_contexts_once_whatever_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    executor = placed()
    counting = CountingNoGrad()
    monkeypatch.setattr(executor._hooks, "no_grad", counting)
    forwards: list[torch.Tensor] = []
    executor._placed_model.register_forward_hook(lambda module, inputs, output: forwards.append(output))
    clock = HostStepClock()
    clock.mark()
    executor.run_steps(9, clock)
    assert counting.entries == 1 and len(forwards) == 9
    assert len(clock.intervals_seconds()) == 9  # a step time for every step still
    assert all(output.is_inference() for output in forwards)
    executor.check_finite()


def test_a_run_enters_them_once_per_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = CountingNoGrad()
    monkeypatch.setattr(TorchDeviceHooks, "no_grad", lambda hooks: counting())
    result = infer_here(steps=12, warmup_steps=5)
    assert result.status.ok, result.status
    assert counting.entries == 3  # first step, warm-up, window
    assert result.window_steps == 12 and result.step_seconds_median is not None


def nan_at_forward(executor: TorchInferenceExecutor, call: int) -> None:
    """Make the model's ``call``-th forward pass (from 1) return a NaN in one output."""
    calls = [0]

    def poison(module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == call:
            output = output.clone()
            output[0, 0] = float("nan")
        return output

    executor._placed_model.register_forward_hook(poison)


@pytest.mark.parametrize("call", [1, 37, 64, 65, 100])
def test_where_each_step_has_new_inputs_a_nan_output_in_any_of_them_is_reported(call: int) -> None:
    executor = placed(data="synthetic-host")  # the micro-batch copied over each step, as real data is
    executor.run_steps(1)  # the first step's phase
    nan_at_forward(executor, call)
    executor.run_steps(100)
    executor.synchronize()
    with pytest.raises(NonFiniteLossError, match="NaN/inf"):
        executor.check_finite()
    executor.check_finite()  # read and cleared: reported once


def test_a_model_that_draws_random_numbers_has_every_output_checked() -> None:
    executor = placed()
    executor._placed_model.register_forward_pre_hook(lambda module, inputs: torch.rand(1) and None)
    executor.run_steps(1)
    nan_at_forward(executor, 37)
    executor.run_steps(100)
    with pytest.raises(NonFiniteLossError):
        executor.check_finite()


def test_where_every_step_repeats_the_first_the_last_outputs_stand_for_the_phase() -> None:
    executor = placed()
    executor.run_steps(1)  # the first step's phase: its one pass checked
    checked: list[Any] = []
    executor._output_check.add = checked.append  # type: ignore[method-assign]
    executor.run_steps(50)
    assert len(checked) == 1  # the same model on the same micro-batch: the same outputs each pass
    with torch.no_grad():
        executor._placed_model[-1].bias.fill_(float("nan"))  # weights gone bad: every pass's outputs
    del executor._output_check.add
    executor.run_steps(50)
    with pytest.raises(NonFiniteLossError):
        executor.check_finite()


def test_a_run_whose_window_makes_a_nan_output_names_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    original = TorchInferenceExecutor.run_steps
    phases = [0]

    def run_steps(self: TorchInferenceExecutor, count: int, clock: Any = None) -> None:
        phases[0] += 1
        if phases[0] == 3:  # the window (after the first step and the warm-up)
            nan_at_forward(self, count // 2)
        original(self, count, clock)

    monkeypatch.setattr(TorchInferenceExecutor, "run_steps", run_steps)
    result = infer_here(steps=40, warmup_steps=2, data="synthetic-host")
    assert result.status.state is RunState.non_finite_loss and result.status.phase == "window"


def test_outputs_of_other_shapes_are_checked_each_alone() -> None:
    flag = NonFiniteFlag(torch.device("cpu"))
    check = DeferredOutputCheck(flag, most=3)
    with torch.inference_mode():
        check.add((torch.ones(2, 3), {"scores": torch.ones(5)}))
        check.add(torch.tensor([1.0, float("inf")]))  # the group is full: checked here
    assert float(flag.take()) != 0
    check.add([torch.ones(1), torch.zeros(2, 2, dtype=torch.int64)])  # integers are not checked
    check.flush()
    assert float(flag.take()) == 0


class RecordingLoadGen:
    """mlperf_loadgen's response surface, recording the ids of each QuerySamplesComplete call (read
    at the call: LoadGen copies the responses, and core reuses them)."""

    class QuerySampleResponse:
        def __init__(self, sample_id: int, data: int, size: int) -> None:
            self.id = sample_id

    def __init__(self) -> None:
        self.completed: list[list[int]] = []

    def QuerySamplesComplete(self, responses: list[Any]) -> None:  # noqa: N802 - LoadGen's name
        self.completed.append([response.id for response in responses])


def test_an_offline_query_is_served_in_slices_of_one_gather_and_completed_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    executor = placed()
    pool = executor._pool_inputs
    executor.load(list(range(16)))
    seen: list[torch.Tensor] = []
    executor._placed_model.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    gathers: list[int] = []
    original_gather = torch.Tensor.index_select

    def index_select(tensor: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        gathers.append(len(index))
        return original_gather(tensor, dim, index)

    monkeypatch.setattr(torch.Tensor, "index_select", index_select)
    loadgen = RecordingLoadGen()
    answerer = QueryAnswerer(executor, loadgen, max_batch_size=BATCH, answer_on_worker=False)
    indices = [9, 2, 2, 15, 0, 7, 3, 11, 4, 12]  # as LoadGen draws them: any order, repeats
    sample_ids = [1000 + n for n in range(len(indices))]
    with executor.answering():
        answerer.issue_query(sample_ids, indices)
    answerer.raise_failure()
    assert loadgen.completed == [sample_ids[0:4], sample_ids[4:8], sample_ids[8:10]]
    assert answerer.samples_answered == len(indices)
    assert gathers == [len(indices)]  # the query gathered once, each batch a slice of it
    assert [len(batch) for batch in seen] == [4, 4, 2]
    assert torch.equal(torch.cat(seen), pool[indices])
    executor.check_finite()


def test_a_single_sample_is_a_view_of_the_loaded_samples_and_a_missing_one_is_refused() -> None:
    executor = placed()
    executor.load([3, 5, 7])
    seen: list[torch.Tensor] = []
    executor._placed_model.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    executor.infer([5])
    assert executor._loaded is not None
    assert seen[0].data_ptr() == executor._loaded[1].data_ptr()  # nothing copied
    with pytest.raises(KeyError, match=r"samples \[4\] were not loaded"):
        executor.infer(QueryRows([5, 4], 0, 2))


def test_query_rows_read_as_the_samples_they_name() -> None:
    rows = QueryRows([9, 8, 7, 6, 5], 1, 4)
    assert len(rows) == 3 and list(rows) == [8, 7, 6] and rows[0] == 8 and rows[-1] == 6 and rows[1:] == [7, 6]
    assert set(rows) == {6, 7, 8}
