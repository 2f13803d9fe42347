"""fp16's dynamic loss scaling over a device mesh (core.executors.parallel): PyTorch's own
``ShardedGradScaler``, whose verdict on NaN/inf gradients is every process's."""

from __future__ import annotations

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from core.executors.parallel import local_tensor


class MeshGradScaler(ShardedGradScaler):
    """PyTorch's ``ShardedGradScaler`` over every process of the run (its default group, WORLD): each
    unscales its own part of the gradients and checks it for NaN/inf, then one all-reduce of the
    found-inf flag makes the verdict every process's, so all skip the step, and ``update`` lowers or
    raises the scale, alike. Two changes to the engine's scaler, both for a mesh's processes:

    - the scale is made at once, identically (2**16) on every process: a pipeline's stages before
      the last never scale a loss, which is where a GradScaler makes its scale;
    - the unscale kernel takes each gradient's local part (a DTensor's ``to_local()``, a view): on
      DTensors torch 2.13 runs it on the local parts too, but then all-reduces the flag over the
      mesh of the list's first gradient, a collective per call whose group depends on which weight
      comes first on each process (FSDP2's, tensor parallelism's and a stage's lists differ). Here
      the one all-reduce over the run, ShardedGradScaler's own, is the only collective.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__(device.type)
        self._lazy_init_scale_growth_tracker(device)

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        grouped: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                gradient = local_tensor(parameter.grad)
                if gradient.dtype == torch.float16 and not allow_fp16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                grouped.setdefault((gradient.device, gradient.dtype), []).append(gradient)
        # one flag per device, as GradScaler keeps them; a process without gradients still joins
        # the all-reduce with its flag at 0
        found_per_device = {found_inf.device: found_inf}  # made on the scale's device
        with torch.no_grad():
            for (device, _), gradients in grouped.items():
                found = found_per_device.setdefault(device, found_inf.to(device))
                torch._amp_foreach_non_finite_check_and_unscale_(gradients, found, inv_scale.to(device))
        return found_per_device
