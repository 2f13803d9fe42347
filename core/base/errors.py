"""Exceptions that core raises to users and plugins."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class CoreError(Exception):
    """Base class of every error core raises on purpose."""


class ConfigError(CoreError, ValueError):
    """A run configuration is invalid; raised before any device is touched.

    The message always names the field, the offending value and what is allowed. A rule that
    spans several fields (``hidden_width`` against ``input_width``) names them all in ``fields``;
    ``field`` then lists them, and ``value`` holds each one's value by name.
    """

    def __init__(
        self, field: str, value: Any, allowed: str, *, fields: tuple[str, ...] = (), missing: bool = False
    ) -> None:
        self.fields = tuple(fields) or (field,)
        self.field = field if not fields else ", ".join(self.fields)
        self.value = value
        self.allowed = allowed
        self.missing = missing
        super().__init__(f"invalid {self.field}{shown_value(self)}: {allowed}")


def shown_value(error: ConfigError) -> str:
    """`` = value`` as an error message quotes it; `` (missing)`` for a field left out, whose "= None"
    would read as if None had been written."""
    return " (missing)" if getattr(error, "missing", False) else f" = {error.value!r}"


class ConfigErrors(ConfigError):
    """Several fields are invalid at once (pydantic reports them together)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        first = errors[0]
        CoreError.__init__(self, "; ".join(str(e) for e in errors))
        self.field, self.value, self.allowed, self.fields = first.field, first.value, first.allowed, first.fields


class PluginError(CoreError):
    """A plugin failed to import, register or validate."""


class RegistrationError(PluginError):
    """A plugin handed over something core cannot accept (wrong type, duplicate name)."""


class DataError(CoreError):
    """A data file could not be read during a run: the message names the file and the problem.

    A fault of the data, not of the model: memory that runs out while a file is read or decoded is
    reported as this, never as the model's out-of-memory. Its one argument is the whole message, so
    a DataLoader worker's copy of it is rebuilt as the same type in the main process.
    """


class NonFiniteLossError(CoreError, ArithmeticError):
    """The loss became NaN or infinite during a measured phase."""


def closest_name(word: str, names: Iterable[str]) -> str | None:
    """The name ``word`` most likely misspells, or None where none is close (difflib's ratio of at
    least 0.6, as Python's own suggestions use): for the "did you mean" of an unknown command, flag,
    workload, accelerator or option. Case is ignored, so ``FCNN`` finds ``fcnn``."""
    folded: dict[str, str] = {}
    for name in names:
        folded.setdefault(name.casefold(), name)
    found = difflib.get_close_matches(word.casefold(), list(folded), n=1, cutoff=0.6)
    return folded[found[0]] if found else None


def did_you_mean(word: str, names: Iterable[str]) -> str:
    """`` (did you mean 'resnet50'?)`` to follow what refuses ``word``, or "" where no name is close."""
    name = closest_name(word, names)
    return f" (did you mean {name!r}?)" if name is not None else ""
