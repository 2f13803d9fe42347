"""A Swin Transformer's token grids and its parameter and FLOP counts, as transformers builds it
(``SwinModel``): counted once for the image classifier (``vision/swin.py``) and for the DINO-like
detector's backbone (``detection.py``), so the two cannot drift apart."""

from __future__ import annotations

import math

from core.workloads.counting import Tally


def swin_stage_resolutions(image: tuple[int, int], patch: int, stages: int) -> list[tuple[int, int]]:
    """Token grid of each stage: the image padded to whole patches, halved (rounded up: patch merging
    pads to even) per merge."""
    resolution = (math.ceil(image[0] / patch), math.ceil(image[1] / patch))
    resolutions = []
    for _ in range(stages):
        resolutions.append(resolution)
        resolution = (math.ceil(resolution[0] / 2), math.ceil(resolution[1] / 2))
    return resolutions


def swin_tally(
    t: Tally,
    *,
    channels: int,
    embed: int,
    depths: tuple[int, ...],
    heads: tuple[int, ...],
    window: int,
    patch: int,
    image: tuple[int, int],
    stage_norms: bool,
) -> list[tuple[int, int, int]]:
    """Add the patch embedding, every stage's shifted-window blocks, the patch merging between stages
    and the final layer norm to ``t``; ``stage_norms``: each stage's output has a layer norm of its
    own (transformers' ``SwinBackbone`` with every stage as an output). Returns (channels, height,
    width) of each stage's output."""
    resolutions = swin_stage_resolutions(image, patch, len(depths))
    t.conv(channels, embed, patch, *resolutions[0], bias=True, reads_input=True)
    t.params(2 * embed)  # layer norm of the patch embeddings
    dim = embed
    outputs = []
    for stage, (depth, stage_heads) in enumerate(zip(depths, heads)):
        height, width = resolutions[stage]
        # transformers shrinks the window to a smaller map (the classifier refuses such an image)
        stage_window = min(window, height, width)
        tokens = height * width
        padded = math.ceil(height / stage_window) * stage_window * math.ceil(width / stage_window) * stage_window
        for _ in range(depth):
            t.params(2 * dim)
            for _ in range(4):  # query, key, value, output: on the window-padded map
                t.linear(dim, dim, tokens=padded)
            t.params((2 * window - 1) ** 2 * stage_heads)  # relative position bias table, built for the window
            t.matmul(2 * padded * stage_window * stage_window * dim)  # scores and weighted values in every window
            t.params(2 * dim)
            t.linear(dim, 4 * dim, tokens=tokens)
            t.linear(4 * dim, dim, tokens=tokens)
        outputs.append((dim, height, width))
        if stage_norms:
            t.params(2 * dim)  # the stage output's layer norm
        if stage < len(depths) - 1:
            merged = resolutions[stage + 1][0] * resolutions[stage + 1][1]
            t.params(2 * 4 * dim)
            t.linear(4 * dim, 2 * dim, tokens=merged, bias=False)
            dim *= 2
    t.params(2 * dim)  # the final layer norm (built, unused, in the backbone)
    return outputs
