"""Inference as a run mode: the option, its refusals, the PyTorch inference executor (eval mode,
inference_mode, no optimizer, a query source for a load generator), forward-only FLOPs, latency
percentiles, weights from files checked in planning, top-1 accuracy, and the result's layout."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from core import ConfigError, Workload, run
from core.base.config import make_config
from core.base.distributed import SINGLE_PROCESS
from core.base.results import RunResult
from core.contract.manager import get_plugin_manager
from core.contract.workload import TorchTrainingSpec
from core.data.torch_datasets import ImageFolder
from core.executors.pytorch import TorchExecutor, TorchPlacement, torch_executor
from core.executors.pytorch_inference import TorchInferenceExecutor
from core.running.loadgen import QuerySource
from core.running.planning import plan_run
from core.storage.store import ResultStore
from core.testing import TINY_FCNN, registered_plugins

IMAGE_SHAPE = (3, 12, 12)
CLASSES = 3
QUICK = {"steps": 3, "warmup_steps": 1, "power_meter": "none"}


class TinyClassifier(Workload):
    """Images -> logits, with batch norm and dropout: layers that behave differently in eval mode."""

    name: ClassVar[str] = "tiny-classifier"
    default_micro_batch_size: ClassVar[int] = 4

    def build_torch(self, options: Any, seed: int) -> TorchTrainingSpec:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Dropout(0.5),
            torch.nn.Linear(4 * 10 * 10, CLASSES),
        )
        return TorchTrainingSpec(
            model=model,
            loss_fn=torch.nn.CrossEntropyLoss(),
            make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
            inputs=torch.randn(16, *IMAGE_SHAPE),
            targets=torch.randint(0, CLASSES, (16,)),
        )

    def flops_per_sample(self, options: Any) -> float:
        return 6.0 * (4 * 3 * 3 * 3 * 10 * 10 + 4 * 10 * 10 * CLASSES)


def placed(workload: Workload, **options: Any) -> Any:
    """The executor the CPU accelerator would build for ``options`` (planning included)."""
    plan = plan_run(get_plugin_manager(), workload, "cpu", {"power_meter": "none", **options})
    return plan.accelerator.executor_for(plan.workload, plan.context(SINGLE_PROCESS))


# --- the option and its refusals -----------------------------------------------------------------


def test_mode_defaults_to_train_and_takes_its_two_values_only() -> None:
    assert make_config(workload="fcnn", accelerator="cpu").mode == "train"
    assert make_config(workload="fcnn", accelerator="cpu", mode="inference").mode == "inference"
    for wrong in ("infer", "Inference", 1, True, None):
        with pytest.raises(ConfigError) as caught:
            make_config(workload="fcnn", accelerator="cpu", mode=wrong)
        assert caught.value.field == "mode"


@pytest.mark.parametrize(
    "options,field,says",
    [
        ({"mode": "inference", "gradient_accumulation": 4}, "gradient_accumulation", "one forward pass"),
        ({"accuracy": True}, "accuracy", "mode 'inference'"),
        ({"mode": "inference", "accuracy": True}, "accuracy", "labelled images"),
        ({"mode": "inference", "accuracy": 1}, "accuracy", "a boolean"),
        ({"mode": "inference", "weights": 3}, "weights", "a string"),
        ({"mode": "inference", "weights": "/no/such/file.safetensors"}, "weights", "no such file"),
    ],
)
def test_options_that_mean_nothing_in_the_mode_are_refused_by_name(options: dict, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "cpu", workload_options=TINY_FCNN, **QUICK, **options)
    assert caught.value.field == field and says in str(caught.value)
    assert caught.value.value == options[field]  # the value as given, its type kept


def test_an_accelerator_that_does_not_declare_inference_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = get_plugin_manager().accelerator("cpu")
    monkeypatch.setattr(type(accelerator), "supports_inference", False)
    with pytest.raises(ConfigError) as caught:
        run("fcnn", "cpu", mode="inference", workload_options=TINY_FCNN, **QUICK)
    assert caught.value.field == "mode" and "supports_inference" in str(caught.value)


# --- the executor ----------------------------------------------------------------------------------


def test_the_factory_builds_the_executor_of_the_mode() -> None:
    spec = TinyClassifier().build_torch(None, 0)
    placement = TorchPlacement(device="cpu")
    config = make_config(workload="w", accelerator="cpu", micro_batch_size=4)
    assert type(torch_executor(spec, config, placement, SINGLE_PROCESS)) is TorchExecutor
    inference = config.model_copy(update={"mode": "inference"})
    assert type(torch_executor(spec, inference, placement, SINGLE_PROCESS)) is TorchInferenceExecutor
    with pytest.raises(ValueError, match="torch_executor"):
        TorchExecutor(spec, inference, placement, SINGLE_PROCESS)


def test_one_step_is_one_forward_pass_in_eval_mode_without_gradients() -> None:
    executor = placed(TinyClassifier(), mode="inference", micro_batch_size=4)
    model = executor._placed_model
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    calls: list[torch.Tensor] = []
    model.register_forward_hook(lambda module, inputs, output: calls.append(output))
    executor.step()
    executor.step()
    executor.synchronize()
    executor.check_finite()
    assert len(calls) == 2 and not model.training
    assert calls[0].is_inference() and not calls[0].requires_grad
    assert all(p.grad is None for p in model.parameters())
    # Eval mode: dropout off and batch norm on its running statistics, so the same micro-batch gives
    # the same outputs, and nothing (running statistics included) changes.
    assert torch.equal(calls[0], calls[1])
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert not hasattr(executor, "_optimizer")
    assert executor.details()["mode"] == "inference" and executor.details()["ddp"] is False


def test_a_nan_output_is_reported_at_the_phase_boundary() -> None:
    executor = placed(TinyClassifier(), mode="inference", micro_batch_size=4)
    with torch.no_grad():
        executor._placed_model[5].bias.fill_(float("nan"))
    executor.step()
    from core.base.errors import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match="NaN/inf"):
        executor.check_finite()
    executor.check_finite()  # read and cleared: reported once


def test_the_executor_is_a_query_source_for_a_load_generator() -> None:
    executor = placed(TinyClassifier(), mode="inference", micro_batch_size=4)
    assert isinstance(executor, QuerySource)
    assert executor.total_samples == 16 and executor.performance_samples == 16
    seen: list[torch.Tensor] = []
    executor._placed_model.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    with pytest.raises(KeyError, match="not loaded"):
        executor.infer([0])
    executor.load([3, 5, 7])
    executor.infer([7, 3])
    assert torch.equal(seen[0], torch.stack([executor._pool_inputs[7], executor._pool_inputs[3]]))
    executor.unload([3])
    with pytest.raises(KeyError):
        executor.infer([3])


# --- figures ---------------------------------------------------------------------------------------


def test_an_inference_run_reports_latency_percentiles_and_forward_flops() -> None:
    result = run("fcnn", "cpu", mode="inference", micro_batch_size=8, workload_options=TINY_FCNN, **QUICK)
    assert result.status.ok, result.status
    assert result.mode == "inference" and result.config.mode == "inference"
    assert result.samples_per_update == 8 and result.window_samples == 24
    assert result.first_step_seconds is not None and result.window_seconds is not None
    assert result.step_seconds_median <= result.step_seconds_p90 <= result.step_seconds_p99  # type: ignore[operator]
    training = run("fcnn", "cpu", micro_batch_size=8, workload_options=TINY_FCNN, **QUICK)
    # FCNN's training FLOPs are 6 per weight; its forward is 2: a third, as the contract's default says.
    assert result.flops_per_sample == pytest.approx(training.flops_per_sample / 3)  # type: ignore[operator]
    assert result.flops_per_second == pytest.approx(result.flops_per_sample * result.throughput_per_second)


def test_a_zoo_workload_gives_its_analytic_forward_flops() -> None:
    w = get_plugin_manager().workload("resnet50")
    options = w.parse_options({"variant": "small"})
    tally = w.tally(options, w.reference_framework)  # type: ignore[attr-defined]
    assert w.inference_flops_per_sample(options) == tally.forward_flops
    # Not a third of training: the first convolution computes no input gradient when training.
    assert w.inference_flops_per_sample(options) > w.flops_per_sample(options) / 3  # type: ignore[operator]


def test_energy_per_sample_is_over_exactly_the_window() -> None:
    result = RunResult.of_config(
        make_config(workload="fcnn", accelerator="cpu", micro_batch_size=8, mode="inference"),
        1,
        window_samples=800,
        energy_joules=40.0,
        samples_per_watt_hour=800 / (40.0 / 3600),
    )
    assert result.energy_joules_per_sample == 0.05
    document = json.loads(result.to_json())
    assert document["mode"] == "inference" and document["energy_joules_per_sample"] == 0.05


# --- the result and the store ------------------------------------------------------------------------


def test_a_version_1_3_document_reads_as_a_training_run() -> None:
    result = RunResult.of_config(make_config(workload="fcnn", accelerator="cpu", micro_batch_size=8), 1)
    document = json.loads(result.to_json())
    for name in ("mode", "energy_joules_per_sample", "step_seconds_p99", "top1_accuracy", "accuracy_samples"):
        document.pop(name)
    for name in ("mode", "weights", "accuracy"):
        document["config"].pop(name)
    document["schema_version"] = "1.3"
    read = RunResult.model_validate_json(json.dumps(document))
    assert read.schema_version == "1.3" and read.mode == "train" and read.config.mode == "train"
    assert read.config.weights is None and read.config.accuracy is False


def test_the_store_and_its_csv_export_keep_the_mode(tmp_path: Path) -> None:
    inference = run("fcnn", "cpu", mode="inference", micro_batch_size=8, workload_options=TINY_FCNN, **QUICK)
    training = run("fcnn", "cpu", micro_batch_size=8, workload_options=TINY_FCNN, **QUICK)
    with ResultStore(tmp_path / "results.db") as store:
        store.add(inference, sweep="s", cell_key="inference", repeat=0)
        store.add(training, sweep="s", cell_key="train", repeat=0)
        assert {run.result.mode for run in store.runs(sweep="s")} == {"inference", "train"}
        buffer = io.StringIO()
        store.export_csv(buffer)
    import csv

    rows = {row["cell_key"]: row for row in csv.DictReader(io.StringIO(buffer.getvalue()))}
    assert rows["inference"]["mode"] == "inference" and rows["train"]["mode"] == "train"
    assert float(rows["inference"]["step_seconds_p99"]) > 0


def test_mode_is_a_sweep_axis_like_any_other(tmp_path: Path) -> None:
    from core.sweep.plan import expand_cells

    spec_file = tmp_path / "modes.toml"
    spec_file.write_text(
        'name = "modes"\n[grid]\nworkload = "fcnn"\naccelerator = "cpu"\nmode = ["train", "inference"]\n'
    )
    from core.sweep.spec import load_sweep

    cells = expand_cells(load_sweep(spec_file))
    assert sorted(cell.options["mode"] for cell in cells) == ["inference", "train"]


def test_the_cli_runs_inference_and_shows_latency(capsys: pytest.CaptureFixture[str]) -> None:
    from core.cli import main

    code = main(
        ["run", "fcnn", "--mode", "inference", "--steps", "2", "--warmup-steps", "1", "--power-meter", "none"]
        + [f"-o{key}={value}" for key, value in TINY_FCNN.items()]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "inference): ok" in out and "batch latency" in out and "p99" in out
    assert main(["run", "fcnn", "--mode", "inference", "--gradient-accumulation", "2"]) == 2
    assert "invalid gradient_accumulation (--gradient-accumulation) = 2" in capsys.readouterr().err


# --- weights from files --------------------------------------------------------------------------------


def _trained_state() -> dict[str, torch.Tensor]:
    spec = TinyClassifier().build_torch(None, seed=5)
    return {name: tensor.clone() for name, tensor in spec.model.state_dict().items()}


@pytest.mark.parametrize("kind", ["safetensors", "torch"])
def test_weights_load_from_a_file_into_the_placed_model(kind: str, tmp_path: Path) -> None:
    state = _trained_state()
    path = tmp_path / f"weights.{kind}"
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    with registered_plugins(TinyClassifierPlugin()):
        executor = placed(TinyClassifier(), mode="inference", weights=str(path))
    placed_state = executor._placed_model.state_dict()
    assert all(torch.equal(placed_state[name], tensor) for name, tensor in state.items())
    assert executor.details()["weights_format"] == kind


@pytest.mark.parametrize("kind", ["safetensors", "torch"])
def test_a_file_that_does_not_fit_the_model_is_refused_in_planning(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = _trained_state()
    state["5.weight"] = torch.zeros(CLASSES + 1, 400)
    path = tmp_path / f"wrong.{kind}"
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    accelerator = get_plugin_manager().accelerator("cpu")

    def no_device(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a device was touched")

    monkeypatch.setattr(type(accelerator), "executor_for", no_device)
    with pytest.raises(ConfigError) as caught:
        run(TinyClassifier(), "cpu", mode="inference", weights=str(path), **QUICK)
    assert caught.value.field == "weights" and caught.value.value == str(path)
    assert "'5.weight' is [4, 400] in the file, [3, 400] in the model" in str(caught.value)


def test_a_checkpoint_that_is_not_a_state_dict_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    torch.save({"model": _trained_state(), "epoch": 3}, path)
    with pytest.raises(ConfigError, match="not a state dict") as caught:
        run(TinyClassifier(), "cpu", mode="inference", weights=str(path), **QUICK)
    assert caught.value.field == "weights"


# --- accuracy ------------------------------------------------------------------------------------------


class TinyClassifierPlugin:
    from core import hookimpl

    @hookimpl
    def core_register_workloads(self, register: Any) -> None:
        register(TinyClassifier())


def _png(color: tuple[int, int, int], size: int = 20) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def labelled_images(tmp_path: Path) -> Path:
    """Made-up labelled images: each class a colour family, so a few steps learn something."""
    root = tmp_path / "images"
    for label, name in enumerate(["red", "green", "blue"]):
        (root / name).mkdir(parents=True)
        for i in range(6):
            color = [30 * i, 30 * i, 30 * i]
            color[label] = 255
            (root / name / f"{i}.png").write_bytes(_png((color[0], color[1], color[2])))
    return root


def test_top1_of_a_trained_and_saved_model_matches_evaluating_it_by_hand(labelled_images: Path, tmp_path: Path) -> None:
    workload = TinyClassifier()
    with registered_plugins(TinyClassifierPlugin()):
        # Train a few steps on the labelled images with core's own training executor, and save.
        trainer = placed(workload, data=str(labelled_images), data_workers=0, micro_batch_size=6)
        for _ in range(8):
            trainer.step()
        weights = tmp_path / "trained.safetensors"
        from safetensors.torch import save_file

        save_file(trainer.model_state(), str(weights))
        trainer.close()

        result = run(
            "tiny-classifier",
            "cpu",
            mode="inference",
            weights=str(weights),
            data=str(labelled_images),
            data_workers=0,
            accuracy=True,
            micro_batch_size=4,
            **QUICK,
        )
    assert result.status.ok, result.status

    # By hand: the same file, the same images, a plain eval-mode forward.
    model = workload.build_torch(None, seed=123).model
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(weights)))
    model.eval()
    images = ImageFolder(labelled_images, IMAGE_SHAPE)
    with torch.no_grad():
        inputs = torch.stack([images[i][0] for i in range(len(images))])
        labels = torch.stack([images[i][1] for i in range(len(images))])
        correct = int((model(inputs).argmax(dim=-1) == labels).sum())
    assert result.accuracy_samples == len(images) == 18
    assert result.top1_accuracy == correct / 18
    assert result.config.weights == str(weights) and result.executor_details["weights_tensors"] == 9


# --- Keras ----------------------------------------------------------------------------------------------


def test_keras_inference_runs_forward_passes_only() -> None:
    tf = pytest.importorskip("tensorflow")
    from core.executors.keras import KerasInferenceExecutor, KerasPlacement, keras_executor
    from core.workloads.fcnn import Fcnn, FcnnOptions

    config = make_config(
        workload="fcnn", accelerator="cpu", framework="tensorflow", mode="inference", micro_batch_size=4
    )
    # Built directly: the CPU accelerator sets TensorFlow's thread pools, which an earlier test may
    # have fixed already in this process.
    placement = KerasPlacement(lambda: tf.distribute.OneDeviceStrategy("/cpu:0"), 1, "/cpu:0")
    executor = keras_executor(Fcnn().build_keras(FcnnOptions(**TINY_FCNN), seed=0), config, placement)
    try:
        assert isinstance(executor, KerasInferenceExecutor)
        weights = [w.numpy().copy() for w in executor.model.weights]
        executor.step()
        executor.step()
        executor.synchronize()
        executor.check_finite()
        assert all((w.numpy() == before).all() for w, before in zip(executor.model.weights, weights))
        assert executor.optimizer is None and executor.details()["mode"] == "inference"
    finally:
        executor.close()


@pytest.mark.slow  # torchrun: one process per replica
def test_inference_replicas_are_independent_processes_without_ddp() -> None:
    result = run("fcnn", "cpu", mode="inference", replicas=2, micro_batch_size=8, workload_options=TINY_FCNN, steps=5)
    assert result.status.ok, result.status
    assert result.world_size == 2 and result.samples_per_update == 16
    assert result.executor_details["ddp"] is False
    assert result.window_samples == 5 * 16 and result.step_seconds_p99 is not None


@pytest.mark.parametrize("workload", ["segformer-b4", "deeplabv3plus-r101", "dino-swin-l", "bert-base-squad"])
def test_the_dense_and_language_models_run_inference(workload: str) -> None:
    pytest.importorskip("transformers")
    small = {"variant": "small"} if workload != "bert-base-squad" else {"variant": "small"}
    result = run(workload, "cpu", mode="inference", micro_batch_size=1, steps=2, warmup_steps=1, workload_options=small)
    assert result.status.ok, result.status
    training = get_plugin_manager().workload(workload)
    options = training.parse_options(small)
    assert result.flops_per_sample == pytest.approx(training.inference_flops_per_sample(options))


def test_an_inference_runs_dataset_epoch_is_the_evaluation_split() -> None:
    options = {"variant": "small"}
    inference = run(
        "resnet50", "cpu", mode="inference", micro_batch_size=2, steps=2, warmup_steps=0, workload_options=options
    )
    assert inference.status.ok, inference.status
    assert inference.samples_per_epoch == 50_000  # ImageNet's validation set, as the GH200 paper's Fig. 2
    assert inference.epoch_seconds == pytest.approx(50_000 / inference.throughput_per_second)
    fcnn = run("fcnn", "cpu", mode="inference", micro_batch_size=2, steps=2, warmup_steps=0, workload_options=TINY_FCNN)
    assert fcnn.samples_per_epoch is None  # no evaluation split known: no estimate rather than a wrong one
