"""Fake of ``tensorflow.python.ipu.gradient_accumulation`` (graphcore/tensorflow, SDK r2.6)."""

from __future__ import annotations

from enum import Enum


class GradientAccumulationReductionMethod(Enum):
    SUM = 0
    MEAN = 1
    RUNNING_MEAN = 2

    @classmethod
    def parse(cls, reduction_method: object) -> GradientAccumulationReductionMethod:
        if isinstance(reduction_method, cls):
            return reduction_method
        if isinstance(reduction_method, str) and reduction_method.upper() in cls.__members__:
            return cls[reduction_method.upper()]
        raise ValueError(
            f"Cannot parse {reduction_method} as one of GradientAccumulationReductionMethod. "
            f"Valid values are: {', '.join(cls._member_names_)}."
        )
