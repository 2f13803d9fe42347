"""What a workload plugin provides: a model, a loss, an optimizer and synthetic data per framework.

Nothing here imports a framework: the training specs hold framework objects as ``Any`` so that
``core workloads`` stays light.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from abc import ABC
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from core.base.config import Framework, RunConfig, config_errors
from core.contract.parallel import TensorParallelPlan
from core.contract.pipeline import PipelineLayout
from core.contract.shape import TransformerShape


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_plugin_options(model: type[BaseModel], options: dict[str, Any], field: str, owner: str) -> BaseModel:
    """Validate a plugin's options; a bad one raises ConfigError naming ``<field>.<key>``.

    Types are strict, whatever ``model`` says (docs/concepts.md): options are validated as the JSON
    values they are (``-o``, sweep files, worker processes), so an int field takes an int only (not
    ``True``, ``8.0`` or ``"8"``), a float field an int or a float, a bool field a bool, and enums
    and literals their values.
    """
    try:
        try:
            document = json.dumps(options, allow_nan=False)
        except (TypeError, ValueError):  # a Python object no JSON spells (or NaN): validate it as it is
            return model.model_validate(options, strict=True)
        return model.model_validate_json(document, strict=True)
    except ValidationError as exc:
        errors = config_errors(exc, model, unknown=f"unknown option for {owner}; allowed", prefix=field)
        raise errors[0] from None


#: framework -> (its module, how to install it), for planning's check that it is installed
FRAMEWORK_LIBRARIES: dict[Framework, tuple[str, str]] = {
    Framework.torch: ("torch", "pip install torch (the build for this accelerator)"),
    Framework.tensorflow: ("tensorflow", "pip install 'core[tensorflow]'"),
}


def module_installed(module: str) -> bool:
    """Whether ``module``'s top-level package can be imported, without importing it (find_spec of a
    dotted name would import its parents)."""
    top = module.partition(".")[0]
    try:
        return importlib.util.find_spec(top) is not None
    except ValueError:  # imported already, without a __spec__
        return top in sys.modules
    except ImportError:
        return False


@dataclass
class TorchTrainingSpec:
    """A PyTorch model ready to train: the executor moves it and the data to the device.

    ``inputs``/``targets`` are a pool of synthetic samples on the host; sample ``i`` of any run is
    ``pool[i % len(pool)]``, so data does not depend on how a global batch is split.
    """

    model: Any  # torch.nn.Module
    loss_fn: Callable[[Any, Any], Any]  # (outputs, targets) -> scalar mean loss
    make_optimizer: Callable[[Any], Any]  # parameters -> torch.optim.Optimizer
    inputs: Any  # torch.Tensor [pool, ...]
    targets: Any  # torch.Tensor [pool, ...]
    #: where the inputs are token ids, the vocabulary size: ids read from a token file are checked
    #: against it, so an id the model cannot embed is a data error naming the file
    vocabulary: int | None = None
    #: a labelled held-out split, the same for every seed (a run to a target evaluates on it: the
    #: executor's ``evaluate``); None where the workload has none. With it, ``inputs``/``targets``
    #: are the training split, which a run to a target reads in real, shuffled epochs
    evaluation_inputs: Any = None  # torch.Tensor [held-out samples, ...]
    evaluation_targets: Any = None  # torch.Tensor [held-out samples]: class indices
    #: a language model's held-out evaluation (a run to a target on token files): (logits, token ids)
    #: -> (the summed loss of every token predicted, a 0-d tensor; how many tokens were predicted).
    #: With it an evaluation gives the mean loss of a token and its perplexity, each token weighing
    #: the same over every process's sequences; without it, top-1 and the mean loss of a sample
    token_loss_sums: Callable[[Any, Any], tuple[Any, int]] | None = None
    #: how ``model``'s layers split over a tensor-parallel group (``Workload.tensor_parallel_plan``);
    #: None where the workload has none
    tensor_parallel_plan: TensorParallelPlan | None = None
    #: where ``model`` may be cut into pipeline stages (``Workload.pipeline_layout``); None where it
    #: names none
    pipeline_layout: PipelineLayout | None = None
    #: one pipeline stage of ``model``: (model, indices of the ``pipeline_layout`` blocks the stage
    #: holds, whether it is the first stage, the last) -> the stage's module, which keeps the model's
    #: parameter names and drops what other stages hold; its forward takes the previous stage's
    #: output (the first: the inputs) and returns the next stage's input (the last: the outputs)
    pipeline_stage: Callable[[Any, range, bool, bool], Any] | None = None


@dataclass
class KerasTrainingSpec:
    """A Keras model factory; ``make_model`` and ``make_optimizer`` run inside the strategy's scope."""

    make_model: Callable[[], Any]
    make_loss: Callable[[], Any]  # -> per-sample loss fn (targets, outputs) -> [batch]
    make_optimizer: Callable[[], Any]
    inputs: Any  # numpy array [pool, ...]
    targets: Any  # numpy array [pool, ...]
    details: dict[str, Any] = field(default_factory=dict)
    #: a labelled held-out split, as ``TorchTrainingSpec.evaluation_inputs``: with it, ``inputs``/``targets``
    #: are the training split, which a run to a target reads in real, shuffled epochs
    evaluation_inputs: Any = None  # numpy array [held-out samples, ...]
    evaluation_targets: Any = None  # numpy array [held-out samples]: class indices


