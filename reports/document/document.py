"""A tiny document model for the report, rendered twice: Markdown (report.md, images by relative path) and
self-contained HTML (report.html, PNGs embedded as base64, inline CSS, no external assets).

Blocks: :class:`Heading`, :class:`Paragraph`, :class:`Bullets`, :class:`Table` (a DataFrame and per-column
formats) and :class:`Image`. Inline markup in texts: ``code`` and **bold** only. Pure Python + pandas.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A DataFrame shown as a table; ``formats`` maps a column to a function of the cell value giving its
    text; ``bold_min`` lists columns among which each row's lowest value is bold (the best loss)."""

    frame: pd.DataFrame
    formats: Mapping[str, Callable[[Any], str]] = field(default_factory=dict)
    bold_min: tuple[str, ...] = ()


@dataclass(frozen=True)
class Image:
    """A figure: ``path`` relative to the report's folder (the PNG), its alt text and caption."""

    path: str
    alt: str
    caption: str
    other_formats: tuple[str, ...] = ()


Block = Heading | Paragraph | Bullets | Table | Image


def default_format(value: Any) -> str:
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return str(value)


def table_cells(table: Table) -> tuple[list[str], list[list[str]], list[set[int]]]:
    """(header, text rows, per row the column indexes to bold)."""
    frame = table.frame
    header = [str(c) for c in frame.columns]
    rows, bold = [], []
    for _, row in frame.iterrows():
        cells = []
        for col in frame.columns:
            fmt = table.formats.get(col, default_format)
            cells.append(fmt(row[col]))
        rows.append(cells)
        marks: set[int] = set()
        if table.bold_min:
            values = {
                c: row[c]
                for c in table.bold_min
                if c in frame.columns and isinstance(row[c], float) and math.isfinite(row[c])
            }
            if len(values) >= 2:
                low = min(values.values())
                marks = {list(frame.columns).index(c) for c, v in values.items() if v == low}
        bold.append(marks)
    return header, rows, bold


# ---------------------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Paragraph):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            header, rows, bold = table_cells(b)
            out.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
            out.append("|" + "|".join("---" for _ in header) + "|")
            for cells, marks in zip(rows, bold):
                shown = [f"**{_md_cell(c)}**" if i in marks and c else _md_cell(c) for i, c in enumerate(cells)]
                out.append("| " + " | ".join(shown) + " |")
            out.append("")
        elif isinstance(b, Image):
            out.append(f"![{b.alt}]({b.path})")
            out.append("")
            extra = (
                f" (also as {', '.join(f'[{Path(p).suffix[1:].upper()}]({p})' for p in b.other_formats)})"
                if b.other_formats
                else ""
            )
            out += [f"*{b.caption}*{extra}", ""]
        else:  # pragma: no cover
            raise TypeError(f"unknown block {b!r}")
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1180px; margin: 2em auto;
       padding: 0 1.2em; color: #222; line-height: 1.45; }
