"""Where a workload's model can be cut into pipeline stages (one stage per device of a replica).

Pipeline parallelism is not one vendor's idea: an IPU replica spanning four IPUs, or a GPU
pipeline, both need to know which modules of the model may begin a stage. A workload names them
(``Workload.pipeline_layout``); the accelerator that pipelines decides how to use them, and can
refuse an impossible split while planning, before anything is built or compiled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RecommendedSplit:
    """Split points known to balance a model over a number of stages, and who found them."""

    split_points: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class PipelineLayout:
    """The blocks a model's stages may begin at, in execution order.

    ``blocks`` are module paths as ``model.named_modules()`` names them in the model that
    ``build_torch`` returns (for a Keras model: the name of each block's first layer). Whatever
    runs before the first block (embeddings, a stem) belongs to the first stage, whatever runs
    after the last (a head) to the last, so a model of ``n`` blocks has at most ``n + 1`` stages.
    """

    blocks: tuple[str, ...]
    #: what one block is, for messages ("encoder layer", "MBConv block", "bottleneck")
    unit: str
    #: the blocks are identical layers (a transformer's), so a split may be given as how many
    #: layers each stage holds (Graphcore's ``layers_per_ipu``)
    repeated_layers: bool = False
    #: stage count -> split points known to balance well there
    recommended: Mapping[int, RecommendedSplit] = field(default_factory=dict)
    #: modules after the last block that share a weight with what precedes the first block (an output
    #: layer tied to the input embedding): a pipeline must run them on the first stage's device, in a
    #: stage of its own after the last (one more pipeline stage)
    tied_to_first_stage: tuple[str, ...] = ()

    @property
    def max_stages(self) -> int:
        return len(self.blocks) + 1

    def split_points_for_layers(self, layers_per_stage: Sequence[int]) -> tuple[str, ...]:
        """The split points that give stage ``k`` ``layers_per_stage[k]`` blocks (the first stage
        also holds what precedes the first block). ValueError says what is wrong."""
        if not self.repeated_layers:
            raise ValueError(f"the model's {self.unit}s are not identical layers; give split points instead")
        if any(count < 0 for count in layers_per_stage):
            raise ValueError("layer counts cannot be negative")
        if sum(layers_per_stage) != len(self.blocks):
            raise ValueError(
                f"the counts add up to {sum(layers_per_stage)}; the model has {len(self.blocks)} {self.unit}s"
            )
        if any(count == 0 for count in layers_per_stage[1:]):
            raise ValueError(f"every stage after the first needs at least one {self.unit} (only the first may hold 0)")
        starts = [sum(layers_per_stage[:k]) for k in range(1, len(layers_per_stage))]
        return tuple(self.blocks[start] for start in starts)

    def layers_per_stage(self, split_points: Sequence[str]) -> tuple[int, ...]:
        """How many blocks each stage holds when the stages begin at ``split_points`` (valid ones)."""
        starts = [0] + [self.blocks.index(point) for point in split_points] + [len(self.blocks)]
        return tuple(starts[k + 1] - starts[k] for k in range(len(starts) - 1))

    def check_split_points(self, split_points: Sequence[str]) -> None:
        """ValueError unless ``split_points`` are distinct blocks in execution order."""
        unknown = [point for point in split_points if point not in self.blocks]
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a {self.unit} of the model")
        positions = [self.blocks.index(point) for point in split_points]
        if positions != sorted(set(positions)):
            raise ValueError("split points must be distinct and in the model's execution order")
