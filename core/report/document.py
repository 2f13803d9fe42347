"""The report as a document: blocks (tables, figures, text) rendered to Markdown and to HTML.

Everything in a report comes from the database and is treated as untrusted text: both renderings
escape it (Markdown too: no raw HTML, no table or code-span breakage).
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.base.errors import CoreError
from core.running.progress import escape_character

REPORT_MARKDOWN = "report.md"
REPORT_HTML = "report.html"
PLOTS_DIRECTORY = "plots"
_TEXT_CHARS = 300  # of a label or an option value shown in a table or a paragraph


class ReportError(CoreError):
    """Nothing to report, or matplotlib is missing."""


# --- file names from data -------------------------------------------------------------------------


# A sweep name used as it is in file names and HTML ids: letters, digits, "-" and "_", starting
# with a letter or digit. Anything else ("../x", "/some/where", "a b", "Ä") becomes a slug plus a
# hash of the name, so two names never share files and no name reaches outside plots/.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,120}\.(png|svg|pdf)")


def _hashed_slug(name: str) -> str:
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-") or "sweep"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable}-{digest}"


def sweep_slugs(names: Sequence[str]) -> dict[str, str]:
    """Each sweep name's slug for file names and HTML ids: the name itself where it is plain and
    no other slug equals it (ignoring case, for case-insensitive file systems), else slug + hash."""
    slugs = {name: name if _PLAIN_NAME.fullmatch(name) else _hashed_slug(name) for name in names}
    lowered = [slug.lower() for slug in slugs.values()]
    for name, slug in slugs.items():
        if slug == name and lowered.count(slug.lower()) > 1:
            slugs[name] = _hashed_slug(name)
    return slugs


def list_names(names: Sequence[str]) -> str:
    """``a, b, '../x'``: plain names as they are, others quoted (control characters escaped)."""
    return ", ".join(name if _PLAIN_NAME.fullmatch(name) else repr(name) for name in names) or "none"


def _checked_file_name(name: str) -> str:
    """A plot's file name, refused unless it is one plain component (never a path)."""
    if not _FILE_NAME.fullmatch(name):
        raise ReportError(f"refusing plot file name {name!r}: not a plain file name")
    return name


# --- the document: blocks rendered to Markdown and to HTML ------------------------------------


@dataclass(frozen=True)
class Value:
    """A table cell: its text, and the exact number behind it (HTML keeps it in data-value)."""

    text: str
    number: float | int | None = None


@dataclass(frozen=True)
class Table:
    columns: list[tuple[str, str]]  # (machine name, header text)
    rows: list[list[Value]]
    identifier: str = ""
    row_keys: list[str] = field(default_factory=list)  # each row's cell key (HTML data-cell-key)
    dropped: tuple[tuple[str, str], ...] = ()  # the columns left out because every row read n/a


MISSING = "n/a"


def without_empty_columns(table: Table) -> Table:
    """``table`` less the columns that read n/a in every row (a CPU's MFU, energy without a meter),
    their headers kept in ``dropped`` so the report says once what was left out."""
    if not table.rows:
        return table
    empty = {
        index
        for index in range(len(table.columns))
        if all(index < len(row) and row[index].text == MISSING and row[index].number is None for row in table.rows)
    }
    if not empty:
        return table
    return Table(
        columns=[column for index, column in enumerate(table.columns) if index not in empty],
        rows=[[value for index, value in enumerate(row) if index not in empty] for row in table.rows],
        identifier=table.identifier,
        row_keys=table.row_keys,
        dropped=table.dropped + tuple(table.columns[index] for index in sorted(empty)),
    )


class PlotImage(bytes):
    """A plot's PNG bytes that also carry the same plot as vector files for print (``svg``, ``pdf``):
    a :class:`Figure` built from it writes them beside its PNG, and the report links them."""

    vectors: dict[str, bytes]

    def __new__(cls, png: bytes, vectors: dict[str, bytes]) -> PlotImage:
        image = super().__new__(cls, png)
        image.vectors = dict(vectors)
        return image


