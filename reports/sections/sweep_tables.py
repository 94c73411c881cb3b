"""The tables of a sweep's section: validation loss per model size (like the paper's Table 2), the learning-rate
sensitivity where the sweep ran some size at several learning rates, and the ablations at one size (like its
Table 4). Each is computed by :mod:`reports.sections.tables`, saved as CSV by :func:`reports.sections.section.table` (or
skipped with the reason) and shown here with its heading, caption and cell formats. Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from reports.base.captions import chosen_points, fmt_count, fmt_delta, fmt_gap, fmt_int, fmt_loss, fmt_sci
from reports.base.context import ReportContext
from reports.document.document import Block, Heading, Paragraph, Table
from reports.sections import tables
from reports.sections.section import Section, table

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitSettings, SweepFit


def sweep_tables(ctx: ReportContext, sw: SweepFit) -> list[Section]:
    """The tables like the paper's Table 2 (loss per model size) and Table 4 (ablations), and the
    learning-rate sensitivity where the sweep ran some size at several learning rates."""
    sweep, runs, points, baseline = sw.sweep, ctx.results.runs, sw.points, ctx.settings.baseline
    parts = [
        table(
            ctx,
            "table2_sizes",
            sweep,
            lambda: tables.size_table(runs, sweep=sweep, baseline=baseline, points=points),
            lambda t2: _show_size_table(t2, ctx.settings),
        )
    ]
    # only where the sweep ran some size at several learning rates (not a "skipped" line for every other sweep)
    if tables.has_lr_sweep(runs, sweep=sweep):
        parts.append(table(ctx, "lr_sensitivity", sweep, lambda: tables.lr_table(runs, sweep=sweep), _show_lr_table))
    parts.append(
        table(
            ctx,
            "table4_ablations",
            sweep,
            lambda: tables.ablation_table(runs, sweep=sweep, baseline=baseline, points=points, one_shape=sw.one_shape),
            _show_ablation_table,
        )
    )
    return parts


def _show_size_table(t2: pd.DataFrame, settings: FitSettings) -> list[Block]:
    formats = {
        "params (non-embedding)": fmt_count,
        "tokens": fmt_count,
        "training FLOPs": fmt_sci,
        "lr": fmt_sci,
    }
    formats.update({c: fmt_loss for c in t2.attrs.get("loss_columns", [])})
    return [
        Heading("Table: validation loss per model size (like the paper's Table 2)", 3),
        Paragraph(
            f"Validation loss in nats/token ({chosen_points(settings)}; the lowest in each row in bold); params are "
            "non-embedding; FLOPs and lr are the baseline's."
        ),
        Table(t2, formats, tuple(t2.attrs.get("loss_columns", []))),
    ]


def _show_lr_table(t_lr: pd.DataFrame) -> list[Block]:
    formats = {"tokens": fmt_count, "lr": fmt_sci, "seeds": fmt_int}
    formats.update({c: fmt_loss for c in t_lr.attrs.get("loss_columns", [])})
    return [
        Heading("Table: learning-rate sensitivity", 3),
        Paragraph(
            "Validation loss in nats/token (mean over seeds) of every variant at each learning rate the "
            "sweep ran, per model size; the lowest in each row in bold."
        ),
        Table(t_lr, formats, tuple(t_lr.attrs.get("loss_columns", []))),
    ]


def _show_ablation_table(t4: pd.DataFrame) -> list[Block]:
    formats = {
        "params (non-embedding)": fmt_count,
        "loss": fmt_loss,
        "Δ loss vs baseline": fmt_delta,
        tables.PAPER_DELTA_COLUMN: fmt_delta,
        "N": fmt_int,
        "S": fmt_int,
        **{c: fmt_gap for c in tables.GAP_COLUMNS},
    }
    gaps = (
        " With the fit's comparison at this shape: each row's gap to the baseline, 100 (ln L_baseline - ln L) in "
        "points of %, > 0 where the row's loss is lower, with its interval (low, high; the fit's section says how "
        "it is made), and the paper's gap in the same units."
        if tables.GAP_COLUMNS[0] in t4.columns
        else ""
    )
    return [
        Heading("Table: ablations at one size (like the paper's Table 4)", 3),
        Paragraph(
            f"Every variant at {t4.attrs.get('shape')}: validation loss (nats/token), its difference from the "
            f"baseline, and the paper's difference from its baseline in its Table 4 ({tables.PAPER_TABLE4_SIZE} model, "
            "their data), where the paper has the same variant; negative is better." + gaps
        ),
        Table(t4, formats),
    ]
