"""Semantic segmentation on Cityscapes-shaped data: SegFormer-B4 and DeepLabV3+ R101, as the GH200
paper trained them from MMSegmentation's model zoo (its Table II).

SegFormer comes from transformers (MiT-B4 encoder with MMSegmentation's 256-wide decode head);
transformers has no DeepLabV3+, so it is written here in plain torch after MMSegmentation's
``deeplabv3plus_r101-d8`` config (ResNetV1c-101, output stride 8, depthwise-separable ASPP, an
auxiliary FCN head). Both train with their own losses: pixel-wise cross-entropy on the logits
upsampled to the label size, ignoring label 255 (Cityscapes' "unlabelled"), DeepLab's auxiliary
head weighted 0.4.

Synthetic samples are random crops of the training size with masks of 19 train ids and about 10 %
ignored pixels; real data reads the Cityscapes folder layout (``core.data.cityscapes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.contract.workload import TorchTrainingSpec
from core.workloads.counting import Tally, conv_output
from core.workloads.zoo import (
    Source,
    ZooOptions,
    ZooWorkload,
    logits_module,
    option_error,
    seeded,
    transformers_source,
)

CITYSCAPES_CLASSES = 19  # the train ids of Cityscapes' evaluation classes
IGNORE_INDEX = 255  # Cityscapes' train id for unlabelled pixels, skipped by the loss
#: Cityscapes' fine-annotated training split (gtFine train), the standard split size
CITYSCAPES_TRAIN_IMAGES = 2_975
CITYSCAPES_VAL_IMAGES = 500
#: share of synthetic pixels labelled 255: Cityscapes leaves roughly this much of a frame unlabelled
SYNTHETIC_IGNORED_SHARE = 0.1
ADAMW_LEARNING_RATE = 6e-5  # MMSegmentation's SegFormer schedule
SGD_LEARNING_RATE = 0.01  # MMSegmentation's DeepLabV3+ schedule
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 5e-4
AUXILIARY_LOSS_WEIGHT = 0.4  # MMSegmentation's FCN auxiliary head


class SegmentationOptions(ZooOptions):
    crop_height: int | None = Field(
        default=None, ge=32, le=4096, description="training crop height in pixels; None: the workload's own"
    )
    crop_width: int | None = Field(
        default=None, ge=32, le=4096, description="training crop width in pixels; None: the workload's own"
    )
    # Full-size crops are megabytes each: a smaller pool than the classifiers' keeps host memory sane.
    synthetic_pool_samples: int = Field(
        default=8, ge=1, le=1 << 16, description="distinct synthetic samples; sample i is pool[i % pool]"
    )


class SegmentationWorkload(ZooWorkload):
    """Cityscapes segmentation: images [3, H, W] -> logits; targets are uint8 masks [H, W] of train ids."""

    task: ClassVar[str] = "segmentation"
    sample_unit: ClassVar[str] = "images"
    options_model: ClassVar[type[BaseModel]] = SegmentationOptions
    data_formats: ClassVar[tuple[str, ...] | None] = ("cityscapes",)
    prefers_channels_last: ClassVar[bool] = True
    #: (height, width) of MMSegmentation's training crop
    crop: ClassVar[tuple[int, int]]
    small_crop: ClassVar[tuple[int, int]] = (64, 64)

    def crop_shape(self, o: SegmentationOptions) -> tuple[int, int]:
        default = self.small_crop if o.variant == "small" else self.crop
        return (o.crop_height or default[0], o.crop_width or default[1])

    def input_shape(self, o: SegmentationOptions) -> tuple[int, int, int]:
        return (3, *self.crop_shape(o))

    def samples_per_epoch(self, options: BaseModel) -> int:
        return CITYSCAPES_TRAIN_IMAGES

    def evaluation_samples(self, options: BaseModel) -> int:
        return CITYSCAPES_VAL_IMAGES

    def shape_details(self, o: SegmentationOptions) -> dict[str, Any]:
        return {
            "dataset": "cityscapes",
            "input_shape": list(self.input_shape(o)),
            "num_classes": CITYSCAPES_CLASSES,
            "ignore_index": IGNORE_INDEX,
        }

    def make_optimizer(self, parameters: Any) -> Any:
        raise NotImplementedError

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        assert isinstance(options, SegmentationOptions)
        model = seeded(seed, lambda: self.torch_model(options))
        model.train()
        images, masks = synthetic_cityscapes(options.synthetic_pool_samples, self.crop_shape(options), seed + 1)
        return TorchTrainingSpec(
            model=model, loss_fn=self.loss, make_optimizer=self.make_optimizer, inputs=images, targets=masks
        )

    def loss(self, outputs: Any, masks: Any) -> Any:
        """The model's own loss on its outputs (logits, or DeepLab's (logits, auxiliary logits))."""
        return pixel_cross_entropy(outputs, masks)


def synthetic_cityscapes(pool: int, crop: tuple[int, int], seed: int) -> tuple[Any, Any]:
    """``pool`` normalised images [3, H, W] and uint8 masks [H, W] of train ids 0..18 or 255."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(pool, 3, *crop, generator=generator)
    masks = torch.randint(0, CITYSCAPES_CLASSES, (pool, *crop), generator=generator, dtype=torch.uint8)
    ignored = torch.rand(pool, *crop, generator=generator) < SYNTHETIC_IGNORED_SHARE
    masks[ignored] = IGNORE_INDEX
    return images, masks


