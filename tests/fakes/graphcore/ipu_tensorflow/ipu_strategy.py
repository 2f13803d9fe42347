"""Fake of ``tensorflow.python.ipu.ipu_strategy``: ``IPUStrategy`` (= ``IPUStrategyV1``).

The real strategy places variables on ``/device:IPU:0`` and, with ``enable_keras_extensions``
(the default), gives Keras models the IPU extensions. The fake runs on the CPU under TensorFlow's
default strategy and installs the fake extensions (``tensorflow.python.ipu._keras``)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from . import _keras


class IPUStrategyV1:
    def __init__(
        self,
        ipu_device: str = "/device:IPU:0",
        cpu_device: str = "/device:CPU:0",
        enable_dataset_iterators: bool = True,
        enable_keras_extensions: bool = True,
    ) -> None:
        self._ipu_device = ipu_device
        if enable_keras_extensions:
            _keras.install()

    @property
    def num_replicas_in_sync(self) -> int:
        return 1

    @property
    def supports_loss_scaling(self) -> bool:
        # ipu_strategy.py: True, which graphcore/keras's strategy_supports_loss_scaling() asks first
        return True

    def scope(self) -> Any:
        return tf.distribute.get_strategy().scope()

    def run(self, fn: Any, args: tuple = (), kwargs: Any = None, options: Any = None) -> Any:
        return fn(*args, **(kwargs or {}))


IPUStrategy = IPUStrategyV1
