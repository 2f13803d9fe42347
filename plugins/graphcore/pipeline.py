"""Split a model's layers into pipeline stages, one per IPU of a replica.

A stage is a contiguous run of the model's layers. Stage ``k`` starts at its first layer, which
``poptorch.BeginBlock(layer, user_id=..., ipu_id=k)`` marks: PopTorch places that layer and every
later one on IPU ``k`` until the next block begins (graphcore/poptorch ``python/ops.py``), and
``PipelinedExecution(AutoStage.SameAsIpu)`` makes the IPU index the stage index. graphcore/examples
split its CNNs the same way, at named layers (``vision/cnns/pytorch/models/models.py``).

Without named split points, the stages are balanced by parameter count: the split minimises the
largest stage's parameters (a stage's weights live in that IPU's memory). Layers without
parameters (activations) stay with the layer before them.

Torch is imported lazily; the planning functions work on (name, parameter count) lists and are
testable without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.plugin import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Stage:
    index: int  # the stage, and the IPU of the replica it runs on
    layers: tuple[str, ...]  # layer names, as in model.named_modules()
    parameters: int

    @property
    def first_layer(self) -> str:
        return self.layers[0]


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    balanced_by: str  # "parameter count" or "split points"

    @property
    def layer_to_stage(self) -> dict[str, int]:
        return {layer: stage.index for stage in self.stages for layer in stage.layers}

    def summary(self) -> dict[str, Any]:
        return {
            "pipeline_balanced_by": self.balanced_by,
            "pipeline_stage_plan": [
                {"ipu": s.index, "first_layer": s.first_layer, "layers": len(s.layers), "parameters": s.parameters}
                for s in self.stages
            ],
        }


def pipeline_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's layers in order: the children of the outermost module with more than one child.

    Wrappers holding a single module (a model inside a loss wrapper) are looked through; layer
    names are those of ``model.named_modules()``. The order is the registration order, which is
    the execution order for ``nn.Sequential`` and for models that call their layers in turn.
    """
    prefix, module = "", model
    while True:
        children = list(module.named_children())
        if len(children) != 1:
            break
        name, module = children[0]
        prefix = f"{prefix}{name}."
    if not children:
        return [(prefix.rstrip(".") or "", module)]
    return [(f"{prefix}{name}", child) for name, child in children]


def _segments(layers: Sequence[tuple[str, int]]) -> list[tuple[list[str], int]]:
    """Group each parameterised layer with the parameter-free layers after it (and the leading
    parameter-free layers with the first group)."""
    segments: list[tuple[list[str], int]] = []
    leading: list[str] = []
    for name, count in layers:
        if count > 0 or not segments:
            if count > 0:
                segments.append((leading + [name], count))
                leading = []
            else:
                leading.append(name)
        else:
            segments[-1][0].append(name)
    if leading:  # no layer has parameters: one segment per layer
        return [([name], 0) for name in leading] if not segments else segments
    return segments


def balance(layers: Sequence[tuple[str, int]], stages: int) -> StagePlan:
    """Contiguous stages minimising the largest stage's parameter count (ties: earlier splits)."""
    segments = _segments(layers)
    if stages > len(segments):
        raise ConfigError(
            "devices_per_replica",
            stages,
            f"the model has {len(segments)} layer(s) with parameters to pipeline "
            f"({', '.join(s[0][0] for s in segments)}); at most {len(segments)} stages",
        )
    weights = [w for _, w in segments]
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: the smallest largest-stage weight splitting the first i segments into k stages.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n - (stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    result = []
    for k in range(stages):
        chosen = segments[bounds[k] : bounds[k + 1]]
        result.append(Stage(k, tuple(name for names, _ in chosen for name in names), sum(w for _, w in chosen)))
    return StagePlan(tuple(result), "parameter count")


def split_at(layers: Sequence[tuple[str, int]], split_points: Sequence[str], stages: int) -> StagePlan:
    """Stages that begin at the named layers (the first stage begins at the first layer)."""
    names = [name for name, _ in layers]
    if len(split_points) != stages - 1:
        raise ConfigError(
            "accelerator_options.pipeline_splits",
            ",".join(split_points),
            f"{stages} stages (devices_per_replica) need {stages - 1} split point(s), "
            f"one per stage after the first; layers: {', '.join(names)}",
        )
    positions = []
    for point in split_points:
        if point not in names:
            raise ConfigError(
                "accelerator_options.pipeline_splits", point, f"not a layer of the model; layers: {', '.join(names)}"
            )
        positions.append(names.index(point))
    if positions != sorted(positions) or len(set(positions)) != len(positions) or (positions and positions[0] == 0):
        raise ConfigError(
            "accelerator_options.pipeline_splits",
            ",".join(split_points),
            f"split points must be distinct layers after the first, in model order: {', '.join(names)}",
        )
    bounds = [0] + positions + [len(layers)]
    counts = dict(layers)
    return StagePlan(
        tuple(
            Stage(k, tuple(names[bounds[k] : bounds[k + 1]]), sum(counts[n] for n in names[bounds[k] : bounds[k + 1]]))
            for k in range(stages)
        ),
        "split points",
    )


def plan_stages(model: torch.nn.Module, stages: int, split_points: Sequence[str] = ()) -> StagePlan:
    """The stage plan of ``model`` over ``stages`` IPUs."""
    layers = [(name, sum(p.numel() for p in module.parameters())) for name, module in pipeline_layers(model)]
    return split_at(layers, split_points, stages) if split_points else balance(layers, stages)


def assign_blocks(poptorch: Any, model: torch.nn.Module, plan: StagePlan) -> None:
    """Mark each stage's first layer with ``poptorch.BeginBlock`` on the stage's IPU."""
    modules = dict(model.named_modules())
    for stage in plan.stages:
        poptorch.BeginBlock(modules[stage.first_layer], user_id=f"stage{stage.index}", ipu_id=stage.index)
