"""Sections that plugins add to a report, through the ``core_report_sections`` hook.

Each implementation is called on its own: one that raises, or hands over something that is not a
well-formed block, loses its own sections, which the report names in a note (and ``core report``
in a warning); every other section is written. A plugin's blocks are checked here, before
rendering, so a bad one can never break the rendering of the whole report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any

from core.base.results import RunResult
from core.report.document import (
    _FILE_NAME,
    Code,
    Figure,
    Heading,
    Paragraph,
    Preformatted,
    Table,
    Value,
    one_line,
    shorten,
)

HOOK = "core_report_sections"
_TITLE_CHARS = 200


class SectionError(TypeError):
    """What a plugin handed ``add_section`` is not a section: raised at the plugin's own call."""


def _check_inline(part: object) -> None:
    if isinstance(part, Code):
        if not isinstance(part.text, str):
            raise SectionError(f"Code text is {type(part.text).__name__}, not str")
    elif not isinstance(part, str):
        raise SectionError(f"a Paragraph part is {type(part).__name__}, not str or Code")


def _check_number(number: object) -> None:
    if number is None:
        return
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise SectionError(f"a Value's number is {type(number).__name__}, not int, float or None")
    if isinstance(number, float) and not math.isfinite(number):
        raise SectionError(f"a Value's number is {number!r}; give None for a missing figure")


def _check_table(table: Table) -> None:
    columns = table.columns
    if not isinstance(columns, list) or not all(
        isinstance(column, tuple) and len(column) == 2 and all(isinstance(text, str) for text in column)
        for column in columns
    ):
        raise SectionError("Table.columns must be a list of (name, header) pairs of str")
    if not isinstance(table.rows, list):
        raise SectionError(f"Table.rows is {type(table.rows).__name__}, not a list")
    for row in table.rows:
        if not isinstance(row, list) or len(row) != len(columns):
            raise SectionError(f"a Table row must be a list of {len(columns)} Value, one per column")
        for value in row:
            if not isinstance(value, Value) or not isinstance(value.text, str):
                raise SectionError(f"a Table cell is {type(value).__name__}, not a Value with str text")
            _check_number(value.number)
    if not isinstance(table.identifier, str) or not all(isinstance(key, str) for key in table.row_keys):
        raise SectionError("Table.identifier and row_keys must be str")


def _check_block(block: object) -> None:
    """Refuse anything the renderers could not render, at the plugin's call."""
    if isinstance(block, Heading):
        if isinstance(block.level, bool) or block.level not in (3, 4, 5, 6) or not isinstance(block.text, str):
            raise SectionError("a Heading in a section has level 3 to 6 (core gives the section level 2) and str text")
    elif isinstance(block, Paragraph):
        for part in block.parts:
            _check_inline(part)
    elif isinstance(block, Preformatted):
        if not isinstance(block.text, str):
            raise SectionError(f"Preformatted text is {type(block.text).__name__}, not str")
    elif isinstance(block, Table):
        _check_table(block)
    elif isinstance(block, Figure):
        if not isinstance(block.png, bytes) or not isinstance(block.caption, str):
            raise SectionError("a Figure has png bytes and a str caption")
        if not isinstance(block.file_name, str) or not _FILE_NAME.fullmatch(block.file_name):
            raise SectionError(f"a Figure's file_name must be a plain NAME.png, not {block.file_name!r}")
        if block.data is not None:
            if not isinstance(block.data, Table):
                raise SectionError("a Figure's data is a Table or None")
            _check_table(block.data)
    else:
        raise SectionError(
            f"a section's blocks are Heading, Paragraph, Preformatted, Table or Figure, not {type(block).__name__}"
        )


def _own_file_names(blocks: list[Any], plugin: str, title: str, taken: set[str]) -> list[Any]:
    """A plugin's figures under file names of their own: the plugin and section hashed in front,
    so that no two sections (nor core's plots) can ask for one file. ``taken``: the report's file
    names so far, lower case (a case-insensitive file system has one file for two spellings)."""
    prefix = "plugin-" + hashlib.sha256(f"{plugin}\0{title}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
    renamed = []
    for block in blocks:
        if isinstance(block, Figure):
            name = f"{prefix}-{block.file_name}"
            if not _FILE_NAME.fullmatch(name):
                raise SectionError(f"a Figure's file_name {block.file_name!r} is too long (at most 100 characters)")
            if name.lower() in taken:
                raise SectionError(f"two Figures of one section share the file_name {block.file_name!r}")
            taken.add(name.lower())
            block = dataclasses.replace(block, file_name=name)
        renamed.append(block)
    return renamed


def plugin_sections(runs: Sequence[RunResult], taken_file_names: Sequence[str] = ()) -> tuple[list[Any], list[str]]:
    """(blocks, warnings): every plugin's sections, each under its level-2 heading, and what was
    left out. Implementations run in pluggy's order; a faulty one costs its own sections only.

    :param taken_file_names: the plot files of core's own sections, which no plugin figure may take.
    """
    from core.base.errors import ConfigError
    from core.contract.manager import PluginFault, get_plugin_manager

    manager = get_plugin_manager()
    blocks: list[Any] = []
    warnings: list[str] = []
    taken = {name.lower() for name in taken_file_names}
    shared = tuple(runs)  # one plugin cannot change the list the next one gets
    for plugin, call in manager.implementations(HOOK):
        added: list[Any] = []
        names = set(taken)

        def add_section(
            title: str,
            section: Sequence[Any],
            _added: list[Any] = added,
            _plugin: str = plugin,
            _names: set[str] = names,
        ) -> None:
            if not isinstance(title, str) or not title.strip():
                raise SectionError(f"a section's title is non-empty text, not {title!r}")
            if isinstance(section, (str, bytes)) or not isinstance(section, Sequence):
                raise SectionError(f"a section's blocks are a list of blocks, not {type(section).__name__}")
            for block in section:
                _check_block(block)
            title = shorten(one_line(title), _TITLE_CHARS)
            _added += [Heading(2, title), *_own_file_names(list(section), _plugin, title, _names)]

        try:
            with manager.plugin_named(plugin, f"the {HOOK} hook"):
                returned = call(runs=shared, add_section=add_section)
        except PluginFault as fault:
            warnings.append(f"{fault}; its report sections are left out")
            continue
        except ConfigError as error:  # a refusal is no fault elsewhere; here it is a section that failed
            warnings.append(f"plugin {plugin!r} raised in the {HOOK} hook: {error}; its report sections are left out")
            continue
        if returned is not None:
            warnings.append(
                f"plugin {plugin!r}: the {HOOK} hook returned {type(returned).__name__}, which is ignored: a "
                "section is added by calling add_section(title, blocks)"
            )
        blocks += added
        taken = names
    if warnings:
        blocks += [Heading(2, "Plugin sections left out")] + [Paragraph(shorten(one_line(w), 1200)) for w in warnings]
    return blocks, warnings
