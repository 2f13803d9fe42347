"""A replica over several devices, planned before a machine is booked: the rules of the split and the
memory each device holds.

The rules (each a ConfigError naming the field, before any device is touched): ``tensor_parallel``
divides the attention heads and the hidden size; the pipeline stages (``devices_per_replica /
tensor_parallel``) are at most the layers (an uneven split is said, not refused); a pipeline has at
least as many micro-batches (``gradient_accumulation``) as stages.

The memory of a device (:func:`replica_memory`) is that of the replica's heaviest pipeline stage:

- weights and gradients in fp32 (autocast keeps fp32 master weights) and the optimizer's fp32 state
  (``Workload.optimizer_state_per_parameter``; Adam's two where undeclared), of the stage's layers
  split over the tensor-parallel devices; under ``sharding = "fsdp"`` divided over the data
  replicas, plus the layers FSDP gathers whole to compute (the one at work and the one prefetched);
  under ``"fsdp-offload"`` only those gathered layers (the rest waits in host memory);
- activations per micro-batch, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", Table 2), bytes per layer for 16-bit activations, tensor parallelism ``t``
  with sequence parallelism (where the workload's tensor plan splits the sequence between the
  layers, as GPT's does): ``sbh(34/t + 5as/(ht))`` without recomputation (``sbh(34 + 5as/h)`` at
  ``t = 1``), ``34sbh/t`` with selective recomputation (the attention scores are computed again; a
  fused attention kernel keeps none either), ``2sbh/t`` with full recomputation (each layer's input;
  one layer's whole activations while it is recomputed); without sequence parallelism the norms',
  dropouts' and residuals' ``10sbh`` and a layer's input stay whole on every device
  (``sbh(10 + 24/t + 5as/(ht))``, and ``2sbh`` under full recomputation). fp32 activations take
  twice the bytes. The last stage also holds a micro-batch's logits (16-bit and the loss's fp32
  copy);
- micro-batches in flight: one without a pipeline; under 1F1B (the default schedule) stage ``k`` of
  ``p`` holds up to ``p - k`` (the first stage the most); under GPipe all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import get_args

from core.base.config import Recompute, RunConfig
from core.base.errors import ConfigError
from core.contract.shape import TransformerShape

#: bytes per parameter training keeps whatever the precision: fp32 weights and fp32 gradients
WEIGHT_BYTES = 4
GRADIENT_BYTES = 4
#: bytes of one fp32 value of the optimizer's state
OPTIMIZER_VALUE_BYTES = 4
#: what Adam and AdamW keep per parameter: two moments
ADAM_STATE_VALUES = 2
#: Korthikanti et al.'s activation constants are bytes for 16-bit activations
_FORMULA_ACTIVATION_BYTES = 2
#: layers FSDP holds whole at once: the one computing and the next, prefetched
FSDP_GATHERED_LAYERS = 2
RECOMPUTE_CHOICES: tuple[str, ...] = get_args(Recompute)


def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage, as even as possible; where they do not divide, the later stages take
    one more each (the first holds the embeddings and, under 1F1B, the most micro-batches)."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if stage >= stages - extra else 0) for stage in range(stages))


def check_replica_split(shape: TransformerShape | None, config: RunConfig, workload: str) -> list[str]:
    """Refuse a split of a replica the model cannot take (ConfigError naming the field); return what
    planning should say of an uneven one."""
    tensor, stages = config.tensor_parallel, config.pipeline_parallel
    if tensor > 1 and shape is None:
        raise ConfigError(
            "tensor_parallel",
            tensor,
            f"1 (workload {workload!r} gives no transformer shape, Workload.transformer_shape, so no split of "
            "its layers over devices is known)",
        )
    if shape is not None and (shape.attention_heads % tensor or shape.hidden % tensor):
        divisors = [d for d in range(1, shape.attention_heads + 1) if not shape.attention_heads % d]
        allowed = [d for d in divisors if not shape.hidden % d]
        raise ConfigError(
            "tensor_parallel",
            tensor,
            f"a divisor of workload {workload!r}'s {shape.attention_heads} attention heads and hidden size "
            f"{shape.hidden} (each device holds whole heads): {', '.join(map(str, allowed))}",
        )
    notes: list[str] = []
    if stages > 1 and shape is not None:
        if stages > shape.layers:
            raise ConfigError(
                "devices_per_replica",
                config.devices_per_replica,
                f"at most {shape.layers * tensor} (pipeline stages = devices_per_replica / tensor_parallel "
                f"{tensor}: at most workload {workload!r}'s {shape.layers} layers, one or more each)",
            )
        if shape.layers % stages:
            counts = split_layers(shape.layers, stages)
            notes.append(
                f"{shape.layers} layers do not divide into {stages} pipeline stages: they hold "
                f"{', '.join(map(str, counts))} layers (the later stages one more; the first holds the embeddings)"
            )
    if stages > 1 and config.mode == "train" and config.gradient_accumulation < stages:
        raise ConfigError(
            "gradient_accumulation",
            config.gradient_accumulation,
            f"at least the {stages} pipeline stages (the micro-batches a pipeline keeps its stages busy with; "
            "devices_per_replica / tensor_parallel)",
        )
    return notes


def micro_batches_in_flight(config: RunConfig, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once (see the module docstring)."""
    stages, micro_batches = config.pipeline_parallel, config.gradient_accumulation
    if stages == 1 or config.mode == "inference":
        return 1
    if config.pipeline_schedule == "gpipe":
        return micro_batches
    return min(stages - stage, micro_batches)


