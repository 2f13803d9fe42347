"""A model's weights from a file on disk: a safetensors file or a PyTorch state dict.

Never downloaded. Planning checks the file against the model before any device is touched
(:func:`check_weights_file`): tensor names and shapes are read from the safetensors JSON header,
or from a ``torch.save`` archive mapped onto PyTorch's meta device, without reading tensor data.
The executor then loads the tensors into the model on the host (:func:`load_weights`), before
placing it.

Nothing here imports a framework at module import.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from core.errors import ConfigError

# safetensors layout (huggingface/safetensors, docs "Format"): an unsigned 64-bit little-endian
# header length N, then N bytes of JSON {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}.
_SAFETENSORS_LENGTH = struct.Struct("<Q")
_SAFETENSORS_MAX_HEADER_BYTES = 100 << 20  # the library's own limit (100 MB)
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format (the default since 1.6)
_PICKLE_PROTOCOL_2 = b"\x80\x02"  # torch.save's legacy format (_use_new_zipfile_serialization=False)

Shapes = dict[str, tuple[int, ...]]


def weights_format(path: Path) -> str:
    """'safetensors' or 'torch', from the file's first bytes (not its name)."""
    with open(path, "rb") as stream:
        head = stream.read(9)
    if head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_PROTOCOL_2):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise ValueError("neither a safetensors file nor a PyTorch state dict (torch.save)")


def safetensors_shapes(path: Path) -> Shapes:
    """Name -> shape of every tensor in a safetensors file, from its JSON header alone."""
    with open(path, "rb") as stream:
        prefix = stream.read(_SAFETENSORS_LENGTH.size)
        if len(prefix) != _SAFETENSORS_LENGTH.size:
            raise ValueError("too short for a safetensors header")
        (length,) = _SAFETENSORS_LENGTH.unpack(prefix)
        if length > _SAFETENSORS_MAX_HEADER_BYTES:
            raise ValueError(f"a safetensors header of {length} bytes is over the format's limit")
        header = json.loads(stream.read(length))
    if not isinstance(header, dict):
        raise ValueError("its safetensors header is not a JSON object")
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def torch_state_dict_shapes(path: Path) -> Shapes:
    """Name -> shape of every tensor in a ``torch.save``d state dict, mapped onto the meta device
    (``weights_only=True``: no code in the file runs; no tensor data is read)."""
    import torch

    state = torch.load(path, map_location="meta", weights_only=True)
    return {name: tuple(tensor.shape) for name, tensor in _state_dict(state).items()}


def _state_dict(state: Any) -> dict[str, Any]:
    import torch

    if not isinstance(state, dict) or not all(
        isinstance(name, str) and isinstance(tensor, torch.Tensor) for name, tensor in state.items()
    ):
        raise ValueError(
            "not a state dict (a mapping of tensor names to tensors, as model.state_dict() gives); "
            "save the model's state_dict(), not a checkpoint holding it"
        )
    return state


def file_shapes(path: Path) -> Shapes:
    return safetensors_shapes(path) if weights_format(path) == "safetensors" else torch_state_dict_shapes(path)


def first_mismatch(model: Shapes, file: Shapes) -> str | None:
    """The first tensor, in the model's order, whose name or shape the file does not match."""
    for name, shape in model.items():
        if name not in file:
            return f"tensor {name!r} {list(shape)} of the model is not in the file"
        if tuple(file[name]) != tuple(shape):
            return f"tensor {name!r} is {list(file[name])} in the file, {list(shape)} in the model"
    extra = [name for name in file if name not in model]
    if extra:
        return f"tensor {extra[0]!r} of the file is not in the model ({len(extra)} such)"
    return None


def check_weights_file(weights: str, model_shapes: Shapes) -> None:
    """Refuse a weights file that is missing, unreadable, or does not fit the model: a ConfigError
    naming ``weights``, the file and the first mismatched tensor."""
    from core.contract.workload import module_installed

    path = Path(weights)
    if not path.is_file():
        raise ConfigError("weights", weights, "no such file; a safetensors file or a PyTorch state dict (torch.save)")
    try:
        shapes = file_shapes(path)
        kind = weights_format(path)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise ConfigError("weights", weights, f"cannot read it as weights: {exc}") from None
    if kind == "safetensors" and not module_installed("safetensors"):
        raise ConfigError(
            "weights", weights, "reading safetensors files needs the safetensors package (pip install safetensors)"
        )
    mismatch = first_mismatch(model_shapes, shapes)
    if mismatch is not None:
        raise ConfigError("weights", weights, f"does not fit the model: {mismatch}")


def load_weights(model: Any, weights: str) -> dict[str, Any]:
    """Load the file's tensors into ``model`` (a torch.nn.Module on the host), strictly: every
    tensor of the model, and nothing else. Returns what the result records about the file."""
    import torch

    path = Path(weights)
    kind = weights_format(path)
    if kind == "safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path), device="cpu")
    else:
        state = _state_dict(torch.load(path, map_location="cpu", weights_only=True))
    model.load_state_dict(state, strict=True)
    return {"weights": str(path), "weights_format": kind, "weights_tensors": len(state)}
