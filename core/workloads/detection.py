"""Object detection on COCO-shaped data: Faster R-CNN R50-FPN and a DINO-like Swin-L detector, the
GH200 paper's MMDetection models (its Table II).

- ``faster-rcnn-r50-fpn``: torchvision's Faster R-CNN (ResNet-50 v1.5 with frozen batch-norm
  statistics, FPN, RPN, two-layer RoI box head), 91 classes. torchvision pins one torch release and
  cannot load with every torch build; then planning refuses the workload, naming the package.
- ``dino-swin-l``: transformers has no DINO. The closest model it has is Deformable DETR with
  two-stage proposals and iterative box refinement; here with DINO's Swin-L backbone (window 12,
  384-px pretraining shape), 5 feature levels, 900 queries and 2048-wide feed-forward layers. DINO's
  contrastive denoising queries and mixed query selection are not in it.

Samples are images padded to a fixed size (MMDetection resizes COCO images to fit 1333x800 keeping
the aspect ratio, and pads); targets are ``objects_per_image`` rows of (class index 0..79, x1, y1,
x2, y2) in pixels, rows of class -1 being padding (real images have varying object counts). Both
train with the model's own loss: torchvision's RPN and RoI-head losses, Deformable DETR's
Hungarian-matched focal, L1 and GIoU losses with auxiliary decoder losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from core.base.config import Framework
from core.contract.workload import TorchTrainingSpec
from core.workloads.counting import Tally, conv_output
from core.workloads.swin_counting import swin_tally
from core.workloads.zoo import Source, ZooOptions, ZooWorkload, seeded, torchvision_source, transformers_source

COCO_CLASSES = 80  # the object categories of COCO's detection task
#: COCO train2017, the standard split size
COCO_TRAIN_IMAGES = 118_287
COCO_VAL_IMAGES = 5_000  # val2017
#: COCO train2017 has 860,001 object annotations over 118,287 images: 7.3 per image
COCO_OBJECTS_PER_IMAGE = 7
PADDING_LABEL = -1
SMALLEST_BOX_PIXELS = 8
ADAMW_LEARNING_RATE = 1e-4  # MMDetection's DINO schedule
SGD_LEARNING_RATE = 0.02  # MMDetection's Faster R-CNN 1x schedule (16 images per update)
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 1e-4


class DetectionOptions(ZooOptions):
    image_height: int | None = Field(default=None, ge=64, le=4096, description="padded image height; None: 800")
    image_width: int | None = Field(default=None, ge=64, le=4096, description="padded image width; None: 1333")
    objects_per_image: int = Field(
        default=COCO_OBJECTS_PER_IMAGE, ge=1, le=100, description="boxes per synthetic image (COCO averages 7.3)"
    )
    synthetic_pool_samples: int = Field(
        default=8, ge=1, le=1 << 16, description="distinct synthetic samples; sample i is pool[i % pool]"
    )


class DetectionWorkload(ZooWorkload):
    """COCO detection: images [3, H, W] -> the model's outputs; targets [objects, 5] float rows."""

    task: ClassVar[str] = "detection"
    sample_unit: ClassVar[str] = "images"
    options_model: ClassVar[type[BaseModel]] = DetectionOptions
    data_formats: ClassVar[tuple[str, ...] | None] = ("coco",)
    default_micro_batch_size: ClassVar[int] = 2  # MMDetection's 8xb2
    #: MMDetection's test-time and synthetic shape: COCO resized to fit 1333x800
    image_shape: ClassVar[tuple[int, int]] = (800, 1333)
    small_image_shape: ClassVar[tuple[int, int]] = (128, 128)

    def padded_shape(self, o: DetectionOptions) -> tuple[int, int]:
        default = self.small_image_shape if o.variant == "small" else self.image_shape
        return (o.image_height or default[0], o.image_width or default[1])

    def input_shape(self, o: DetectionOptions) -> tuple[int, int, int]:
        return (3, *self.padded_shape(o))

    def samples_per_epoch(self, options: BaseModel) -> int:
        return COCO_TRAIN_IMAGES

    def evaluation_samples(self, options: BaseModel) -> int:
        return COCO_VAL_IMAGES

    def shape_details(self, o: DetectionOptions) -> dict[str, Any]:
        return {
            "dataset": "coco",
            "input_shape": list(self.input_shape(o)),
            "num_classes": COCO_CLASSES,
            "objects_per_image": o.objects_per_image,
        }

    def make_optimizer(self, parameters: Any) -> Any:
        raise NotImplementedError

    def build_torch(self, options: BaseModel, seed: int) -> TorchTrainingSpec:
        assert isinstance(options, DetectionOptions)
        model = seeded(seed, lambda: self.torch_model(options))
        model.train()
        images, targets = synthetic_coco(
            options.synthetic_pool_samples, self.padded_shape(options), options.objects_per_image, seed + 1
        )
        return TorchTrainingSpec(
            model=model, loss_fn=model.loss, make_optimizer=self.make_optimizer, inputs=images, targets=targets
        )


