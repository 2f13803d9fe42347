"""Non-finite detection cannot miss: a NaN/inf in the loss or in the gradients of any update since
the last check is reported, the window's last update included, in both executors.

Each case injects the fault where no kernel can mask it (a loss that returns NaN, a gradient
hook or custom gradient that returns inf) at a chosen update and micro-step, then drives the
executor as the runner does: steps, synchronize(), check_finite(). TensorFlow runs with its
defaults (oneDNN on).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from launching import torchrun_two_ranks

from core import RunState, Workload, run
from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.base.errors import NonFiniteLossError
from core.contract.workload import TorchTrainingSpec
from core.executors.pytorch import TorchDeviceHooks, TorchExecutor, TorchPlacement
from core.testing import TINY_FCNN, registered_plugins
from core.workloads.fcnn import Fcnn, FcnnOptions

OPTIONS = {"layers": 3, "hidden_width": 32, "input_width": 20, "output_width": 10}
UPDATES = 3  # the fault goes into the last of them unless a test says otherwise
NAN, INF = float("nan"), float("inf")


# --- PyTorch -----------------------------------------------------------------------------------


class Faults:
    """Counts micro-steps (loss calls, backward passes) and injects a fault at chosen ones."""

    def __init__(
        self,
        nan_loss_at: int | None = None,
        inf_gradient_at: int | None = None,
        gradient: float = INF,
        nan_losses_from: int | None = None,
    ) -> None:
        self.nan_loss_at, self.inf_gradient_at, self.gradient = nan_loss_at, inf_gradient_at, gradient
        self.nan_losses_from = nan_losses_from
        self.loss_calls = self.backward_calls = 0
        self.losses: list[float] = []

    def wrap_loss(self, loss_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            self.loss_calls += 1
            value = loss_fn(outputs, targets)
            self.losses.append(float(value.detach()))  # a test-only sync: the executor never does this
            # Adding a constant NaN leaves every gradient finite: only the loss check sees it.
            every_later = self.nan_losses_from is not None and self.loss_calls >= self.nan_losses_from
            return value + NAN if self.loss_calls == self.nan_loss_at or every_later else value

        return loss

    def gradient_hook(self, grad: torch.Tensor) -> torch.Tensor:
        self.backward_calls += 1
        # Replaces the first layer's gradient after the loss is computed: only the gradient check sees it.
        return torch.full_like(grad, self.gradient) if self.backward_calls == self.inf_gradient_at else grad


def torch_executor(
    faults: Faults, accumulation: int = 1, precision: str = "fp32", fold_every: int | None = None
) -> TorchExecutor:
    spec = Fcnn().build_torch(FcnnOptions(**OPTIONS), seed=0)
    spec.loss_fn = faults.wrap_loss(spec.loss_fn)
    spec.model[0].weight.register_hook(faults.gradient_hook)
    config = make_config(
        workload="fcnn",
        accelerator="cpu",
        workload_options=OPTIONS,
        micro_batch_size=8,
        gradient_accumulation=accumulation,
        precision=precision,
    )
    hooks = TorchDeviceHooks()
    if fold_every is not None:
        hooks.losses_folded_every = fold_every
    return TorchExecutor(spec, config, TorchPlacement(device="cpu", hooks=hooks), SINGLE_PROCESS)


def run_window(executor: Any, updates: int = UPDATES) -> None:
    """What the runner does in a phase, up to the check."""
    for _ in range(updates):
        executor.step()
    executor.synchronize()


@pytest.mark.parametrize("accumulation,micro_step", [(1, 0), (3, 0), (3, 2)])
def test_torch_nan_loss_in_the_last_update_is_reported_then_resets(accumulation: int, micro_step: int) -> None:
    faults = Faults(nan_loss_at=(UPDATES - 1) * accumulation + micro_step + 1)
    executor = torch_executor(faults, accumulation)
    run_window(executor)
    with pytest.raises(NonFiniteLossError, match="NaN/inf"):
        executor.check_finite()
    executor.check_finite()  # reported once: the flag starts again from clear
    # The gradients stayed finite, so the weights did too: the next update is clean.
    run_window(executor, 1)
    executor.check_finite()


@pytest.mark.parametrize("accumulation,micro_step", [(1, 0), (2, 0), (2, 1)])
def test_torch_inf_gradient_with_a_finite_loss_in_the_last_update_is_reported(
    accumulation: int, micro_step: int
) -> None:
    faults = Faults(inf_gradient_at=(UPDATES - 1) * accumulation + micro_step + 1)
    executor = torch_executor(faults, accumulation)
    run_window(executor)
    assert all(np.isfinite(faults.losses))  # a loss-only check would have passed this window
    with pytest.raises(NonFiniteLossError):
        executor.check_finite()
    executor.check_finite()


def test_torch_a_clean_window_passes() -> None:
    executor = torch_executor(Faults(), accumulation=2)
    run_window(executor)
    executor.check_finite()


@pytest.mark.parametrize("fold_every", [1, 2, 256])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_torch_names_the_update_whose_loss_was_nan_first(fold_every: int, accumulation: int) -> None:
    """The losses are folded into a record on the device every few updates (the fold here falls
    before, inside and after the fault's phase); the check names the first NaN loss's update,
    counted from the run's first, though every later loss is NaN too."""
    bad_update = 4  # the second phase's second update
    faults = Faults(nan_losses_from=(bad_update - 1) * accumulation + accumulation)  # its last micro-step
    executor = torch_executor(faults, accumulation, fold_every=fold_every)
    run_window(executor, 2)
    executor.check_finite()
    run_window(executor, 4)
    micro_step = f", micro-step {accumulation} of {accumulation}" if accumulation > 1 else ""
    with pytest.raises(NonFiniteLossError, match=f"loss was NaN/inf in update {bad_update} of the run{micro_step},"):
        executor.check_finite()
    executor.check_finite()  # nothing ran since


def test_torch_a_nan_gradient_with_finite_losses_is_found_in_the_weights_at_the_check() -> None:
    """No update reads its gradients: a NaN one that no loss shows (the phase's last update's)
    is caught by the check's read of the weights, which the optimizer step made NaN."""
    faults = Faults(inf_gradient_at=UPDATES, gradient=NAN)
    executor = torch_executor(faults)
    run_window(executor)
    assert all(np.isfinite(faults.losses))
    with pytest.raises(
        NonFiniteLossError, match=f"a weight after a NaN/inf gradient, in one of updates 1 to {UPDATES}"
    ):
        executor.check_finite()
    executor.check_finite()  # nothing ran since


def test_torch_a_nan_gradient_before_the_phases_last_update_shows_in_the_next_loss() -> None:
    faults = Faults(inf_gradient_at=2, gradient=NAN)
    executor = torch_executor(faults)
    run_window(executor, 4)
    assert np.isfinite(faults.losses[:2]).all() and np.isnan(faults.losses[2])
    with pytest.raises(NonFiniteLossError, match="loss was NaN/inf in update 3 of the run"):
        executor.check_finite()


def test_torch_fp16_scaler_skips_are_not_reported_but_a_nan_loss_is() -> None:
    # An inf in the scaled gradients is loss scaling's business: the step is skipped, the scale halves.
    executor = torch_executor(Faults(inf_gradient_at=UPDATES), accumulation=1, precision="fp16")
    assert executor.precision.scales_loss
    run_window(executor, UPDATES - 1)
    before, scale = executor.model_state(), executor.precision.scaler.get_scale()
    run_window(executor, 1)
    assert all(torch.equal(before[k], v) for k, v in executor.model_state().items())
    assert executor.precision.scaler.get_scale() == scale / 2
    executor.check_finite()

    executor = torch_executor(Faults(nan_loss_at=2 * UPDATES), accumulation=2, precision="fp16")
    run_window(executor)
    with pytest.raises(NonFiniteLossError):
        executor.check_finite()


def test_a_nan_gradient_in_the_windows_last_update_fails_the_run() -> None:
    """End to end: the fault enters in the very last update and is in the window's status."""
    from core_plugins.cpu.accelerator import CpuAccelerator

    steps, warmup = 3, 1
    faults = Faults(inf_gradient_at=1 + warmup + steps)  # first step + warm-up + window

    class LastUpdateFault(Workload):
        name: ClassVar[str] = "fcnn-fault-in-last-update"
        options_model = FcnnOptions

        def build_torch(self, options: Any, seed: int) -> TorchTrainingSpec:
            spec = Fcnn().build_torch(options, seed)
            spec.model[0].weight.register_hook(faults.gradient_hook)
            return spec

    with registered_plugins():
        result = run(
            LastUpdateFault(),
            CpuAccelerator(),
            micro_batch_size=4,
            steps=steps,
            warmup_steps=warmup,
            power_meter="none",
            workload_options=TINY_FCNN,
        )
    assert faults.backward_calls == 1 + warmup + steps
    assert result.status.state is RunState.non_finite_loss and result.status.phase == "window"


def test_a_run_names_the_update_whose_loss_was_nan() -> None:
    """End to end: the first step is update 1, the warm-up's are 2 and 3, the window's 4 to 7."""
    from core_plugins.cpu.accelerator import CpuAccelerator

    bad_update = 6
    faults = Faults(nan_loss_at=bad_update)

    class NanLossAtAnUpdate(Workload):
        name: ClassVar[str] = "fcnn-nan-loss-at-an-update"
        options_model = FcnnOptions

        def build_torch(self, options: Any, seed: int) -> TorchTrainingSpec:
            spec = Fcnn().build_torch(options, seed)
            spec.loss_fn = faults.wrap_loss(spec.loss_fn)
            return spec

    with registered_plugins():
        result = run(
            NanLossAtAnUpdate(),
            CpuAccelerator(),
            micro_batch_size=4,
            steps=4,
            warmup_steps=2,
            power_meter="none",
            workload_options=TINY_FCNN,
        )
    assert result.status.state is RunState.non_finite_loss and result.status.phase == "window"
    assert f"update {bad_update} of the run" in (result.status.message or ""), result.status


DDP_WORKER = textwrap.dedent("""
    import gc, json, sys, torch
    from core.base.config import make_config
    from core.base.distributed import ProcessContext
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.fcnn import Fcnn, FcnnOptions
    options = {options!r}
    process = ProcessContext.from_environment()
    verdicts = {{}}
    for case in ("clean", "inf_gradient_on_rank_1", "nan_loss_on_rank_1"):
        spec = Fcnn().build_torch(FcnnOptions(**options), seed=0)
        calls = {{"loss": 0, "grad": 0}}
        last = 3 * 2  # the last micro-step of the third update (accumulation 2)
        loss_fn = spec.loss_fn
        def loss(outputs, targets, case=case, calls=calls):
            calls["loss"] += 1
            value = loss_fn(outputs, targets)
            hit = case == "nan_loss_on_rank_1" and process.rank == 1 and calls["loss"] == last
            return value + float("nan") if hit else value
        def hook(grad, case=case, calls=calls):
            calls["grad"] += 1
            hit = case == "inf_gradient_on_rank_1" and process.rank == 1 and calls["grad"] == last
            return torch.full_like(grad, float("inf")) if hit else grad
        spec.loss_fn = loss
        spec.model[0].weight.register_hook(hook)
        config = make_config(workload="fcnn", accelerator="cpu", micro_batch_size=4, gradient_accumulation=2,
                             replicas=2, workload_options=options)
        executor = TorchExecutor(spec, config, TorchPlacement(device="cpu", distributed_backend="gloo"), process)
        for _ in range(3):
            executor.step()
        executor.synchronize()
        try:
            executor.check_finite()
            verdicts[case] = "finite"
        except Exception as exc:
            verdicts[case] = type(exc).__name__
        executor.check_finite()  # cleared on every rank alike
        executor.barrier()
        if case != "nan_loss_on_rank_1":
            # The process group serves every case: free this case's DDP model now, so only the
            # last executor is alive when close() destroys the group, as in a single run.
            del executor
            gc.collect()
    executor.close()
    with open(sys.argv[1] + f".{{process.rank}}", "w") as out:
        json.dump(verdicts, out)
""")


@pytest.mark.slow
def test_ddp_ranks_agree_on_a_fault_seen_by_one_rank(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(DDP_WORKER.format(options=OPTIONS))
    out = tmp_path / "verdicts"
    completed = torchrun_two_ranks(script, out, tmp_path / "torchelastic")
    assert completed.returncode == 0, completed.stderr[-3000:]
    expected = {
        "clean": "finite",
        "inf_gradient_on_rank_1": "NonFiniteLossError",
        "nan_loss_on_rank_1": "NonFiniteLossError",
    }
    for rank in (0, 1):
        assert json.loads(Path(f"{out}.{rank}").read_text()) == expected, rank


# --- Keras -------------------------------------------------------------------------------------


def keras_executor(trigger: Any, fault: str, accumulation: int = 1, precision: str = "fp32", jit: bool = False) -> Any:
    """An FCNN whose loss is NaN, or whose first layer's gradient is inf, while ``trigger`` is 1."""
    tf = pytest.importorskip("tensorflow")
    from tensorflow import keras

    from core.executors.keras import KerasExecutor, KerasPlacement

    spec = Fcnn().build_keras(FcnnOptions(**OPTIONS), seed=0)
    make_model, make_loss = spec.make_model, spec.make_loss

    @tf.custom_gradient
    def poison_gradient(x: Any) -> Any:
        def grad(dy: Any) -> Any:
            return dy * tf.cast(tf.where(trigger > 0, INF, 1.0), dy.dtype)

        return tf.identity(x), grad

    class GradientFault(keras.layers.Layer):  # identity forward: the loss never sees it
        def call(self, x: Any) -> Any:
            return poison_gradient(x)

    def model() -> Any:
        built = make_model()
        if fault != "inf_gradient":
            return built
        # Between the first Dense and the rest: every weight upstream gets an inf gradient.
        layers = built.layers
        return keras.Sequential([keras.Input(shape=(OPTIONS["input_width"],)), layers[0], GradientFault(), *layers[1:]])

    def loss() -> Any:
        per_sample = make_loss()
        if fault != "nan_loss":
            return per_sample
        # A constant NaN added to the loss: every gradient stays finite.
        return lambda y, outputs: per_sample(y, outputs) + tf.where(trigger > 0, NAN, 0.0)

    spec.make_model, spec.make_loss = model, loss
    config = make_config(
        workload="fcnn",
        accelerator="cpu",
        framework="tensorflow",
        micro_batch_size=8,
        gradient_accumulation=accumulation,
        precision=precision,
    )
    placement = KerasPlacement(lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), 1, "/cpu:0", jit)
    return KerasExecutor(spec, config, placement)


def keras_window_with_fault_in_last_update(executor: Any, trigger: Any) -> None:
    trigger.assign(0.0)
    run_window(executor, UPDATES - 1)
    trigger.assign(1.0)
    run_window(executor, 1)
    trigger.assign(0.0)


@pytest.fixture
def trigger() -> Any:
    tf = pytest.importorskip("tensorflow")
    return tf.Variable(0.0, trainable=False)


@pytest.mark.tensorflow
@pytest.mark.parametrize("fault", ["nan_loss", "inf_gradient"])
@pytest.mark.parametrize("accumulation,jit", [(1, False), (2, False), (2, True)])
def test_keras_fault_in_the_last_update_is_reported_then_resets(
    trigger: Any, fault: str, accumulation: int, jit: bool
) -> None:
    executor = keras_executor(trigger, fault, accumulation, jit=jit)
    try:
        keras_window_with_fault_in_last_update(executor, trigger)
        # A NaN loss names its update (the last of UPDATES); a gradient's fault, found in the
        # weights at the check, the updates since the last check.
        message = (
            f"training loss was NaN/inf in update {UPDATES} of the run"
            if fault == "nan_loss"
            else f"a weight after a NaN/inf gradient, in one of updates 1 to {UPDATES} of the run"
        )
        with pytest.raises(NonFiniteLossError, match=message):
            executor.check_finite()
        executor.check_finite()  # reported once
        if fault == "nan_loss":  # finite gradients left the weights finite: the next update is clean
            run_window(executor, 1)
            executor.check_finite()
    finally:
        executor.close()


@pytest.mark.tensorflow
def test_keras_a_clean_window_passes(trigger: Any) -> None:
    executor = keras_executor(trigger, "inf_gradient", accumulation=2)
    try:
        run_window(executor)
        executor.check_finite()
    finally:
        executor.close()


@pytest.mark.tensorflow
def test_keras_fp16_loss_scale_skips_are_not_reported_but_a_nan_loss_is(trigger: Any) -> None:
    executor = keras_executor(trigger, "inf_gradient", precision="fp16")
    try:
        run_window(executor, 1)
        before = [np.array(v.numpy()) for v in executor.model.trainable_variables]
        trigger.assign(1.0)
        run_window(executor, 1)  # overflowing gradients: the optimizer skips this update
        after = [np.array(v.numpy()) for v in executor.model.trainable_variables]
        assert all(np.array_equal(a, b) for a, b in zip(before, after))
        executor.check_finite()
    finally:
        executor.close()

    executor = keras_executor(trigger, "nan_loss", precision="fp16")
    try:
        keras_window_with_fault_in_last_update(executor, trigger)
        with pytest.raises(NonFiniteLossError):
            executor.check_finite()
    finally:
        executor.close()


@pytest.mark.tensorflow
def test_keras_names_the_update_whose_loss_was_nan_first(trigger: Any) -> None:
    """Each replica counts its updates before its running loss sum went NaN (it stays so): the
    check names the first NaN loss's update, counted from the run's first, not a later one's."""
    executor = keras_executor(trigger, "nan_loss", accumulation=2)
    try:
        run_window(executor, 2)
        executor.check_finite()
        run_window(executor, 1)  # update 3: clean
        trigger.assign(1.0)
        run_window(executor, 2)  # updates 4 and 5: NaN losses
        trigger.assign(0.0)
        run_window(executor, 1)
        with pytest.raises(NonFiniteLossError, match="training loss was NaN/inf in update 4 of the run"):
            executor.check_finite()
        executor.check_finite()  # nothing ran since
    finally:
        executor.close()
