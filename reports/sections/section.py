"""A part of the report as it is made (:class:`Section`: its blocks, the figures and tables it wrote, their files
and what it skipped), and the helpers that draw one figure or compute one table into a section, or record why
not: a figure whose data are missing is skipped with its reason (:class:`reports.base.data.MissingData`), and any
other error in one figure is recorded as a skip too (unless the build is strict), so one figure never stops the
report. Never imports torch."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from reports.base.captions import CAPTIONS
from reports.base.context import ReportContext
from reports.base.data import MissingData
from reports.document.document import Block, Heading, Image
from reports.document.files import safe_name, save_figure, save_table
from reports.sections.records import FigureRecord, Skipped


@dataclass
class Section:
    """What one part of the report adds: its blocks, the figures and tables it wrote (report.json lists them),
    the files of those, and what it skipped. Parts are made on their own and joined in document order."""

    blocks: list[Block | FigureTitle] = field(default_factory=list)
    figures: list[FigureRecord] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @classmethod
    def join(cls, parts: Iterable[Section]) -> Section:
        out = cls()
        for part in parts:
            out.blocks += part.blocks
            out.figures += part.figures
            out.tables += part.tables
            out.files += part.files
            out.skipped += part.skipped
        return out


@dataclass(frozen=True)
class FigureTitle:
    """A figure's heading before the document numbers its figures: ``Figure <n>. <label>``."""

    label: str


def number_figures(blocks: Iterable[Block | FigureTitle]) -> list[Block]:
    """The blocks with each figure's heading numbered in document order."""
    out: list[Block] = []
    n = 0
    for b in blocks:
        if isinstance(b, FigureTitle):
            n += 1
            b = Heading(f"Figure {n}. {b.label}", 4)
        out.append(b)
    return out


def attempt(ctx: ReportContext, name: str, sweep: str | None, make: Callable[[], Any]) -> tuple[Any, list[Skipped]]:
    """``make()``, or None and why it was skipped."""
    try:
        return make(), []
    except MissingData as err:
        return None, [Skipped(name, sweep, str(err))]
    except Exception as err:  # one broken figure must not stop the report
        if ctx.strict:
            raise
        print(f"attnres report: {name} (sweep {sweep}) failed:\n{traceback.format_exc()}", file=sys.stderr)
        return None, [Skipped(name, sweep, f"failed with {type(err).__name__}: {err}")]


def figure(
    ctx: ReportContext,
    name: str,
    sweep: str | None,
    make: Callable[[], Any],
    caption_key: str,
    subject: str | None = None,
    **fmt: Any,
) -> Section:
    """The figure ``make()`` draws, saved and shown with its caption; or the reason it was skipped."""
    fig, skipped = attempt(ctx, name, sweep, make)
    if fig is None:
        return Section(skipped=skipped)
    folder = ctx.out / "figures" / (safe_name(sweep) if sweep else "reference")
    paths = save_figure(fig, folder / name, ctx.formats)
    title, caption = CAPTIONS[caption_key]
    caption = caption.format(with_interval=ctx.with_interval, **fmt)
    png = next(p for p in paths if p.suffix == ".png")
    rel = png.relative_to(ctx.out).as_posix()
    others = tuple(p.relative_to(ctx.out).as_posix() for p in paths if p.suffix != ".png")
    label = title + (f": {subject}" if subject else "")
    return Section(
        blocks=[FigureTitle(label), Image(rel, label, caption, others)],
        figures=[FigureRecord(name, sweep, title, caption, tuple(paths))],
        files=list(paths),
    )


def table(
    ctx: ReportContext,
    name: str,
    sweep: str,
    make: Callable[[], pd.DataFrame],
    show: Callable[[pd.DataFrame], list[Block]],
) -> Section:
    """The table ``make()`` computes, saved as CSV and shown by ``show``; or the reason it was skipped."""
    frame, skipped = attempt(ctx, name, sweep, make)
    if frame is None:
        return Section(skipped=skipped)
    path = ctx.out / "tables" / safe_name(sweep) / f"{name}.csv"
    save_table(frame, path)
    record = {
        "name": name,
        "sweep": sweep,
        "file": path.relative_to(ctx.out).as_posix(),
        "attrs": dict(frame.attrs),
        "rows": frame.to_dict(orient="records"),
    }
    return Section(blocks=show(frame), tables=[record], files=[path])
