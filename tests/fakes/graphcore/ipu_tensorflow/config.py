"""Fake of ``tensorflow.python.ipu.config`` (graphcore/tensorflow, r2.6/sdk-release-3.3,
``tensorflow/python/ipu/config.py``): ``IPUConfig`` with the attributes and categories the plugin
sets, and ``configure_ipu_system``, which records each configuration applied (``configured``) after
the checks the real one makes when it builds its ``IpuOptions`` protobuf.

Mirrored, each where the real module does it:
- ``_ConfigBase.__getattr__`` / ``__setattr__``: an attribute the config does not have is refused
  ("'x' is not a valid attribute of this config."), and a value must have the type of the
  attribute's default (``_set_value_of_existing_user_attribute`` -> ``check_type``: TypeError);
  categories (``matmuls``, ``norms``, ...) cannot be assigned to.
- ``IPUConfig._to_protobuf``: not both ``auto_select_ipus`` and ``select_ipus``; an int becomes a
  one-element list; ``select_ipus`` refused on the IPU Model; distributed batch norm refused with
  I/O tiles.
- ``_poplar_options_to_protobuf``: option values go into a protobuf string field, which refuses
  anything but ``str`` with a TypeError.
- ``_NormsExperimentalConfig._to_protobuf``: ``distributed_batch_norm_replica_group_size`` >= 1.
- ``_MultiReplicaDistributionConfig._to_protobuf``: not on the IPU Model; the process index in
  ``[0, process_count)``.
- TF_POPLAR_FLAGS: Poplar parses them once per process (``PoplarXlaFlags::Get()`` holds a
  function-level static, ``tensorflow/compiler/plugin/poplar/driver/tools/flags.cc``): the fake
  reads them at the first configuration and every later one runs with those, whatever the
  environment says then (``parsed_poplar_flags``; ``reset()`` stands for a new process).
"""

from __future__ import annotations

import copy
import os
from typing import Any

configured: list[IPUConfig] = []

#: the flags Poplar parsed in this (fake) process; None until the first configuration
parsed_poplar_flags: str | None = None


def reset() -> None:
    """A new process: nothing configured, no flags parsed."""
    global parsed_poplar_flags
    configured.clear()
    parsed_poplar_flags = None


def running_on_ipu_model() -> bool:
    """``utils.running_on_ipu_model``: reads the environment (not what Poplar parsed)."""
    return "--use_ipu_model" in os.environ.get("TF_POPLAR_FLAGS", "")


class _ConfigBase:
    """Attributes are created in ``__init__`` only; afterwards, unknown names and wrong types are refused."""

    def __setattr__(self, name: str, value: Any) -> None:
        if not self.__dict__.get("_frozen"):
            object.__setattr__(self, name, value)
            return
        if name not in self.__dict__:
            raise ValueError(f"'{name}' is not a valid attribute of this config. ")
        current = self.__dict__[name]
        if isinstance(current, _ConfigBase):
            raise Exception(f"{name} is a category and cannot be assigned to.")
        if name not in self._union_attributes and type(value) is not type(current):  # noqa: E721 - as the SDK checks
            raise TypeError(f"Trying to set {name} to {value}, but it must be of type {type(current).__name__}")
        object.__setattr__(self, name, value)

    _union_attributes: tuple[str, ...] = ()

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)


class _IPUModelConfig(_ConfigBase):
    def __init__(self) -> None:
        self.compile_ipu_code = True
        self.tiles_per_ipu = 0
        self.version = "ipu2"
        self._freeze()


class _PoplarOptionsConfig(_ConfigBase):
    """``_MatmulConfig`` / ``_ConvolutionConfig``: PopLibs options for every such operation."""

    def __init__(self) -> None:
        self.poplar_options: dict[str, Any] = {}
        self._freeze()


class _NormsExperimentalConfig(_ConfigBase):
    def __init__(self) -> None:
        self.distributed_batch_norm_replica_group_size = 1
        self._freeze()


