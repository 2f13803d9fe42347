"""A weights file that is not a plain state dict or a safetensors file is bad input: refused while
planning (ConfigError naming ``weights`` and the file; exit 2 from ``core run``), saying what the
file is and what is accepted, and never repeating PyTorch's advice to load it with
``weights_only=False`` (which would run whatever code a pickled object brings)."""

from __future__ import annotations

import json
import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from core import ConfigError, run
from core.cli import main
from core.contract.manager import get_plugin_manager
from core.testing import TINY_FCNN

QUICK = {"mode": "inference", "steps": 1, "warmup_steps": 0, "power_meter": "none", "workload_options": TINY_FCNN}


class WholeModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)


def fcnn_state() -> dict[str, torch.Tensor]:
    """A state dict that fits the tiny FCNN (names and shapes), the base of the broken files."""
    from core.running.planning import plan_run

    plan = plan_run(get_plugin_manager(), "fcnn", "cpu", {"workload_options": TINY_FCNN})
    shapes = plan.workload.torch_state_shapes(plan.workload_options)
    return {name: torch.zeros(shape) for name, shape in shapes.items()}


def safetensors_bytes(state: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({name: tensor.contiguous() for name, tensor in state.items()})


def _pickled_model(path: Path) -> None:
    torch.save(WholeModel(), path)


def _pickled_model_legacy(path: Path) -> None:
    torch.save(WholeModel(), path, _use_new_zipfile_serialization=False)


def _torchscript(path: Path) -> None:
    torch.jit.save(torch.jit.script(WholeModel()), str(path))


def _random(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 8)


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _zip_not_torch(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights/readme.txt", "not a torch file")


def _zip_cut_off(path: Path) -> None:
    torch.save(fcnn_state(), path)
    path.write_bytes(path.read_bytes()[:-300])


def _non_tensor_values(path: Path) -> None:
    torch.save({**fcnn_state(), "step": 5}, path)


def _non_str_key(path: Path) -> None:
    torch.save({**fcnn_state(), 5: torch.zeros(8)}, path)


def _plain_pickle_protocol_5(path: Path) -> None:
    path.write_bytes(pickle.dumps(fcnn_state(), protocol=5))


def _pickled_model_legacy_protocol_4(path: Path) -> None:
    torch.save(WholeModel(), path, _use_new_zipfile_serialization=False, pickle_protocol=4)


def _checkpoint(path: Path) -> None:
    torch.save({"model": fcnn_state(), "epoch": 3}, path)


def _a_list(path: Path) -> None:
    torch.save(list(fcnn_state().values()), path)


def _plain_pickle(path: Path) -> None:
    path.write_bytes(pickle.dumps(fcnn_state(), protocol=2))


def _legacy_cut_off(path: Path) -> None:
    torch.save(fcnn_state(), path, _use_new_zipfile_serialization=False)
    path.write_bytes(path.read_bytes()[:60])


def _safetensors_cut_off(path: Path) -> None:
    path.write_bytes(safetensors_bytes(fcnn_state())[:-100])


def _safetensors_bad_entry(path: Path) -> None:
    header = json.dumps({"0.weight": [1, 2, 3]}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def _safetensors_bad_offsets(path: Path) -> None:
    header = json.dumps({"0.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)


def _safetensors_with(path: Path, entries: dict[str, Any], data: bytes) -> None:
    header = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _safetensors_unknown_dtype(path: Path) -> None:
    _safetensors_with(path, {"0.weight": {"dtype": "XYZ", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)


def _safetensors_complex(path: Path) -> None:
    _safetensors_with(path, {"0.weight": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16)


def _safetensors_overlapping(path: Path) -> None:
    entries = {name: {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]} for name in ("0.weight", "0.bias")}
    _safetensors_with(path, entries, b"\0" * 8)


def _safetensors_trailing_bytes(path: Path) -> None:
    _safetensors_with(path, {"0.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12)


def _safetensors_nested_header(path: Path) -> None:
    header = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def _meta_tensors(path: Path) -> None:
    torch.save({name: tensor.to("meta") for name, tensor in fcnn_state().items()}, path)


def _a_sparse_tensor(path: Path) -> None:
    state = fcnn_state()
    name = next(iter(state))
    torch.save({**state, name: state[name].to_sparse()}, path)


def _a_complex_tensor(path: Path) -> None:
    state = fcnn_state()
    name = next(iter(state))
    torch.save({**state, name: state[name].to(torch.complex64)}, path)


def _booleans(path: Path) -> None:
    torch.save({name: tensor.to(torch.bool) for name, tensor in fcnn_state().items()}, path)


def _integers(path: Path) -> None:
    torch.save({name: tensor.to(torch.int64) for name, tensor in fcnn_state().items()}, path)


def _safetensors_integers(path: Path) -> None:
    path.write_bytes(safetensors_bytes({name: tensor.to(torch.int32) for name, tensor in fcnn_state().items()}))


@pytest.mark.parametrize(
    "make,fragment",
    [
        # Issue 26 (F10, F11): each of these got past planning, and failed the run in setup (rc 1),
        # crashed with a RecursionError, or (complex) ran with the imaginary part dropped.
        (_safetensors_unknown_dtype, "dtype 'XYZ', not one PyTorch loads"),
        (_safetensors_complex, "is complex (C64)"),
        (_safetensors_overlapping, "it overlaps"),
        (_safetensors_trailing_bytes, "its tensors take 8 bytes of data, the file holds 12"),
        (_safetensors_nested_header, "nested 100001 deep"),
        (_meta_tensors, "on the meta device"),
        (_a_sparse_tensor, "sparse_coo"),
        (_a_complex_tensor, "complex (complex64)"),
        (_pickled_model, "pickled"),
        (_pickled_model_legacy, "pickled"),
        (_torchscript, "TorchScript archive"),
        (_random, "neither a safetensors file nor a torch.save file"),
        (_empty, "an empty file"),
        (_zip_not_torch, "not one torch.save writes"),
        (_zip_cut_off, "damaged zip archive"),
        (_non_tensor_values, "its entry 'step' is of type int"),
        (_checkpoint, "its entry 'model'"),
        # Issue 26, second tester: the key, not its tensor, is what is wrong.
        (_non_str_key, "its key 5 is of type int, not a str"),
        (_pickled_model_legacy_protocol_4, "a pickle in protocol 4"),
        (_plain_pickle_protocol_5, "a pickle in protocol 5"),
        (_a_list, "not a state dict"),
        (_plain_pickle, "pickled torch.storage"),  # tensors pickled by pickle itself, not torch.save
        (_legacy_cut_off, "cut off"),
        (_safetensors_cut_off, "outside the file's"),
        (_safetensors_bad_entry, "not an object"),
        (_safetensors_bad_offsets, "needs 64 bytes"),
        # Issue 26, third pass: load_state_dict cast these into the model's floats without a word.
        (_booleans, "holds booleans (bool) in the file, floating-point numbers (float32) in the model"),
        (_integers, "holds integers (int64) in the file"),
        (_safetensors_integers, "holds integers (I32) in the file"),
    ],
    ids=lambda value: getattr(value, "__name__", "")[1:] or None,
)
def test_a_file_that_is_not_weights_is_refused_in_planning(
    make: Callable[[Path], None], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if make in (_safetensors_cut_off, _safetensors_integers):
        pytest.importorskip("safetensors")
    path = tmp_path / "weights.pt"
    make(path)
    accelerator = get_plugin_manager().accelerator("cpu")

    def no_device(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a device was touched")

    monkeypatch.setattr(type(accelerator), "executor_for", no_device)
    with pytest.raises(ConfigError) as refused:
        run("fcnn", "cpu", weights=str(path), **QUICK)
    message = str(refused.value)
    assert refused.value.field == "weights" and refused.value.value == str(path)
    assert fragment in message, message
    assert "weights_only" not in message and "trusted source" not in message, message


@pytest.mark.parametrize("protocol", [2, 3])
def test_a_legacy_torch_save_file_loads_in_the_pickle_protocols_torch_reads(protocol: int, tmp_path: Path) -> None:
    # Issue 26, second tester: only protocol 2's first bytes were known, so torch.save(...,
    # _use_new_zipfile_serialization=False, pickle_protocol=3) was "neither ... nor a torch.save file".
    # Protocols 4 and 5, which torch.load(weights_only=True) cannot read, are refused saying so (above).
    path = tmp_path / "legacy.pt"
    state = {name: torch.full_like(tensor, 0.5) for name, tensor in fcnn_state().items()}
    torch.save(state, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    result = run("fcnn", "cpu", weights=str(path), **QUICK)
    assert result.status.ok, result.status


def test_weights_of_another_floating_point_dtype_are_accepted(tmp_path: Path) -> None:
    # Only the kind of number must match: fp16 weights load into an fp32 model as PyTorch casts them.
    path = tmp_path / "half.pt"
    torch.save({name: tensor.to(torch.float16) for name, tensor in fcnn_state().items()}, path)
    assert run("fcnn", "cpu", weights=str(path), **QUICK).status.ok


def test_core_run_refuses_a_pickled_model_as_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.pt"
    _pickled_model(path)
    code = main(["run", "fcnn", "--mode", "inference", "--weights", str(path), "--power-meter", "none"])
    error = capsys.readouterr().err
    assert code == 2, error
    assert f"invalid weights (--weights) = '{path}'" in error and "state_dict()" in error
    assert "weights_only" not in error and "internal error" not in error


@pytest.mark.parametrize("kind", ["/dev/null", "fifo", "folder"])
def test_weights_that_are_no_regular_file_are_refused(kind: str, tmp_path: Path) -> None:
    import os

    path = tmp_path / "weights.pt"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(kind)
    with pytest.raises(ConfigError, match="not a regular file") as refused:
        run("fcnn", "cpu", weights=str(path), **QUICK)
    assert refused.value.field == "weights"
    assert "not a regular file; accepted: a safetensors file" in str(refused.value)
