"""Runs to a target quality on the Graphcore plugin (docs/to-target.md), against the fake PopTorch
(tests/fakes/graphcore): digits trained in real epochs on the IPUs and evaluated there by an inference
model of the training model's module, replicas that keep the curve, a sharded evaluation equal to one
process's on the same weights, and the runs the plugin refuses before anything compiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from core.api import run_here
from core.base.distributed import SINGLE_PROCESS
from core.base.errors import ConfigError
from core.base.results import RunState
from core.contract.manager import get_plugin_manager
from core.running.planning import plan_run

pytestmark = pytest.mark.usefixtures("fake_sdk")

TARGET = {"metric": "top1", "value": 0.9, "max_epochs": 30}


def build(**options: Any) -> Any:
    """digits' PopTorch executor for a run to a target, as the runner's setup phase builds it."""
    plan = plan_run(get_plugin_manager(), "digits", "graphcore", {"power_meter": "none", "target": TARGET, **options})
    return plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS)), plan


def host_metrics(executor: Any, plan: Any) -> dict[str, float]:
    """top1 and loss of the executor's trained weights, read to the host, over the whole held-out split
    in one forward pass on the CPU: one process's evaluation."""
    spec = plan.workload.build_torch(plan.workload_options, plan.config.seed)
    spec.model.load_state_dict(executor.model_state())
    spec.model.eval()
    with torch.no_grad():
        outputs = spec.model(spec.evaluation_inputs).float()
    labels = spec.evaluation_targets
    return {
        "top1": float((outputs.argmax(-1) == labels).double().mean()),
        "loss": float(spec.loss_fn(outputs, labels)),
    }


def test_digits_reaches_its_target_on_ipus_with_a_curve(fake_sdk: Any) -> None:
    result = run_here("digits", "graphcore", power_meter="none", target=TARGET)
    outcome = result.to_target
    assert result.status.state is RunState.ok and outcome is not None, result.status
    assert outcome.reached and outcome.stopped_by == "target"
    last = outcome.curve[-1]
    assert last.value >= 0.9 and all(point.value < 0.9 for point in outcome.curve[:-1])
    # Real epochs of the training split: 1437 samples, 44 updates of 32 each.
    assert [point.samples for point in outcome.curve] == [44 * 32 * (i + 1) for i in range(len(outcome.curve))]
    assert outcome.epochs_to_target == pytest.approx(len(outcome.curve) * 44 * 32 / 1437)
    assert set(last.metrics) == {"top1", "loss"}
    details = result.executor_details
    assert details["dataset_samples"] == result.samples_per_epoch == 1437 and details["held_out_samples"] == 360
    assert "inferenceModel" in details["evaluation"]
    # Both executables compiled inside the clock, and recorded apart.
    assert 0 < details["compile_seconds"] and 0 < details["evaluation_compile_seconds"]
    assert fake_sdk.poptorch.fake_hardware.attached == []  # close() destroyed both executables


def test_two_replicas_give_one_replica_s_curve(fake_sdk: Any) -> None:
    one = run_here("digits", "graphcore", power_meter="none", target=TARGET).to_target
    two = run_here("digits", "graphcore", power_meter="none", target=TARGET, replicas=2, micro_batch_size=16).to_target
    assert one is not None and two is not None and one.reached and two.reached
    assert [p.samples for p in two.curve] == [p.samples for p in one.curve]
    for a, b in zip(one.curve, two.curve, strict=True):
        # The same samples per update: the curves differ by float rounding of the mean gradient only.
        assert abs(a.value - b.value) <= 1 / 360
        assert b.metrics["loss"] == pytest.approx(a.metrics["loss"], rel=1e-4)