class _NormConfig(_ConfigBase):
    def __init__(self) -> None:
        self.use_stable_statistics = False
        self.experimental = _NormsExperimentalConfig()
        self._freeze()


class _IOTilesConfig(_ConfigBase):
    def __init__(self) -> None:
        self.num_io_tiles = 0
        self.place_ops_on_io_tiles = False
        self.available_memory_proportion = 0.9
        self._freeze()


class _MultiReplicaDistributionConfig(_ConfigBase):
    def __init__(self) -> None:
        self.process_index = 0
        self.process_count = 0
        self._freeze()


class _ExperimentalConfig(_ConfigBase):
    def __init__(self) -> None:
        self.always_rearrange_copies_on_the_host = False
        self.enable_remote_buffer_embedding = False
        self.enable_prng_stability = False
        self.multi_replica_distribution = _MultiReplicaDistributionConfig()
        self._freeze()


class IPUConfig(_ConfigBase):
    # ``auto_select_ipus`` and ``select_ipus`` are annotated Union[int, List[int], Tuple[int, ...]]
    _union_attributes = ("auto_select_ipus", "select_ipus")

    def __init__(self) -> None:
        self.allow_recompute = False
        self.serialization_output_folder = ""
        self.compilation_poplar_options: dict[str, Any] = {}
        self.auto_select_ipus: int | list[int] = []
        self.select_ipus: int | list[int] = []
        self.ipu_model = _IPUModelConfig()
        self.matmuls = _PoplarOptionsConfig()
        self.convolutions = _PoplarOptionsConfig()
        self.norms = _NormConfig()
        self.io_tiles = _IOTilesConfig()
        self.experimental = _ExperimentalConfig()
        self._freeze()

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
        group_size = self.norms.experimental.distributed_batch_norm_replica_group_size
        if self.io_tiles.num_io_tiles > 0 and group_size > 1:
            raise ValueError(
                "norms.experimental.distributed_batch_norm_replica_group_size is not supported with I/O tiles."
            )
        for options in (self.compilation_poplar_options, self.matmuls.poplar_options, self.convolutions.poplar_options):
            for value in options.values():
                if not isinstance(value, str):  # protobuf's string field
                    raise TypeError(f"{value!r} has type {type(value).__name__}, but expected one of: bytes, unicode")
        if group_size < 1:
            raise ValueError("norms.experimental.distributed_batch_norm_replica_group_size must be at least 1.")
        distribution = self.experimental.multi_replica_distribution
        if running_on_ipu_model() and distribution.process_count > 0:
            raise Exception("Multi-replica distribution is not supported on the IPU model.")
        if distribution.process_count and not 0 <= distribution.process_index < distribution.process_count:
            raise ValueError(
                "experimental.multi_replica_distribution.process_index must be in the range"
                " [0, experimental.multi_replica_distribution.process_count)."
            )

    def configure_ipu_system(self, device: str = "cpu") -> None:
        configure_ipu_system(self, device)


def configure_ipu_system(config: Any, device: str = "cpu", reset_configuration: bool = True) -> None:
    global parsed_poplar_flags
    if not isinstance(config, IPUConfig):
        raise TypeError("`config` must be an IpuOptions instance.")
    if parsed_poplar_flags is None:
        parsed_poplar_flags = os.environ.get("TF_POPLAR_FLAGS", "")
    config._validate()
    snapshot = copy.deepcopy(config)
    object.__setattr__(snapshot, "poplar_flags", parsed_poplar_flags)  # what Poplar runs with, not the environment
    configured.append(snapshot)


def ipus_of_configured_device() -> int:
    """IPUs of the last configured device: ``auto_select_ipus``, or the multi-IPU device
    ``select_ipus`` names (a PopDist device: every instance's IPUs, which the fake PopDist sizes)."""
    if not configured:
        raise ValueError("no IPU system configured")
    last = configured[-1]
    if last.auto_select_ipus:
        return int(last.auto_select_ipus[0])  # type: ignore[index]
    if last.select_ipus:
        import popdist

        return int(popdist.ipus_of_device(last.select_ipus[0]))  # type: ignore[index]
    return 0
