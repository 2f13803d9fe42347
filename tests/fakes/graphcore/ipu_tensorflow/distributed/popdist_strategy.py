"""Fake of ``tensorflow.python.ipu.distributed.popdist_strategy`` (graphcore/tensorflow,
r2.6/sdk-release-3.3): ``PopDistStrategy``.

The real strategy calls ``popdist.init()`` in its constructor, reduces across every instance's
replicas with GCL, and, like ``IPUStrategy``, gives Keras models the IPU extensions
(``keras_extensions.KerasExtensions.__init__``); ``update_ipu_config`` writes this process's place
into ``IPUConfig.experimental.multi_replica_distribution``. The fake runs on the CPU under
TensorFlow's default strategy and installs the fake extensions."""

from __future__ import annotations

from typing import Any

import popdist
import tensorflow as tf

from .. import _keras


class PopDistStrategy:
    def __init__(
        self,
        ipu_device: str = "/device:IPU:0",
        add_ipu_cross_replica_reductions: bool = True,
        enable_dataset_iterators: bool = True,
        enable_keras_extensions: bool = True,
    ) -> None:
        popdist.init()
        self._ipu_device = ipu_device
        if enable_keras_extensions:
            _keras.install()

    def update_ipu_config(self, config: Any) -> None:
        config.experimental.multi_replica_distribution.process_count = popdist.getNumInstances()
        config.experimental.multi_replica_distribution.process_index = popdist.getInstanceIndex()

    @property
    def supports_loss_scaling(self) -> bool:
        return True

    def scope(self) -> Any:
        return tf.distribute.get_strategy().scope()
