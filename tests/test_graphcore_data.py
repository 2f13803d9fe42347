"""Real data on IPUs: ``poptorch.DataLoader`` hands each host call its combined batch of real samples
(an image folder, WebDataset shards), in its async mode where background workers read; the wait is
counted; a format PopTorch cannot feed is refused while planning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_data import TinyCnn

from core import ConfigError, run
from core.testing import registered_plugins

pytestmark = pytest.mark.usefixtures("fake_sdk")


def train_on_ipus(**options: Any) -> Any:
    settings: dict[str, Any] = {"steps": 3, "warmup_steps": 1, "power_meter": "none", "micro_batch_size": 2}
    settings.update(options)
    with registered_plugins():
        return run(TinyCnn(), "graphcore", **settings)


def test_an_image_folder_feeds_whole_host_calls(image_folder: Path) -> None:
    result = train_on_ipus(data=str(image_folder), data_workers=0, replicas=2, gradient_accumulation=2)
    assert result.status.ok, result.status
    details = result.executor_details
    assert details["data"] == "files" and details["data_format"] == "image-folder"
    assert details["dataset_samples"] == 12 and details["data_loader_mode"] == "Sync"
    # One host call: micro-batch 2 x gradient accumulation 2 x replicas 2 real images.
    assert details["host_call_samples"] == 8 == result.samples_per_host_call
    assert details["data_wait_seconds"] >= 0.0
    assert result.window_samples == 3 * 8


def test_background_workers_read_in_poptorchs_async_mode(image_folder: Path, fake_sdk: Any) -> None:
    loaders: list[Any] = []
    original = fake_sdk.poptorch.DataLoader

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            loaders.append(self)

    fake_sdk.poptorch.DataLoader = Recording
    result = train_on_ipus(data=str(image_folder), data_workers=1)
    assert result.status.ok, result.status
    assert result.executor_details["data_loader_mode"] == "Async"
    (loader,) = loaders
    assert loader.mode == fake_sdk.poptorch.DataLoaderMode.Async and loader.num_workers == 1
    assert loader.terminated  # the accessor's worker process is stopped when the run closes


def test_webdataset_shards_are_read_as_this_instances_share(shards: Path) -> None:
    result = train_on_ipus(data=str(shards), data_workers=0, gradient_accumulation=2)
    assert result.status.ok, result.status
    details = result.executor_details
    assert details["data_format"] == "webdataset" and details["dataset_samples"] is None  # streamed
    assert details["host_call_samples"] == 4


def test_synthetic_runs_say_so(image_folder: Path) -> None:
    result = train_on_ipus(steps=1)
    assert result.status.ok and result.executor_details["data"] == "synthetic"


def test_the_dataset_too_small_for_one_host_call_is_refused_in_planning(image_folder: Path) -> None:
    # PopTorch's DataLoader reads whole host calls and drops a partial one: 12 images make none of
    # 16. Refused before any device is touched (it failed in setup).
    with pytest.raises(ConfigError, match=r"12 samples, fewer than one host call of 16 .*: needs at least 16"):
        train_on_ipus(data=str(image_folder), data_workers=0, gradient_accumulation=8)


def test_tensorflow_on_ipus_still_refuses_a_path(image_folder: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        run("fcnn", "graphcore", framework="tensorflow", data=str(image_folder), power_meter="none")
    assert refused.value.field in ("data", "framework")
