"""The fits part of a sweep's section: the tables ``attnres fit`` prints (fits, multipliers, budgets, loss gaps,
sensitivity, Chinchilla surfaces, the frontier) and, beside the headline, what bears on each M (the paired
per-size M, the stalled runs, both tuning protocols, the learning-rate envelopes), with the fit's notes.
Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis.data.stalls import has_seeds_to_compare
from analysis.laws.forms import law_for
from analysis.tables.robust_tables import (
    envelope_table,
    paired_table,
    protocol_cell_table,
    protocol_table,
    stall_texts,
)
from analysis.tables.shape_tables import architecture_table, depth_table, one_shape_table
from analysis.tables.tables import (
    MISSING_SEEDS,
    chinchilla_table,
    exponent_texts,
    frontier_table,
    joint_text,
    sensitivity_texts,
)
from attnres.variants import curve_order
from reports.base.context import ReportContext
from reports.base.data import MissingData
from reports.document.document import Block, Bullets, Heading, Paragraph, Table
from reports.figures import scaling
from reports.figures.learning_rates import best_lr_table
from reports.sections import tables

if TYPE_CHECKING:  # pragma: no cover
    from analysis import SweepFit


def fit_blocks(ctx: ReportContext, sw: SweepFit) -> list[Block]:
    """The sweep's fits, multipliers and Chinchilla surfaces (the tables of ``attnres fit``), and its notes."""
    blocks: list[Block] = [Heading("Fits", 3)]
    if sw.missing_seeds:
        blocks += [
            Paragraph(f"**{MISSING_SEEDS[0].upper() + MISSING_SEEDS[1:]}:**"),
            Bullets(tuple(m.text() for m in sw.missing_seeds)),
        ]
    blocks += _curve_blocks(ctx, sw)
    if sw.architecture is not None:
        cells = architecture_table(sw.architecture)
        blocks += [Heading("Architecture cells", 3), Paragraph(cells.caption), Table(cells.frame())]
    if sw.curves and not sw.multipliers:
        blocks.append(Paragraph(f"No multiplier: {scaling.no_multiplier_reason(ctx.fit, sw)}."))
    if sw.multipliers:
        blocks += _multiplier_blocks(ctx, sw)
    if sw.chinchilla:
        surface = chinchilla_table(sw, ctx.settings)
        blocks += [Paragraph(surface.caption), Table(surface.frame())]
    if sw.frontier_multipliers:
        at_frontier = frontier_table(sw, ctx.settings)
        blocks += [Paragraph(at_frontier.caption), Table(at_frontier.frame())]
    if sw.notes:
        blocks += [Paragraph("Notes from the fit:"), Bullets(tuple(sw.notes))]
    return blocks


def _curve_blocks(ctx: ReportContext, sw: SweepFit) -> list[Block]:
    """The sweep's fitted curves (and joint fit), or what it has instead of them: Chinchilla surfaces, an
    architecture grid, one shape's gaps, or why no curve could be fitted."""
    blocks: list[Block] = []
    if sw.curves:
        fits = tables.curve_fits(ctx.fit, sw.sweep)
        blocks += [Paragraph(fits.caption), Table(fits.frame())]
        if sw.joint is not None:
            blocks.append(Paragraph(joint_text(sw.joint).sentence))
    elif sw.chinchilla or sw.frontier_multipliers:
        blocks.append(
            Paragraph(
                f"The sweep's runs taken together: every (size, budget) point, each curve fitted as one Chinchilla "
                f"surface in N and D, and M read between the surfaces' compute-optimal frontiers (its power laws "
                f"in C are fitted per ratio, in the sections `{sw.sweep}@<r>tpp`)."
            )
        )
    elif sw.architecture is not None:
        blocks.append(
            Paragraph(
                "An architecture sweep: its cells share one parameter count and one compute, so there is no scaling "
                "law to fit; its result is the loss of each cell, below and in the heatmaps."
            )
        )
    elif sw.one_shape is not None:
        order = curve_order([g.curve for g in sw.one_shape.gaps], sw.curve_variants)
        gaps = one_shape_table(sw.one_shape, ctx.settings, order)
        blocks += [
            Paragraph(
                "Every curve at one model shape and one budget: no scaling law can be fitted, and the result is each "
                "curve's gap to the baseline at that shape."
            ),
            Heading("Gaps to the baseline at one shape", 3),
            Paragraph(gaps.caption),
            Table(gaps.frame()),
        ]
    else:
        law = law_for(ctx.fit.settings.form)
        blocks.append(
            Paragraph(
                f"No curve could be fitted in this sweep: a curve needs finished runs at {law.n_params} or more "
                f"budgets for the form {law.short}; see the notes below."
            )
        )
    return blocks


