"""Fake of ``tensorflow.python.ipu.config`` (graphcore/tensorflow, SDK r2.6): ``IPUConfig`` with the
attributes the plugin sets, and ``configure_ipu_system``, which records each configuration applied
(``configured``) after the checks the real one makes when it builds its protobuf."""

from __future__ import annotations

import copy
import os
from typing import Any

configured: list[IPUConfig] = []


def running_on_ipu_model() -> bool:
    return "--use_ipu_model" in os.environ.get("TF_POPLAR_FLAGS", "")


class _IPUModelConfig:
    def __init__(self) -> None:
        self.compile_ipu_code = True
        self.tiles_per_ipu = 0
        self.version = "ipu2"


class IPUConfig:
    def __init__(self) -> None:
        self.auto_select_ipus: int | list[int] = []
        self.select_ipus: int | list[int] = []
        self.ipu_model = _IPUModelConfig()
        self.allow_recompute = False
        self.serialization_output_folder = ""

    def _validate(self) -> None:
        if self.auto_select_ipus and self.select_ipus:
            raise Exception("Only one of `auto_select_ipus` and `select_ipus` can be set.")
        if isinstance(self.auto_select_ipus, int):
            self.auto_select_ipus = [self.auto_select_ipus]
        if isinstance(self.select_ipus, int):
            self.select_ipus = [self.select_ipus]
        if self.select_ipus and running_on_ipu_model():
            raise Exception(
                "When using the IPUModel, the devices to attach to can only be specified with `auto_select_ipus`."
            )

    def configure_ipu_system(self, device: str = "cpu") -> None:
        configure_ipu_system(self, device)


def configure_ipu_system(config: Any, device: str = "cpu", reset_configuration: bool = True) -> None:
    if not isinstance(config, IPUConfig):
        raise TypeError("`config` must be an IpuOptions instance.")
    config._validate()
    snapshot = copy.deepcopy(config)
    snapshot.poplar_flags = os.environ.get("TF_POPLAR_FLAGS", "")
    configured.append(snapshot)
