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
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,120}\.png")


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


@dataclass(frozen=True)
class Figure:
    file_name: str  # under plots/
    png: bytes
    caption: str
    data: Table | None = None  # the figures the plot draws, shown with it so they can be copied


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


Block = Heading | Paragraph | Table | Figure | Preformatted


def format_number(value: float | int | None) -> str:
    """Four significant digits, thousands separated from 1,000 up; ``n/a`` for None."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 1e-3:
        return f"{value:.4g}"
    return f"{value:.3e}"


def format_percent(fraction: float | None) -> str:
    return "n/a" if fraction is None or not math.isfinite(fraction) else f"{fraction * 100:.1f} %"


def shorten(text: str, limit: int = _TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Characters that no file may carry: C0 and C1 controls but tab and line ends, and lone surrogates
# (which cannot even be encoded as UTF-8). Newlines are folded where text must stay on one line.
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff]")
_LINE_BREAKS = re.compile(r"[\t\n\r\x0b\x0c\x85\u2028\u2029]+")


def clean_text(text: Any) -> str:
    """Printable text: controls and lone surrogates become U+FFFD; tabs and line ends stay."""
    return _CONTROLS.sub("\ufffd", str(text))


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
    return lines + [""]


def render_markdown(title: str, blocks: Sequence[Block]) -> str:
    lines = [f"# {markdown_text(title)}", ""]
    for block in blocks:
        if isinstance(block, Heading):
            lines += [f"{'#' * block.level} {markdown_text(block.text)}", ""]
        elif isinstance(block, Paragraph):
            lines += [_markdown_inline(block.parts), ""]
        elif isinstance(block, Preformatted):
            lines += markdown_block(block.text) + [""]
        elif isinstance(block, Figure):
            caption = markdown_text(block.caption)
            lines += [f"![{caption}]({PLOTS_DIRECTORY}/{_checked_file_name(block.file_name)})", "", f"*{caption}*", ""]
            if block.data is not None:
                lines += ["Data behind the plot:", ""] + _markdown_table(block.data)
        elif isinstance(block, Table):
            lines += _markdown_table(block)
    return "\n".join(lines).rstrip() + "\n"


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1, h2, h3 { line-height: 1.2; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #c8c8cc; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
td[data-value] { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f2f2f5; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #e0e0e4; }
figcaption { font-size: 0.9rem; color: #555; }
details.plot-data { margin: -1.5rem 0 2rem; }
details.plot-data summary { cursor: pointer; color: #333; font-size: 0.9rem; }
pre { background: #f6f6f8; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; white-space: pre-wrap; }
td, p, code { overflow-wrap: anywhere; }
td:first-child { min-width: 8rem; }
"""


def _escape(text: Any) -> str:
    return html.escape(clean_text(text))


def _html_table(table: Table) -> list[str]:
    identifier = f' id="{_escape(table.identifier)}"' if table.identifier else ""
    parts = [
        f"<table{identifier}><thead><tr>"
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
    parts.append("</tbody></table>")
    return parts


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
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_escape(block.text)}</h{block.level}>")
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
            data = base64.b64encode(block.png).decode("ascii")
            parts.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{_escape(block.caption)}" '
                f'data-file="{PLOTS_DIRECTORY}/{_escape(_checked_file_name(block.file_name))}">'
                f"<figcaption>{_escape(block.caption)}</figcaption></figure>"
            )
            if block.data is not None:
                # Closed by default so the plots stay together; a click opens the figures to copy.
                parts.append('<details class="plot-data"><summary>Data behind this plot</summary>')
                parts += _html_table(block.data)
                parts.append("</details>")
        elif isinstance(block, Table):
            parts += _html_table(block)
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"