def _multiplier_blocks(ctx: ReportContext, sw: SweepFit) -> list[Block]:
    """The sweep's multipliers: the headline table, its unreliable intervals, the exponent test, M per budget,
    the loss gaps, the robustness checks and the sensitivity to the analysis choices."""
    mult = tables.multipliers(ctx.fit, sw.sweep)
    budget = tables.budget_multipliers(ctx.fit, sw.sweep)
    blocks: list[Block] = [Heading("Effective compute multiplier", 3), Paragraph(mult.caption), Table(mult.frame())]
    unreliable = [m for m in sw.multipliers if not m.reliable]
    if unreliable:
        blocks += [
            Paragraph(
                f"**Intervals marked UNRELIABLE** (`--resample {ctx.settings.resample}`; the data cannot "
                'support a calibrated interval of this kind, docs/analysis.md "Reliability"):'
            ),
            Bullets(tuple(f"`{m.variant}`: {m.why}" for m in unreliable)),
        ]
    blocks.append(Bullets(tuple(text.sentence for text in exponent_texts(sw))))
    blocks += [Paragraph(budget.caption), Table(budget.frame())]
    if any(m.gaps for m in sw.multipliers):
        gaps = tables.loss_gaps(ctx.fit, sw.sweep)
        blocks += [Paragraph(gaps.caption), Table(gaps.frame())]
    blocks += robust_blocks(ctx, sw)
    sensitivity = tables.sensitivities(ctx.fit, sw.sweep)
    if sensitivity.rows:
        order = curve_order([m.variant for m in sw.multipliers], sw.curve_variants)
        blocks += [
            Paragraph(sensitivity.caption),
            Table(sensitivity.frame()),
            Bullets(tuple(t.sentence for t in sensitivity_texts(sw, order))),
        ]
    return blocks


def robust_blocks(ctx: ReportContext, sw: SweepFit) -> list[Block]:
    """Beside the headline: the paired per-size M, the stalled runs and M without them, both tuning protocols
    with the best rates and the paper protocol's cost per cell, and the envelopes' edges."""
    order = curve_order([m.variant for m in sw.multipliers], sw.curve_variants)
    blocks: list[Block] = []
    paired = paired_table(sw, ctx.settings, order)
    if paired.rows:
        blocks += [Heading("Paired per-size M", 4), Paragraph(paired.caption), Table(paired.frame())]
    depth = depth_table(sw, ctx.settings, order)
    if depth.rows:
        blocks += [Heading("The depth trend", 4), Paragraph(depth.caption), Table(depth.frame())]
    stalls = stall_texts(sw)
    if stalls:
        blocks += [
            Heading("Stalled runs", 4),
            Paragraph(
                "Runs whose training loss lagged the other seeds of their cell early in training "
                '(docs/analysis.md, "Stalled runs"); the fits above keep them, and each headline without them '
                "follows:"
            ),
            Bullets(tuple(t.sentence for t in stalls)),
        ]
    elif ctx.settings.stall_margin > 0 and has_seeds_to_compare(sw.points):
        blocks += [
            Heading("Stalled runs", 4),
            Paragraph(
                f"None flagged: no run's training loss lagged the other seeds of its cell by more than "
                f'{100 * ctx.settings.stall_margin:g} % early in training (docs/analysis.md, "Stalled runs").'
            ),
        ]
    protocols = protocol_table(sw, ctx.settings, order)
    if protocols.rows:
        cells = protocol_cell_table(sw, order)
        blocks += [
            Heading("Tuning protocols from the same runs", 4),
            Paragraph(protocols.caption),
            Table(protocols.frame()),
        ]
        if cells.rows:
            blocks += [Paragraph(cells.caption), Table(cells.frame())]
    envelope = envelope_table(sw)
    if envelope.rows:
        blocks += [Heading("Learning-rate envelopes", 4), Paragraph(envelope.caption), Table(envelope.frame())]
        try:
            best = best_lr_table(ctx.fit, sw.sweep)
        except MissingData:
            best = None
        if best is not None:
            blocks += [
                Paragraph(
                    "Each variant's best rate as a power law in its parameters, and the rate that law gives at "
                    "the paper's sizes (an extrapolation over three orders of magnitude: a reference, not a "
                    "prediction):"
                ),
                Table(best),
            ]
    return blocks
