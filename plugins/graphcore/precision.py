"""fp16 as Graphcore runs it under PopTorch: a subclass of core's fp16 policy that the accelerator
hands planning (``GraphcoreAccelerator.precision_policy``), so the executor converts the model and
its inputs through the policy rather than by a flag of its own.

Graphcore's "16.16" configurations keep the model's weights and activations in float16, with no
float32 master copy (graphcore/examples ``vision/cnns/pytorch/train/configs.yml``; PopTorch keeps
one copy of the weights, in the model's type): no autocast, the whole model halved. Loss scaling
and stochastic rounding are PopTorch options (``options.build_options``), applied inside the
compiled IPU program; on the host the policy's backward and optimizer step are the plain ones.

Importing this module imports no SDK and no framework (torch only inside the methods).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.plugin import Fp16Policy, PrecisionPolicy

if TYPE_CHECKING:
    import torch


class PopTorchFp16Policy(Fp16Policy):
    """fp16 weights and activations, matmuls and convolutions in float16 (partials per
    ``partials_type``), loss scaling by PopTorch: what ``precision=fp16`` is on an IPU."""

    description = "float16 weights and activations (no float32 master copy), PopTorch's loss scaling"

    def autocast_dtype(self) -> torch.dtype | None:
        return None  # the model itself is float16: nothing to cast on the way in

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.half()

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        # Labels stay integers; only floating-point features take the model's type.
        return tensor.half() if tensor.is_floating_point() else tensor

    # PopTorch scales the loss inside the IPU program; a host-side GradScaler would refuse the
    # float16 gradients of a float16 model ("Attempting to unscale FP16 gradients").
    backward = PrecisionPolicy.backward
    optimizer_step = PrecisionPolicy.optimizer_step
