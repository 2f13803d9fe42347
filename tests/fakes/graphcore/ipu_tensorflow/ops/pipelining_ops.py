"""Fake of ``tensorflow.python.ipu.ops.pipelining_ops`` (graphcore/tensorflow, r2.6/sdk-release-3.3):
the enumerations Keras's ``set_pipelining_options`` forwards to ``pipelining_ops.pipeline``."""

from __future__ import annotations

from enum import Enum


class RecomputationMode(Enum):
    """``RecomputationMode``: how a pipelined training model recomputes activations, when
    ``IPUConfig.allow_recompute`` is set (``pipeline(recomputation_mode=...)``, default Auto)."""

    Auto = 0
    RecomputeThenBackpropagate = 1
    RecomputeAndBackpropagateInterleaved = 2


class PipelineSchedule(Enum):
    """``PipelineSchedule``: ``pipeline(pipeline_schedule=...)``, default Grouped."""

    Grouped = 0
    Interleaved = 1
    Sequential = 2