def pixel_cross_entropy(logits: Any, masks: Any) -> Any:
    """Cross-entropy of logits upsampled (bilinear) to the mask size, unlabelled pixels skipped: what
    transformers' SegformerForSemanticSegmentation and MMSegmentation's decode heads compute."""
    from torch import nn

    upsampled = nn.functional.interpolate(logits, size=masks.shape[-2:], mode="bilinear", align_corners=False)
    return nn.functional.cross_entropy(upsampled, masks.long(), ignore_index=IGNORE_INDEX)


# --- SegFormer-B4 ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SegformerShape:
    depths: tuple[int, ...]
    hidden_sizes: tuple[int, ...]
    heads: tuple[int, ...]
    reduction_ratios: tuple[int, ...]
    decoder_width: int
    patch_sizes: tuple[int, ...] = (7, 3, 3, 3)
    strides: tuple[int, ...] = (4, 2, 2, 2)
    mlp_ratio: int = 4


class SegformerB4(SegmentationWorkload):
    optimizer_state_floats: ClassVar[int | None] = 2  # AdamW
    name: ClassVar[str] = "segformer-b4"
    description: ClassVar[str] = "SegFormer-B4 (MiT-B4, MMSegmentation's 256-wide head), Cityscapes segmentation"
    architecture: ClassVar[str] = (
        "SegFormer: MiT-B4 encoder (depths [3, 8, 27, 3], widths [64, 128, 320, 512], reduction [8, 4, 2, 1]), "
        "all-MLP decode head 256 wide (MMSegmentation's; the SegFormer paper's is 768), 19 classes"
    )
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("SegformerForSemanticSegmentation")
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    crop: ClassVar[tuple[int, int]] = (1024, 1024)
    default_micro_batch_size: ClassVar[int] = 1  # MMSegmentation's 8xb1
    full: ClassVar[SegformerShape] = SegformerShape((3, 8, 27, 3), (64, 128, 320, 512), (1, 2, 5, 8), (8, 4, 2, 1), 256)
    small: ClassVar[SegformerShape] = SegformerShape((1, 1, 1, 1), (16, 32, 64, 128), (1, 1, 2, 4), (8, 4, 2, 1), 32)

    def shape(self, o: SegmentationOptions) -> SegformerShape:
        return self.small if o.variant == "small" else self.full

    def tally(self, o: Any, framework: Framework) -> Tally:
        s = self.shape(o)
        height, width = self.crop_shape(o)
        t = Tally()
        in_channels = 3
        stage_tokens = []
        for stage, (depth, hidden) in enumerate(zip(s.depths, s.hidden_sizes)):
            kernel, stride = s.patch_sizes[stage], s.strides[stage]
            height = conv_output(height, kernel, stride, 2 * (kernel // 2))
            width = conv_output(width, kernel, stride, 2 * (kernel // 2))
            t.conv(in_channels, hidden, kernel, height, width, bias=True, reads_input=stage == 0)
            t.params(2 * hidden)  # patch embedding layer norm
            tokens = height * width
            for _ in range(depth):
                _segformer_block(t, hidden, height, width, s.reduction_ratios[stage], s.mlp_ratio)
            t.params(2 * hidden)  # the stage's closing layer norm
            stage_tokens.append(tokens)
            in_channels = hidden
        decoder = s.decoder_width
        for hidden, tokens in zip(s.hidden_sizes, stage_tokens):
            t.linear(hidden, decoder, tokens=tokens)  # each stage to the decoder width, at its own resolution
        quarter = stage_tokens[0]  # the fused map is at the first stage's 1/4 resolution
        t.conv(len(s.hidden_sizes) * decoder, decoder, 1, quarter, 1, norm_parameters=2)  # linear_fuse + BN
        t.conv(decoder, CITYSCAPES_CLASSES, 1, quarter, 1, bias=True)
        return t

    def torch_model(self, o: SegmentationOptions) -> Any:
        transformers = self.load(Framework.torch)
        s = self.shape(o)
        config = transformers.SegformerConfig(
            depths=list(s.depths),
            hidden_sizes=list(s.hidden_sizes),
            num_attention_heads=list(s.heads),
            sr_ratios=list(s.reduction_ratios),
            decoder_hidden_size=s.decoder_width,
            num_labels=CITYSCAPES_CLASSES,
            semantic_loss_ignore_index=IGNORE_INDEX,
        )
        # the decode head's logits at 1/4 resolution (the loss upsamples them)
        return logits_module(transformers.SegformerForSemanticSegmentation(config), "pixel_values")

    def make_optimizer(self, parameters: Any) -> Any:
        import torch

        return torch.optim.AdamW(parameters, lr=ADAMW_LEARNING_RATE, weight_decay=0.01)


def _segformer_block(t: Tally, hidden: int, height: int, width: int, reduction: int, mlp_ratio: int) -> None:
    """One MiT block: efficient self-attention (keys and values from a map shrunk ``reduction`` times
    per side by a strided convolution) and a Mix-FFN with a 3x3 depthwise convolution."""
    tokens = height * width
    t.params(2 * hidden)  # layer norm before attention
    t.linear(hidden, hidden, tokens=tokens)  # query
    key_tokens = tokens
    if reduction > 1:
        reduced_h, reduced_w = conv_output(height, reduction, reduction), conv_output(width, reduction, reduction)
        t.conv(hidden, hidden, reduction, reduced_h, reduced_w, bias=True)
        t.params(2 * hidden)  # its layer norm
        key_tokens = reduced_h * reduced_w
    t.linear(hidden, hidden, tokens=key_tokens)  # key
    t.linear(hidden, hidden, tokens=key_tokens)  # value
    t.matmul(2 * tokens * key_tokens * hidden)  # scores and weighted values, all heads
    t.linear(hidden, hidden, tokens=tokens)  # output
    t.params(2 * hidden)  # layer norm before the Mix-FFN
    expanded = mlp_ratio * hidden
    t.linear(hidden, expanded, tokens=tokens)
    t.conv(expanded, expanded, 3, height, width, groups=expanded, bias=True)
    t.linear(expanded, hidden, tokens=tokens)


# --- DeepLabV3+ R101 -------------------------------------------------------------------------


@dataclass(frozen=True)
class DeeplabShape:
    depths: tuple[int, ...]  # bottleneck blocks per ResNet stage
    stem_width: int  # ResNetV1c's deep stem: 3x3 convs to stem/2, stem/2, stem channels
    stage_widths: tuple[int, ...]  # output channels per stage (4x the bottleneck width)
    head_channels: int  # ASPP and decoder width (MMSegmentation's ``channels``)
    low_level_channels: int  # the projection of stage 1's features (``c1_channels``)
    auxiliary_channels: int  # the FCN auxiliary head
    aspp_dilations: tuple[int, ...] = (12, 24, 36)
    #: dilation of stages 3 and 4 in place of their stride (output stride 8)
    stage_dilations: tuple[int, ...] = (1, 1, 2, 4)
    stage_strides: tuple[int, ...] = (1, 2, 1, 1)


class DeeplabV3PlusR101(SegmentationWorkload):
    optimizer_state_floats: ClassVar[int | None] = 1  # SGD with momentum
    name: ClassVar[str] = "deeplabv3plus-r101"
    description: ClassVar[str] = "DeepLabV3+ with a dilated ResNet-101-V1c (output stride 8), Cityscapes segmentation"
    architecture: ClassVar[str] = (
        "DeepLabV3+ as MMSegmentation's deeplabv3plus_r101-d8: ResNetV1c-101 (deep stem), stages 3-4 dilated 2 "
        "and 4, depthwise-separable ASPP (dilations 12/24/36, 512 wide), 48-channel low-level branch, "
        "FCN auxiliary head on stage 3, 19 classes"
    )
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: Source("core.workloads.deeplab.DeeplabV3Plus (plain torch)", "torch", "torch")
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    crop: ClassVar[tuple[int, int]] = (512, 1024)
    default_micro_batch_size: ClassVar[int] = 2  # MMSegmentation's 4xb2
    full: ClassVar[DeeplabShape] = DeeplabShape((3, 4, 23, 3), 64, (256, 512, 1024, 2048), 512, 48, 256)
    small: ClassVar[DeeplabShape] = DeeplabShape((1, 1, 1, 1), 16, (32, 64, 128, 256), 32, 8, 16)
    parameter_count_counts: ClassVar[str] = "trainable parameters, the auxiliary head's included"

    def shape(self, o: SegmentationOptions) -> DeeplabShape:
        return self.small if o.variant == "small" else self.full

    def check_options(self, o: SegmentationOptions) -> None:
        height, width = self.crop_shape(o)
        if height % 8 or width % 8:
            # The low-level branch at 1/4 and the ASPP at 1/8 must meet at exactly twice the size.
            raise option_error(
                "crop_height" if height % 8 else "crop_width",
                height if height % 8 else width,
                "a multiple of 8 (the backbone's output stride)",
            )

    def tally(self, o: Any, framework: Framework) -> Tally:
        return deeplab_tally(self.shape(o), self.crop_shape(o), CITYSCAPES_CLASSES)

    def torch_model(self, o: SegmentationOptions) -> Any:
        from core.workloads.deeplab import DeeplabV3Plus

        return DeeplabV3Plus(self.shape(o), CITYSCAPES_CLASSES)

    def loss(self, outputs: Any, masks: Any) -> Any:
        logits, auxiliary_logits = outputs
        return pixel_cross_entropy(logits, masks) + AUXILIARY_LOSS_WEIGHT * pixel_cross_entropy(auxiliary_logits, masks)

    def make_optimizer(self, parameters: Any) -> Any:
        import torch

        return torch.optim.SGD(parameters, lr=SGD_LEARNING_RATE, momentum=SGD_MOMENTUM, weight_decay=SGD_WEIGHT_DECAY)


def deeplab_tally(s: DeeplabShape, crop: tuple[int, int], classes: int) -> Tally:
    """Walk ``core.workloads.deeplab.DeeplabV3Plus`` layer by layer (convolutions with batch norm,
    no biases except the classifiers')."""
    t = Tally()
    height, width = conv_output(crop[0], 3, 2, 2), conv_output(crop[1], 3, 2, 2)
    half = s.stem_width // 2
    t.conv(3, half, 3, height, width, norm_parameters=2, reads_input=True)
    t.conv(half, half, 3, height, width, norm_parameters=2)
    t.conv(half, s.stem_width, 3, height, width, norm_parameters=2)
    height, width = conv_output(height, 3, 2, 2), conv_output(width, 3, 2, 2)  # max pool
    in_channels = s.stem_width
    features: list[tuple[int, int, int]] = []  # (channels, height, width) of each stage's output
    for depth, out_channels, stride in zip(s.depths, s.stage_widths, s.stage_strides):
        middle = out_channels // 4
        for block in range(depth):
            t.conv(in_channels, middle, 1, height, width, norm_parameters=2)  # before the stride (v1.5)
            if block == 0:
                height, width = conv_output(height, 3, stride, 2), conv_output(width, 3, stride, 2)
                t.conv(in_channels, out_channels, 1, height, width, norm_parameters=2)  # shortcut projection
            t.conv(middle, middle, 3, height, width, norm_parameters=2)  # dilated: the size is kept
            t.conv(middle, out_channels, 1, height, width, norm_parameters=2)
            in_channels = out_channels
        features.append((out_channels, height, width))
    (low_channels, low_h, low_w), (aux_in, aux_h, aux_w), (top, top_h, top_w) = features[0], features[2], features[3]
    head = s.head_channels
    t.conv(top, head, 1, 1, 1, norm_parameters=2)  # image pooling branch, on the 1x1 pooled map
    t.conv(top, head, 1, top_h, top_w, norm_parameters=2)  # the 1x1 ASPP branch
    for _ in s.aspp_dilations:
        _separable_conv(t, top, head, top_h, top_w)
    t.conv((2 + len(s.aspp_dilations)) * head, head, 3, top_h, top_w, norm_parameters=2)  # ASPP bottleneck
    t.conv(low_channels, s.low_level_channels, 1, low_h, low_w, norm_parameters=2)
    _separable_conv(t, head + s.low_level_channels, head, low_h, low_w)
    _separable_conv(t, head, head, low_h, low_w)
    t.conv(head, classes, 1, low_h, low_w, bias=True)
    t.conv(aux_in, s.auxiliary_channels, 3, aux_h, aux_w, norm_parameters=2)  # auxiliary FCN head
    t.conv(s.auxiliary_channels, classes, 1, aux_h, aux_w, bias=True)
    return t


def _separable_conv(t: Tally, in_channels: int, out_channels: int, height: int, width: int) -> None:
    """MMSegmentation's DepthwiseSeparableConvModule: 3x3 depthwise + BN, 1x1 pointwise + BN."""
    t.conv(in_channels, in_channels, 3, height, width, groups=in_channels, norm_parameters=2)
    t.conv(in_channels, out_channels, 1, height, width, norm_parameters=2)


SEGMENTATION_WORKLOADS = (SegformerB4, DeeplabV3PlusR101)