def synthetic_coco(pool: int, shape: tuple[int, int], objects: int, seed: int) -> tuple[Any, Any]:
    """``pool`` normalised images [3, H, W] and targets [objects, 5]: (class, x1, y1, x2, y2) in pixels,
    boxes at least 8 px a side, anywhere in the image."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    height, width = shape
    images = torch.randn(pool, 3, height, width, generator=generator)
    labels = torch.randint(0, COCO_CLASSES, (pool, objects), generator=generator).float()
    corners = torch.rand(pool, objects, 2, 2, generator=generator)  # two random points per box
    scale = torch.tensor([width - SMALLEST_BOX_PIXELS, height - SMALLEST_BOX_PIXELS])
    low = torch.minimum(corners[:, :, 0], corners[:, :, 1]) * scale
    high = torch.maximum(corners[:, :, 0], corners[:, :, 1]) * scale + SMALLEST_BOX_PIXELS
    return images, torch.cat([labels.unsqueeze(-1), low, high], dim=-1)


def target_rows(targets: Any) -> list[Any]:
    """Per image, its [objects, 5] rows without the padding rows."""
    return [rows[rows[:, 0] != PADDING_LABEL] for rows in targets]


# --- DINO-like: Deformable DETR, two-stage, box refinement, Swin-L ---------------------------


@dataclass(frozen=True)
class SwinShape:
    embed: int
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    window: int
    pretrain_image_size: int
    patch: int = 4


@dataclass(frozen=True)
class DeformableShape:
    width: int  # d_model
    encoder_layers: int
    decoder_layers: int
    heads: int
    feed_forward: int
    queries: int
    feature_levels: int = 5
    points: int = 4


class DinoSwinL(DetectionWorkload):
    optimizer_state_floats: ClassVar[int | None] = 2  # AdamW
    name: ClassVar[str] = "dino-swin-l"
    description: ClassVar[str] = (
        "DINO-like: Deformable-DETR two-stage + box refinement with a Swin-L backbone; "
        "DINO's contrastive denoising is not in it"
    )
    architecture: ClassVar[str] = (
        "Deformable DETR (two-stage, iterative box refinement), 900 queries, 5 feature levels, 6+6 layers, "
        "FFN 2048; Swin-L backbone (embed 192, depths [2, 2, 18, 2], window 12, 384-px pretraining shape); "
        "80 classes"
    )
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: transformers_source("DeformableDetrForObjectDetection")
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    full_swin: ClassVar[SwinShape] = SwinShape(192, (2, 2, 18, 2), (6, 12, 24, 48), 12, 384)
    small_swin: ClassVar[SwinShape] = SwinShape(16, (1, 1, 1, 1), (1, 1, 2, 2), 4, 128)
    full_transformer: ClassVar[DeformableShape] = DeformableShape(256, 6, 6, 8, 2048, 900)
    small_transformer: ClassVar[DeformableShape] = DeformableShape(32, 1, 2, 2, 64, 20)

    def shapes(self, o: DetectionOptions) -> tuple[SwinShape, DeformableShape]:
        if o.variant == "small":
            return self.small_swin, self.small_transformer
        return self.full_swin, self.full_transformer

    def tally(self, o: Any, framework: Framework) -> Tally:
        swin, deformable = self.shapes(o)
        t = DetachedTally()
        stages = swin_tally(
            t,
            channels=3,
            embed=swin.embed,
            depths=swin.depths,
            heads=swin.heads,
            window=swin.window,
            patch=swin.patch,
            image=self.padded_shape(o),
            stage_norms=True,  # transformers' SwinBackbone with every stage as an output
        )
        deformable_detr_tally(t, deformable, stages, COCO_CLASSES)
        return t

    def torch_model(self, o: DetectionOptions) -> Any:
        transformers = self.load(Framework.torch)
        swin, deformable = self.shapes(o)
        backbone = transformers.SwinConfig(
            image_size=swin.pretrain_image_size,
            embed_dim=swin.embed,
            depths=list(swin.depths),
            num_heads=list(swin.heads),
            window_size=swin.window,
            out_features=[f"stage{i + 1}" for i in range(len(swin.depths))],
        )
        config = transformers.DeformableDetrConfig(
            use_timm_backbone=False,
            use_pretrained_backbone=False,
            backbone_config=backbone,
            num_queries=deformable.queries,
            two_stage=True,
            two_stage_num_proposals=deformable.queries,
            with_box_refine=True,
            num_feature_levels=deformable.feature_levels,
            d_model=deformable.width,
            encoder_layers=deformable.encoder_layers,
            decoder_layers=deformable.decoder_layers,
            encoder_attention_heads=deformable.heads,
            decoder_attention_heads=deformable.heads,
            encoder_ffn_dim=deformable.feed_forward,
            decoder_ffn_dim=deformable.feed_forward,
            encoder_n_points=deformable.points,
            decoder_n_points=deformable.points,
            num_labels=COCO_CLASSES,
        )
        from core.workloads.detr_loss import DeformableDetrTraining

        return DeformableDetrTraining(transformers.DeformableDetrForObjectDetection(config))

    def make_optimizer(self, parameters: Any) -> Any:
        import torch

        return torch.optim.AdamW(parameters, lr=ADAMW_LEARNING_RATE, weight_decay=1e-4)


@dataclass
class DetachedTally(Tally):
    """A tally with layers whose outputs reach no loss: they run forward only (no backward)."""

    #: forward multiply-adds of those layers (also in ``macs``)
    forward_only_macs: int = 0

    def forward_only(self, build: Any) -> None:
        """Count what ``build(self)`` adds as forward-only."""
        before = self.macs
        build(self)
        self.forward_only_macs += self.macs - before

    @property
    def training_flops(self) -> int:
        return 2 * (3 * self.macs - self.input_macs - 2 * self.forward_only_macs)


def _box_mlp(t: Tally, width: int, tokens: int, *, reused: bool = False) -> None:
    """The 3-layer box regression MLP (width -> width -> width -> 4); ``reused``: a second pass through
    one already counted, which adds its multiply-adds only."""
    if reused:
        t.matmul((2 * width * width + 4 * width) * tokens)
        return
    t.linear(width, width, tokens=tokens)
    t.linear(width, width, tokens=tokens)
    t.linear(width, 4, tokens=tokens)


def _deformable_attention(t: Tally, d: DeformableShape, query_tokens: int, value_tokens: int) -> None:
    """Multi-scale deformable attention: values projected at every position of every level, offsets and
    weights predicted per query; the bilinear sampling and weighted sum are no matmuls."""
    samples = d.heads * d.feature_levels * d.points
    t.linear(d.width, d.width, tokens=value_tokens)  # value projection
    t.linear(d.width, 2 * samples, tokens=query_tokens)  # sampling offsets
    t.linear(d.width, samples, tokens=query_tokens)  # attention weights
    t.linear(d.width, d.width, tokens=query_tokens)  # output projection


def deformable_detr_tally(
    t: DetachedTally, d: DeformableShape, stages: list[tuple[int, int, int]], classes: int
) -> None:
    """transformers' DeformableDetrForObjectDetection (two-stage, box refinement) after the backbone."""
    w = d.width
    levels = [(h, wd) for _, h, wd in stages]
    for channels, height, width in stages:
        t.conv(channels, w, 1, height, width, bias=True, norm_parameters=2)  # input projection + group norm
    extra_channels, last_h, last_w = stages[-1]
    for _ in range(d.feature_levels - len(stages)):  # 3x3 stride-2 convolutions make the coarser levels
        last_h, last_w = conv_output(last_h, 3, 2, 2), conv_output(last_w, 3, 2, 2)
        t.conv(extra_channels, w, 3, last_h, last_w, bias=True, norm_parameters=2)
        levels.append((last_h, last_w))
        extra_channels = w
    t.params(d.feature_levels * w)  # level embeddings
    tokens = sum(h * wd for h, wd in levels)
    for _ in range(d.encoder_layers):
        _deformable_attention(t, d, tokens, tokens)
        t.linear(w, d.feed_forward, tokens=tokens)
        t.linear(d.feed_forward, w, tokens=tokens)
        t.params(2 * 2 * w)  # two layer norms

    # Two-stage: every encoder position proposes a box; the top-scoring ones seed the queries. The
    # proposals are detached and transformers' loss leaves these outputs out: no backward through them.
    def proposal_head(t: Tally) -> None:
        t.linear(w, w, tokens=tokens)
        t.params(2 * w)
        t.linear(w, classes, tokens=tokens)
        _box_mlp(t, w, tokens)

    t.forward_only(proposal_head)
    t.linear(2 * w, 2 * w, tokens=d.queries)  # position embedding of the proposals -> query and target
    t.params(2 * 2 * w)
    for _ in range(d.decoder_layers):
        for _ in range(4):  # self-attention: query, key, value, output
            t.linear(w, w, tokens=d.queries)
        t.matmul(2 * d.queries * d.queries * w)
        _deformable_attention(t, d, d.queries, tokens)
        t.linear(w, d.feed_forward, tokens=d.queries)
        t.linear(d.feed_forward, w, tokens=d.queries)
        t.params(3 * 2 * w)  # three layer norms
        _box_mlp(t, w, d.queries)  # box refinement inside the decoder
        t.linear(w, classes, tokens=d.queries)  # the head: class and box of every decoder layer
        _box_mlp(t, w, d.queries, reused=True)  # the same box MLP as the refinement's


