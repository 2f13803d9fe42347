"""Which GPUs a ROCm process sees, and in what order: the runtimes' visibility variables applied
to the node's GPUs, which amdsmi lists whatever the variables say.

Two layers apply, in this order (ROCm docs, "GPU isolation techniques"):

1. ``ROCR_VISIBLE_DEVICES``, read by the ROCr runtime (ROCR-Runtime ``RvdFilter``,
   ``core/runtime/amd_filter_device.cpp``): tokens are indices into the node's GPUs in KFD
   topology order, or UUID prefixes ``GPU-<hex>``; tokens are upper-cased and trimmed; indices are
   parsed like C ``strtol(s, &end, 0)`` (so ``0x1`` is 1); the list ends at the first token that
   is invalid, out of range, repeated, or a UUID prefix matching no or several GPUs. Set but
   empty, it hides every GPU.
2. ``HIP_VISIBLE_DEVICES``, or when it is unset or empty ``CUDA_VISIBLE_DEVICES``, read by HIP
   (ROCm/clr ``rocclr/device/rocm/rocdevice.cpp``): tokens index the GPUs ROCr exposes, or name
   one by a ``GPU-`` UUID substring; an index must be a plain decimal; the list ends at the first
   invalid token; a repeated GPU is skipped. Empty, it filters nothing.

The result is in the order PyTorch numbers the devices: ``cuda:0`` is the first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

ROCR = "ROCR_VISIBLE_DEVICES"
HIP = "HIP_VISIBLE_DEVICES"
CUDA = "CUDA_VISIBLE_DEVICES"


def _strtol(text: str) -> int | None:
    """C strtol(text, &end, 0) where the whole text must be consumed; None otherwise."""
    sign, digits = 1, text.lstrip()
    if digits[:1] in "+-" and digits:
        sign, digits = (-1 if digits[0] == "-" else 1), digits[1:]
    base = 10
    if digits[:2].lower() == "0x":
        base, digits = 16, digits[2:]
    elif digits.startswith("0") and len(digits) > 1:
        base, digits = 8, digits[1:]
    if not digits:
        return None
    try:
        return sign * int(digits, base)
    except ValueError:
        return None


def rocr_visible(value: str | None, uuids: Sequence[str]) -> list[int]:
    """Indices into ``uuids`` (the node's GPUs in KFD order, "GPU-<16 hex>") that ROCr exposes."""
    if value is None:
        return list(range(len(uuids)))
    # A GPU without a unique id ("GPU-XX", pre-gfx9) can be chosen by index only.
    upper_uuids = ["INVALID-UUID" if uuid.upper() == "GPU-XX" else uuid.upper() for uuid in uuids]
    chosen: list[int] = []
    tokens = [token.strip().upper() for token in value.split(",")] if value else []
    for token in tokens[: len(uuids)]:
        if not token:
            break  # ROCr would index an empty token's first character; treat it as the end
        if token[0] == "G":
            if not 5 <= len(token) <= 20:
                break
            matches = [i for i, uuid in enumerate(upper_uuids) if uuid.startswith(token)]
            index = matches[0] if len(matches) == 1 else None
        else:
            index = _strtol(token)
        if index is None or not 0 <= index < len(uuids) or index in chosen:
            break
        chosen.append(index)
    return chosen


def hip_visible(value: str | None, uuids: Sequence[str]) -> list[int]:
    """Indices into ``uuids`` (the GPUs ROCr exposes, in its order) that HIP exposes."""
    if not value:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for token in value.split(","):
        if "GPU-" in token:
            token = next((str(i) for i, uuid in enumerate(uuids) if token in uuid), token)
        if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) >= len(uuids):
            break
        if int(token) not in chosen:
            chosen.append(int(token))
    return chosen


def visible_order(environment: Mapping[str, str], uuids: Sequence[str]) -> list[int]:
    """Indices into the node's GPUs (KFD order) as this process numbers them: ROCr, then HIP."""
    exposed = rocr_visible(environment.get(ROCR), uuids)
    hip_value = environment.get(HIP) or environment.get(CUDA)
    return [exposed[i] for i in hip_visible(hip_value, [uuids[j] for j in exposed])]