h1 { font-size: 1.7em; border-bottom: 2px solid #ddd; padding-bottom: .2em; }
h2 { font-size: 1.35em; margin-top: 1.8em; border-bottom: 1px solid #eee; }
h3 { font-size: 1.12em; margin-top: 1.4em; }
code { background: #f4f4f4; padding: 0 .25em; border-radius: 3px; font-size: .92em; }
.table { overflow-x: auto; margin: .6em 0 1.2em; }
table { border-collapse: collapse; font-size: .86em; }
th, td { border: 1px solid #ddd; padding: .25em .55em; text-align: left; white-space: nowrap; }
table.wide { width: 100%; table-layout: auto; font-size: .76em; }
table.wide th, table.wide td { white-space: normal; overflow-wrap: break-word; padding: .2em .35em; }
th { background: #f6f6f6; }
tr:nth-child(even) td { background: #fcfcfc; }
figure { margin: 1em 0 1.8em; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #444; margin-top: .3em; }
nav.toc { background: #fafafa; border: 1px solid #eee; padding: .5em 1em; margin: 1em 0 1.5em; font-size: .92em; }
nav.toc ul { list-style: none; padding-left: 0; margin: .3em 0 0; columns: 2; }
nav.toc li.toc3 { padding-left: 1.2em; font-size: .94em; }
"""


WIDE_TABLE_CHARS = 130  # a table wider than this (in characters, at the page's font) gets class "wide"


def is_wide(header: Sequence[str], rows: Sequence[Sequence[str]]) -> bool:
    """Whether a table would not fit the page's width on one line per cell (about 130 characters at the
    table font): then it is set smaller, its cells wrap (at spaces and after "/") and it spans the page, so
    every column shows without a horizontal scroll."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    return sum(widths) + 3 * len(widths) > WIDE_TABLE_CHARS


def _cell_html(text: str, wide: bool) -> str:
    escaped = html.escape(text)
    return escaped.replace("/", "/<wbr>") if wide else escaped


def _inline(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    escaped = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
    escaped = re.sub(r"(?<![\w*])\*([^*]+)\*(?![\w*])", r"<em>\1</em>", escaped)
    return escaped


TOC_LEVELS = (2, 3)  # the headings the HTML's table of contents lists (sections and their parts)


def heading_ids(blocks: Sequence[Block]) -> dict[int, str]:
    """An anchor for every heading (by its index in ``blocks``): its text in lower case, words joined by "-",
    made unique with "-2", "-3", ... in document order."""
    ids: dict[int, str] = {}
    seen: dict[str, int] = {}
    for i, b in enumerate(blocks):
        if isinstance(b, Heading):
            slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"[`*]", "", b.text).lower()).strip("-") or "section"
            seen[slug] = seen.get(slug, 0) + 1
            ids[i] = slug if seen[slug] == 1 else f"{slug}-{seen[slug]}"
    return ids


def _toc(blocks: Sequence[Block], ids: Mapping[int, str]) -> str:
    items = [
        f'<li class="toc{b.level}"><a href="#{ids[i]}">{_inline(b.text)}</a></li>'
        for i, b in enumerate(blocks)
        if isinstance(b, Heading) and b.level in TOC_LEVELS
    ]
    return f'<nav class="toc"><strong>Contents</strong><ul>{"".join(items)}</ul></nav>' if items else ""


def to_html(blocks: Sequence[Block], root: Path, title: str) -> str:
    """The blocks as one self-contained HTML page, a table of contents after its title (every section and its
    parts, linked to their anchors); PNG images under ``root`` are embedded as base64."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
    ]
    ids = heading_ids(blocks)
    toc = _toc(blocks, ids)
    for i, b in enumerate(blocks):
        if isinstance(b, Heading):
            out.append(f'<h{b.level} id="{ids[i]}">{_inline(b.text)}</h{b.level}>')
            if b.level == 1 and toc:
                out.append(toc)
                toc = ""
        elif isinstance(b, Paragraph):
            out.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            header, rows, bold = table_cells(b)
            wide = is_wide(header, rows)
            parts = [
                '<div class="table"><table class="wide">' if wide else '<div class="table"><table>',
                "<thead><tr>" + "".join(f"<th>{_cell_html(h, wide)}</th>" for h in header) + "</tr></thead>",
                "<tbody>",
            ]
            for cells, marks in zip(rows, bold):
                tds = "".join(
                    f"<td><strong>{_cell_html(c, wide)}</strong></td>"
                    if i in marks and c
                    else f"<td>{_cell_html(c, wide)}</td>"
                    for i, c in enumerate(cells)
                )
                parts.append(f"<tr>{tds}</tr>")
            parts.append("</tbody></table></div>")
            out.append("".join(parts))
        elif isinstance(b, Image):
            data = base64.b64encode((root / b.path).read_bytes()).decode("ascii")
            out.append(
                f'<figure><img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_inline(b.caption)}</figcaption></figure>"
            )
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
