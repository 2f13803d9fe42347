"""The GH200 paper's detection and segmentation workloads (Table II): exact parameter counts, FLOPs
against FlopCounterMode, a tiny training run each, the scipy-free matcher, and Faster R-CNN's refusal
where torchvision cannot load."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from test_zoo import counted_training_flops, has_module

from core import ConfigError, run
from core.contract.manager import get_plugin_manager
from core.workloads.assignment import linear_sum_assignment
from core.workloads.detection import PADDING_LABEL, synthetic_coco, target_rows
from core.workloads.segmentation import IGNORE_INDEX, synthetic_cityscapes
from core.workloads.zoo import ZooWorkload

TORCHVISION_LOADS = has_module("torchvision.models")


def workload(name: str) -> ZooWorkload:
    item = get_plugin_manager().workload(name)
    assert isinstance(item, ZooWorkload)
    return item


class SummedOutputs:
    """``module(x)`` -> one scalar over every output tensor, for a backward pass to count."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, images: Any) -> Any:
        outputs = self.model(images)
        return sum(o.float().sum() for o in outputs) if isinstance(outputs, tuple) else outputs.float().sum()


def parameters_on_meta(name: str, options: dict[str, Any]) -> int:
    import torch

    w = workload(name)
    with torch.device("meta"):
        model = w.torch_model(w.parse_options(options))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "name,expected",
    [
        ("segformer-b4", 61_373_395),  # MiT-B4 60,842,688 + MMSegmentation's 256-wide head, 19 classes
        ("deeplabv3plus-r101", 62_582_006),  # the spec's analytic count of MMSegmentation's model
        ("dino-swin-l", 218_152_064),  # Swin-L backbone 195,204,276 + Deformable DETR 22,947,788
    ],
)
def test_the_built_model_has_the_counted_parameters(name: str, expected: int) -> None:
    w = workload(name)
    assert parameters_on_meta(name, {}) == w.parameter_count(w.parse_options({})) == expected


def test_segformer_with_the_papers_768_head_is_the_segformer_papers_count() -> None:
    import torch
    import transformers

    config = transformers.SegformerConfig(  # type: ignore[call-arg]
        depths=[3, 8, 27, 3],
        hidden_sizes=[64, 128, 320, 512],
        num_attention_heads=[1, 2, 5, 8],
        sr_ratios=[8, 4, 2, 1],
        decoder_hidden_size=768,
        num_labels=150,
    )
    with torch.device("meta"):
        model = transformers.SegformerForSemanticSegmentation(config)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 64.1  # the GH200 paper's "64.1 million"


@pytest.mark.parametrize(
    "name,options",
    [
        ("segformer-b4", {}),
        ("segformer-b4", {"variant": "small"}),
        ("segformer-b4", {"crop_height": 96, "crop_width": 200}),
        ("deeplabv3plus-r101", {}),
        ("deeplabv3plus-r101", {"variant": "small"}),
        ("deeplabv3plus-r101", {"crop_height": 96, "crop_width": 200}),
    ],
)
def test_segmentation_flops_are_what_flop_counter_mode_counts(name: str, options: dict[str, Any]) -> None:
    import torch
    from torch.utils import flop_counter

    w = workload(name)
    parsed = w.parse_options(options)
    with torch.device("meta"):
        model = w.torch_model(parsed)
        counted = counted_training_flops(SummedOutputs(model), torch.rand(2, *w.input_shape(parsed)))  # type: ignore[attr-defined]
    assert counted / 2 == w.flops_per_sample(parsed)
    with torch.device("meta"), flop_counter.FlopCounterMode(display=False) as forward, torch.no_grad():
        model(torch.rand(2, *w.input_shape(parsed)))  # type: ignore[attr-defined]
    assert forward.get_total_flops() / 2 == w.inference_flops_per_sample(parsed)  # an inference run's MFU


def test_dino_flops_are_close_to_what_flop_counter_mode_counts() -> None:
    """On the CPU (transformers' position embeddings do not build on the meta device). FlopCounterMode
    does not see the decoder's scaled-dot-product self-attention here, which the tally counts."""
    import torch
    from torch.utils import flop_counter

    w = workload("dino-swin-l")
    parsed = w.parse_options({"variant": "small"})
    model = w.torch_model(parsed)
    counted = counted_training_flops(SummedOutputs(model), torch.rand(2, *w.input_shape(parsed)))  # type: ignore[attr-defined]
    assert counted / 2 == pytest.approx(w.flops_per_sample(parsed), rel=0.01)
    with flop_counter.FlopCounterMode(display=False) as forward, torch.no_grad():
        model(torch.rand(2, *w.input_shape(parsed)))  # type: ignore[attr-defined]
    # The unseen self-attention weighs more in a forward pass alone: 2.4 % of it at this size.
    assert forward.get_total_flops() / 2 == pytest.approx(w.inference_flops_per_sample(parsed), rel=0.03)


