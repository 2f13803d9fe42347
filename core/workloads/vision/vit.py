"""Vision Transformers: ViT-L/32, ViT-L/16 and ViT-H/14."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from core.base.config import Framework
from core.contract.parallel import TensorParallelPlan
from core.contract.shape import TransformerShape
from core.workloads.counting import Tally
from core.workloads.vision.base import VisionOptions, VisionWorkload
from core.workloads.zoo import Source, logits_module, transformers_source


class VisionTransformer(VisionWorkload):
    """ViT (Dosovitskiy et al. 2021): patches, a CLS token and learned positions, pre-norm encoder layers."""

    #: (hidden, layers, heads, intermediate) of the full and the small variant
    full: ClassVar[tuple[int, int, int, int]]
    small: ClassVar[tuple[int, int, int, int]] = (64, 2, 2, 256)
    patch_size: ClassVar[int]
    optimizer: ClassVar[Literal["sgd", "adamw"]] = "adamw"
    sources: ClassVar[dict[Framework, Source]] = {Framework.torch: transformers_source("ViTForImageClassification")}
    frameworks: ClassVar[tuple[Framework, ...]] = tuple(sources)

    def dimensions(self, o: VisionOptions) -> tuple[int, int, int, int]:
        return self.small if o.variant == "small" else self.full

    def transformer_shape(self, options: Any) -> TransformerShape:
        hidden, layers, heads, intermediate = self.dimensions(options)
        _, height, width = self.input_shape(options)
        patches = (height // self.patch_size) * (width // self.patch_size)
        # the head classifies the CLS token alone: no per-token logits; transformers builds ViT's
        # attention with PyTorch's fused kernel (attn_implementation "sdpa", its default)
        return TransformerShape(layers, hidden, heads, patches + 1, intermediate, fused_attention=True)

    def tensor_parallel_plan(self, options: BaseModel) -> TensorParallelPlan:
        # Megatron's split of a ViT layer: q, k and v projections (three nn.Linear) by output
        # features, o_proj by input features; the MLP (fc1, fc2) likewise. The attention reshapes
        # by the tensor's width (view(..., -1, head_dim)); its stored head count is made per device
        # anyway. Patch embedding, norms and the classifier stay whole on every device.
        assert isinstance(options, VisionOptions)
        _, _, heads, intermediate = self.dimensions(options)
        layer = "model.vit.layers.*"
        return TensorParallelPlan(
            styles={
                f"{layer}.attention.q_proj": "colwise",
                f"{layer}.attention.k_proj": "colwise",
                f"{layer}.attention.v_proj": "colwise",
                f"{layer}.attention.o_proj": "rowwise",
                f"{layer}.mlp.fc1": "colwise",
                f"{layer}.mlp.fc2": "rowwise",
            },
            head_count_attributes={f"{layer}.attention": ("num_attention_heads",)},
            divided={"attention heads": heads, "MLP width": intermediate},
        )

    def tally(self, o: Any, framework: Framework) -> Tally:
        hidden, layers, _, intermediate = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        grid_h, grid_w = height // self.patch_size, width // self.patch_size
        tokens = grid_h * grid_w + 1  # patches and the CLS token
        t = Tally()
        t.conv(channels, hidden, self.patch_size, grid_h, grid_w, bias=True, reads_input=True)
        t.params(hidden + tokens * hidden)  # CLS token, position embeddings
        for _ in range(layers):
            t.params(2 * hidden)  # layer norm before attention
            for _ in range(4):  # query, key, value, output
                t.linear(hidden, hidden, tokens=tokens)
            t.matmul(2 * tokens * tokens * hidden)  # scores and weighted values, all heads
            t.params(2 * hidden)  # layer norm before the MLP
            t.linear(hidden, intermediate, tokens=tokens)
            t.linear(intermediate, hidden, tokens=tokens)
        t.params(2 * hidden)  # final layer norm
        t.linear(hidden, self.num_classes(o))  # on the CLS token
        return t

    def torch_model(self, o: VisionOptions) -> Any:
        transformers = self.load(Framework.torch)
        hidden, layers, heads, intermediate = self.dimensions(o)
        channels, height, width = self.input_shape(o)
        config = transformers.ViTConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            image_size=(height, width),
            patch_size=self.patch_size,
            num_channels=channels,
            num_labels=self.num_classes(o),
        )
        return logits_module(transformers.ViTForImageClassification(config), "pixel_values")


class VitLarge32(VisionTransformer):
    """The GH200 paper's ViT-L: its 306.5 M parameters are ViT-L/32's (torchvision vit_l_32: 306,535,400)."""

    name: ClassVar[str] = "vit-l32"
    description: ClassVar[str] = "ViT-L/32 vision transformer, image classification (the GH200 paper's ViT-L)"
    architecture: ClassVar[str] = "ViT-L/32: 24 layers, hidden 1024, 16 heads, MLP 4096, 32x32 patches"
    full: ClassVar[tuple[int, int, int, int]] = (1024, 24, 16, 4096)
    patch_size: ClassVar[int] = 32
    default_micro_batch_size: ClassVar[int] = 64


class VitLarge16(VisionTransformer):
    name: ClassVar[str] = "vit-l16"
    description: ClassVar[str] = "ViT-L/16 vision transformer, image classification (4x ViT-L/32's FLOPs)"
    architecture: ClassVar[str] = "ViT-L/16: 24 layers, hidden 1024, 16 heads, MLP 4096, 16x16 patches"
    full: ClassVar[tuple[int, int, int, int]] = (1024, 24, 16, 4096)
    patch_size: ClassVar[int] = 16
    default_micro_batch_size: ClassVar[int] = 32


class VitHuge14(VisionTransformer):
    """ViT-H/14 at 518 px: the GH200 paper's 633.5 M parameters are torchvision's SWAG end-to-end
    vit_h_14 (633,470,440), whose position table is for 518 px (37 x 37 patches)."""

    name: ClassVar[str] = "vit-h14"
    description: ClassVar[str] = "ViT-H/14 vision transformer at 518 px, image classification"
    architecture: ClassVar[str] = "ViT-H/14: 32 layers, hidden 1280, 16 heads, MLP 5120, 14x14 patches, 518 px"
    imagenet_image_size: ClassVar[int] = 518
    full: ClassVar[tuple[int, int, int, int]] = (1280, 32, 16, 5120)
    patch_size: ClassVar[int] = 14
    small_image_size: ClassVar[int] = 28
    min_image_size: ClassVar[int] = 14
    default_micro_batch_size: ClassVar[int] = 16
