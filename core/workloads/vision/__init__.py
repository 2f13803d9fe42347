"""Image classification: ResNet, ViT, Swin, EfficientNet, MobileNetV3 and Inception-v3, one module
per family (``resnet``, ``vit``, ``swin``, ``efficientnet``, ``mobilenet``, ``inception``) over what
they share (``base``: options, input shapes, synthetic data, optimizers, the Keras builders).

Every architecture comes from a well-kept library, built from its configuration with random
weights (never downloaded): transformers for PyTorch (torchvision for MobileNetV3 and
Inception-v3, which transformers does not have), keras.applications for TensorFlow.
``tally()`` walks each architecture the way its library builds it, for parameter counts and
FLOPs without building anything; tests check both against the built models.

The "small" variant keeps the architecture and cuts it down for CI: transformers get fewer,
narrower layers; convolutional networks keep every layer (the libraries offer no shallower
form in both frameworks) and take small images.
"""

from __future__ import annotations

from core.workloads.vision.base import (
    ADAMW_LEARNING_RATE,
    SGD_LEARNING_RATE,
    SGD_MOMENTUM,
    HydraOptions,
    VisionOptions,
    VisionWorkload,
)
from core.workloads.vision.efficientnet import (
    EfficientNet,
    EfficientNetB0,
    EfficientNetB0G16GN,
    EfficientNetB4,
    EfficientNetB4G16GN,
    EfficientNetG16GN,
)
from core.workloads.vision.inception import InceptionV3
from core.workloads.vision.mobilenet import MobileNetV3, MobileNetV3Large, MobileNetV3Small
from core.workloads.vision.resnet import ResNet, ResNet50, ResNet152, ResNetOptions, ResNetVersion
from core.workloads.vision.swin import SwinBase, SwinLarge, SwinTiny, SwinTransformer
from core.workloads.vision.vit import VisionTransformer, VitHuge14, VitLarge16, VitLarge32

__all__ = [
    "ADAMW_LEARNING_RATE",
    "SGD_LEARNING_RATE",
    "SGD_MOMENTUM",
    "VISION_WORKLOADS",
    "EfficientNet",
    "EfficientNetB0",
    "EfficientNetB0G16GN",
    "EfficientNetB4",
    "EfficientNetB4G16GN",
    "EfficientNetG16GN",
    "HydraOptions",
    "InceptionV3",
    "MobileNetV3",
    "MobileNetV3Large",
    "MobileNetV3Small",
    "ResNet",
    "ResNet50",
    "ResNet152",
    "ResNetOptions",
    "ResNetVersion",
    "SwinBase",
    "SwinLarge",
    "SwinTiny",
    "SwinTransformer",
    "VisionOptions",
    "VisionTransformer",
    "VisionWorkload",
    "VitHuge14",
    "VitLarge16",
    "VitLarge32",
]

VISION_WORKLOADS = (
    ResNet50,
    ResNet152,
    VitLarge32,
    VitLarge16,
    VitHuge14,
    SwinTiny,
    SwinBase,
    SwinLarge,
    EfficientNetB0,
    EfficientNetB4,
    EfficientNetB0G16GN,
    EfficientNetB4G16GN,
    MobileNetV3Small,
    MobileNetV3Large,
    InceptionV3,
)