@dataclass(frozen=True)
class Figure:
    file_name: str  # under plots/
    png: bytes
    caption: str
    data: Table | None = None  # the figures the plot draws, shown with it so they can be copied

    @property
    def vector_files(self) -> dict[str, bytes]:
        """The print versions written beside the PNG: ``name.svg``, ``name.pdf`` (where drawn)."""
        stem = _checked_file_name(self.file_name).removesuffix(".png")
        vectors = getattr(self.png, "vectors", {})
        return {f"{stem}.{kind}": vectors[kind] for kind in ("svg", "pdf") if kind in vectors}

    @property
    def files(self) -> dict[str, bytes]:
        """Every file of the figure under plots/: the PNG, then its print versions."""
        return {_checked_file_name(self.file_name): self.png, **self.vector_files}


@dataclass(frozen=True)
class Contents:
    """The table of contents: a link to each section (level 2) and part (level 3) after it."""


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Code:
    """Literal text shown as code (a path, a label): a code span in Markdown, <code> in HTML."""

    text: str


Inline = str | Code


@dataclass(frozen=True)
class Paragraph:
    """Plain text and code spans; plain text is shown as it is, never read as markup."""

    parts: tuple[Inline, ...]

    def __init__(self, *parts: Inline) -> None:
        object.__setattr__(self, "parts", tuple(parts))


@dataclass(frozen=True)
class Preformatted:
    text: str


Block = Heading | Paragraph | Table | Figure | Preformatted | Contents


# --- anchors: one per heading, as GitHub makes them, so the Markdown's links work there too -------

_ANCHOR_DROPPED = re.compile(r"[^\w\- ]")


def heading_anchors(blocks: Sequence[Block], taken: Sequence[str] = ()) -> dict[int, str]:
    """Each heading's anchor by its index in ``blocks``: its text lower-cased, punctuation dropped,
    spaces as "-" (GitHub's rule), "-1", "-2" after repeats and names already ``taken``."""
    used = {name.lower() for name in taken}
    anchors: dict[int, str] = {}
    for index, block in enumerate(blocks):
        if not isinstance(block, Heading):
            continue
        base = _ANCHOR_DROPPED.sub("", one_line(block.text).lower()).replace(" ", "-") or "section"
        anchor, count = base, 0
        while anchor in used:
            count += 1
            anchor = f"{base}-{count}"
        used.add(anchor)
        anchors[index] = anchor
    return anchors


def _contents_entries(blocks: Sequence[Block], anchors: dict[int, str]) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of the headings after the contents, levels 2 and 3."""
    start = next((index for index, block in enumerate(blocks) if isinstance(block, Contents)), len(blocks))
    return [
        (block.level, block.text, anchors[index])
        for index, block in enumerate(blocks)
        if index > start and isinstance(block, Heading) and block.level in (2, 3)
    ]


_PREFIXES = {-4: "p", -3: "n", -2: "µ", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}


def format_number(value: float | int | None) -> str:
    """Engineering notation, four significant digits: ``146.5``, ``40.18 k``, ``2.336 m``, ``1.2 G``
    (a power of 1000 as its SI prefix, before the unit the column names); ``n/a`` for None.
    Values from 0.001 to 1 stay plain (``0.0123``), as a fraction reads best."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1:
        return f"{value:.4g}"
    power = math.floor(math.log10(magnitude) / 3)
    if power not in _PREFIXES:  # beyond exa or below pico: no prefix says it
        return f"{value:.3e}"
    mantissa = float(f"{value / 1000.0**power:.4g}")
    if abs(mantissa) >= 1000 and power < max(_PREFIXES):  # 999.96 rounds up to the next prefix
        power, mantissa = power + 1, mantissa / 1000
    prefix = _PREFIXES[power]
    return f"{mantissa:.4g} {prefix}" if prefix else f"{mantissa:.4g}"


_SECONDS_PER_MINUTE = 60.0
_SECONDS_PER_HOUR = 3600.0


