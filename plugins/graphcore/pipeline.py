"""Split a model into pipeline stages, one per IPU of a replica.

A stage begins at a module: ``poptorch.BeginBlock(module, user_id=..., ipu_id=k)`` places that
module and everything executed after it on IPU ``k`` until the next block begins (graphcore/poptorch
``python/ops.py``), and ``PipelinedExecution(AutoStage.SameAsIpu)`` makes the IPU index the stage
index. graphcore/examples splits its models the same way: its CNNs at named layers
(``vision/cnns/pytorch/models/models.py``, ``pipeline_splits``), BERT and GPT-2 by layers per IPU
(``layers_per_ipu``, the embeddings with the first IPU).

Where the split points come from, in order (:func:`choose_split_points`, run while planning, before
the model is built): ``accelerator_options.pipeline_splits``; ``accelerator_options.layers_per_ipu``
for a workload of identical layers; the split the workload recommends for that many stages (a
published configuration); else the workload's blocks balanced by parameter count, the largest
stage's weights as small as can be (a stage's weights live in its IPU's memory). A workload that
declares no blocks (no ``pipeline_layout``) is split among its outermost layers.

Torch is imported lazily; the planning functions work on names and parameter counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.plugin import ConfigError, PipelineLayout

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Stage:
    index: int  # the stage, and the IPU of the replica it runs on
    layers: tuple[str, ...]  # the layers (or the workload's blocks) it holds, as model.named_modules() names them
    parameters: int
    #: the module its BeginBlock marks, where it is not its first layer ("": the whole model)
    begins_at: str | None = None

    @property
    def first_layer(self) -> str:
        return self.layers[0] if self.begins_at is None else self.begins_at


@dataclass(frozen=True)
class StagePlan:
    stages: tuple[Stage, ...]
    balanced_by: str  # how the split points were chosen
    #: (module, IPU): a module of a later stage that shares a weight with an earlier stage's module
    #: (a tied output layer), moved back to that stage's IPU: layers sharing a weight sit on one IPU
    tied: tuple[tuple[str, int], ...] = ()

    @property
    def layer_to_stage(self) -> dict[str, int]:
        return {layer: stage.index for stage in self.stages for layer in stage.layers}

    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "pipeline_balanced_by": self.balanced_by,
            "pipeline_stage_plan": [
                {"ipu": s.index, "first_layer": s.first_layer, "layers": len(s.layers), "parameters": s.parameters}
                for s in self.stages
            ],
        }
        if self.tied:
            summary["pipeline_tied_layers"] = [{"layer": name, "ipu": ipu} for name, ipu in self.tied]
        return summary


@dataclass(frozen=True)
class SplitChoice:
    """What planning decided: the split points, or None to balance the blocks by parameter count
    once the model is built; and the rule that chose them (recorded in the result)."""

    split_points: tuple[str, ...] | None
    rule: str


#: no split points: balance by parameter count (over the outermost layers where the workload names no blocks)
DEFAULT_SPLIT = SplitChoice(None, "parameter count")


def describe_split(choice: SplitChoice, layout: PipelineLayout | None) -> str:
    """One line for a dry run: the blocks per stage where known, and the rule that chose them."""
    if choice.split_points is None:
        return f"balanced by {choice.rule} when the model is built"
    if layout is not None:
        counts = ",".join(str(count) for count in layout.layers_per_stage(choice.split_points))
        return f"{layout.unit}s per IPU {counts} ({choice.rule})"
    return f"stages begin at {', '.join(choice.split_points)} ({choice.rule})"


def _listing(layout: PipelineLayout) -> str:
    return f"{len(layout.blocks)} {layout.unit}s: {', '.join(layout.blocks)}"


def _parse_counts(value: str) -> list[int]:
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise ConfigError(
            "accelerator_options.layers_per_ipu", value, "comma-separated whole numbers, one per IPU, e.g. 0,4,4,4"
        ) from None


def choose_split_points(
    layout: PipelineLayout | None, stages: int, pipeline_splits: str, layers_per_ipu: str
) -> SplitChoice:
    """The split points of a replica over ``stages`` IPUs, checked against the workload's blocks.

    Raises ConfigError naming the option, the value and the valid points; nothing is built.
    """
    splits = tuple(point.strip() for point in pipeline_splits.split(",") if point.strip())
    if splits and layers_per_ipu.strip():
        raise ConfigError(
            "accelerator_options.layers_per_ipu",
            layers_per_ipu,
            "either pipeline_splits or layers_per_ipu, not both: they say the same thing two ways",
        )
    if splits:
        if len(splits) != stages - 1:
            raise ConfigError(
                "accelerator_options.pipeline_splits",
                pipeline_splits,
                f"{stages} stages (devices_per_replica) need {stages - 1} split point(s), one per stage after the "
                "first" + (f"; the model's {_listing(layout)}" if layout else ""),
            )
        if layout is not None:
            try:
                layout.check_split_points(splits)
            except ValueError as exc:
                raise ConfigError(
                    "accelerator_options.pipeline_splits", pipeline_splits, f"{exc}; the model's {_listing(layout)}"
                ) from None
        return SplitChoice(splits, "pipeline_splits")
    if layers_per_ipu.strip():
        counts = _parse_counts(layers_per_ipu)
        if len(counts) != stages:
            raise ConfigError(
                "accelerator_options.layers_per_ipu",
                layers_per_ipu,
                f"one count per IPU of a replica: {stages} (devices_per_replica)",
            )
        if layout is None or not layout.repeated_layers:
            raise ConfigError(
                "accelerator_options.layers_per_ipu",
                layers_per_ipu,
                "a workload of identical layers (BERT, GPT); "
                + (f"this one has {_listing(layout)}: use pipeline_splits" if layout else "this workload names none"),
            )
        try:
            return SplitChoice(layout.split_points_for_layers(counts), f"layers_per_ipu {layers_per_ipu}")
        except ValueError as exc:
            raise ConfigError("accelerator_options.layers_per_ipu", layers_per_ipu, str(exc)) from None
    if layout is None:
        return SplitChoice(None, "parameter count (outermost layers)")
    if stages > layout.max_stages:
        raise ConfigError(
            "devices_per_replica",
            stages,
            f"at most {layout.max_stages} pipeline stages: the model has {len(layout.blocks)} {layout.unit}s to "
            "begin a stage at (the first stage also holds what precedes them)",
        )
    recommended = layout.recommended.get(stages)
    if recommended is not None:
        return SplitChoice(recommended.split_points, f"recommended: {recommended.source}")
    return SplitChoice(None, f"parameter count ({layout.unit}s)")


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


def _parameters_by_stage(model: torch.nn.Module, split_points: Sequence[str], stages: int) -> list[int]:
    """Parameters of each stage when stages begin at ``split_points``: every module belongs to the
    stage of the last split point before it in ``named_modules()`` order (the registration order,
    which is the execution order of the zoo's models); a weight shared by two modules (GPT-2's
    tied embeddings) counts once, where it first appears."""
    counts = [0] * stages
    seen: set[int] = set()
    starts = {point: index + 1 for index, point in enumerate(split_points)}
    for _, module, stage in _modules_by_stage(model, starts):
        for parameter in module.parameters(recurse=False):
            if id(parameter) not in seen:
                seen.add(id(parameter))
                counts[stage] += parameter.numel()
    return counts


def _modules_by_stage(model: torch.nn.Module, starts: Mapping[str, int]) -> Iterator[tuple[str, Any, int]]:
    """(name, module, stage) for every module in ``named_modules()`` order: a module belongs to the
    stage whose first module (``starts``: name -> stage) last preceded it, stage 0 before any."""
    stage = 0
    for name, module in model.named_modules():
        stage = starts.get(name, stage)
        yield name, module, stage


def plan_from_split_points(
    model: torch.nn.Module, layout: PipelineLayout | None, split_points: Sequence[str], rule: str
) -> StagePlan:
    """Stages beginning at ``split_points`` (module paths anywhere in the model, in execution order);
    the first stage begins with the model itself."""
    modules = dict(model.named_modules())
    order = {name: position for position, name in enumerate(modules)}
    missing = [point for point in split_points if point not in modules or not point]
    if missing:
        raise ConfigError(
            "accelerator_options.pipeline_splits",
            ",".join(split_points),
            f"{', '.join(missing) or repr('')}: not a module of the model; "
            f"modules: {', '.join(n for n in modules if n)}",
        )
    positions = [order[point] for point in split_points]
    if positions != sorted(set(positions)):
        raise ConfigError(
            "accelerator_options.pipeline_splits",
            ",".join(split_points),
            "split points must be distinct modules in the model's order (that of model.named_modules())",
        )
    stages = len(split_points) + 1
    parameters = _parameters_by_stage(model, split_points, stages)
    if layout is not None:
        counts = layout.layers_per_stage(split_points)
        bounds = [sum(counts[:k]) for k in range(stages + 1)]
        held = [layout.blocks[bounds[k] : bounds[k + 1]] for k in range(stages)]
    else:
        held = [(point,) for point in ("", *split_points)]
    # The first stage is marked too, explicitly on IPU 0, at the model's first outermost layer
    # (graphcore/examples marks its embeddings the same way); a block spans its module and every
    # sub-module until one of those begins another block (BeginBlock, python/ops.py).
    first = pipeline_layers(model)[0][0]
    begins = (first if first and order.get(first, len(order)) < positions[0] else "", *split_points)
    return StagePlan(tuple(Stage(k, tuple(held[k]), parameters[k], begins_at=begins[k]) for k in range(stages)), rule)


def balance_blocks(model: torch.nn.Module, layout: PipelineLayout, stages: int) -> StagePlan:
    """The layout's blocks grouped into contiguous stages minimising the largest stage's parameters;
    what precedes the first block weighs on the first stage, what follows the last on the last."""
    rule = f"parameter count ({layout.unit}s)"
    if stages == layout.max_stages:  # one stage per block, and the first holds only what precedes them
        return plan_from_split_points(model, layout, layout.blocks, rule)
    # counts[0]: before the first block; counts[i]: block i-1 and what follows it up to the next block.
    counts = _parameters_by_stage(model, layout.blocks, layout.max_stages)
    weights = [counts[0] + counts[1], *counts[2:]]
    plan = balance(list(zip(layout.blocks, weights)), stages)
    return plan_from_split_points(model, layout, [stage.layers[0] for stage in plan.stages[1:]], rule)


def plan_stages(
    model: torch.nn.Module,
    stages: int,
    split_points: Sequence[str] = (),
    layout: PipelineLayout | None = None,
    rule: str = "split points",
) -> StagePlan:
    """The stage plan of ``model`` over ``stages`` IPUs: at ``split_points`` where given, else
    balanced over the layout's blocks, else over the model's outermost layers; a later layer that
    shares a weight with an earlier stage is moved back to that stage's IPU (:func:`with_tied_layers`)."""
    return with_tied_layers(model, _plan_stages(model, stages, split_points, layout, rule))


