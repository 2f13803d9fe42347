"""The PopTorch executor: one ``step()`` is one host call, running ``device_iterations`` weight
updates on the IPUs.

Setup (``__init__``) builds the workload on the host, pipelines it (``BeginBlock`` per stage) when
a replica spans several IPUs, builds the ``poptorch.Options``, wraps model and optimizer with
``poptorch.trainingModel``, and takes one host call's samples from a ``poptorch.DataLoader``.
The first ``step()`` compiles explicitly (``PoplarExecutor.compile``) and then runs, so compilation
falls in the runner's first-step phase, apart from the steady window; its own duration is recorded
as ``compile_seconds`` (the ACES paper's first epoch against the second).

Data: sample ``i`` of an update is ``pool[i % pool]`` as everywhere in core. A host call's combined
batch is laid out ``[device_iterations, gradient_accumulation, replicas, micro_batch]`` (PopART's
input layout, graphcore/popart ``docs/popart/glossary.rst``), and replica ``r`` holds samples
``[(r x GA + a) x micro, ...)`` of the update, so every update trains on the same global batch as
the other placements. The batch is built once, in setup; each call streams it to the IPUs, which
is part of what a host call costs and so is inside the window.

Imported only when a run starts: it imports torch at the top, and PopTorch through the caller.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from core.plugin import (
    SYNTHETIC_SOURCES,
    ConfigError,
    Executor,
    HostStepClock,
    NonFiniteLossError,
    PipelineLayout,
    PrecisionPolicy,
    RunConfig,
    StepClock,
    TorchTrainingSpec,
    metrics_from_sums,
    outcome_sums,
)

from .data import HostCallFiles
from .options import OptionSettings, build_options, numerics_summary, options_summary
from .pipeline import DEFAULT_SPLIT, SplitChoice, StagePlan, assign_blocks, plan_stages
from .placement import IpuPlacement, host_call_samples, plan_placement
from .to_target import HeldOutHostCalls, HostCallEpochs


class ModelWithLoss(torch.nn.Module):
    """What ``poptorch.trainingModel`` wants: a model that returns its loss; in eval mode, as a run to a
    target's ``poptorch.inferenceModel`` of this same module calls it, the model's outputs."""

    def __init__(self, model: torch.nn.Module, loss_fn: Any, identity_loss: Any) -> None:
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn
        self._identity_loss = identity_loss

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training:
            return self.model(inputs)
        # identity_loss marks the (already reduced) loss as where backpropagation starts, whatever
        # the workload computes it with (graphcore/poptorch python/ops.py).
        return self._identity_loss(self._loss_fn(self.model(inputs), targets), reduction="none")


def host_call_indices(placement: IpuPlacement, instance_index: int, pool: int) -> torch.Tensor:
    """Pool indices of one host call of this instance, flattened from [D, GA, R_local, micro]."""
    return torch.tensor(host_call_samples(placement, instance_index), dtype=torch.long) % pool


class _PoolSamples(torch.utils.data.Dataset):
    """Samples ``indices`` of the synthetic pool, in order."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        self._inputs, self._targets, self._indices = inputs, targets, indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = int(self._indices[index])
        return self._inputs[i], self._targets[i]


def host_call_batch(
    poptorch: Any, options: Any, spec: TorchTrainingSpec, placement: IpuPlacement, settings: OptionSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """One host call's (inputs, targets) for this process, built once: the call's samples for every
    instance, of which the ``poptorch.DataLoader`` hands this process its share."""
    every_instance = torch.cat([host_call_indices(placement, i, len(spec.inputs)) for i in range(placement.instances)])
    loader = poptorch.DataLoader(
        options,
        _PoolSamples(spec.inputs, spec.targets, every_instance),
        batch_size=placement.micro_batch_size,
        shuffle=False,
        drop_last=True,
    )
    inputs, targets = next(iter(loader))
    return _host(settings).convert_input(inputs), targets


def _host(settings: OptionSettings) -> PrecisionPolicy:
    """The run's precision policy for the host-side tensors PopTorch takes (model and inputs)."""
    return settings.precision(torch.device("cpu"))


# PopTorch's optimizers: the torch hyper-parameters their constructors take, and the keyword arguments
# naming their accumulator types (graphcore/poptorch python/optim.py, SDK 3.3).
_POPTORCH_OPTIMIZERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "SGD": (("lr", "momentum", "dampening", "weight_decay", "nesterov"), ("accum_type", "velocity_accum_type")),
    "Adam": (
        ("lr", "betas", "eps", "weight_decay", "amsgrad"),
        ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type"),
    ),
    "AdamW": (
        ("lr", "betas", "eps", "weight_decay", "amsgrad"),
        ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type"),
    ),
    "RMSprop": (
        ("lr", "alpha", "eps", "weight_decay", "momentum", "centered"),
        ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type"),
    ),
}


