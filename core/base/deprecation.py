"""Deprecations: what core still accepts from code written for an older release, and until when.

Every ``DeprecationWarning`` core raises goes through :func:`warn_deprecated`, which names the release
that removes what it warns about. tests/test_deprecations.py finds every call in core's sources and
fails once core's version reaches that release with the compatibility code still in place, so a shim
promised to go in 0.3 cannot quietly outlive it.
"""

from __future__ import annotations

import warnings

#: the release that removes what core 0.2 keeps working for code written against 0.1 (old module
#: paths, the 0.1 forms of the plugin methods) and the 0.2 forms the RunContext replaced
REMOVED_IN = "0.3"


def warn_deprecated(message: str, *, removed_in: str | None, stacklevel: int = 2) -> None:
    """Raise a DeprecationWarning at the caller's caller (``stacklevel`` as :func:`warnings.warn`).

    :param removed_in: the release that removes the deprecated thing (its text is added to the
        message), or None for a warning about a use that no release turns into an error (a plugin
        importing core's internals: they may change in any release).
    """
    warnings.warn(_with_release(message, removed_in), DeprecationWarning, stacklevel=stacklevel + 1)


def warn_deprecated_at(message: str, *, removed_in: str | None, filename: str, lineno: int, module: str) -> None:
    """A DeprecationWarning attributed to ``filename:lineno`` in ``module``: the line of a plugin's
    source that core found by reading it, not a frame on the stack."""
    warnings.warn_explicit(_with_release(message, removed_in), DeprecationWarning, filename, lineno, module=module)


def _with_release(message: str, removed_in: str | None) -> str:
    if removed_in is None or f"core {removed_in}" in message:
        return message
    return f"{message} (removed in core {removed_in})"
