"""A sweep's section of the report: its heading and runs, its fits (:mod:`reports.sections.sweep_fits`), its figures
(:mod:`reports.sections.sweep_figures`) and its tables (:mod:`reports.sections.sweep_tables`), with the files they wrote
and what was skipped. Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reports.base.context import ReportContext
from reports.base.data import sweep_runs
from reports.document.document import Heading, Paragraph
from reports.sections.section import Section
from reports.sections.sweep_figures import shape_figures, sweep_figures
from reports.sections.sweep_fits import fit_blocks
from reports.sections.sweep_tables import sweep_tables

if TYPE_CHECKING:  # pragma: no cover
    from analysis import SweepFit


def sweep_section(ctx: ReportContext, sweep: str) -> Section:
    """A sweep's fits, figures and tables, with the files they wrote and what was skipped."""
    sw = ctx.fit.sweep(sweep)
    if sw.architecture is not None:  # its cells are the result: the per-size figures and tables would pool heads
        figures = Section.join(shape_figures(ctx, sw))
        return Section.join(
            [
                Section([Heading(f"Sweep `{sweep}`", 2), _sweep_summary(ctx, sw), Heading("Figures", 3)]),
                figures,
                Section(list(fit_blocks(ctx, sw))),
            ]
        )
    figures = Section.join(sweep_figures(ctx, sw))
    if not figures.figures:
        figures.blocks.append(Paragraph("No figure could be drawn for this sweep; see Skipped."))
    # the figures first: a reader looks before reading the fits' tables
    return Section.join(
        [
            Section([Heading(f"Sweep `{sweep}`", 2), _sweep_summary(ctx, sw), Heading("Figures", 3)]),
            figures,
            Section(list(fit_blocks(ctx, sw))),
            *sweep_tables(ctx, sw),
        ]
    )


def _sweep_summary(ctx: ReportContext, sw: SweepFit) -> Paragraph:
    # a slice (``cpu_envelope@8tpp``) names no runs of its own: its runs are the sweep's at that ratio
    mine, _ = sweep_runs(ctx.results.runs, sw.sweep)
    n_done = int((mine["status"] == "done").sum())
    return Paragraph(
        f"{len(mine)} runs ({n_done} finished); FLOP convention: "
        f"{'; '.join(sw.flops_convention) or 'unknown'}"
        + ("; points are IsoFLOP minima (one compute-optimal point per budget)." if sw.frontier else ".")
    )
