"""A fake of ``tensorflow.python.ipu`` (the IPU build of TensorFlow 2, graphcore/tensorflow and
graphcore/keras at SDK r2.6), loaded by a test fixture under its real module name next to the real
TensorFlow: ``config`` (IPUConfig, configure_ipu_system), ``ipu_strategy`` (IPUStrategy, which gives
Keras models the IPU extensions), ``gradient_accumulation``."""

from __future__ import annotations

from . import _keras, config, gradient_accumulation, ipu_strategy


def remove_keras_extensions() -> None:
    _keras.remove()
    _keras.calls.clear()
    config.configured.clear()


__all__ = ["config", "gradient_accumulation", "ipu_strategy", "remove_keras_extensions"]
