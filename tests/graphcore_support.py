"""Fixtures for the Graphcore tests: the fakes of poptorch, popdist, gcipuinfo and
``tensorflow.python.ipu`` importable under their real names for the duration of a test.

tests/conftest.py imports them, so every test module can ask for them by name.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAKES = Path(__file__).parent / "fakes" / "graphcore"
_FAKE_MODULES = ("poptorch", "popdist", "gcipuinfo")


def _forget(prefixes: tuple[str, ...]) -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in prefixes:
            del sys.modules[name]


@pytest.fixture
def fake_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """poptorch, popdist and gcipuinfo fakes on sys.path; a host with 16 IPUs drawing 100 W each."""
    monkeypatch.syspath_prepend(str(FAKES))
    for variable in (
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "POPTORCH_CACHE_DIR",
        "TF_POPLAR_FLAGS",
    ):
        monkeypatch.delenv(variable, raising=False)
    _forget(_FAKE_MODULES)
    import gcipuinfo
    import popdist
    import poptorch

    poptorch.fake_hardware.ipus = 16
    gcipuinfo.reset(gcipuinfo.FakeMachine.with_ipus(16))
    popdist.environment = None
    yield types.SimpleNamespace(poptorch=poptorch, popdist=popdist, gcipuinfo=gcipuinfo)
    _forget(_FAKE_MODULES)


@pytest.fixture
def fake_tf_ipu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake ``tensorflow.python.ipu`` in sys.modules beside the real TensorFlow; a Graphcore-built
    TensorFlow version for the availability probe. Removes the fake's Keras patches afterwards."""
    import importlib.util

    import tensorflow.python as tf_python

    spec = importlib.util.spec_from_file_location(
        "tensorflow.python.ipu",
        FAKES / "ipu_tensorflow" / "__init__.py",
        submodule_search_locations=[str(FAKES / "ipu_tensorflow")],
    )
    assert spec is not None and spec.loader is not None
    import keras

    from core_plugins.graphcore import tensorflow_settings

    _forget_fake_ipu_modules()
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tensorflow.python.ipu", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(tf_python, "ipu", module, raising=False)
    monkeypatch.delenv("TF_POPLAR_FLAGS", raising=False)
    # A new process: nothing configured IPU TensorFlow yet (the plugin remembers the first).
    monkeypatch.setattr(tensorflow_settings, "_configured", None)
    # The SDK's Keras is 2.6: its LossScaleOptimizer signature, over the Keras 3 the tests run.
    monkeypatch.setattr(keras.mixed_precision, "LossScaleOptimizer", module._keras.LossScaleOptimizer)
    previous_policy = keras.mixed_precision.global_policy()
    yield module
    module.remove_keras_extensions()
    keras.mixed_precision.set_global_policy(previous_policy)
    _forget_fake_ipu_modules()


def _forget_fake_ipu_modules() -> None:
    """Drop the fake's submodules (``tensorflow.python.ipu.config``, ...) so each test loads them anew."""
    for name in list(sys.modules):
        if name.startswith("tensorflow.python.ipu."):
            del sys.modules[name]
