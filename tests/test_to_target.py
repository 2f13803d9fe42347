"""Training to a target quality (RunConfig.target, docs/to-target.md): the refusals before running,
a run that reaches its target on scikit-learn's digits, one that spends its budget, and replicas whose
curve and sharded evaluation equal one process's."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from launching import torchrun_two_ranks

from core.api import run_here
from core.base.config import make_config
from core.base.errors import ConfigError
from core.base.results import RunState

BUDGET = {"max_epochs": 30}
EVERY_EPOCH = {"evaluate_every_epochs": 1}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"target": {"metric": "top1", "value": 0.9}}, "target.max_epochs"),  # no budget
        ({"target": {"metric": "top1", "value": 1.5, **BUDGET}}, "target.value"),
        ({"target": {"metric": "top1", "value": True, **BUDGET}}, "target.value"),  # strict: no boolean
        ({"target": {"metric": "loss", "value": -0.1, **BUDGET}}, "target.value"),
        (
            {"target": {"metric": "top1", "value": 0.9, **EVERY_EPOCH, "evaluate_every_samples": 64, **BUDGET}},
            "target.evaluate_every_samples",
        ),
        ({"target": {"metric": "top1", "value": 0.9, "max_epochs": 0}}, "target.max_epochs"),
        ({"target": {"metric": "top1", "value": 0.9, "patience": 3, **BUDGET}}, "target.patience"),
        ({"mode": "inference", "target": {"metric": "top1", "value": 0.9, **BUDGET}}, "target"),
        ({"energy_scope": "run", "target": {"metric": "top1", "value": 0.9, **BUDGET}}, "energy_scope"),
        ({"duration_seconds": 5.0, "target": {"metric": "top1", "value": 0.9, **BUDGET}}, "duration_seconds"),
    ],
)
def test_a_target_that_cannot_be_run_is_refused_naming_its_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        make_config(workload="digits", accelerator="cpu", **options)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("workload", "options", "field"),
    [
        ("fcnn", {}, "target"),  # synthetic data, random labels: nothing to judge a target on
        ("digits", {"data": "/no/such/folder"}, "data"),
        ("digits", {"target": {"metric": "top5", "value": 0.9, **BUDGET}}, "target.metric"),
        ("digits", {"micro_batch_size": 4096}, "micro_batch_size"),  # no global batch in the training split
    ],
)
def test_planning_refuses_a_target_the_workload_cannot_judge(
    workload: str, options: dict[str, Any], field: str
) -> None:
    options = {"target": {"metric": "top1", "value": 0.9, **BUDGET}, **options}
    with pytest.raises(ConfigError) as refused:
        run_here(workload, "cpu", **options)
    assert refused.value.field == field


@pytest.mark.slow
def test_digits_reaches_its_target_and_reports_time_epochs_and_the_curve() -> None:
    result = run_here("digits", "cpu", power_meter="none", target={"metric": "top1", "value": 0.9, **BUDGET})
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None
    assert outcome.reached and outcome.stopped_by == "target"
    last = outcome.curve[-1]
    assert last.value >= 0.9 and all(point.value < 0.9 for point in outcome.curve[:-1])
    assert outcome.time_to_target_seconds == last.seconds == outcome.training_seconds
    assert outcome.epochs_to_target == pytest.approx(len(outcome.curve) * (1437 // 32) * 32 / 1437)
    assert outcome.samples_to_target == last.samples == len(outcome.curve) * (1437 // 32) * 32
    assert [point.seconds for point in outcome.curve] == sorted(point.seconds for point in outcome.curve)
    assert outcome.evaluation_seconds == pytest.approx(sum(point.evaluation_seconds for point in outcome.curve))
    assert outcome.initialization_seconds == result.setup_seconds
    assert set(last.metrics) == {"top1", "loss"}
    # No meter: no energy, and the result says why.
    assert outcome.energy_to_target_joules is None and last.joules is None
    assert result.energy_unavailable_reason
    assert result.throughput_per_second is None  # no steady window: not faked


@pytest.mark.slow
def test_an_unreachable_target_ends_with_its_status_and_keeps_the_curve() -> None:
    target = {"metric": "loss", "value": 0.0, "max_epochs": 2, "evaluate_every_samples": 448}
    result = run_here("digits", "cpu", power_meter="none", target=target)
    outcome = result.to_target
    assert result.status.state is RunState.target_not_reached and outcome is not None
    assert not outcome.reached and outcome.stopped_by == "max_epochs"
    # 448 samples are 14 updates of 32; 2 epochs are 88 updates: evaluations at 14, 28, ..., 84, 88.
    assert [point.samples for point in outcome.curve] == [*range(448, 88 * 32, 448), 88 * 32]
    assert outcome.time_to_target_seconds is None and outcome.epochs_to_target is None
    assert outcome.epochs == pytest.approx(88 * 32 / 1437)


WORKER = textwrap.dedent("""
    import json, sys
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.digits import Digits, DigitsOptions

    def curve(process, placement, micro_batch_size, replicas):
        target = {"metric": "top1", "value": 1.0, "max_epochs": 3}
        config = make_config(workload="digits", accelerator="cpu", micro_batch_size=micro_batch_size,
                             replicas=replicas, target=target)
        executor = TorchExecutor(Digits().build_torch(DigitsOptions(), seed=0), config, placement, process)
        points = [executor.evaluate()]  # the seeded weights, before any update
        for _ in range(3):
            executor.run_steps(1437 // 32)
            points.append(executor.evaluate())
        executor.close()
        return points

    process = ProcessContext.from_environment()
    replicated = curve(process, TorchPlacement(device="cpu", distributed_backend="gloo"), 16, 2)
    if process.rank == 0:
        from core.base.distributed import SINGLE_PROCESS
        whole = curve(SINGLE_PROCESS, TorchPlacement(device="cpu"), 32, 1)
        with open(sys.argv[1], "w") as out:
            json.dump({"replicated": replicated, "whole": whole}, out)
""")


@pytest.mark.slow
def test_two_replicas_give_one_process_curve_and_its_sharded_evaluation(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "curves.json"
    completed = torchrun_two_ranks(script, out, tmp_path / "torchelastic")
    assert completed.returncode == 0, completed.stderr[-3000:]
    curves = json.loads(out.read_text())
    replicated, whole = curves["replicated"], curves["whole"]
    # The same weights (seeded, before any update): the sharded counts add up exactly, the loss to fp32 rounding.
    assert replicated[0]["top1"] == whole[0]["top1"]
    assert replicated[0]["loss"] == pytest.approx(whole[0]["loss"], rel=1e-6)  # fp32 means, summed apart
    # The same global batches in the same order: DDP's averaged gradients differ from one process's by
    # rounding only, so after 3 epochs top-1 is within one held-out image (1/360) and the loss within 1%.
    for ours, theirs in zip(replicated[1:], whole[1:]):
        assert abs(ours["top1"] - theirs["top1"]) <= 1 / 360 + 1e-12
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-2)


@pytest.mark.slow
def test_digits_reaches_its_target_in_bf16() -> None:
    # The forward passes and the evaluation's in bf16 autocast (the run's precision): the digits MLP
    # still reaches 90% top-1, and the curve's loss is the fp32 one of bf16 outputs (finite, falling).
    target = {"metric": "top1", "value": 0.9, **BUDGET}
    result = run_here("digits", "cpu", power_meter="none", precision="bf16", target=target)
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None and outcome.reached
    assert result.executor_details["autocast_dtype"] == "bfloat16"
    assert outcome.curve[-1].value >= 0.9
    assert outcome.curve[-1].metrics["loss"] < outcome.curve[0].metrics["loss"]


@pytest.mark.slow
def test_gradient_accumulation_keeps_the_global_batch_and_the_curve() -> None:
    from core.base.distributed import SINGLE_PROCESS
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.digits import Digits, DigitsOptions

    def curve(micro_batch_size: int, accumulation: int) -> list[dict[str, float]]:
        target = {"metric": "top1", "value": 1.0, "max_epochs": 3}
        config = make_config(
            workload="digits",
            accelerator="cpu",
            micro_batch_size=micro_batch_size,
            gradient_accumulation=accumulation,
            target=target,
        )
        assert config.samples_per_update == 32
        spec = Digits().build_torch(DigitsOptions(), seed=0)
        executor = TorchExecutor(spec, config, TorchPlacement(device="cpu"), SINGLE_PROCESS)
        points = []
        for _ in range(3):
            executor.run_steps(1437 // 32)
            points.append(executor.evaluate() or {})
        executor.close()
        return points

    whole, accumulated = curve(32, 1), curve(16, 2)
    assert whole[-1]["top1"] > 0.9  # it trained
    # Two micro-steps of 16 take the global batch's two halves, in order: the accumulated gradient is the
    # whole batch's up to rounding, so each epoch's top-1 is within one held-out image and the loss within 1%.
    for ours, theirs in zip(accumulated, whole):
        assert abs(ours["top1"] - theirs["top1"]) <= 1 / 360 + 1e-12
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-2)


def test_the_epoch_order_splits_one_global_batch_whatever_the_replicas_and_micro_steps() -> None:
    import numpy as np

    from core.data.epoch_order import EpochOrder

    whole = EpochOrder(100, seed=3, micro_batch=32, accumulation=1, replicas=1)
    split = EpochOrder(100, seed=3, micro_batch=8, accumulation=2, replicas=2)
    assert whole.updates_per_epoch == split.updates_per_epoch == 3  # the last 4 samples dropped
    for update in range(7):  # across three epochs
        pieces = [split.update(update, replica).ravel() for replica in range(2)]
        assert np.array_equal(np.concatenate(pieces), whole.update(update, 0).ravel())
    first, second = whole.permutation(0).copy(), whole.permutation(1)
    assert sorted(first) == list(range(100)) and not np.array_equal(first, second)
    assert np.array_equal(EpochOrder(100, 3, 32, 1, 1).permutation(0), first)  # from the seed alone