# --- Faster R-CNN R50-FPN (torchvision) ------------------------------------------------------

RESNET50_DEPTHS = (3, 4, 6, 3)
FPN_WIDTH = 256
ANCHORS_PER_POSITION = 3  # torchvision's default: 3 aspect ratios, one size per level
ROI_SAMPLES_PER_IMAGE = 512  # box_batch_size_per_image: RoIs the box head trains on per image
ROI_POOL = 7
BOX_HEAD_WIDTH = 1024
TORCHVISION_COCO_CLASSES = 91  # torchvision's COCO head: 90 category ids (with gaps) and background


class FasterRcnnR50Fpn(DetectionWorkload):
    optimizer_state_floats: ClassVar[int | None] = 1  # SGD with momentum
    name: ClassVar[str] = "faster-rcnn-r50-fpn"
    description: ClassVar[str] = (
        "Faster R-CNN with a ResNet-50 FPN backbone, COCO detection; needs torchvision (refused without it)"
    )
    architecture: ClassVar[str] = (
        "torchvision fasterrcnn_resnet50_fpn: ResNet-50 v1.5 (frozen batch-norm statistics), FPN 256, RPN with "
        "3 anchors per position on 5 levels, RoIAlign 7x7, two 1024-wide layers, 91 classes"
    )
    sources: ClassVar[dict[Framework, Source]] = {
        Framework.torch: torchvision_source("detection.fasterrcnn_resnet50_fpn")
    }
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)
    parameter_count_counts: ClassVar[str] = (
        "trainable parameters (batch-norm statistics and affines are frozen buffers)"
    )

    def tally(self, o: Any, framework: Framework) -> Tally:
        height, width = (math.ceil(side / 32) * 32 for side in self.padded_shape(o))  # batched to /32
        t = Tally()
        stages = resnet50_tally(t, height, width)
        levels = []
        for channels, h, w in stages:
            t.conv(channels, FPN_WIDTH, 1, h, w, bias=True)  # lateral
            t.conv(FPN_WIDTH, FPN_WIDTH, 3, h, w, bias=True)  # output
            levels.append((h, w))
        levels.append((conv_output(levels[-1][0], 1, 2), conv_output(levels[-1][1], 1, 2)))  # max-pooled P6
        t.params(FPN_WIDTH * FPN_WIDTH * 9 + FPN_WIDTH)  # the RPN head: shared over levels
        t.params((FPN_WIDTH + 1) * ANCHORS_PER_POSITION * 5)
        for h, w in levels:
            t.macs += FPN_WIDTH * FPN_WIDTH * 9 * h * w + FPN_WIDTH * ANCHORS_PER_POSITION * 5 * h * w
        rois = ROI_SAMPLES_PER_IMAGE
        t.linear(FPN_WIDTH * ROI_POOL * ROI_POOL, BOX_HEAD_WIDTH, tokens=rois)
        t.linear(BOX_HEAD_WIDTH, BOX_HEAD_WIDTH, tokens=rois)
        t.linear(BOX_HEAD_WIDTH, TORCHVISION_COCO_CLASSES, tokens=rois)
        t.linear(BOX_HEAD_WIDTH, 4 * TORCHVISION_COCO_CLASSES, tokens=rois)
        return t

    def torch_model(self, o: DetectionOptions) -> Any:
        models = self.load(Framework.torch)
        from core.workloads.rcnn import FasterRcnnTraining

        height, width = self.padded_shape(o)
        return FasterRcnnTraining(models, height, width, TORCHVISION_COCO_CLASSES)

    def make_optimizer(self, parameters: Any) -> Any:
        import torch

        return torch.optim.SGD(parameters, lr=SGD_LEARNING_RATE, momentum=SGD_MOMENTUM, weight_decay=SGD_WEIGHT_DECAY)


