"""core-example-plugin: a worked example of a third-party core plugin.

It registers, through the ``core`` entry-point group (see ../pyproject.toml):

- the accelerator ``example-cpu``: PyTorch on the host CPU with one thread, run by core's shared
  TorchExecutor (the plugin describes the device; it writes no training loop);
- the workload ``example-mlp``: a two-layer MLP on its own pool of synthetic samples.

Only ``core``, ``pydantic`` and the standard library are imported at module level: ``core plugins``
imports this module, and it must stay light. torch is imported inside the methods that run.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from core.plugin import (
    Accelerator,
    Availability,
    DeviceRecord,
    Framework,
    Precision,
    RunConfig,
    RunContext,
    TorchTrainingSpec,
    Workload,
    hookimpl,
)

if TYPE_CHECKING:
    from core.plugin import Executor

LEARNING_RATE = 0.01


# --- the accelerator -------------------------------------------------------------------------


def _use_one_thread(config: RunConfig) -> dict[str, Any]:
    """TorchPlacement.configure: runs in the executor before the model is built.

    Returns what it set; the executor copies it into ``result.executor_details`` (and keys ending
    in ``_threads`` also into ``result.environment.host_threads``).
    """
    import torch

    # Process-wide: a later run in the same process on another accelerator sets its own threads.
    torch.set_num_threads(1)
    return {"torch_num_threads": torch.get_num_threads()}


class ExampleCpuAccelerator(Accelerator):
    name: ClassVar[str] = "example-cpu"
    description: ClassVar[str] = "example plugin: PyTorch on one host CPU thread, via core's TorchExecutor"
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch,)
    # launcher stays None: with max_replicas_for 1 there is never a second process to start.

    def availability(self) -> Availability:
        # `core plugins` calls this: it must be cheap and import no framework. A vendor checks for
        # its device nodes and, with importlib.util.find_spec, for its SDK, without importing it.
        return Availability.yes()

    def precisions(self, framework: Framework) -> tuple[Precision, ...]:
        # fp16 autocast on a CPU is slow and tf32 does not exist there; offer what is worth running.
        return (Precision.fp32, Precision.bf16)

    def max_replicas_for(self, context: RunContext) -> int:
        return 1

    def devices(self) -> list[DeviceRecord]:
        return [
            DeviceRecord(
                index=0,
                name=platform.processor() or platform.machine() or "cpu",
                kind=self.name,
                details={"threads": 1},
            )
        ]

    def executor_for(self, workload: Workload, context: RunContext) -> Executor:
        # Imported here, not at the top: this module imports torch.
        from core.plugin import TorchExecutor, TorchPlacement

        config = context.config
        placement = TorchPlacement(
            device="cpu",
            configure=_use_one_thread,
            details={"plugin": "core-example-plugin"},
        )
        model = workload.build_torch(context.workload_options, config.seed)
        return TorchExecutor(model, config, placement, context.process)


# --- the workload ----------------------------------------------------------------------------


class ExampleMlpOptions(BaseModel):
    """Hyper-parameters, set with ``-o key=value``; extra="forbid" turns a typo into an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_width: int = Field(default=32, ge=1, le=1 << 16, description="input features")
    hidden_width: int = Field(default=64, ge=1, le=1 << 16, description="nodes of the hidden layer")
    output_width: int = Field(default=10, ge=2, le=1 << 16, description="output classes")
    synthetic_pool_samples: int = Field(
        default=256, ge=1, le=1 << 20, description="distinct synthetic samples; sample i is pool[i % pool]"
    )


def weight_count(o: ExampleMlpOptions) -> int:
    return o.input_width * o.hidden_width + o.hidden_width * o.output_width


def bias_count(o: ExampleMlpOptions) -> int:
    return o.hidden_width + o.output_width


class ExampleMlp(Workload):
    name: ClassVar[str] = "example-mlp"
    description: ClassVar[str] = "example plugin: Linear, ReLU, Linear on synthetic data"
    frameworks: ClassVar[tuple[Framework, ...]] = (Framework.torch,)
    default_micro_batch_size: ClassVar[int] = 16
    options_model: ClassVar[type[BaseModel]] = ExampleMlpOptions

    def parameter_count(self, options: BaseModel) -> int:
        # Every trainable number, biases included (what sum(p.numel()) gives for the model).
        assert isinstance(options, ExampleMlpOptions)
        return weight_count(options) + bias_count(options)

    def flops_per_sample(self, options: BaseModel) -> float:
        # 2 FLOPs per weight forward, 4 backward; bias additions are negligible and left out.
        assert isinstance(options, ExampleMlpOptions)
        return 6.0 * weight_count(options)

    def details(self, options: BaseModel) -> dict[str, Any]:
        assert isinstance(options, ExampleMlpOptions)
        return {
            "source": "core_example_plugin (docs/example-plugin)",
            "options": options.model_dump(),
            "weights": weight_count(options),
            "biases": bias_count(options),
        }

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        import torch
        from torch import nn

        assert isinstance(options, ExampleMlpOptions)
        o = options
        # fork_rng: the weights come from `seed` without disturbing the caller's global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = nn.Sequential(
                nn.Linear(o.input_width, o.hidden_width), nn.ReLU(), nn.Linear(o.hidden_width, o.output_width)
            )
        # The pool stays on the host; the executor copies each update's samples to the device once.
        generator = torch.Generator().manual_seed(seed + 1)
        inputs = torch.randn(o.synthetic_pool_samples, o.input_width, generator=generator)
        targets = torch.randint(0, o.output_width, (o.synthetic_pool_samples,), generator=generator)
        return TorchTrainingSpec(
            model=model,
            loss_fn=nn.CrossEntropyLoss(),  # a mean over the micro-batch, as the executor expects
            make_optimizer=lambda params: torch.optim.SGD(params, lr=LEARNING_RATE),
            inputs=inputs,
            targets=targets,
        )


# --- the hooks -------------------------------------------------------------------------------


@hookimpl
def core_register_accelerators(register: Callable[[Accelerator], None]) -> None:
    register(ExampleCpuAccelerator())


@hookimpl
def core_register_workloads(register: Callable[[Workload], None]) -> None:
    register(ExampleMlp())
