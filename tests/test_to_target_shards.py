"""Training to a target from WebDataset shards and TFRecord files split into train/ and val/
(docs/to-target.md, "From shards and record files"): the split's index from the files' framing, digits
from shards reaching its target on PyTorch with one replica and two gloo replicas, the shards'
evaluation against the in-memory one on the same weights, and planning's refusals."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from launching import torchrun_two_ranks
from target_support import HELD_OUT, TARGET, TRAINING, assert_reached_from_files, digits_executor

from core.api import run_here
from core.base.errors import ConfigError

pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from core.workloads.digits import write_shards

    return write_shards(tmp_path_factory.mktemp("digits") / "shards")


def test_the_shards_are_indexed_from_their_headers_in_the_in_memory_order(digits_shards: Path) -> None:
    from core.data.split_index import split_samples
    from core.data.torch_datasets import IndexedShards
    from core.workloads.digits import DigitsOptions, split_digits

    assert sorted(p.name for p in (digits_shards / "train").iterdir()) == [f"digits-{n:04d}.tar" for n in range(4)]
    assert split_samples(digits_shards / "train", "webdataset") == TRAINING
    assert split_samples(digits_shards / "val", "webdataset") == HELD_OUT
    train_x, train_y, test_x, test_y = split_digits(DigitsOptions())
    for split, images, labels in (("train", train_x, train_y), ("val", test_x, test_y)):
        dataset = IndexedShards(digits_shards / split, (1, 8, 8))
        assert len(dataset) == len(images)
        for index in (0, 1, 359, len(images) - 1):  # the first and last of a shard, across shards
            image, label = dataset[index]
            assert int(label) == labels[index]
            # The PNG holds round(value x 255): within half a grey level of the in-memory pixel.
            assert np.abs(image.numpy().reshape(-1) - images[index]).max() <= 1 / 510 + 1e-7


@pytest.mark.slow
def test_digits_reach_their_target_from_shards_with_the_curve(digits_shards: Path) -> None:
    result = run_here("digits", "cpu", power_meter="none", data=str(digits_shards), target=TARGET)
    assert_reached_from_files(result, "webdataset")


@pytest.mark.slow
def test_the_shards_evaluation_is_the_in_memory_one_on_the_png_rounded_images(digits_shards: Path) -> None:
    """On the same weights (trained one epoch from the shards), the shards' evaluation counts the same
    right predictions as the in-memory evaluation of the images rounded as the PNGs store them, with
    the same loss to fp32 rounding."""
    import torch

    from core.workloads.digits import DigitsOptions, split_digits

    files = digits_executor(str(digits_shards))
    memory = digits_executor("synthetic")
    try:
        files.run_steps(TRAINING // 32)
        memory._placed_model.load_state_dict(files.model_state())
        from_files = files.evaluate()
        _, _, test_x, test_y = split_digits(DigitsOptions())
        memory._spec.evaluation_inputs = torch.from_numpy(np.rint(test_x * 255.0) / 255.0).float().reshape(-1, 1, 8, 8)
        memory._spec.evaluation_targets = torch.from_numpy(test_y).long()
        in_memory = memory.evaluate()
    finally:
        files.close()
        memory.close()
    assert from_files is not None and in_memory is not None
    assert from_files["top1"] > 0.5  # trained: the labels the shards gave are the digits'
    assert from_files["top1"] == in_memory["top1"]
    assert from_files["loss"] == pytest.approx(in_memory["loss"], rel=1e-5)


WORKER = textwrap.dedent("""
    import json, sys
    from core.base.config import make_config
    from core.base.distributed import ProcessContext, SINGLE_PROCESS
    from core.executors.pytorch import TorchExecutor, TorchPlacement
    from core.workloads.digits import Digits, DigitsOptions

    def curve(process, placement, micro_batch_size, replicas):
        target = {"metric": "top1", "value": 1.0, "max_epochs": 3}
        config = make_config(workload="digits", accelerator="cpu", micro_batch_size=micro_batch_size,
                             replicas=replicas, target=target, data=sys.argv[2])
        executor = TorchExecutor(Digits().build_torch(DigitsOptions(), seed=0), config, placement, process)
        points = [executor.evaluate()]  # the seeded weights, before any update
        for _ in range(3):
            executor.run_steps(1437 // 32)
            points.append(executor.evaluate())
        executor.close()
        return points

    process = ProcessContext.from_environment()
    replicated = curve(process, TorchPlacement(device="cpu", distributed_backend="gloo"), 16, 2)
    if process.rank == 0:
        whole = curve(SINGLE_PROCESS, TorchPlacement(device="cpu"), 32, 1)
        with open(sys.argv[1], "w") as out:
            json.dump({"replicated": replicated, "whole": whole}, out)
""")


@pytest.mark.slow
def test_two_gloo_replicas_read_their_shares_of_the_shards_with_one_process_curve(
    digits_shards: Path, tmp_path: Path
) -> None:
    """Two replicas of 16 each read their half of every global batch from the shards and evaluate every
    other held-out sample: the same curve as one process of 32, and both reach top-1 0.9."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("sys.argv[2]", repr(str(digits_shards))))
    out = tmp_path / "curves.json"
    completed = torchrun_two_ranks(script, out, tmp_path / "torchelastic")
    assert completed.returncode == 0, completed.stderr[-3000:]
    curves = json.loads(out.read_text())
    replicated, whole = curves["replicated"], curves["whole"]
    # The same seeded weights: the sharded counts add up exactly, the loss to fp32 rounding.
    assert replicated[0]["top1"] == whole[0]["top1"]
    assert replicated[0]["loss"] == pytest.approx(whole[0]["loss"], rel=1e-6)
    # The same global batches in the same order: DDP's averaged gradients differ from one process's by
    # rounding only (measured: the same top-1 to the image, the loss to 1e-6).
    for ours, theirs in zip(replicated[1:], whole[1:]):
        assert abs(ours["top1"] - theirs["top1"]) <= 1 / HELD_OUT + 1e-12
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-2)
    assert replicated[-1]["top1"] >= 0.9 and whole[-1]["top1"] >= 0.9


