"""A fake of ``tensorflow.python.ipu`` (the IPU build of TensorFlow 2, graphcore/tensorflow and
graphcore/keras at SDK r2.6/sdk-release-3.3), loaded by a test fixture under its real module name
next to the real TensorFlow: ``config`` (IPUConfig, configure_ipu_system), ``ipu_strategy``
(IPUStrategy, which gives Keras models the IPU extensions), ``gradient_accumulation``,
``ops.pipelining_ops`` and, imported by name as in the SDK, ``distributed.popdist_strategy``."""

from __future__ import annotations

from . import _keras, config, gradient_accumulation, ipu_strategy, ops
from .ops import pipelining_ops


def remove_keras_extensions() -> None:
    _keras.remove()
    _keras.calls.clear()
    config.reset()


__all__ = ["config", "gradient_accumulation", "ipu_strategy", "ops", "pipelining_ops", "remove_keras_extensions"]
