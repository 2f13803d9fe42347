"""What every workload of the zoo shares: sources in well-kept libraries, a full and a small variant,
per-framework parameter counts and analytic FLOPs, seeded synthetic data.

A workload lists a framework only where it has an implementation. Planning refuses a framework
whose implementation's library is not installed (found with ``importlib.util.find_spec``, never
imported), naming the package to install; one that is installed but fails to load raises
``MissingLibraryError`` when the model is built.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.base.config import Framework
from core.base.errors import ConfigError, CoreError
from core.contract.pipeline import PipelineLayout, RecommendedSplit
from core.contract.workload import Workload, module_installed
from core.workloads.counting import Tally


class MissingLibraryError(CoreError, ImportError):
    """The library that implements a workload in the chosen framework is not installed or fails to load."""


@dataclass(frozen=True)
class Source:
    """Where one framework's implementation of a workload comes from."""

    name: str  # the class or function that builds the model, e.g. "transformers.ResNetForImageClassification"
    distribution: str  # the package that provides it, for its version
    module: str  # what to import
    install: str = ""  # how to get it, for the error when it is missing

    def version(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def missing(self) -> str | None:
        """What to install when the library's package cannot be found (nothing is imported)."""
        if module_installed(self.module):
            return None
        return (
            f"{self.distribution} ({self.name}), which is not installed here; "
            f"{self.install or 'pip install ' + self.distribution}"
        )

    def load(self, workload: str) -> Any:
        """Import the library, or raise MissingLibraryError saying what to install."""
        try:
            return importlib.import_module(self.module)
        except Exception as exc:  # ImportError, or a binary mismatch (torchvision against another torch build)
            raise MissingLibraryError(
                f"workload {workload!r} builds its model with {self.name}, but {self.distribution} "
                f"{'is not installed' if isinstance(exc, ModuleNotFoundError) else 'fails to load'} "
                f"({type(exc).__name__}: {exc}); {self.install or 'install ' + self.distribution} "
                "or choose another framework"
            ) from exc

    def record(self) -> dict[str, Any]:
        return {"source": self.name, "library": self.distribution, "library_version": self.version()}


def transformers_source(model_class: str) -> Source:
    return Source(
        f"transformers.{model_class}", "transformers", "transformers", "pip install 'core[zoo]' (transformers)"
    )


def keras_source(application: str) -> Source:
    # The Keras that TensorFlow brings (tf.keras): the one the Keras executor trains.
    return Source(f"keras.applications.{application}", "keras", "tensorflow", "pip install 'core[tensorflow]'")


def torchvision_source(builder: str) -> Source:
    # Not in an extra: each torchvision release pins one torch release, and pip would replace the
    # torch build (CPU, ROCm, an SDK's) that this environment was set up with.
    return Source(
        f"torchvision.models.{builder}",
        "torchvision",
        "torchvision.models",
        "install the torchvision release built for this environment's torch",
    )


Variant = Literal["full", "small"]


class ZooOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variant: Variant = Field(
        default="full",
        description="'full': the published model; 'small': the same architecture cut down for CI",
    )
    synthetic_pool_samples: int = Field(
        default=64, ge=1, le=1 << 16, description="distinct synthetic samples; sample i is pool[i % pool]"
    )


class ZooWorkload(Workload):
    """A zoo workload: one reference architecture, one implementation per framework.

    ``parameter_count`` and ``flops_per_sample`` are those of ``reference_framework``'s
    implementation (the one the paper ran); ``details()`` lists every framework's.
    """

    #: framework -> where its implementation comes from; ``frameworks`` lists the same keys
    sources: ClassVar[dict[Framework, Source]]
    reference_framework: ClassVar[Framework] = Framework.torch
    architecture: ClassVar[str] = ""
    #: what "parameter_count" counts, for the result
    parameter_count_counts: ClassVar[str] = "trainable parameters"
    #: fp32 values its optimizer keeps per parameter (SGD with momentum 1, Adam/AdamW 2)
    optimizer_state_floats: ClassVar[int | None] = None

    @abstractmethod
    def tally(self, options: Any, framework: Framework) -> Tally:
        """Parameters and forward MACs per sample of ``framework``'s implementation."""

    def torch_model(self, options: Any) -> Any:
        """The PyTorch module, untrained and without data: images -> logits, token ids -> logits, or
        images -> reconstructions. ``build_torch`` builds it from the run's seed; tests build it on the
        meta device to count its parameters and FLOPs."""
        raise NotImplementedError(f"workload {self.name!r} has no PyTorch implementation")

    #: the blocks a pipeline stage may begin at: a regular expression matched (``re.search``) against
    #: the module paths of ``torch_model``'s ``named_modules()``; None: no pipeline layout
    pipeline_blocks: ClassVar[str | None] = None
    #: what one of those blocks is, for messages
    pipeline_unit: ClassVar[str] = "block"
    #: the blocks are identical layers (transformers): a split may be given as layers per stage
    pipeline_repeated_layers: ClassVar[bool] = False

    def keras_model(self, options: Any) -> Any:
        """The Keras model (images -> logits, ...), untrained; ``build_keras`` builds it from the run's seed."""
        raise NotImplementedError(f"workload {self.name!r} has no TensorFlow implementation")

    #: Keras: a regular expression whose first group names the block a layer of ``keras_model``
    #: belongs to (``conv2_block1`` of ``conv2_block1_1_conv``); a block begins at its first layer
    keras_pipeline_blocks: ClassVar[str | None] = None

    def pipeline_layout(self, options: BaseModel, framework: Framework = Framework.torch) -> PipelineLayout | None:
        """The blocks matching ``pipeline_blocks`` (``keras_pipeline_blocks``), read off the model
        built on PyTorch's meta device (no memory, no arithmetic) or built by Keras, so that every
        name is one the built model really has."""
        if framework is Framework.tensorflow:
            return self._keras_pipeline_layout(options)
        if self.pipeline_blocks is None or Framework.torch not in self.sources:
            return None
        import torch

        with torch.device("meta"):
            model = self.torch_model(options)
        pattern = re.compile(self.pipeline_blocks)
        blocks = tuple(name for name, _ in model.named_modules() if name and pattern.search(name))
        return PipelineLayout(
            blocks=blocks,
            unit=self.pipeline_unit,
            repeated_layers=self.pipeline_repeated_layers,
            recommended=self.recommended_pipeline_splits(options, blocks),
            tied_to_first_stage=_tied_to_first_stage(model, blocks),
        )

    def _keras_pipeline_layout(self, options: Any) -> PipelineLayout | None:
        if self.keras_pipeline_blocks is None or Framework.tensorflow not in self.sources:
            return None
        pattern = re.compile(self.keras_pipeline_blocks)
        starts: dict[str, str] = {}  # block -> its first layer, in the model's layer order
        for layer in self.keras_model(options).layers:
            match = pattern.match(layer.name)
            if match is not None:
                starts.setdefault(match.group(1), layer.name)
        blocks = tuple(starts.values())
        return PipelineLayout(blocks, self.pipeline_unit, recommended=self.recommended_pipeline_splits(options, blocks))

    def recommended_pipeline_splits(self, options: Any, blocks: tuple[str, ...]) -> dict[int, RecommendedSplit]:
        """Stage count -> split points known to balance this model (a published configuration)."""
        return {}

    #: options that fix a size; a toy drops them so that the small variant's sizes apply
    toy_resets: ClassVar[tuple[str, ...]] = (
        "image_size",
        "sequence_length",
        "channels",
        "residual_blocks",
        "synthetic_pool_samples",
    )

    def toy_options(self, options: dict[str, Any]) -> dict[str, Any]:
        kept = {key: value for key, value in options.items() if key not in self.toy_resets}
        return {**kept, "variant": "small"}

    def missing_library(self, framework: Framework) -> str | None:
        source = self.sources.get(framework)
        return source.missing() if source is not None else None

    def check_options(self, options: Any) -> None:
        """Raise ConfigError for option combinations the architecture cannot take."""

    def parse_options(self, options: dict[str, Any]) -> BaseModel:
        parsed = super().parse_options(options)
        self.check_options(parsed)
        return parsed

    def parameter_count(self, options: BaseModel) -> int:
        return self.tally(options, self.reference_framework).parameters

    def flops_per_sample(self, options: BaseModel) -> float:
        return float(self.tally(options, self.reference_framework).training_flops)

    def optimizer_state_per_parameter(self, options: BaseModel) -> int | None:
        return self.optimizer_state_floats

    def figures_for(self, options: BaseModel, framework: Framework) -> tuple[int | None, float | None]:
        tally = self.tally(options, framework if framework in self.sources else self.reference_framework)
        return tally.parameters, float(tally.training_flops)

    def inference_flops_per_sample(self, options: BaseModel) -> float:
        # The tally's own forward count, not a third of training: layers that read the raw input
        # skip their input gradient, so training is less than three forwards.
        return float(self.tally(options, self.reference_framework).forward_flops)

    def inference_figures_for(self, options: BaseModel, framework: Framework) -> tuple[int | None, float | None]:
        tally = self.tally(options, framework if framework in self.sources else self.reference_framework)
        return tally.parameters, float(tally.forward_flops)

    def _torch_state_on_meta(self, options: BaseModel) -> dict[str, Any]:
        # (torch_state_shapes, torch_state_dtypes) the bare module on the meta device: no synthetic
        # pool, no memory for the weights.
        import torch

        with torch.device("meta"):
            return dict(self.torch_model(options).state_dict())

    def shape_details(self, options: Any) -> dict[str, Any]:
        """Input shape, labels, dataset: what the synthetic data looks like."""
        return {}

    def details(self, options: BaseModel) -> dict[str, Any]:
        implementations = {}
        for framework, source in self.sources.items():
            tally = self.tally(options, framework)
            implementations[framework.value] = {
                **source.record(),
                "parameter_count": tally.parameters,
                "flops_per_sample": float(tally.training_flops),
            }
        return {
            "architecture": self.architecture,
            "options": options.model_dump(),
            **self.shape_details(options),
            "samples_per_epoch": self.samples_per_epoch(options),
            "reference_framework": self.reference_framework.value,
            "implementations": implementations,
            "parameter_count_counts": self.parameter_count_counts,
            "flops_per_sample_counts": "multiply-adds of matmuls and convolutions x 2; backward twice the forward, "
            "except the input gradient of layers reading the raw input",
        }

    def load(self, framework: Framework) -> Any:
        return self.sources[framework].load(self.name)


def option_error(name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"workload_options.{name}", value, allowed)


def seeded(seed: int, build: Callable[[], Any]) -> Any:
    """Build torch modules from ``seed`` without disturbing the caller's global RNG."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def logits_module(model: Any, keyword: str) -> Any:
    """Wrap a transformers model so that ``module(x)`` returns its logits: ``model(**{keyword: x}).logits``."""
    from torch import nn

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs: Any) -> Any:
            return self.model(**{keyword: inputs}).logits

    return Logits()


def float32_logits(model: Any) -> Any:
    """A Keras model whose outputs are float32, so mixed-precision policies keep a stable softmax."""
    from tensorflow import keras

    outputs = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(model.output)
    return keras.Model(model.input, outputs, name=model.name)


def layers_per_stage_recommendation(
    blocks: tuple[str, ...], layers_per_stage: tuple[int, ...], source: str
) -> dict[int, RecommendedSplit]:
    """A published layers-per-stage split as split points, where the model has that many layers (the
    small variants have fewer, and get none)."""
    if sum(layers_per_stage) != len(blocks):
        return {}
    starts = [sum(layers_per_stage[:k]) for k in range(1, len(layers_per_stage))]
    return {len(layers_per_stage): RecommendedSplit(tuple(blocks[start] for start in starts), source)}


def _tied_to_first_stage(model: Any, blocks: tuple[str, ...]) -> tuple[str, ...]:
    """Modules after the last of ``blocks`` holding a weight that a module before the first holds
    too (transformers ties a language model's output layer to its input embedding: the same
    Parameter object, also on the meta device)."""
    if not blocks:
        return ()
    modules = [name for name, _ in model.named_modules()]
    first, last = modules.index(blocks[0]), modules.index(blocks[-1])
    last_block_prefix = blocks[-1] + "."
    before: set[int] = set()
    tied: list[str] = []
    for position, (name, module) in enumerate(model.named_modules()):
        own = {id(parameter) for parameter in module.parameters(recurse=False)}
        if position < first:
            before |= own
        elif position > last and not name.startswith(last_block_prefix) and own & before:
            tied.append(name)
    return tuple(tied)
