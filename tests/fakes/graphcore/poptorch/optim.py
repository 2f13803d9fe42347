"""The fake ``poptorch.optim`` (graphcore/poptorch ``python/optim.py``, SDK 3.3): PyTorch's optimizers
with PopTorch's extra arguments, checked as the real constructors check them. ``loss_scaling``
defaults to 1.0; the accumulator types default to ``torch.float32`` and must be float32 or float16
("Accumulation types must be either torch.float32 or torch.float16"). On the CPU the fake steps
as PyTorch does; the types are recorded, not emulated."""

from __future__ import annotations

from typing import Any

import torch

_TYPES = (torch.float16, torch.float32)


def _accumulation_types(self: Any, names: tuple[str, ...], given: dict[str, Any]) -> None:
    for name in names:
        value = given.get(name) or torch.float32
        assert value in _TYPES, "Accumulation types must be either torch.float32 or torch.float16"
        setattr(self, name, value)


class SGD(torch.optim.SGD):
    def __init__(
        self,
        params: Any,
        lr: float,
        *,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        velocity_accum_type: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, lr=lr, **{k: v for k, v in kwargs.items() if v is not None})
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        _accumulation_types(
            self,
            ("accum_type", "velocity_accum_type"),
            {"accum_type": accum_type, "velocity_accum_type": velocity_accum_type},
        )


class _AdamTypes:
    _names = ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type")


class Adam(torch.optim.Adam):
    def __init__(self, params: Any, lr: float = 1e-3, *, loss_scaling: float | None = None, **kwargs: Any) -> None:
        types = {name: kwargs.pop(name, None) for name in _AdamTypes._names}
        super().__init__(params, lr=lr, **{k: v for k, v in kwargs.items() if v is not None})
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        _accumulation_types(self, _AdamTypes._names, types)


class AdamW(torch.optim.AdamW):
    def __init__(self, params: Any, lr: float = 1e-3, *, loss_scaling: float | None = None, **kwargs: Any) -> None:
        types = {name: kwargs.pop(name, None) for name in _AdamTypes._names}
        super().__init__(params, lr=lr, **{k: v for k, v in kwargs.items() if v is not None})
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        _accumulation_types(self, _AdamTypes._names, types)


class RMSprop(torch.optim.RMSprop):
    _names = ("accum_type", "first_order_momentum_accum_type", "second_order_momentum_accum_type")

    def __init__(self, params: Any, lr: float = 1e-2, *, loss_scaling: float | None = None, **kwargs: Any) -> None:
        types = {name: kwargs.pop(name, None) for name in self._names}
        super().__init__(params, lr=lr, **{k: v for k, v in kwargs.items() if v is not None})
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        _accumulation_types(self, self._names, types)
