"""A model's weights from a file on disk: a safetensors file or a PyTorch state dict.

Never downloaded. Planning checks the file against the model before any device is touched
(:func:`check_weights_file`): tensor names and shapes are read from the safetensors JSON header,
or from a ``torch.save`` archive mapped onto PyTorch's meta device, without reading tensor data.
The executor then loads the tensors into the model on the host (:func:`load_weights`), before
placing it.

Nothing here imports a framework at module import.
"""

from __future__ import annotations

import math
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any, TypeGuard

from core.base.errors import ConfigError
from core.base.files import parse_json
from core.data.files import file_problem

#: what ``weights`` accepts, in every refusal
ACCEPTED = "a safetensors file, or a PyTorch state dict saved with torch.save(model.state_dict(), path)"

# safetensors layout (huggingface/safetensors, docs "Format"): an unsigned 64-bit little-endian
# header length N, then N bytes of JSON {name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}},
# then the tensors' bytes, each at its [begin, end) offsets from the end of the header.
_SAFETENSORS_LENGTH = struct.Struct("<Q")
_SAFETENSORS_MAX_HEADER_BYTES = 100 << 20  # the library's own limit (100 MB)
# Bytes per element of the safetensors dtypes that safetensors.torch loads into PyTorch (its _TYPES)
# and a model's real-valued tensors take. Any other is refused in planning: a dtype the format does
# not define (a typo, a newer format) or PyTorch cannot load (the sub-byte F4, F6_*) would fail the
# run in setup, and a complex one (C64) would lose its imaginary part in the model.
_SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E5M2FNUZ": 1, "F8_E4M3FNUZ": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_SAFETENSORS_COMPLEX = ("C64", "C128")
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's archive format (the default since 1.6)
# torch.save's legacy format (_use_new_zipfile_serialization=False) is pickles, the first opening
# with PROTO n for its pickle_protocol (2 to 5). torch.load(weights_only=True) reads protocols 2 and
# 3; 4 and 5 frame their opcodes (FRAME, 0x95), which its unpickler does not know.
_PICKLE_PROTO = 0x80
_LEGACY_PROTOCOLS = range(2, 6)
_FRAMED_PROTOCOLS = range(4, 6)


Shapes = dict[str, tuple[int, ...]]


class WeightsFileError(ValueError):
    """The file is not weights core reads; the message says what it is instead."""


def weights_format(path: Path) -> str:
    """'safetensors' or 'torch', from the file's first bytes (not its name)."""
    with open(path, "rb") as stream:
        head = stream.read(9)
    if not head:
        raise WeightsFileError("an empty file")
    if head.startswith(_ZIP_MAGIC) or _is_legacy_torch_save(head):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise WeightsFileError(f"neither a safetensors file nor a torch.save file (it begins {head!r})")


def _is_legacy_torch_save(head: bytes) -> bool:
    """Whether ``head`` opens a pickle as torch.save's legacy format writes one (any protocol it
    takes); what the pickle holds, the loader tells."""
    return len(head) >= 2 and head[0] == _PICKLE_PROTO and head[1] in _LEGACY_PROTOCOLS


def _pickle_protocol(path: Path) -> int | None:
    with open(path, "rb") as stream:
        head = stream.read(2)
    return head[1] if _is_legacy_torch_save(head) else None


