"""core.cli, core.storage.store and core.workloads.vision were split into modules along their seams:
every name they offered before is still importable from them (tests, plugins' tests and the docs
import them so)."""

from __future__ import annotations

import importlib

import pytest

BEFORE_THE_SPLIT = {
    "core.cli": (
        "main build_parser run_flags format_result format_cells describe_plan plugin_report workload_report "
        "resume_command _OWN_SYNTAX _run_options _COMMANDS _SweepDisplay _text_context _RESUMED_FLAGS "
        "_NOT_RESUMED _SLURM_FLAGS _core_program _describe_config_error"
    ),
    "core.storage.store": (
        "ResultStore StoredRun SweepRecord SkippedRow SweepLock StoreError StoreWriteError DatabaseInUseError "
        "EXPORT_COLUMNS DEFAULT_DATABASE DATABASE_ENVIRONMENT_VARIABLE STORE_SCHEMA_VERSION MINIMUM_FREE_BYTES "
        "default_database lock_path unsaved_directory"
    ),
    "core.workloads.vision": (
        "VISION_WORKLOADS VisionOptions HydraOptions VisionWorkload ResNetOptions ResNetVersion ResNet ResNet50 "
        "ResNet152 VisionTransformer VitLarge32 VitLarge16 VitHuge14 SwinTransformer SwinTiny SwinBase SwinLarge "
        "EfficientNet EfficientNetB0 EfficientNetB4 MobileNetV3 MobileNetV3Small MobileNetV3Large InceptionV3 "
        "SGD_LEARNING_RATE SGD_MOMENTUM ADAMW_LEARNING_RATE"
    ),
}


@pytest.mark.parametrize("module", sorted(BEFORE_THE_SPLIT))
def test_every_name_of_a_split_module_is_still_importable_from_it(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in BEFORE_THE_SPLIT[module].split() if not hasattr(imported, name)]
    assert not missing, f"{module} lost {missing}"


def test_the_vision_workloads_are_one_of_each_family_module() -> None:
    from core.workloads.vision import VISION_WORKLOADS

    families = {workload.__module__.rsplit(".", 1)[-1] for workload in VISION_WORKLOADS}
    assert families == {"resnet", "vit", "swin", "efficientnet", "mobilenet", "inception"}
