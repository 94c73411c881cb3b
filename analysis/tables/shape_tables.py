"""The tables of the studies of a model's shape, for ``attnres fit`` and the report alike
(:class:`analysis.tables.table_format.FitTable`): the depth trend of a fixed-width ladder
(:mod:`analysis.estimates.depth`), the cells of an architecture sweep (:mod:`analysis.estimates.architecture`) and the
curves of a one-shape sweep (:mod:`analysis.estimates.one_shape`).

Pure Python; no I/O; never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from analysis.tables.table_format import Cell, FitTable, has_intervals, number, ordered_multipliers, with_interval

if TYPE_CHECKING:  # pragma: no cover
    from analysis.estimates.architecture import ArchitectureGrid
    from analysis.estimates.one_shape import ShapeComparison
    from analysis.fitting.results import SweepFit
    from analysis.fitting.settings import FitSettings


def depth_table(sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """On a fixed-width depth ladder (:mod:`analysis.estimates.depth`): per variant, the paired gap and M at each depth,
    then the least-squares trend over the ladder with its t-interval over depths and what it says."""
    ms = [m for m in ordered_multipliers(sw, order) if m.depth is not None]
    if not ms:
        return FitTable((), ())
    rows: list[tuple[Cell, ...]] = []
    for m in ms:
        t = m.depth
        for p in t.points:
            rows.append(
                (m.variant, f"L{p.n_layer}-d{t.d_model}", p.sublayers, f"{p.gap:+.2f}", number(p.multiplier, 3), "")
            )
        low, high = t.span
        rows.append(
            (
                m.variant,
                f"trend {low} -> {high} sublayers",
                "",
                f"{t.gap_change.text(3)} points",
                f"x {t.m_ratio.text(3)}",
                f"{t.verdict()} ({t.noise_text()})",
            )
        )
        rows.append((m.variant, "the line crosses 0", "", "", "", t.crossing_text()))
    what = (
        "the depth trend (one width, only depth moves): the paired gap 100 (ln L_base - ln L_var) at each depth, "
        "> 0 where the variant's loss is lower, and its least-squares line over the depths; the trend is the line's "
        "change from the shallowest to the deepest size (gap: points of %, its interval from the depths' scatter about "
        "the line or, where that is below it, the noise floor per seed; M: the ratio of the line's M at the two ends, "
        "a point estimate); then where the line crosses 0, in sublayers, with Fieller's interval from the same noise"
    )
    gap = with_interval("gap (%)", settings) if has_intervals(settings) else "gap (%)"
    header = ("variant", "size", "sublayers", gap, "M", "reading")
    return FitTable(header, tuple(rows), f"{what}:", f"{what[0].upper()}{what[1:]}.")


def architecture_table(grid: ArchitectureGrid | None) -> FitTable:
    """One row per (depth, heads) cell: its shape, every curve's loss (the best cell of each marked *), and each
    variant's gap to the baseline there."""
    if grid is None:
        return FitTable((), ())
    curves = grid.curves
    others = [c for c in curves if c != grid.baseline]
    by = {(c.curve, c.n_layer, c.row): c for c in grid.cells}
    best = {curve: grid.best(curve).name for curve in curves}
    shapes = sorted({(c.n_layer, c.row) for c in grid.cells})
    rows: list[tuple[Cell, ...]] = []
    for n_layer, row in shapes:
        first = next(by[(curve, n_layer, row)] for curve in curves if (curve, n_layer, row) in by)
        cells: list[Cell] = [first.n_layer, first.d_model, first.n_head, f"{first.d_model / first.n_layer:.3g}"]
        for curve in curves:
            c = by.get((curve, n_layer, row))
            cells.append("" if c is None else f"{c.loss:.4f}" + (" *" if c.name == best[curve] else ""))
        for curve in others:
            c = by.get((curve, n_layer, row))
            cells.append("" if c is None or np.isnan(c.gap_pct) else f"{c.gap_pct:+.2f}")
        rows.append(tuple(cells))
    header = (
        "n_layer",
        "d_model",
        "n_head",
        "d_model / n_layer",
        *curves,
        *(f"{c} - {grid.baseline} (%)" for c in others),
    )
    for curve, gap in grid.gap_change.items():  # the last rows: each variant's gap trend over the columns
        trend: list[Cell] = [f"change {gap.depths[0]} -> {gap.depths[1]} layers", "", "", "", *[""] * len(curves)]
        trend += [gap.change.text(3) if c == curve else "" for c in others]
        rows.append(tuple(trend))
    what = (
        "the architecture sweep (one parameter count, one compute): each cell's loss per curve (mean over seeds at "
        "the best rate; * the curve's best cell) and each variant's gap to the baseline in the same cell, "
        "100 (ln L_var - ln L_base), < 0 where the variant's loss is lower; last, the gap's least-squares change "
        "from the shallowest to the deepest column, the depths as the units (each depth's gap the mean over its "
        "head counts, which share its rate and its runs), with a t interval on the depths' scatter (< 0: the variant "
        "gains more from depth than the baseline)"
    )
    return FitTable(header, tuple(rows), f"{what}:", f"{what[0].upper()}{what[1:]}.")


def one_shape_table(one: ShapeComparison | None, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """A one-shape sweep (:mod:`analysis.estimates.one_shape`): every curve's loss and its paired gap to the
    baseline."""
    if one is None:
        return FitTable((), ())
    gaps = {g.curve: g for g in one.gaps}
    names = [c for c in (order or gaps) if c in gaps]
    rows: list[tuple[Cell, ...]] = [(one.baseline, f"{one.baseline_loss:.4f}", "0", "", "", "", "")]
    for c in names:
        g = gaps[c]
        rows.append((c, f"{g.loss:.4f}", g.gap.text(3), g.n_pairs, number(g.lr, 3), g.edge, g.reading()))
    how = (
        f"a {settings.level:.0%} Student t interval on {one.df} df: the paired seeds' scatter pooled over the "
        f"curves ({one.seed_sd:.2f} points per seed)"
        + (
            f", and the error the envelope's parabola shares between seeds (residual sd {100 * one.curve_sd:.2f} %)"
            if np.isfinite(one.curve_sd)
            else ""
        )
        if has_intervals(settings) and one.df
        else "no interval"
    )
    family = sum(1 for g in one.gaps if g.gap.has_interval)
    if family > 1:
        how += (
            f"; {family} comparisons: each gap's p-value Holm-adjusted over all of them (the reading), so that the "
            f"chance of any false 'resolved' in the family stays below {1 - settings.level:.0%}"
        )
    if any(g.edge for g in one.gaps):
        how += (
            "; a curve marked edge has its envelope minimum at that end of the swept rates: its loss is an upper "
            "bound, its gap a lower bound, kept out of the pools and without an interval"
        )
    what = (
        f"every curve at {one.shape}, {one.tokens / 1e6:.3g}M tokens (one shape and one budget: no scaling law): its "
        f"loss and its gap to {one.baseline}, 100 (ln L_{one.baseline} - ln L), points of %, > 0 where the curve's "
        f"loss is lower, the mean over the seeds both ran of the paired per-seed gap; {how}"
    )
    gap = with_interval("gap (%)", settings) if has_intervals(settings) else "gap (%)"
    header = ("curve", "loss", gap, "seeds", "lr", "edge", "reading")
    return FitTable(header, tuple(rows), f"{what}:", f"{what[0].upper()}{what[1:]}.")
