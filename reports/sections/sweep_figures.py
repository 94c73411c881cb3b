"""The figures of a sweep's section: scaling curves and multiplier, training dynamics, the block-size ablation, a
depth-attention heatmap per AttnRes curve and, for a sweep fitted with learning-rate envelopes, loss against
rate and best rate against size. Each is drawn by its figure function and saved by
:func:`reports.sections.section.figure` (or skipped with the reason). Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnres.variants import curve_order
from reports.base.captions import ENVELOPE_SHAPES, chosen_points
from reports.base.context import ReportContext
from reports.figures import ablation, architecture, depth, dynamics, heatmaps, learning_rates, scaling
from reports.sections.records import Skipped
from reports.sections.section import Section, figure

if TYPE_CHECKING:  # pragma: no cover
    from analysis import SweepFit


def sweep_figures(ctx: ReportContext, sw: SweepFit) -> list[Section]:
    """Every figure of the sweep: scaling curves and multiplier, training dynamics, block-size ablation, and
    a depth-attention heatmap per AttnRes curve."""
    sweep, runs, res, points = sw.sweep, ctx.results.runs, ctx.results, sw.points
    point_kind = "IsoFLOP minima per budget" if sw.frontier else chosen_points(ctx.settings)
    return [
        figure(
            ctx,
            "scaling_curves",
            sweep,
            lambda: scaling.plot_scaling_curves(ctx.fit, sweep, runs=runs),
            "scaling_curves",
            points=point_kind,
        ),
        figure(
            ctx,
            "multiplier",
            sweep,
            lambda: scaling.plot_multiplier(ctx.fit, sweep, runs=runs, paper_reference=ctx.paper),
            "multiplier",
        ),
        figure(
            ctx,
            "loss_curves",
            sweep,
            lambda: dynamics.plot_loss_curves(runs, res.metrics, sweep=sweep, points=points),
            "loss_curves",
        ),
        figure(
            ctx,
            "block_output_rms",
            sweep,
            lambda: dynamics.plot_block_output_rms(runs, res.layers, sweep=sweep, points=points),
            "block_output_rms",
        ),
        figure(
            ctx,
            "block_grad_norm",
            sweep,
            lambda: dynamics.plot_block_grad_norm(runs, res.layers, sweep=sweep, points=points),
            "block_grad_norm",
        ),
        figure(
            ctx,
            "block_size_ablation",
            sweep,
            lambda: ablation.plot_block_size_ablation(runs, sweep=sweep, points=points),
            "block_size_ablation",
        ),
        *depth_attention_figures(ctx, sw),
        *learning_rate_figures(ctx, sw),
        *shape_figures(ctx, sw),
    ]


def shape_figures(ctx: ReportContext, sw: SweepFit) -> list[Section]:
    """The depth trend of a fixed-width depth ladder and the heatmaps of an architecture sweep, where the sweep is
    one (nothing otherwise: no skip line in the reports of other sweeps)."""
    out = []
    if any(m.depth is not None for m in sw.multipliers):
        level = f"{100 * ctx.settings.level:g} %"
        out.append(
            figure(
                ctx,
                "depth_trend",
                sw.sweep,
                lambda: depth.plot_depth_trend(ctx.fit, sw.sweep),
                "depth_trend",
                level=level,
            )
        )
    if sw.architecture is not None:
        out.append(
            figure(
                ctx, "architecture", sw.sweep, lambda: architecture.plot_architecture(ctx.fit, sw.sweep), "architecture"
            )
        )
    return out


def learning_rate_figures(ctx: ReportContext, sw: SweepFit) -> list[Section]:
    """Loss against rate and best rate against size, for a sweep fitted with learning-rate envelopes."""
    if sw.envelope is None:
        return []
    return [
        figure(
            ctx,
            "lr_curves",
            sw.sweep,
            lambda: learning_rates.plot_lr_curves(ctx.fit, sw.sweep),
            "lr_curves",
            envelope_shape=ENVELOPE_SHAPES[sw.envelope.cells[0].shape if sw.envelope.cells else "local"],
        ),
        figure(ctx, "best_lr", sw.sweep, lambda: learning_rates.plot_best_lr(ctx.fit, sw.sweep), "best_lr"),
    ]


def depth_attention_figures(ctx: ReportContext, sw: SweepFit) -> list[Section]:
    """A depth-attention heatmap per Full or Block AttnRes curve of the sweep (skipped when there is none)."""
    sweep, runs, points = sw.sweep, ctx.results.runs, sw.points
    variants = sw.curve_variants
    curves = [c for c in curve_order(points["curve"] if len(points) else [], variants) if variants[c].is_attnres]
    if not curves:
        reason = "no finished Full or Block AttnRes runs in this sweep, so no depth-attention weights"
        return [Section(skipped=[Skipped("depth_attention", sweep, reason)])]
    return [
        figure(
            ctx,
            f"depth_attention_{c}",
            sweep,
            lambda c=c: heatmaps.plot_depth_attention(
                runs, ctx.results.depth_attn, variant=c, sweep=sweep, points=points
            ),
            "depth_attention",
            subject=variants[c].title,
            block="; columns are depth blocks and outlined cells the row's own partial block"
            if variants[c].name == "block"
            else "",
        )
        for c in curves
    ]