@pytest.mark.parametrize(("replicas", "micro_batch"), [(1, 32), (3, 7), (4, 8)])
def test_the_sharded_evaluation_equals_one_process_s_on_the_same_weights(
    fake_sdk: Any, replicas: int, micro_batch: int
) -> None:
    # 360 held-out samples over 3 replicas of 7 (18 host calls, the last padded), or 4 of 8 (12 calls).
    executor, plan = build(replicas=replicas, micro_batch_size=micro_batch)
    try:
        for _ in range(5):
            executor.step()
        evaluated = executor.evaluate()
        expected = host_metrics(executor, plan)
        assert evaluated is not None
        assert round(evaluated["top1"] * 360) == round(expected["top1"] * 360)
        assert evaluated["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    finally:
        executor.close()


def test_evaluation_reads_the_trained_weights_and_changes_neither_them_nor_the_training(fake_sdk: Any) -> None:
    evaluated, plain = build(replicas=2, micro_batch_size=16)[0], build(replicas=2, micro_batch_size=16)[0]
    try:
        before = evaluated.evaluate()
        for _ in range(4):
            evaluated.step()
            plain.step()
        weights = evaluated.model_state()
        after = evaluated.evaluate()
        assert before is not None and after is not None and after["loss"] < before["loss"]
        assert all(torch.equal(weights[name], evaluated.model_state()[name]) for name in weights)
        for _ in range(3):  # the next updates read the same samples as a run that never evaluated
            evaluated.step()
            plain.step()
        trained, untouched = evaluated.model_state(), plain.model_state()
        assert all(torch.allclose(trained[name], untouched[name], atol=1e-6) for name in trained)
        assert evaluated.dataset_samples() == 1437
    finally:
        evaluated.close()
        plain.close()


@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({"devices_per_replica": 2, "gradient_accumulation": 4}, "devices_per_replica", "not pipelined"),
        ({"device_iterations": 2}, "device_iterations", "between weight updates"),
        ({"accelerator_options": {"instances": 2}, "replicas": 2}, "accelerator_options.instances", "held-out"),
    ],
)
def test_a_target_the_plugin_cannot_run_is_refused_naming_the_field(
    fake_sdk: Any, options: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(ConfigError, match=rule) as refused:
        run_here("digits", "graphcore", power_meter="none", target=TARGET, **options)
    assert refused.value.field == field
    assert fake_sdk.poptorch.fake_hardware.attached == []


def test_a_target_from_an_image_folder_is_refused_on_ipus(fake_sdk: Any, tmp_path: Path) -> None:
    from core.workloads.digits import write_image_folder

    write_image_folder(str(tmp_path), per_split=40)
    with pytest.raises(ConfigError, match="own training and held-out splits") as refused:
        run_here("digits", "graphcore", power_meter="none", data=str(tmp_path), micro_batch_size=8, target=TARGET)
    assert refused.value.field == "data"


def test_a_target_under_ipu_keras_is_refused_naming_the_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    from core_plugins.graphcore import accelerator

    monkeypatch.setattr(accelerator, "_tensorflow_is_graphcore_build", lambda: True)  # the SDK's TensorFlow
    with pytest.raises(ConfigError, match="IPU Keras executor does not evaluate") as refused:
        run_here("digits", "graphcore", power_meter="none", framework="tensorflow", target=TARGET)
    assert refused.value.field == "framework"


# --- the fake's weights, as PopTorch moves them (python/_poplar_executor.py) ---------------------------


def test_the_fake_keeps_trained_weights_on_the_device_until_they_are_read(fake_sdk: Any) -> None:
    poptorch = fake_sdk.poptorch
    torch.manual_seed(0)
    inner = torch.nn.Linear(4, 2)

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
            out = self.inner(x)
            return poptorch.identity_loss(((out - y) ** 2).mean(), reduction="none") if self.training else out

    model = WithLoss()
    initial = inner.weight.detach().clone()
    training = poptorch.trainingModel(model, poptorch.Options(), torch.optim.SGD(model.parameters(), lr=0.5))
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    training(x, y)
    # The host's tensors still hold the initial weights: the trained ones are on the device.
    assert torch.equal(inner.weight.detach(), initial)
    # An inference model of another module (here the submodule) attaches with the host's weights.
    stale = poptorch.inferenceModel(inner, poptorch.Options())
    assert torch.allclose(stale(x), torch.nn.functional.linear(x, initial, inner.bias.detach()))
    # One of the module the training model wraps copies the trained weights to host and device first.
    model.eval()
    fresh = poptorch.inferenceModel(model, poptorch.Options())
    trained_out = fresh(x)
    assert not torch.equal(inner.weight.detach(), initial)
    assert torch.allclose(trained_out, inner(x))
    for executable in (training, stale, fresh):
        executable.destroy()
    assert type(model) is WithLoss and poptorch.fake_hardware.attached == []