def resnet50_tally(t: Tally, height: int, width: int) -> list[tuple[int, int, int]]:
    """torchvision's ResNet-50 v1.5 without its classifier, batch norms frozen (no parameters); returns
    (channels, height, width) of each stage's output."""
    height, width = conv_output(height, 7, 2, 6), conv_output(width, 7, 2, 6)
    t.conv(3, 64, 7, height, width, reads_input=True)
    height, width = conv_output(height, 3, 2, 2), conv_output(width, 3, 2, 2)
    in_channels = 64
    outputs = []
    for stage, (depth, out_channels) in enumerate(zip(RESNET50_DEPTHS, (256, 512, 1024, 2048))):
        middle = out_channels // 4
        for block in range(depth):
            t.conv(in_channels, middle, 1, height, width)
            if block == 0:
                stride = 1 if stage == 0 else 2
                height, width = conv_output(height, 3, stride, 2), conv_output(width, 3, stride, 2)
                t.conv(in_channels, out_channels, 1, height, width)
            t.conv(middle, middle, 3, height, width)
            t.conv(middle, out_channels, 1, height, width)
            in_channels = out_channels
        outputs.append((out_channels, height, width))
    return outputs


DETECTION_WORKLOADS = (FasterRcnnR50Fpn, DinoSwinL)
