"""The real datasets the zoo's synthetic data stands for: sample shapes, label ranges, epoch sizes.

Synthetic samples have exactly these shapes and label ranges, and ``samples_per_epoch`` lets a
result state time and energy per epoch of the real dataset. Training splits are counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ImageDataset:
    name: str
    channels: int
    height: int
    width: int
    num_classes: int
    samples_per_epoch: int
    description: str
    #: fed at the model's own ImageNet input size, not at the dataset's: what the GH200 paper's
    #: Table I implies for CIFAR-100 and Food-101 (docs/workloads.md, "Dataset shapes")
    resized_to_model: bool = False
    #: its validation (or test) split, what an inference run's "dataset" epoch counts; None: unknown
    evaluation_samples: int | None = None


@dataclass(frozen=True)
class TokenDataset:
    name: str
    tokens_per_epoch: int
    description: str

    def samples_per_epoch(self, sequence_length: int) -> int:
        return self.tokens_per_epoch // sequence_length


IMAGE_DATASETS: dict[str, ImageDataset] = {
    d.name: d
    for d in (
        ImageDataset(
            "imagenet",
            3,
            224,
            224,
            1000,
            1_281_167,
            "ImageNet-1k (ILSVRC 2012) training set at the usual 224x224 crop",
            evaluation_samples=50_000,  # the validation set the GH200 paper's Fig. 2 infers over
        ),
        ImageDataset(
            "cifar100",
            3,
            32,
            32,
            100,
            50_000,
            "CIFAR-100 training set (50,000 of its 60,000 images), resized to the model's input",
            resized_to_model=True,
            evaluation_samples=10_000,
        ),
        ImageDataset(
            "food101",
            3,
            512,
            512,
            101,
            75_750,
            "Food-101 training split (750 of the 1,000 images of each class; up to 512 px), resized to the "
            "model's input",
            resized_to_model=True,
            evaluation_samples=25_250,  # 250 test images of each class
        ),
        ImageDataset(
            "mnist",
            1,
            28,
            28,
            10,
            60_000,
            "MNIST training set (60,000 of its 70,000 digits)",
            evaluation_samples=10_000,
        ),
        ImageDataset(
            "hydra",
            3,
            600,
            800,
            2,
            28_900,
            "GlueX Hydra monitoring plots of the AI4NP study: 800x600 RGB, 28.9k training samples; "
            "the poster does not give the label count, 2 (good, bad) is assumed",
        ),
    )
}

TOKEN_DATASETS: dict[str, TokenDataset] = {
    d.name: d
    for d in (
        TokenDataset(
            "openwebtext", 9_035_582_198, "OpenWebText in GPT-2 BPE tokens, as nanoGPT prepares it (its train.bin)"
        ),
        TokenDataset(
            "wikipedia-bookcorpus",
            3_300_000_000,
            "BERT's pre-training corpus: English Wikipedia (2,500M words) and BooksCorpus (800M words), "
            "counted as one token per word (WordPiece gives somewhat more)",
        ),
    )
}

ImageDatasetName = Literal["imagenet", "cifar100", "food101", "mnist", "hydra"]
TokenDatasetName = Literal["openwebtext", "wikipedia-bookcorpus"]
