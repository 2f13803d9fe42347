"""The fake ``poptorch.optim`` (graphcore/poptorch ``python/optim.py``, SDK 3.3): PyTorch's optimizers
with PopTorch's extra arguments, checked as the real constructors check them. ``loss_scaling``
defaults to 1.0; the accumulator types default to ``torch.float32`` and must be float32 or float16
("Accumulation types must be either torch.float32 or torch.float16"). On the CPU the fake steps
as PyTorch does; the types are recorded, not emulated."""

from __future__ import annotations

from typing import Any

import torch

_TYPES = (torch.float16, torch.float32)
_ADAM_TYPES = ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type")


def _poptorch_optimizer(base: type[torch.optim.Optimizer], type_names: tuple[str, ...]) -> type[Any]:
    """``base`` taking PopTorch's ``loss_scaling`` and accumulator-type arguments as well."""

    class PoptorchOptimizer(base):  # type: ignore[valid-type, misc]
        def __init__(self, params: Any, *args: Any, loss_scaling: float | None = None, **kwargs: Any) -> None:
            types = {name: kwargs.pop(name, None) for name in type_names}
            super().__init__(params, *args, **{k: v for k, v in kwargs.items() if v is not None})
            self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
            for name, value in types.items():
                value = value or torch.float32
                assert value in _TYPES, "Accumulation types must be either torch.float32 or torch.float16"
                setattr(self, name, value)

    PoptorchOptimizer.__name__ = PoptorchOptimizer.__qualname__ = base.__name__
    return PoptorchOptimizer


SGD = _poptorch_optimizer(torch.optim.SGD, ("accum_type", "velocity_accum_type"))
Adam = _poptorch_optimizer(torch.optim.Adam, _ADAM_TYPES)
AdamW = _poptorch_optimizer(torch.optim.AdamW, _ADAM_TYPES)
RMSprop = _poptorch_optimizer(torch.optim.RMSprop, _ADAM_TYPES)