# --- planning's refusals -------------------------------------------------------------------------------


def _copy(shards: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    return copy


def _gzipped_shard(shards: Path, tmp_path: Path) -> Path:
    copy = _copy(shards, tmp_path)
    shard = copy / "train" / "digits-0000.tar"
    shard.write_bytes(gzip.compress(shard.read_bytes()))
    return copy


def _sample_without_label(shards: Path, tmp_path: Path) -> Path:
    copy = _copy(shards, tmp_path)
    with tarfile.open(copy / "val" / "digits-0003.tar", "w") as archive:
        member = tarfile.TarInfo("000001.png")
        member.size = 4
        archive.addfile(member, io.BytesIO(b"\x89PNG"))
    return copy


def _records_beside_shards(shards: Path, tmp_path: Path) -> Path:
    copy = _copy(shards, tmp_path)
    shutil.rmtree(copy / "val")
    (copy / "val").mkdir()
    (copy / "val" / "digits.tfrecord").write_bytes(b"")
    return copy


def _records(shards: Path, tmp_path: Path) -> Path:
    # Named as records: the framework is refused before a record is read.
    records = tmp_path / "records"
    for split in ("train", "val"):
        (records / split).mkdir(parents=True)
        (records / split / "digits.tfrecord").write_bytes(b"")
    return records


@pytest.mark.parametrize(
    ("make", "options", "field", "says"),
    [
        (
            lambda shards, _: shards,
            {"framework": "tensorflow"},
            "data",
            "webdataset splits, which a run to a target "
            "reads with torch only; with tensorflow it reads tfrecord splits",
        ),
        (
            _records,
            {},
            "data",
            "tfrecord splits, which a run to a target reads with tensorflow only; with torch it "
            "reads image-folder, webdataset or tokens splits",
        ),
        (_gzipped_shard, {}, "data", "not an uncompressed tar file"),
        (_sample_without_label, {}, "data", "sample '000001' needs an image"),
        (_records_beside_shards, {}, "data", "tfrecord data, not webdataset"),
        (lambda shards, _: shards, {"micro_batch_size": 1500}, "micro_batch_size", "training split of 1437"),
    ],
)
def test_planning_refuses_shards_or_records_a_target_cannot_be_run_on(
    digits_shards: Path, tmp_path: Path, make: Any, options: dict[str, Any], field: str, says: str
) -> None:
    data = make(digits_shards, tmp_path)
    with pytest.raises(ConfigError) as refused:
        run_here("digits", "cpu", power_meter="none", data=str(data), target=TARGET, **options)
    assert refused.value.field == field
    assert says in str(refused.value)
