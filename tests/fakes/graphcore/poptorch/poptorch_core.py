"""Fake of ``poptorch.poptorch_core``, the compiled module that defines PopTorch's error classes.

As in graphcore/poptorch ``python/poptorch.cpp``: ``Error`` derives from ``Exception``,
``RecoverableError`` and ``UnrecoverableError`` from ``Error``; an instance carries ``type``,
``message`` and ``location``, and a ``RecoverableError`` also ``recovery_action``.
"""

from __future__ import annotations


class Error(Exception):
    type = ""
    message = ""
    location = ""


class RecoverableError(Error):
    recovery_action = ""


class UnrecoverableError(Error):
    pass


def raise_compiler_error(message: str, location: str) -> Error:
    """An error as the C++ compiler raises it (``ERROR(...)`` in popart_compiler)."""
    error = Error(message)
    error.type = "poptorch_cpp_error"
    error.message = message
    error.location = location
    return error