def layer_activation_bytes(
    shape: TransformerShape,
    micro_batch: int,
    tensor: int,
    recompute: str,
    activation_bytes: int,
    sequence_parallel: bool = True,
) -> float:
    """Bytes of activations one layer keeps for the backward, per micro-batch and device (Korthikanti
    et al. 2022, Table 2, with sequence parallelism or without), scaled from their 16-bit constants."""
    s, b, h, a = shape.sequence, micro_batch, shape.hidden, shape.attention_heads
    scale = activation_bytes / _FORMULA_ACTIVATION_BYTES
    if recompute == "full":
        return 2 * s * b * h / (tensor if sequence_parallel else 1) * scale
    scores = 0.0 if recompute == "selective" or shape.fused_attention else 5 * a * s / (h * tensor)
    between_layers = 34 / tensor if sequence_parallel else 10 + 24 / tensor
    return s * b * h * (between_layers + scores) * scale


@dataclass(frozen=True)
class ReplicaMemory:
    """What one device of the heaviest pipeline stage holds, in bytes (activations None where the
    workload gives no transformer shape)."""

    parameters: int
    #: what the weights' and gradients' bytes are: "fp32 weights and gradients", or "fp32 weights"
    kept: str
    sharding: str
    #: the stage this is (0: the first), and each stage's layers (empty without a shape)
    stage: int
    layers_per_stage: tuple[int, ...]
    parameters_per_device: float
    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    optimizer_state_values_per_parameter: int
    optimizer_state_assumed: bool
    micro_batches_in_flight: int
    #: the stage's activations (logits included) under each recompute choice; empty: not counted
    activations_by_recompute: Mapping[str, int] = field(default_factory=dict)
    recompute: str = "none"
    device_memory_bytes: int | None = None

    @property
    def model_state_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes

    @property
    def activation_bytes(self) -> int | None:
        return self.activations_by_recompute.get(self.recompute)

    @property
    def total_bytes(self) -> int:
        return self.model_state_bytes + (self.activation_bytes or 0)

    def total_with(self, recompute: str) -> int | None:
        activations = self.activations_by_recompute.get(recompute)
        return None if activations is None else self.model_state_bytes + activations


def _stage_parameters(
    shape: TransformerShape, parameters: int, layers: int, tensor: int, first: bool
) -> tuple[float, float]:
    """(parameters on one device of a stage of ``layers`` layers, of them in one layer): each layer's
    matrices and column-split biases divided over the tensor-parallel devices, the row-split biases
    and norms whole; what lies outside the layers (embeddings, positions, norms, a head) on the
    first stage, split over the tensor-parallel devices as a vocabulary-parallel embedding is."""
    h, i = shape.hidden, shape.intermediate
    per_layer = (4 * h * h + 2 * h * i + 3 * h + i) / tensor + 6 * h
    outside = parameters - shape.layers * shape.layer_parameters()
    return layers * per_layer + (outside / tensor if first else 0.0), per_layer


