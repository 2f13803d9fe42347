"""argparse's parser as ``core`` uses it: "did you mean" for a misspelt command, flag or choice,
and ``--version``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from core.base.errors import closest_name

if TYPE_CHECKING:
    #: a parser's sub-commands (core's and the plugins'), each a CoreParser
    Subcommands = argparse._SubParsersAction["CoreParser"]


def core_version() -> str | None:
    """The installed distribution's version (pyproject's), as a result records it; None where core
    is not installed as a distribution."""
    from importlib import metadata

    try:
        return metadata.version("core")
    except metadata.PackageNotFoundError:
        return None


class VersionAction(argparse.Action):
    """``core --version``: read from the package metadata only when asked (no plugin loaded)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> NoReturn:
        version = core_version()
        if version is None:
            unknown = "core's version is unknown: it is not installed as a distribution (pip install -e .)"
            parser.exit(1, f"core: error: {unknown}\n")
        print(f"core {version}")  # on stdout, as argparse's own version action
        parser.exit(0)


class CoreParser(argparse.ArgumentParser):
    """argparse's parser with the closest choice added to an invalid one (a sub-command, ``--format``)."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as refused:
            name = closest_name(str(value), map(str, action.choices or ()))
            if name is None:
                raise
            raise argparse.ArgumentError(action, f"{refused.message}; did you mean {name!r}?") from None

    def refuse_unrecognized(self, args: argparse.Namespace, unrecognized: Sequence[str]) -> NoReturn:
        """argparse's error for arguments no parser took, with the closest option of the command for
        each misspelt flag (``--batchsize`` -> ``--batch-size``); an option of ``core`` itself given
        after the command (``core run fcnn --version``) is said to go before it."""
        own = _option_strings(self)
        known = own + _option_strings(_subcommand_parser(self, args))
        meant = {}  # misspelt flag -> the closest known one
        misplaced = []
        for word in unrecognized:
            flag = word.split("=", 1)[0]
            if flag in own:
                misplaced.append(flag)
            elif flag.startswith("-") and len(flag) > 1 and (name := closest_name(flag, known)) is not None:
                meant[flag] = name
        hints = [f"{flag} goes before the command: core {flag}" for flag in misplaced]
        if len(meant) == 1:
            hints.append(f"did you mean {next(iter(meant.values()))}?")
        elif meant:
            hints.append(f"did you mean {', '.join(f'{name} for {flag}' for flag, name in meant.items())}?")
        hint = f" ({'; '.join(hints)})" if hints else ""
        self.error(f"unrecognized arguments: {' '.join(unrecognized)}{hint}")


def _option_strings(parser: argparse.ArgumentParser | None) -> list[str]:
    if parser is None:
        return []
    return [option for action in parser._actions for option in action.option_strings]


def _subcommand_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser | None:
    """The parser of the sub-command ``args`` were parsed for, if any."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen: argparse.ArgumentParser | None = action.choices.get(getattr(args, action.dest, None) or "")
            return chosen
    return None