def format_duration(seconds: float | int | None) -> str:
    """A time in the unit that reads best: ``12.5 µs``, ``850 ms``, ``40.18 s``, ``38.5 min``,
    ``2.31 h`` (seconds up to two minutes, minutes up to two hours, then hours)."""
    if seconds is None or (isinstance(seconds, float) and not math.isfinite(seconds)):
        return "n/a"
    magnitude = abs(seconds)
    if magnitude == 0:
        return "0 s"
    if magnitude < 1e-3:
        return f"{format_number(seconds)}s"  # "12.5 µ" + "s"
    if magnitude < 1:
        return f"{seconds * 1e3:.4g} ms"
    if magnitude < 2 * _SECONDS_PER_MINUTE:
        return f"{seconds:.4g} s"
    if magnitude < 2 * _SECONDS_PER_HOUR:
        return f"{seconds / _SECONDS_PER_MINUTE:.4g} min"
    return f"{format_number(seconds / _SECONDS_PER_HOUR)} h"


def format_percent(fraction: float | None) -> str:
    return "n/a" if fraction is None or not math.isfinite(fraction) else f"{fraction * 100:.1f} %"


def shorten(text: str, limit: int = _TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Characters that no file may carry, written out as the terminal filter writes them: C0 and C1
# controls but tab and line ends, the bidirectional overrides and isolates (text shown in another
# order than it is), and lone surrogates (which cannot even be encoded as UTF-8). Newlines are folded
# where text must stay on one line.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_LINE_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x85\u2028\u2029]+")


def clean_text(text: Any) -> str:
    """Printable text: controls, bidirectional overrides and lone surrogates written out as the
    terminal shows them (``\\x1b``, ``\\u202e``: docs/sweeps.md, "What reaches the terminal"), not
    replaced, so a report and ``core results`` name the same character; tabs and line ends stay."""
    return _CONTROLS.sub(escape_character, str(text))


def one_line(text: Any) -> str:
    """Printable text on one line: line breaks and tabs become spaces."""
    return clean_text(_LINE_BREAKS.sub(" ", str(text)))


# Markdown that inline text could start: code spans, emphasis, links, strikethrough, table cell
# breaks, math ($), headings' closing #; "_" only where it can open or close emphasis.
_MARKDOWN_SPECIALS = re.compile(r"[\\`*\[\]|~$#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BLOCK_START = re.compile(r"([-+=]|\d+[.)])")


def markdown_text(text: Any, *, line_start: bool = False) -> str:
    """Untrusted text as literal Markdown on one line: HTML escaped, markup characters backslashed.

    ``line_start``: the text starts a line, where ``-``, ``+``, ``=`` or ``1.`` would begin a list
    or a heading underline; they are escaped there too.
    """
    text = html.escape(one_line(text), quote=False)
    text = _MARKDOWN_SPECIALS.sub(lambda match: "\\" + match.group(0), text)
    if line_start:
        text = text.lstrip()  # four spaces would start a code block
        start = _BLOCK_START.match(text)
        if start:
            text = start.group(0)[:-1] + "\\" + text[start.end() - 1 :]
    return text


def markdown_code(text: Any) -> str:
    """A code span holding ``text`` literally, whatever backticks it contains."""
    text = one_line(text)
    if not text:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def markdown_block(text: Any) -> list[str]:
    """A fenced code block of ``text``: its fence is longer than any run of backticks inside."""
    text = clean_text(text).replace("\r\n", "\n").replace("\r", "\n")
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return [f"{fence}text", text, fence]


def _markdown_inline(parts: Sequence[Inline]) -> str:
    pieces = []
    for index, part in enumerate(parts):
        if isinstance(part, Code):
            pieces.append(markdown_code(part.text))
        else:
            pieces.append(markdown_text(part, line_start=index == 0))
    return "".join(pieces)


def _markdown_table(table: Table) -> list[str]:
    lines = [
        "| " + " | ".join(markdown_text(header) for _, header in table.columns) + " |",
        "|" + "|".join(" --- " for _ in table.columns) + "|",
    ]
    for row in table.rows:
        lines.append("| " + " | ".join(markdown_text(value.text) for value in row) + " |")
    lines.append("")
    if table.dropped:
        lines += [markdown_text(_dropped_text(table)), ""]
    return lines


def _dropped_text(table: Table) -> str:
    return f"Not shown, {MISSING} in every row: {', '.join(header for _, header in table.dropped)}."


def _markdown_contents(blocks: Sequence[Block], anchors: dict[int, str]) -> list[str]:
    lines = ["Contents:", ""]
    for level, text, anchor in _contents_entries(blocks, anchors):
        lines.append(f"{'  ' * (level - 2)}- [{markdown_text(text)}](#{anchor})")
    return lines + [""]


def _markdown_figure(figure: Figure) -> list[str]:
    caption = markdown_text(figure.caption)
    lines = [f"![{caption}]({PLOTS_DIRECTORY}/{_checked_file_name(figure.file_name)})", "", f"*{caption}*", ""]
    vectors = figure.vector_files
    if vectors:
        links = ", ".join(f"[{name.rsplit('.', 1)[1].upper()}]({PLOTS_DIRECTORY}/{name})" for name in vectors)
        lines += [f"For print: {links}.", ""]
    if figure.data is not None:
        lines += ["Data behind the plot:", ""] + _markdown_table(figure.data)
    return lines


def render_markdown(title: str, blocks: Sequence[Block]) -> str:
    lines = [f"# {markdown_text(title)}", ""]
    anchors = heading_anchors(blocks)
    for block in blocks:
        if isinstance(block, Heading):
            lines += [f"{'#' * block.level} {markdown_text(block.text)}", ""]
        elif isinstance(block, Contents):
            lines += _markdown_contents(blocks, anchors)
        elif isinstance(block, Paragraph):
            lines += [_markdown_inline(block.parts), ""]
        elif isinstance(block, Preformatted):
            lines += markdown_block(block.text) + [""]
        elif isinstance(block, Figure):
            lines += _markdown_figure(block)
        elif isinstance(block, Table):
            lines += _markdown_table(block)
    return "\n".join(lines).rstrip() + "\n"


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1, h2, h3 { line-height: 1.2; }
/* A wide table scrolls sideways in its own box; the page never does, and no column is squeezed
   until its words break letter by letter. The box may reach past the text column to the window's
   right edge (the body is 74rem wide with its padding, centred): a wide window shows more columns. */
.table-scroll { overflow-x: auto; width: max-content; max-width: calc(100vw - max(0px, (100vw - 74rem) / 2) - 3rem);
                margin: 0.5rem 0 1.5rem; }
.table-scroll table { margin: 0; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #c8c8cc; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top;
         overflow-wrap: normal; word-break: normal; hyphens: none; }
th { background: #f2f2f5; min-width: 4.5rem; }
td { min-width: 3rem; }
td[data-value] { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td[data-column="note"], td[data-column="reason"], td[data-column="values"] { min-width: 22rem; }
td[data-column="status"] { white-space: nowrap; }
p.dropped { font-size: 0.85rem; color: #555; margin-top: -1rem; }
nav.contents { background: #f6f6f8; padding: 0.4rem 1rem; border: 1px solid #e0e0e4; }
nav.contents ul { margin: 0.2rem 0; padding-left: 1.2rem; }
figcaption a { margin-left: 0.3rem; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e0e0e4; }
figcaption { font-size: 0.9rem; color: #555; }
details.plot-data { margin: -1.5rem 0 2rem; }
details.plot-data summary { cursor: pointer; color: #333; font-size: 0.9rem; }
pre { background: #f6f6f8; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; white-space: pre-wrap; }
p, code { overflow-wrap: anywhere; }
td:first-child { min-width: 8rem; }
"""


def _escape(text: Any) -> str:
    return html.escape(clean_text(text))


def _html_table(table: Table) -> list[str]:
    identifier = f' id="{_escape(table.identifier)}"' if table.identifier else ""
    parts = [
        f'<div class="table-scroll"><table{identifier}><thead><tr>'
        + "".join(f'<th data-column="{_escape(name)}">{_escape(header)}</th>' for name, header in table.columns)
        + "</tr></thead><tbody>"
    ]
    for index, row in enumerate(table.rows):
        key = f' data-cell-key="{_escape(table.row_keys[index])}"' if index < len(table.row_keys) else ""
        cells = []
        for (name, _), value in zip(table.columns, row):
            number = f' data-value="{value.number!r}"' if value.number is not None else ""
            cells.append(f'<td data-column="{_escape(name)}"{number}>{_escape(value.text)}</td>')
        parts.append(f"<tr{key}>{''.join(cells)}</tr>")
    parts.append("</tbody></table></div>")
    if table.dropped:
        parts.append(f'<p class="dropped">{_escape(_dropped_text(table))}</p>')
    return parts


def _html_contents(blocks: Sequence[Block], anchors: dict[int, str]) -> list[str]:
    """A list of the sections, each holding a list of its parts."""
    parts = ['<nav class="contents"><strong>Contents</strong><ul>']
    section_open = nested = False
    for level, text, anchor in _contents_entries(blocks, anchors):
        link = f'<a href="#{_escape(anchor)}">{_escape(text)}</a>'
        if level == 2:
            parts.append(("</ul>" if nested else "") + ("</li>" if section_open else "") + f"<li>{link}")
            section_open, nested = True, False
            continue
        if not nested:
            parts.append("<ul>" if section_open else "<li><ul>")
            section_open = nested = True
        parts.append(f"<li>{link}</li>")
    parts.append(("</ul>" if nested else "") + ("</li>" if section_open else "") + "</ul></nav>")
    return parts


def _html_figure(figure: Figure) -> list[str]:
    data = base64.b64encode(figure.png).decode("ascii")
    links = "".join(
        f' <a href="{PLOTS_DIRECTORY}/{_escape(name)}">{name.rsplit(".", 1)[1].upper()}</a>'
        for name in figure.vector_files
    )
    parts = [
        f'<figure><img src="data:image/png;base64,{data}" alt="{_escape(figure.caption)}" '
        f'data-file="{PLOTS_DIRECTORY}/{_escape(_checked_file_name(figure.file_name))}">'
        f"<figcaption>{_escape(figure.caption)}{' (for print:' + links + ')' if links else ''}</figcaption></figure>"
    ]
    if figure.data is not None:
        # Closed by default so the plots stay together; a click opens the figures to copy.
        parts.append('<details class="plot-data"><summary>Data behind this plot</summary>')
        parts += _html_table(figure.data)
        parts.append("</details>")
    return parts


def _all_tables(blocks: Sequence[Block]) -> list[Table]:
    """The tables of ``blocks``, the plots' data tables too (their ids are taken)."""
    tables = [block for block in blocks if isinstance(block, Table)]
    return tables + [block.data for block in blocks if isinstance(block, Figure) and block.data is not None]


def render_html(title: str, blocks: Sequence[Block]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        # Nothing may load from outside the page: what it shows is what the file contains.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>{_escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        f"<h1>{_escape(title)}</h1>",
    ]
    tables = [block.identifier for block in _all_tables(blocks) if block.identifier]
    anchors = heading_anchors(blocks, taken=tables)
    for index, block in enumerate(blocks):
        if isinstance(block, Heading):
            parts.append(f'<h{block.level} id="{_escape(anchors[index])}">{_escape(block.text)}</h{block.level}>')
        elif isinstance(block, Contents):
            parts += _html_contents(blocks, anchors)
        elif isinstance(block, Paragraph):
            parts.append(
                "<p>"
                + "".join(
                    f"<code>{_escape(part.text)}</code>" if isinstance(part, Code) else _escape(part)
                    for part in block.parts
                )
                + "</p>"
            )
        elif isinstance(block, Preformatted):
            parts.append(f"<pre>{_escape(block.text)}</pre>")
        elif isinstance(block, Figure):
            parts += _html_figure(block)
        elif isinstance(block, Table):
            parts += _html_table(block)
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"