def replica_memory(
    parameters: int,
    shape: TransformerShape | None,
    config: RunConfig,
    state_values: int | None,
    activation_bytes: int,
    device_memory_bytes: int | None = None,
    sequence_parallel: bool = True,
) -> ReplicaMemory:
    """One device's memory for the run (see the module docstring). ``state_values``: the optimizer's
    fp32 values per parameter, None where the workload does not declare them (Adam's assumed);
    ``sequence_parallel``: whether tensor parallelism splits the sequence between the layers."""
    values = 0 if config.mode == "inference" else (ADAM_STATE_VALUES if state_values is None else state_values)
    tensor, stages = config.tensor_parallel, config.pipeline_parallel
    if shape is None:
        layers_per_stage: tuple[int, ...] = ()
        candidates = [(0, parameters / config.devices_per_replica, 0.0)]
    else:
        layers_per_stage = split_layers(shape.layers, stages)
        candidates = [
            (stage, *_stage_parameters(shape, parameters, layers, tensor, first=stage == 0))
            for stage, layers in enumerate(layers_per_stage)
        ]
    stages_memory = [
        _stage_memory(
            parameters, shape, config, values, state_values is None, activation_bytes, sequence_parallel, *candidate
        )
        for candidate in candidates
    ]
    heaviest = max(stages_memory, key=lambda memory: memory.total_bytes)
    return replace(heaviest, layers_per_stage=layers_per_stage, device_memory_bytes=device_memory_bytes)


def _stage_memory(
    parameters: int,
    shape: TransformerShape | None,
    config: RunConfig,
    values: int,
    assumed: bool,
    activation_bytes: int,
    sequence_parallel: bool,
    stage: int,
    on_device: float,
    per_layer: float,
) -> ReplicaMemory:
    inference = config.mode == "inference"
    # What each device keeps between uses: sharded over the data replicas under FSDP, in host memory
    # under offloading; what it gathers whole to compute comes on top.
    kept = on_device
    gathered = 0.0
    if config.sharding != "none" and shape is not None:
        gathered = min(FSDP_GATHERED_LAYERS, shape.layers) * per_layer
    if config.sharding == "fsdp":
        kept = on_device / config.replicas
    elif config.sharding == "fsdp-offload":
        kept = 0.0
    weights = int((kept + gathered) * WEIGHT_BYTES)
    gradients = 0 if inference else int((kept + gathered) * GRADIENT_BYTES)
    optimizer = int(kept * values * OPTIMIZER_VALUE_BYTES)
    in_flight = micro_batches_in_flight(config, stage)
    activations: dict[str, int] = {}
    if shape is not None and config.micro_batch_size is not None:
        layers = split_layers(shape.layers, config.pipeline_parallel)[stage]
        last = stage == config.pipeline_parallel - 1
        for recompute in RECOMPUTE_CHOICES:
            activations[recompute] = _stage_activations(
                shape, config, recompute, activation_bytes, sequence_parallel, layers, in_flight, last
            )
    return ReplicaMemory(
        parameters=parameters,
        kept="fp32 weights" if inference else "fp32 weights and gradients",
        sharding=config.sharding,
        stage=stage,
        layers_per_stage=(),
        parameters_per_device=on_device,
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_state_bytes=optimizer,
        optimizer_state_values_per_parameter=values,
        optimizer_state_assumed=assumed and not inference,
        micro_batches_in_flight=in_flight,
        activations_by_recompute=activations,
        recompute=config.recompute,
    )


def _stage_activations(
    shape: TransformerShape,
    config: RunConfig,
    recompute: str,
    activation_bytes: int,
    sequence_parallel: bool,
    layers: int,
    in_flight: int,
    last: bool,
) -> int:
    """A stage's activations for ``in_flight`` micro-batches; an inference run keeps none for a
    backward, only the layer at work."""
    assert config.micro_batch_size is not None
    b, tensor = config.micro_batch_size, config.tensor_parallel
    whole_layer = layer_activation_bytes(shape, b, tensor, "none", activation_bytes, sequence_parallel)
    logits = shape.sequence * b * shape.vocabulary / tensor * (activation_bytes + 4) if last else 0.0
    if config.mode == "inference":
        return int(whole_layer + logits)
    kept = layers * layer_activation_bytes(shape, b, tensor, recompute, activation_bytes, sequence_parallel) * in_flight
    working = whole_layer if recompute == "full" else 0.0  # the layer being recomputed, whole
    return int(kept + working + logits * in_flight)


def recomputed_forward_flops(shape: TransformerShape, recompute: str) -> float:
    """Forward FLOPs per sample that recomputation computes a second time in the backward: every
    layer's under "full", each layer's attention scores and weighted values under "selective"
    (Korthikanti et al. 2022), none under "none". What a fused attention kernel recomputes inside its
    own backward is the kernel's, not counted."""
    if recompute == "full":
        return shape.layers * shape.layer_forward_flops()
    if recompute == "selective":
        return shape.layers * shape.attention_score_forward_flops()
    return 0.0