def poptorch_optimizer(poptorch: Any, optimizer: torch.optim.Optimizer, settings: OptionSettings) -> Any:
    """The workload's optimizer as PopTorch's own where a static loss scale must travel with it
    (``loss_scaling`` is an argument of poptorch.optim's constructors), its state kept in float32;
    otherwise the torch optimizer itself, whose state PopTorch keeps in float32 already."""
    if settings.loss_scaling is None or not settings.half_precision:
        return optimizer
    kind = type(optimizer).__name__
    if kind not in _POPTORCH_OPTIMIZERS:
        raise ConfigError(
            "accelerator_options.loss_scaling",
            settings.loss_scaling,
            f"a workload whose optimizer PopTorch has ({', '.join(_POPTORCH_OPTIMIZERS)}); this one uses {kind}",
        )
    hyper_parameters, accumulators = _POPTORCH_OPTIMIZERS[kind]
    hyper = {key: optimizer.defaults[key] for key in hyper_parameters if key in optimizer.defaults}
    types = dict.fromkeys(accumulators, torch.float32)
    return getattr(poptorch.optim, kind)(optimizer.param_groups, loss_scaling=settings.loss_scaling, **types, **hyper)


def _pipelined_and_halved(
    poptorch: Any,
    model: torch.nn.Module,
    placement: IpuPlacement,
    settings: OptionSettings,
    split: SplitChoice,
    layout: PipelineLayout | None,
) -> StagePlan | None:
    """Blocks per pipeline stage where a replica spans several IPUs, and the weights in the type the
    precision policy keeps them (float16 for fp16)."""
    stage_plan = None
    if placement.pipelined:
        stage_plan = plan_stages(model, placement.ipus_per_replica, split.split_points or (), layout, split.rule)
        assign_blocks(poptorch, model, stage_plan)
    _host(settings).convert_module(model)  # in place: PopTorch wraps this module
    return stage_plan