def _plan_stages(
    model: torch.nn.Module,
    stages: int,
    split_points: Sequence[str],
    layout: PipelineLayout | None,
    rule: str,
) -> StagePlan:
    if split_points:
        if len(split_points) != stages - 1:
            raise ConfigError(
                "accelerator_options.pipeline_splits",
                ",".join(split_points),
                f"{stages} stages (devices_per_replica) need {stages - 1} split point(s), "
                "one per stage after the first",
            )
        return plan_from_split_points(model, layout, split_points, rule)
    if layout is not None:
        return balance_blocks(model, layout, stages)
    layers = [(name, sum(p.numel() for p in module.parameters())) for name, module in pipeline_layers(model)]
    return balance(layers, stages)


def with_tied_layers(model: torch.nn.Module, plan: StagePlan) -> StagePlan:
    """``plan`` with each module that shares a weight with a module of an earlier stage moved back to
    that stage's IPU (GPT-2's and BERT's output layer, tied to the input embedding on IPU 0).

    PopTorch 3.3's user guide: layers that share weights must be placed on the same IPU; Graphcore's
    own GPT-2 and BERT (graphcore/examples ``nlp/gpt2/pytorch/train_gpt2.py``: ``BeginBlock(lm_head,
    ipu_id=0)``) put the output layer back on IPU 0, in a stage of its own after the last."""
    if len(plan.stages) < 2:
        return plan
    starts = {stage.first_layer: stage.index for stage in plan.stages}
    held = [
        (name, stage, [id(p) for p in module.parameters(recurse=False)])
        for name, module, stage in _modules_by_stage(model, starts)
    ]
    first_stage: dict[int, int] = {}  # parameter -> the earliest stage of a module holding it
    for _, stage, ids in held:
        for parameter in ids:
            first_stage[parameter] = min(first_stage.get(parameter, stage), stage)
    tied = tuple(
        (name, earliest)
        for name, stage, ids in held
        if ids and name not in starts and (earliest := min(first_stage[p] for p in ids)) < stage
    )
    return dataclasses.replace(plan, tied=tied)


def assign_blocks(poptorch: Any, model: torch.nn.Module, plan: StagePlan) -> None:
    """Mark each stage's first module with ``poptorch.BeginBlock`` on the stage's IPU, and each tied
    layer with a block of its own on the IPU of the weight it shares (it, and what runs after it in
    the forward pass, such as the loss, run there)."""
    modules = dict(model.named_modules())
    for stage in plan.stages:
        poptorch.BeginBlock(modules[stage.first_layer], user_id=f"stage{stage.index}", ipu_id=stage.index)
    for name, ipu in plan.tied:
        poptorch.BeginBlock(modules[name], user_id=f"tied:{name}", ipu_id=ipu)