def safetensors_shapes(path: Path) -> Shapes:
    """Name -> shape of every tensor in a safetensors file, from its JSON header alone; the header's
    offsets are checked against the file's size, so a cut-off file is refused here."""
    with open(path, "rb") as stream:
        prefix = stream.read(_SAFETENSORS_LENGTH.size)
        if len(prefix) != _SAFETENSORS_LENGTH.size:
            raise WeightsFileError("too short for a safetensors header")
        (length,) = _SAFETENSORS_LENGTH.unpack(prefix)
        if length > _SAFETENSORS_MAX_HEADER_BYTES:
            raise WeightsFileError(f"a safetensors header of {length} bytes is over the format's limit")
        text = stream.read(length)
        data_bytes = path.stat().st_size - _SAFETENSORS_LENGTH.size - length
    if len(text) != length:
        raise WeightsFileError(f"cut off inside its safetensors header ({len(text)} of {length} bytes)")
    try:
        header = parse_json(text)
    except ValueError as error:
        raise WeightsFileError(f"its safetensors header is not JSON core reads ({error})") from None
    if not isinstance(header, dict):
        raise WeightsFileError("its safetensors header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise WeightsFileError("the __metadata__ of its safetensors header is not an object of strings")
    entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
    shapes = {name: _safetensors_shape(name, entry, data_bytes) for name, entry in entries.items()}
    _check_safetensors_layout(entries, data_bytes)
    return shapes


def _safetensors_shape(name: str, entry: Any, data_bytes: int) -> tuple[int, ...]:
    """One header entry's shape, after checking its dtype, shape and offsets fit the file."""
    if not isinstance(entry, dict):
        raise WeightsFileError(f"tensor {name!r} of its safetensors header is {entry!r}, not an object")
    shape, offsets, dtype = entry.get("shape"), entry.get("data_offsets"), entry.get("dtype")
    if not isinstance(dtype, str):
        raise WeightsFileError(f"tensor {name!r} has no dtype in its safetensors header")
    if not _whole_numbers(shape):
        raise WeightsFileError(f"tensor {name!r} has shape {shape!r}, not a list of whole numbers")
    if not (_whole_numbers(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1] <= data_bytes):
        raise WeightsFileError(
            f"tensor {name!r} has data_offsets {offsets!r}, outside the file's {data_bytes} bytes of data (cut off?)"
        )
    if dtype in _SAFETENSORS_COMPLEX:
        raise WeightsFileError(f"tensor {name!r} is complex ({dtype}); a model's weights are real numbers")
    width = _SAFETENSORS_DTYPE_BYTES.get(dtype)
    if width is None:
        raise WeightsFileError(
            f"tensor {name!r} has dtype {dtype!r}, not one PyTorch loads from safetensors "
            f"({', '.join(_SAFETENSORS_DTYPE_BYTES)})"
        )
    if offsets[1] - offsets[0] != math.prod(shape) * width:
        raise WeightsFileError(
            f"tensor {name!r} ({dtype} {shape}) needs {math.prod(shape) * width} bytes, "
            f"its data_offsets give {offsets[1] - offsets[0]}"
        )
    return tuple(shape)


def _check_safetensors_layout(entries: dict[str, Any], data_bytes: int) -> None:
    """The tensors' data lies back to back from the data's first byte to its last, as the safetensors
    library requires (its Metadata::validate): offsets that overlap or leave a gap, or bytes after the
    last tensor, are refused here instead of in setup."""
    end, previous = 0, None
    for name, entry in sorted(entries.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        begin = entry["data_offsets"][0]
        if begin != end:
            after = f"after tensor {previous!r}, which ends at byte {end}" if previous else "at the data's first byte"
            relation = "overlaps" if begin < end else "leaves a gap"
            raise WeightsFileError(
                f"tensor {name!r} begins at byte {begin} of the data, {after}: it {relation} "
                "(safetensors stores tensors back to back)"
            )
        end, previous = entry["data_offsets"][1], name
    if end != data_bytes:
        raise WeightsFileError(f"its tensors take {end} bytes of data, the file holds {data_bytes} after its header")


def _whole_numbers(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def _check_torch_archive(path: Path) -> None:
    """A torch.save archive is a zip of one folder holding data.pkl; TorchScript's (torch.jit.save)
    adds constants.pkl and code/. Read from the zip's directory alone, before torch opens it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise WeightsFileError(f"a damaged zip archive ({error})") from None
    parts = [name.split("/") for name in names]
    if any(len(p) == 2 and p[1] == "constants.pkl" for p in parts):
        raise WeightsFileError("a TorchScript archive (torch.jit.save), a whole compiled model, not a state dict")
    if not any(len(p) == 2 and p[1] == "data.pkl" for p in parts):
        raise WeightsFileError("a zip archive, but not one torch.save writes (no data.pkl)")


def _torch_load(path: Path, device: str | None) -> Any:
    """torch.load with ``weights_only=True``: no code in the file runs. Its refusals become one
    WeightsFileError saying what the file holds, without PyTorch's advice to load it with
    ``weights_only=False`` (which would run any code a pickled object brings).

    :param device: where the tensors go; None: where they were saved, on the host (a tensor saved on
        the meta device stays there, which mapping everything onto the meta device would hide), read
        from the file only when used where the format allows it (a torch.save archive is
        memory-mapped; the legacy format is read whole)."""
    import torch

    with open(path, "rb") as stream:
        archive = stream.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    if archive:
        _check_torch_archive(path)
    options: dict[str, Any] = {"map_location": device}
    if device is None:
        options = {"map_location": _in_place, "mmap": archive}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own advice about weights_only among them
            return torch.load(path, weights_only=True, **options)
    except MemoryError:
        raise
    except Exception as error:
        protocol = None if archive else _pickle_protocol(path)
        if protocol in _FRAMED_PROTOCOLS and "Unsupported operand" in str(error):
            raise WeightsFileError(
                f"a pickle in protocol {protocol} (torch.save's legacy format with pickle_protocol={protocol}?), "
                "which PyTorch's safe loader cannot read (it reads protocols 2 and 3); save the state "
                "dict again with torch.save(model.state_dict(), path)"
            ) from None
        raise WeightsFileError(_torch_load_failure(error)) from None


def _torch_load_failure(error: Exception) -> str:
    import pickle

    text = str(error)
    if isinstance(error, pickle.UnpicklingError):
        # "... WeightsUnpickler error: Unsupported global: GLOBAL __main__.Net was not an allowed ..."
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if found:
            return (
                f"it holds a pickled {found.group(1)} (a whole model, or other Python objects), not only "
                "tensors; it is not loaded, since that would run code from the file"
            )
        detail = text.split("WeightsUnpickler error:", 1)[-1].strip().split(". ", 1)[0] if text else ""
        return f"its pickle holds more than tensors ({detail or type(error).__name__}); it is not loaded"
    if "magic number" in text.lower():
        return "a pickle, but not one torch.save writes (no PyTorch magic number)"
    if isinstance(error, EOFError) or "unexpected end" in text.lower():
        return "a torch.save file cut off before its end"
    first = text.strip().split(". ", 1)[0].split("\n", 1)[0]
    return f"a damaged torch.save file ({type(error).__name__}{': ' + first if first else ''})"


def _in_place(storage: Any, location: str) -> Any:
    # torch.load's map_location: each storage stays as read (memory-mapped), wherever it was saved
    # (a CUDA device this host lacks included); nothing is copied.
    return storage


def torch_state_dict_shapes(path: Path) -> Shapes:
    """Name -> shape of every tensor in a ``torch.save``d state dict (``weights_only=True``: no code
    in the file runs), read in place: no tensor data is read."""
    return {name: tuple(tensor.shape) for name, tensor in _state_dict(_torch_load(path, None)).items()}


def _state_dict(state: Any) -> dict[str, Any]:
    import torch

    if not isinstance(state, dict):
        raise WeightsFileError(f"it holds an object of type {type(state).__name__}, not a state dict")
    for name, tensor in state.items():
        if not isinstance(name, str):
            raise WeightsFileError(
                f"not a state dict: its key {name!r} is of type {type(name).__name__}, not a str "
                "(a state dict maps parameter names to tensors)"
            )
        if not isinstance(tensor, torch.Tensor):
            raise WeightsFileError(
                f"not a state dict: its entry {name!r} is of type {type(tensor).__name__}, not a tensor "
                "(a checkpoint holding a state dict? save the model's state_dict() alone)"
            )
        problem = _tensor_problem(tensor)
        if problem is not None:
            raise WeightsFileError(f"tensor {name!r} is {problem}; a model's weights are dense real numbers")
    return state


def _tensor_problem(tensor: Any) -> str | None:
    """Why a model cannot take ``tensor`` as weights (load_state_dict would fail in setup, or copy it
    losing part of it), or None."""
    import torch

    if tensor.layout != torch.strided:
        return f"{str(tensor.layout).removeprefix('torch.')} (a sparse or otherwise non-dense layout)"
    if tensor.is_meta and tensor.numel() > 0:
        return "on the meta device: it was saved without its values"
    if tensor.dtype.is_complex:
        return f"complex ({str(tensor.dtype).removeprefix('torch.')}): loaded, its imaginary part would be lost"
    if tensor.is_quantized:
        return f"quantized ({str(tensor.dtype).removeprefix('torch.')})"
    return None


def file_shapes(path: Path) -> Shapes:
    return safetensors_shapes(path) if weights_format(path) == "safetensors" else torch_state_dict_shapes(path)


def file_dtypes(path: Path) -> dict[str, str]:
    """Name -> dtype of every tensor in the file, as the file names it (safetensors' ``F32``,
    PyTorch's ``float32``); call after :func:`file_shapes` accepted the file."""
    if weights_format(path) == "safetensors":
        with open(path, "rb") as stream:
            (length,) = _SAFETENSORS_LENGTH.unpack(stream.read(_SAFETENSORS_LENGTH.size))
            header = parse_json(stream.read(length))
        return {name: entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    return {
        name: str(tensor.dtype).removeprefix("torch.") for name, tensor in _state_dict(_torch_load(path, None)).items()
    }


def number_kind(dtype: str) -> str:
    """'floating-point numbers', 'integers' or 'booleans': what a dtype (PyTorch's or safetensors' name) holds."""
    if dtype.lower() == "bool":
        return "booleans"
    if dtype.startswith(("F", "BF", "float", "bfloat", "half", "double")):
        return "floating-point numbers"
    return "integers"


def first_kind_mismatch(model: dict[str, str], file: dict[str, str]) -> str | None:
    """The first tensor, in the model's order, whose kind of number the file changes (load_state_dict
    would cast it: booleans or integers into floating-point weights, or the other way)."""
    for name, dtype in model.items():
        if name in file and number_kind(file[name]) != number_kind(dtype):
            return (
                f"tensor {name!r} holds {number_kind(file[name])} ({file[name]}) in the file, "
                f"{number_kind(dtype)} ({dtype}) in the model"
            )
    return None


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


def check_weights_file(weights: str, model_shapes: Shapes, model_dtypes: dict[str, str] | None = None) -> None:
    """Refuse a weights file that is missing, unreadable, not a plain state dict or safetensors file,
    or does not fit the model (names and shapes; the kind of number of each tensor where
    ``model_dtypes`` is given): a ConfigError naming ``weights``, the file and what is wrong."""
    from core.contract.workload import module_installed

    path = Path(weights)
    problem = file_problem(path)
    if problem is not None:
        raise ConfigError("weights", weights, f"{problem}; accepted: {ACCEPTED}")
    try:
        kind = weights_format(path)
        shapes = file_shapes(path)
        dtypes = file_dtypes(path) if model_dtypes is not None else {}
    except WeightsFileError as error:
        raise ConfigError("weights", weights, f"{error}; accepted: {ACCEPTED}") from None
    except MemoryError:
        raise ConfigError("weights", weights, f"out of memory reading its header; accepted: {ACCEPTED}") from None
    except OSError as error:
        raise ConfigError("weights", weights, f"cannot read it: {error.strerror or error}") from None
    if kind == "safetensors" and not module_installed("safetensors"):
        raise ConfigError(
            "weights", weights, "reading safetensors files needs the safetensors package (pip install safetensors)"
        )
    mismatch = first_mismatch(model_shapes, shapes) or first_kind_mismatch(model_dtypes or {}, dtypes)
    if mismatch is not None:
        raise ConfigError("weights", weights, f"does not fit the model: {mismatch}")


def load_weights(model: Any, weights: str) -> dict[str, Any]:
    """Load the file's tensors into ``model`` (a torch.nn.Module on the host), strictly: every
    tensor of the model, and nothing else. Returns what the result records about the file."""
    path = Path(weights)
    kind = weights_format(path)
    if kind == "safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path), device="cpu")
    else:
        state = _state_dict(_torch_load(path, "cpu"))
    model.load_state_dict(state, strict=True)
    return {"weights": str(path), "weights_format": kind, "weights_tensors": len(state)}