#: what a task's held-out evaluation gives on real data (``Workload.evaluation_metrics_for``), each
#: metric with whether higher is better
TASK_EVALUATION_METRICS: Mapping[str, Mapping[str, bool]] = MappingProxyType(
    {
        "classification": MappingProxyType({"top1": True, "loss": False}),
        "language-modeling": MappingProxyType({"loss": False, "perplexity": False}),
    }
)
#: the real-data formats whose labelled splits a task's evaluation reads
TASK_EVALUATION_FORMATS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"classification": ("image-folder", "webdataset", "tfrecord"), "language-modeling": ("tokens",)}
)


class Workload(ABC):
    """A model and its data, buildable in one or more frameworks."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    task: ClassVar[str] = "classification"
    sample_unit: ClassVar[str] = "samples"
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch,)
    default_micro_batch_size: ClassVar[int] = 32
    #: convolutional models run faster with NHWC activations on GPUs (channels_last in PyTorch)
    prefers_channels_last: ClassVar[bool] = False
    options_model: ClassVar[type[BaseModel]] = NoOptions
    #: real-data formats (``--data PATH``: "image-folder", "webdataset", "tokens", "tfrecord") whose
    #: samples fit this workload's inputs; () takes synthetic data only. None (not declared) lets
    #: any format through planning, to fail when the data is loaded if the shapes do not fit.
    data_formats: ClassVar[tuple[str, ...] | None] = None
    #: the metrics its held-out evaluation gives, each with whether higher is better (``{"top1": True,
    #: "loss": False}``), where build_torch (and build_keras) give a labelled held-out split (``evaluation_inputs``)
    #: of real data: what ``target.metric`` may name. Empty: no such split, so no run to a target
    evaluation_metrics: ClassVar[Mapping[str, bool]] = MappingProxyType({})

    def evaluation_metrics_for(self, options: BaseModel, data_format: str | None) -> Mapping[str, bool]:
        """What a run to a target may name as ``target.metric`` with this data, each with whether higher
        is better: ``evaluation_metrics`` on the workload's own splits (``data_format`` None: synthetic
        or built in, as digits'); on a real data set split into training and held-out parts
        (``DATA/train``, ``DATA/val``), what the executors' evaluation gives for the task
        (:data:`TASK_EVALUATION_METRICS`: a classifier's top-1 and loss over labelled images, a
        language model's loss and perplexity over held-out tokens). Empty: no run to a target."""
        if data_format is None:
            return self.evaluation_metrics
        formats = TASK_EVALUATION_FORMATS.get(self.task, ())
        return TASK_EVALUATION_METRICS.get(self.task, MappingProxyType({})) if data_format in formats else {}

    def data_formats_for(self, framework: Framework) -> tuple[str, ...] | None:
        """The ``data_formats`` this workload reads with ``framework`` (planning also keeps to the
        formats the framework's executor reads)."""
        return self.data_formats

    def missing_library(self, framework: Framework) -> str | None:
        """What to install where the library that builds this workload in ``framework`` is missing
        (checked with ``importlib.util.find_spec``, never imported); None when nothing is missing."""
        return None

    def parse_options(self, options: dict[str, Any]) -> BaseModel:
        """Validate workload_options; errors name ``workload_options.<key>``."""
        return parse_plugin_options(self.options_model, options, "workload_options", f"workload {self.name!r}")

    def parameter_count(self, options: BaseModel) -> int | None:
        return None

    def optimizer_state_per_parameter(self, options: BaseModel) -> int | None:
        """fp32 values the optimizer keeps per parameter: 0 for plain SGD, 1 for SGD with momentum,
        2 for Adam and AdamW. Planning's memory fit counts it; None (not declared) makes planning
        assume Adam's 2 and say so."""
        return None

    def check_for_framework(self, options: BaseModel, framework: Framework) -> None:
        """Raise ConfigError for options that ``framework``'s implementation cannot build (Keras has
        only ResNet v1, say). Called in planning, after ``parse_options``."""

    def toy_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``workload_options`` shrunk to a toy that trains in a second on a CPU, architecture kept
        where it can be (``core sweep --toy``: a sweep file tried before its machine is booked)."""
        return dict(options)

    def figures_for(self, options: BaseModel, framework: Framework) -> tuple[int | None, float | None]:
        """(parameter count, training FLOPs per sample) of the model as ``framework`` builds it.

        Defaults to the framework-independent figures; a workload whose implementations differ
        between frameworks (Keras adds convolution biases, say) returns each one's own.
        """
        return self.parameter_count(options), self.flops_per_sample(options)

    def samples_per_epoch(self, options: BaseModel) -> int | None:
        """Samples in one epoch of the real dataset this workload stands for (ImageNet: 1,281,167)."""
        return None

    def evaluation_samples(self, options: BaseModel) -> int | None:
        """Samples in the real dataset's validation (or test) split: an inference run's epoch under
        ``epoch_definition = "dataset"`` (ImageNet: 50,000). None where unknown: no estimate then."""
        return None

    def tokens_per_sample(self, options: Any) -> int | None:
        """Tokens in one sample, for a workload whose sample is a token sequence (language models:
        the sequence length); None, the default, for any other. The result turns it into tokens/s
        and tokens/Wh next to sequences/s and sequences/Wh.

        ``options`` is typed ``Any`` (not ``BaseModel``) so that a workload may declare its own
        options class here, as the built-in language models do."""
        return None

    def head_classes(self, options: Any) -> int | None:
        """The classes a classifier's output layer predicts: planning checks that a run to a target's
        labelled image folder has no more class folders than that (a label the head cannot predict
        would break the loss mid-run). None, the default, checks nothing. ``options`` is typed as in
        :meth:`tokens_per_sample`."""
        return None

    def token_vocabulary(self, options: Any) -> int | None:
        """The vocabulary of a workload whose inputs are token ids (language models): every id read from
        a token file must lie below it. Planning checks a run to a target's token splits against it;
        None, the default, checks nothing. ``options`` is typed as in :meth:`tokens_per_sample`."""
        return None

    def flops_per_sample(self, options: BaseModel) -> float | None:
        """Training FLOPs (forward and backward) for one sample, where known analytically."""
        return None

    def memory_bytes_per_sample(self, options: BaseModel, config: RunConfig) -> float | None:
        """Bytes one device moves to and from its memory per sample, where known analytically:
        the roofline's denominator (arithmetic intensity = FLOPs per sample / this).

        ``config`` gives what the count depends on beyond the model: the micro-batch (weights are
        read once per micro-batch, shared by its samples), gradient accumulation (the optimizer
        runs once per update), the precision (bytes per activation) and the mode (inference moves
        no gradients). None, the default, where unknown: the report then draws no roofline point."""
        return None

    def inference_flops_per_sample(self, options: BaseModel) -> float | None:
        """Forward-only FLOPs for one sample (what an inference run's MFU counts).

        Defaults to a third of the training FLOPs where those are known: the backward pass costs
        about twice the forward (the gradients of the inputs and of the weights). A workload that
        knows its forward figure exactly (the zoo's do, from the same tally) returns that.
        """
        training = self.flops_per_sample(options)
        return None if training is None else training / 3

    def inference_figures_for(self, options: BaseModel, framework: Framework) -> tuple[int | None, float | None]:
        """(parameter count, forward FLOPs per sample) of the model as ``framework`` builds it: the
        inference counterpart of :meth:`figures_for`."""
        parameters, _ = self.figures_for(options, framework)
        return parameters, self.inference_flops_per_sample(options)

    def torch_state_shapes(self, options: BaseModel) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor in the PyTorch model's ``state_dict()``, as a weights file
        must hold them; planning compares a ``weights`` file against it before any device is touched.

        The default builds the training spec on PyTorch's meta device (shapes, no memory, no
        arithmetic); a workload whose builder cannot run there (it draws its synthetic data with a
        host generator, say) falls back to the host. A workload may override this with a cheaper form.
        """
        return {name: tuple(tensor.shape) for name, tensor in self._torch_state_on_meta(options).items()}

    def torch_state_dtypes(self, options: BaseModel) -> dict[str, str]:
        """Name -> dtype (PyTorch's name: ``float32``, ``int64``, ``bool``) of every tensor of the
        PyTorch model's ``state_dict()``: planning refuses a weights file whose tensor holds another
        kind of number (integers or booleans for floating-point weights), which ``load_state_dict``
        would cast without a word. Built as :meth:`torch_state_shapes` builds the model."""
        return {
            name: str(tensor.dtype).removeprefix("torch.")
            for name, tensor in self._torch_state_on_meta(options).items()
        }

    def _torch_state_on_meta(self, options: BaseModel) -> dict[str, Any]:
        import torch

        try:
            with torch.device("meta"):
                model = self.build_torch(options, 0).model
        except (RuntimeError, NotImplementedError, TypeError):
            model = self.build_torch(options, 0).model
        return dict(model.state_dict())

    def transformer_shape(self, options: Any) -> TransformerShape | None:
        """Layers, hidden size, attention heads, sequence length and vocabulary of a transformer (GPT,
        BERT, ViT): planning checks a split of a replica over devices against it (tensor_parallel
        divides the heads and the hidden size, no more pipeline stages than layers) and counts the
        activation memory from it, without building the model. None, the default: not a stack of
        identical transformer layers, so planning checks no split and counts no activations.
        ``options`` is typed as in :meth:`tokens_per_sample`."""
        return None

    def pipeline_layout(self, options: BaseModel, framework: Framework = Framework.torch) -> PipelineLayout | None:
        """Where ``framework``'s model may be cut into pipeline stages (a replica over several
        devices): its blocks (PyTorch: module paths; Keras: the layer each block begins with), and
        split points known to balance. None, the default: the accelerator falls back to its own
        rule (Graphcore: the outermost layers, or every layer with Keras)."""
        return None

    def tensor_parallel_plan(self, options: BaseModel) -> TensorParallelPlan | None:
        """How the PyTorch model's layers split over ``tensor_parallel`` devices (module paths of
        ``build_torch``'s model, colwise or rowwise, and the sizes the degree must divide). None, the
        default: the workload cannot run with ``tensor_parallel > 1`` (planning refuses it)."""
        return None

    def details(self, options: BaseModel) -> dict[str, Any]:
        """What the result records about the model: source, version, hyper-parameters."""
        return {"options": options.model_dump()}

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        raise NotImplementedError(f"workload {self.name!r} has no PyTorch implementation")

    def build_keras(self, options: BaseModel, seed: int) -> KerasTrainingSpec:
        raise NotImplementedError(f"workload {self.name!r} has no TensorFlow implementation")