class _PopTorchExecutorBase(Executor):
    """What the PopTorch training and inference executors share: the placement's options and
    pipeline, the host call's batch, one compilation timed inside the first step, and host-side
    timing (a PopTorch call returns once the IPUs finished and the outputs reached the host)."""

    def __init__(
        self,
        spec: TorchTrainingSpec,
        config: RunConfig,
        placement: IpuPlacement,
        settings: OptionSettings,
        *,
        poptorch: Any,
        popdist: Any,
        split: SplitChoice,
        layout: PipelineLayout | None,
        details: dict[str, Any],
    ) -> None:
        data = config.data
        self._poptorch = poptorch
        self._placement = placement
        self.updates_per_step = placement.device_iterations
        self._details: dict[str, Any] = {"framework": "torch", "runtime": "poptorch", **details, **placement.summary()}
        self._user_model = spec.model
        self.stage_plan = _pipelined_and_halved(poptorch, spec.model, placement, settings, split, layout)
        if self.stage_plan is not None:
            self._details.update(self.stage_plan.summary())
        self.options = build_options(poptorch, placement, settings, popdist)
        if self.stage_plan is not None and self.stage_plan.tied:
            # A tied layer runs on an earlier IPU after the last stage: stages counted by block, as
            # Graphcore's GPT-2 does (PipelinedExecution(AutoStage.AutoIncrement), ipu_options.py).
            self.options.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
        self._details["poptorch_options"] = options_summary(self.options)
        self._details["numerics"] = numerics_summary(settings, placement.training)
        self._precision = _host(settings)
        self._files: HostCallFiles | None = None
        if data in SYNTHETIC_SOURCES:
            self._inputs, self._targets = host_call_batch(poptorch, self.options, spec, placement, settings)
            self._pending: tuple[torch.Tensor, torch.Tensor] | None = None
        else:
            instance = settings.process.instance_index if settings.process else 0
            self._files = HostCallFiles(
                poptorch, self.options, config, spec.inputs, placement, instance, vocabulary=spec.vocabulary
            )
            # The first host call's batch, read now: compilation needs its shapes.
            self._pending = self._inputs, self._targets = self._read_files()
        self._details["host_call_samples"] = int(self._inputs.shape[0])
        self._compiled = False

    def _read_files(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._files is not None
        inputs, targets = self._files.next()
        return self._precision.convert_input(inputs), targets

    def _host_call(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This host call's (inputs, targets): the synthetic batch again, or the files' next."""
        if self._files is None:
            return self._inputs, self._targets
        if self._pending is not None:
            batch, self._pending = self._pending, None
            return batch
        return self._read_files()

    def _compile_once(self, compile_model: Any) -> None:
        """The first call compiles (Poplar): timed apart, inside the run's first step."""
        if self._compiled:
            return
        started = time.perf_counter()
        compile_model()
        self._details["compile_seconds"] = time.perf_counter() - started
        self._compiled = True

    def synchronize(self) -> None:
        # A PopTorch call returns after the device finished and its outputs reached the host.
        pass

    def step_clock(self) -> StepClock:
        return HostStepClock()

    def details(self) -> dict[str, Any]:
        return {**self._details, **(self._files.details() if self._files is not None else {"data": "synthetic"})}

    def _close_files(self) -> None:
        if self._files is not None:
            self._files.close()

    def framework_version(self) -> str:
        return f"{torch.__version__} (poptorch {getattr(self._poptorch, '__version__', 'unknown')})"


class PopTorchExecutor(_PopTorchExecutorBase):
    def __init__(
        self,
        spec: TorchTrainingSpec,
        config: RunConfig,
        placement: IpuPlacement,
        settings: OptionSettings,
        *,
        poptorch: Any,
        popdist: Any = None,
        split: SplitChoice = DEFAULT_SPLIT,
        layout: PipelineLayout | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            spec,
            config,
            placement,
            settings,
            poptorch=poptorch,
            popdist=popdist,
            split=split,
            layout=layout,
            details=details or {},
        )
        self._wrapped = ModelWithLoss(self._user_model, spec.loss_fn, poptorch.identity_loss)
        self._wrapped.train()
        optimizer = poptorch_optimizer(poptorch, spec.make_optimizer(self._user_model.parameters()), settings)
        self.training_model = poptorch.trainingModel(self._wrapped, self.options, optimizer=optimizer)
        self._last_loss: torch.Tensor | None = None
        self._loss_fn = spec.loss_fn
        self._settings = settings
        self._updates = 0
        self._epochs: HostCallEpochs | None = None
        self._held_out: HeldOutHostCalls | None = None
        self.evaluation_model: Any = None
        if config.target is not None:
            self._prepare_target(spec, config, placement)

    def _prepare_target(self, spec: TorchTrainingSpec, config: RunConfig, placement: IpuPlacement) -> None:
        """A run to a target: the workload's training split in real epochs, its held-out split for evaluate()
        (planning has refused what this cannot run: files, several instances, pipelines, device iterations)."""
        if spec.evaluation_inputs is None or spec.evaluation_targets is None:
            raise ValueError("a run to a target needs the workload's held-out split (evaluation_inputs)")
        self._epochs = HostCallEpochs(
            spec.inputs,
            spec.targets,
            config.seed,
            placement.micro_batch_size,
            placement.gradient_accumulation,
            placement.replicas,
        )
        self._held_out = HeldOutHostCalls(
            spec.evaluation_inputs, spec.evaluation_targets, placement.replicas, placement.micro_batch_size
        )
        self._details.update(
            {
                "data": "the workload's training split",
                "dataset_samples": self._epochs.samples,
                "held_out_samples": self._held_out.samples,
                "epoch_order": "shuffled per epoch (seeded), last partial global batch dropped",
                "evaluation": "on the IPUs: a poptorch.inferenceModel of the training model's module (PopTorch "
                "copies the trained weights to it), the held-out split sharded over the replicas",
            }
        )

    def step(self) -> None:
        self._compile_once(lambda: self.training_model.compile(self._inputs, self._targets))
        if self._epochs is not None:
            inputs, targets = self._epochs.host_call(self._updates)
            inputs = self._precision.convert_input(inputs)
        else:
            inputs, targets = self._host_call()
        # Returns once the IPUs have run device_iterations updates and the final loss is on the host.
        self._last_loss = self.training_model(inputs, targets)
        self._updates += self.updates_per_step

    def dataset_samples(self) -> int | None:
        return self._epochs.samples if self._epochs is not None else super().dataset_samples()

    def evaluate(self) -> dict[str, float] | None:
        """The held-out split through a ``poptorch.inferenceModel`` of the module the training model wraps.

        PopTorch keeps the two in step itself (graphcore/poptorch sdk/poptorch/3.3.0
        ``python/_poplar_executor.py``: trainingModel turns the module it is given into a ``PoptorchModel``
        whose ``copyWeightsToHostIfNeeded`` reads the trained weights back, and an inference model's call
        of that same module compares ``_host_weights_version`` and calls ``copyWeightsToDevice``; the user
        guide's "PopTorch implicit copies", ``docs/user_guide/precompilation.py``). The training model is
        detached first (``detachFromDevice`` reads its weights to the host), so both fit on the run's
        IPUs; its next call attaches it again (``attachToDevice`` writes the host's weights back, unchanged).
        Every replica takes every replica-count-th held-out sample; every output comes back to the host
        (``OutputMode.All``), where the counts and the loss's sum are added in float64.
        """
        if self._held_out is None:
            return None
        if self.training_model.isAttachedToDevice():
            self.training_model.detachFromDevice()
        sums = torch.zeros(3, dtype=torch.float64)
        # The inference model is traced in eval mode (the flag of its own shallow copy is set when it is made;
        # its submodules' flags are shared with the training model's, which is compiled already).
        self._wrapped.eval()
        try:
            if self.evaluation_model is None:
                self.evaluation_model = self._poptorch.inferenceModel(self._wrapped, self._evaluation_options())
            for inputs, targets, valid in self._held_out:
                outputs = self._evaluate_host_call(self._precision.convert_input(inputs))
                sums += outcome_sums(outputs[valid], targets[valid], self._loss_fn)
        finally:
            self._wrapped.train()
        self.evaluation_model.detachFromDevice()  # the IPUs back to the training model
        return metrics_from_sums(sums.tolist())

    def _evaluate_host_call(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.evaluation_model.isCompiled():
            started = time.perf_counter()
            self.evaluation_model.compile(inputs)
            self._details["evaluation_compile_seconds"] = time.perf_counter() - started
        # Returns once the IPUs have run and every replica's outputs are on the host.
        return torch.as_tensor(self.evaluation_model(inputs))

    def _evaluation_options(self) -> Any:
        """The training placement's replicas, as inference: one device iteration, no accumulation."""
        training = self._placement
        placement = plan_placement(
            micro_batch_size=training.micro_batch_size,
            gradient_accumulation=1,
            replicas=training.replicas,
            ipus_per_replica=training.ipus_per_replica,
            device_iterations=1,
            instances=training.instances,
            training=False,
            auto_round_num_ipus=training.auto_round_num_ipus,
        )
        return build_options(self._poptorch, placement, self._settings)

    def check_finite(self) -> None:
        loss = self._last_loss
        if loss is None:
            return
        values = [float(v) for v in torch.as_tensor(loss).float().reshape(-1)]
        if not all(math.isfinite(v) for v in values):
            raise NonFiniteLossError(f"loss is {values} (not finite)")

    def model_state(self) -> dict[str, torch.Tensor]:
        """The trained weights on the host (tests compare them across placements)."""
        if self.training_model.isCompiled():
            # Reads the device's weights where they changed since the last read (a detached model's
            # were read as it detached).
            self.training_model.copyWeightsToHostIfNeeded()
        return {name: t.detach().cpu().clone() for name, t in self._user_model.state_dict().items()}

    def close(self) -> None:
        # Releases the IPUs and the executables (and copies the weights back to the host).
        try:
            if self.evaluation_model is not None:
                self.evaluation_model.destroy()
            self.training_model.destroy()
        finally:
            self._close_files()


class PopTorchInferenceExecutor(_PopTorchExecutorBase):
    """Inference on IPUs: ``poptorch.inferenceModel`` over the same placement (replicas, device
    iterations, pipelining; gradient accumulation is 1). One ``step()`` is one host call: each
    replica runs ``device_iterations`` forward passes, and every output comes back to the host
    (``OutputMode.All``, inference's default). The first call compiles, in the first-step phase.
    """

    def __init__(
        self,
        spec: TorchTrainingSpec,
        config: RunConfig,
        placement: IpuPlacement,
        settings: OptionSettings,
        *,
        poptorch: Any,
        popdist: Any = None,
        split: SplitChoice = DEFAULT_SPLIT,
        layout: PipelineLayout | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            spec,
            config,
            placement,
            settings,
            poptorch=poptorch,
            popdist=popdist,
            split=split,
            layout=layout,
            details={"mode": "inference", **(details or {})},
        )
        # Before wrapping: inferenceModel wraps a shallow copy, whose own training flag a later
        # eval() would not reach (graphcore/poptorch python/__init__.py, inferenceModel's note).
        self._user_model.eval()
        self.inference_model = poptorch.inferenceModel(self._user_model, self.options)
        self._last_outputs: torch.Tensor | None = None

    def step(self) -> None:
        self._compile_once(lambda: self.inference_model.compile(self._inputs))
        inputs, _ = self._host_call()
        # Returns once the IPUs have run and every output is on the host.
        self._last_outputs = self.inference_model(inputs)

    def check_finite(self) -> None:
        # The outputs are on the host already: checking the last call's costs no device sync.
        outputs = self._last_outputs
        if outputs is not None and outputs.is_floating_point() and not bool(torch.isfinite(outputs).all()):
            raise NonFiniteLossError("a model output was NaN/inf in the last host call")

    def close(self) -> None:
        try:
            self.inference_model.destroy()
        finally:
            self._close_files()
