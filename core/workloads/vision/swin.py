"""Swin Transformers: Swin-T, Swin-B and Swin-L."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from core.base.config import Framework
from core.workloads.counting import Tally
from core.workloads.swin_counting import swin_stage_resolutions, swin_tally
from core.workloads.vision.base import VisionOptions, VisionWorkload
from core.workloads.zoo import Source, logits_module, option_error, transformers_source


class SwinTransformer(VisionWorkload):
    """Swin (Liu et al. 2021): attention inside shifted windows, four stages joined by patch merging."""

    #: (embed_dim, depths, heads, window, patch) of the full and the small variant
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]]
    small: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (16, (2, 2, 2, 2), (1, 2, 2, 4), 2, 4)
    small_image_size: ClassVar[int] = 64
    min_image_size: ClassVar[int] = 8
    optimizer: ClassVar[Literal["sgd", "adamw"]] = "adamw"
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("SwinForImageClassification")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    default_micro_batch_size: ClassVar[int] = 64

    def dimensions(self, o: VisionOptions) -> tuple[int, tuple[int, ...], tuple[int, ...], int, int]:
        return self.small if o.variant == "small" else self.full

    def stage_resolutions(self, o: VisionOptions) -> list[tuple[int, int]]:
        _, depths, _, _, patch = self.dimensions(o)
        _, height, width = self.input_shape(o)
        return swin_stage_resolutions((height, width), patch, len(depths))

    def check_options(self, o: VisionOptions) -> None:
        super().check_options(o)
        _, _, _, window, _ = self.dimensions(o)
        smallest = min(min(r) for r in self.stage_resolutions(o))
        if smallest < window:
            # transformers builds the relative-position table for the configured window and cannot shrink it.
            raise option_error(
                "image_size",
                o.image_size if o.image_size is not None else f"{o.dataset} images",
                f"{self.name}'s last stage would be {smallest} tokens wide, narrower than its "
                f"{window}-token window; use an image_size of at least {self.min_side(o)}",
            )

    def min_side(self, o: VisionOptions) -> int:
        """The smallest image side whose last stage is still a window wide."""
        _, depths, _, window, patch = self.dimensions(o)
        return patch * (window - 1) * 2 ** (len(depths) - 1) + 1

    def tally(self, o: Any, framework: Framework) -> Tally:
        embed, depths, heads, window, patch = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        t = Tally()
        stages = swin_tally(
            t,
            channels=channels,
            embed=embed,
            depths=depths,
            heads=heads,
            window=window,
            patch=patch,
            image=(height, width),
            stage_norms=False,
        )
        last_dim, _, _ = stages[-1]
        t.linear(last_dim, self.num_classes(o))
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        transformers = self.load(Framework.torch)
        embed, depths, heads, window, patch = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        config = transformers.SwinConfig(
            image_size=(height, width),
            patch_size=patch,
            num_channels=channels,
            embed_dim=embed,
            depths=list(depths),
            num_heads=list(heads),
            window_size=window,
            num_labels=self.num_classes(o),
        )
        return logits_module(transformers.SwinForImageClassification(config), "pixel_values")


class SwinTiny(SwinTransformer):
    name: ClassVar[str] = "swin-t"
    description: ClassVar[str] = "Swin-T shifted-window transformer, image classification"
    architecture: ClassVar[str] = "Swin-T: embed 96, depths [2, 2, 6, 2], heads [3, 6, 12, 24], window 7, patch 4"
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (96, (2, 2, 6, 2), (3, 6, 12, 24), 7, 4)


class SwinLarge(SwinTransformer):
    name: ClassVar[str] = "swin-l"
    description: ClassVar[str] = "Swin-L shifted-window transformer, image classification (DINO's backbone)"
    architecture: ClassVar[str] = "Swin-L: embed 192, depths [2, 2, 18, 2], heads [6, 12, 24, 48], window 7, patch 4"
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (
        192,
        (2, 2, 18, 2),
        (6, 12, 24, 48),
        7,
        4,
    )
    default_micro_batch_size: ClassVar[int] = 16


class SwinBase(SwinTransformer):
    name: ClassVar[str] = "swin-b"
    description: ClassVar[str] = "Swin-B shifted-window transformer, image classification"
    architecture: ClassVar[str] = "Swin-B: embed 128, depths [2, 2, 18, 2], heads [4, 8, 16, 32], window 7, patch 4"
    full: ClassVar[tuple[int, tuple[int, ...], tuple[int, ...], int, int]] = (128, (2, 2, 18, 2), (4, 8, 16, 32), 7, 4)
    default_micro_batch_size: ClassVar[int] = 32