@pytest.mark.skipif(not TORCHVISION_LOADS, reason="torchvision is not installed or fails to load with this torch")
def test_faster_rcnn_has_torchvisions_count_and_the_counted_flops() -> None:
    import torch

    w = workload("faster-rcnn-r50-fpn")
    assert parameters_on_meta("faster-rcnn-r50-fpn", {}) == w.parameter_count(w.parse_options({})) == 41_755_286
    parsed = w.parse_options({"variant": "small"})
    assert w.build_torch(parsed, seed=0).model is not None
    del torch


@pytest.mark.skipif(TORCHVISION_LOADS, reason="torchvision loads here")
def test_without_torchvision_faster_rcnn_is_refused_before_the_run() -> None:
    if has_module("torchvision"):  # installed, but broken: the build says what is wrong
        from core.workloads.zoo import MissingLibraryError

        with pytest.raises(MissingLibraryError, match="torchvision"):
            workload("faster-rcnn-r50-fpn").torch_model(workload("faster-rcnn-r50-fpn").parse_options({}))
        return
    with pytest.raises(ConfigError) as refused:
        run("faster-rcnn-r50-fpn", "cpu", micro_batch_size=2, steps=1, warmup_steps=0, power_meter="none")
    assert refused.value.field == "workload" and "torchvision" in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["segformer-b4", "deeplabv3plus-r101", "dino-swin-l"])
def test_trains_on_the_cpu(name: str) -> None:
    result = run(
        name,
        "cpu",
        micro_batch_size=2,
        steps=1,
        warmup_steps=1,
        power_meter="none",
        workload_options={"variant": "small", "synthetic_pool_samples": 4},
    )
    assert result.status.ok, result.status
    w = workload(name)
    assert result.flops_per_sample == w.flops_per_sample(w.parse_options({"variant": "small"})) > 0
    assert result.workload_details["samples_per_epoch"] in (2_975, 118_287)


def test_synthetic_cityscapes_masks_have_train_ids_and_ignored_pixels() -> None:
    images, masks = synthetic_cityscapes(2, (64, 128), seed=0)
    assert images.shape == (2, 3, 64, 128) and masks.shape == (2, 64, 128)
    values = set(masks.unique().tolist())
    assert IGNORE_INDEX in values and values - {IGNORE_INDEX} == set(range(19))
    assert synthetic_cityscapes(2, (64, 128), seed=0)[1].equal(masks)


def test_synthetic_coco_boxes_lie_inside_the_image() -> None:
    images, targets = synthetic_coco(3, (100, 150), objects=5, seed=1)
    assert images.shape == (3, 3, 100, 150) and targets.shape == (3, 5, 5)
    labels, x1, y1, x2, y2 = targets.unbind(-1)
    assert ((labels >= 0) & (labels < 80)).all()
    assert (x1 >= 0).all() and (y1 >= 0).all() and (x2 <= 150).all() and (y2 <= 100).all()
    assert ((x2 - x1) >= 8).all() and ((y2 - y1) >= 8).all()
    padded = targets.clone()
    padded[0, 3:, 0] = PADDING_LABEL
    assert [len(rows) for rows in target_rows(padded)] == [3, 5, 5]


def test_the_assignment_is_the_cheapest() -> None:
    rng = np.random.default_rng(0)
    for rows_count, columns_count in itertools.product(range(1, 5), repeat=2):
        cost = rng.random((rows_count, columns_count))
        rows, columns = linear_sum_assignment(cost)
        smaller = min(rows_count, columns_count)
        if rows_count <= columns_count:
            best = min(
                sum(cost[i, p[i]] for i in range(rows_count))
                for p in itertools.permutations(range(columns_count), rows_count)
            )
        else:
            best = min(
                sum(cost[p[j], j] for j in range(columns_count))
                for p in itertools.permutations(range(rows_count), columns_count)
            )
        assert len(rows) == smaller and len(set(columns.tolist())) == smaller and list(rows) == sorted(rows)
        assert cost[rows, columns].sum() == pytest.approx(best)


def test_deeplab_refuses_a_crop_that_is_not_a_multiple_of_eight() -> None:
    with pytest.raises(ConfigError) as refused:
        workload("deeplabv3plus-r101").parse_options({"crop_height": 100})
    assert refused.value.field == "workload_options.crop_height"
