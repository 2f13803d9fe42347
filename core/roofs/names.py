"""Which matmul dtype a run's precision computes in: what a measured peak is looked up by."""

from __future__ import annotations

from collections.abc import Sequence

from core.base.precision import BUILTIN_POLICIES
from core.roofs.probe import MATMUL_DTYPES


def compute_dtype_of(precision: str) -> str | None:
    """The matmul dtype a run of ``precision`` computes in (bf16 and amp: bfloat16); None for a
    plugin's precision, whose kernels core does not know."""
    policy = BUILTIN_POLICIES.get(str(precision))
    return None if policy is None else policy.compute_dtype


def dtypes_for(precisions: Sequence[str]) -> list[str]:
    """The compute dtypes of ``precisions``, in the probe's order, each once."""
    wanted = {compute_dtype_of(precision) for precision in precisions}
    return [dtype for dtype in MATMUL_DTYPES if dtype in wanted]
