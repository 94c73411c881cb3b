"""Scaling figures: loss vs compute with the fitted power laws (figure 1), the effective compute multiplier vs
compute (figure 2), and the paper's published fits as a separate reference figure.

Every function takes the :class:`analysis.FitReport` (and optionally the runs DataFrame, for the individual
runs behind a point) and returns a matplotlib Figure; each curve is named and drawn from the variant its results
carry (with Block AttnRes's N). Nothing here reads or writes files. Imports matplotlib only inside the functions;
never imports torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis import PFLOP_S_DAY, PowerLaw
from analysis.laws.forms import form_of_curve, law_params
from analysis.tables.tables import NO_INTERVAL, has_intervals
from attnres.variants import Variant
from reports.base.data import MissingData, sweep_fit
from reports.base.paper import PAPER_BLOCK_N, PAPER_FITS, PAPER_HEADLINE_C, PAPER_M, PAPER_RANGE
from reports.base.style import (
    FIGSIZE,
    rc_context,
    readable_log_ticks,
    variant_color,
    variant_label,
    variant_linestyle,
    variant_marker,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from analysis import FitReport, SweepFit


def compute_label(compute_unit: str) -> str:
    """The compute axis label for a report's unit."""
    return "training compute (PFLOP/s-days)" if compute_unit == "pflops_days" else "training FLOPs"


def compute_unit_scale(compute_unit: str) -> float:
    return PFLOP_S_DAY if compute_unit == "pflops_days" else 1.0


def paper_multiplier(variant: Variant) -> float | None:
    """M of the paper's published fits at C = 5.6 PFLOP/s-days (Block: 1.25, Full: 1.27); None for other variants."""
    name = variant.name
    if name not in ("block", "full"):
        return None
    base = PowerLaw(*PAPER_FITS["baseline"])
    var = PowerLaw(*PAPER_FITS[name])
    return float(base.compute_for_loss(var.loss(PAPER_HEADLINE_C)) / PAPER_HEADLINE_C)


def _no_curve_reason(report: FitReport, sw: SweepFit) -> str:
    if sw.one_shape is not None:
        return "one model shape and one budget: no scaling law (the sweep's gaps to the baseline are its result)"
    need = law_params(report.settings.form)
    return (
        f"no curve could be fitted: a curve needs finished runs at {need} or more distinct budgets "
        "(see the sweep's notes)"
    )


def no_multiplier_reason(report: FitReport, sw: SweepFit) -> str:
    """Why a sweep has no multiplier, in one line."""
    if not sw.curves:
        return _no_curve_reason(report, sw)
    fitted = [c.curve for c in sw.curves]
    base = report.settings.baseline
    if base not in fitted:
        return (
            f"no fitted baseline curve {base!r} (fitted: {', '.join(fitted)}); "
            "a multiplier is relative to the baseline's fit"
        )
    return "only the baseline was fitted; a multiplier needs a fitted variant curve (2+ budgets) in the same sweep"


def _runs_behind(runs: pd.DataFrame, sw: SweepFit, c: Any, unit: float) -> tuple[np.ndarray, np.ndarray]:
    """(compute, loss) of the finished runs behind a curve's points: the chosen learning rate's seeds, or with
    an IsoFLOP frontier every run of the curve (the sizes the minimum was fitted through)."""
    g = runs[(runs["sweep"].astype(str) == sw.sweep) & (runs["status"] == "done")]
    if sw.frontier:
        v = c.curve_variant.as_named(c.curve)  # N only when the curve is one N of several: one N per size is every N's
        variant, n = v.name, v.n_blocks
        g = g[g["variant"].astype(str) == variant]
        if n is not None:
            g = g[pd.to_numeric(g["n_blocks"], errors="coerce") == n]
    else:
        ids = {rid for p in c.points for rid in p.run_ids}
        g = g[g["run_id"].astype(str).isin(ids)]
    return g["flops"].to_numpy(float) / unit, pd.to_numeric(g["val_loss"], errors="coerce").to_numpy(float)


def _law_text(law: Any) -> str:
    return form_of_curve(law).legend(law)


def multiplier_text(variant: Variant, estimate: Any) -> str:
    """``Block N=4: M = 1.31 [1.27, 1.34]`` (the variant's :attr:`~attnres.variants.Variant.short` name; 3 significant
    digits, the interval when there is one)."""
    return f"{variant.short}: M = {estimate.text(3)}"


def plot_scaling_curves(report: FitReport, sweep: str | None = None, *, runs: pd.DataFrame | None = None) -> Figure:
    """Figure 1: validation loss vs training compute (log-log), the points the fits used, one fitted power law
    per curve, and each variant's multiplier at its largest budget with its interval.

    The lower panel shows the same points and curves as a percentage of the baseline's fitted loss at the
    same compute, where differences of a percent are visible. With ``runs``, the individual runs behind each
    point (seeds) are drawn as small faint markers. Block curves are labelled with their N.
    """
    import matplotlib.pyplot as plt

    sw = sweep_fit(report, sweep)
    if not sw.curves:
        raise MissingData(_no_curve_reason(report, sw))
    settings = report.settings
    unit = compute_unit_scale(settings.compute_unit)
    curves = {c.curve: c for c in sw.curves}
    base = curves.get(settings.baseline)
    all_c = np.array([p.compute for c in sw.curves for p in c.points], dtype=float)
    grid = np.geomspace(all_c.min() / 1.4, all_c.max() * 1.4, 200)
    with rc_context():
        if base is not None:
            fig, (ax, axr) = plt.subplots(
                2, 1, sharex=True, figsize=(FIGSIZE[0], 6.2), gridspec_kw={"height_ratios": [3, 1.25], "hspace": 0.08}
            )
        else:
            fig, ax = plt.subplots(figsize=FIGSIZE)
            axr = None
        show_runs = (
            runs is not None
            and not runs.empty
            and (sw.frontier or any(p.n_runs > 1 for c in sw.curves for p in c.points))
        )
        panels = _ScalingPanels(ax, axr, base, grid)
        for c in sorted(sw.curves, key=lambda c: (*c.curve_variant.order, c.curve)):
            panels.curve(c)
            if show_runs:
                panels.runs(c.curve_variant.as_named(c.curve), *_runs_behind(runs, sw, c, unit))
        if show_runs:
            what = "individual runs (every size of the IsoFLOP grid)" if sw.frontier else "individual runs (seeds)"
            ax.scatter([], [], marker="o", s=10, facecolor="none", edgecolor="0.4", linewidth=0.6, label=what)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylabel("validation loss (nats/token)")
        point_kind = "IsoFLOP minima" if sw.frontier else settings.points_short()
        ax.set_title(f"Scaling curves: sweep {sw.sweep} (points: {point_kind})")
        readable_log_ticks(ax, "y")
        ax.legend(loc="upper right", frameon=True, framealpha=0.9)
        _multiplier_box(ax, sw, runs, _percent(settings))
        bottom = axr if axr is not None else ax
        if axr is not None:
            axr.axhline(0.0, color="0.5", lw=0.8, ls=":")
            axr.set_ylabel("loss vs baseline\nfit (%)")
            axr.grid(True, which="major")
        bottom.set_xlabel(compute_label(settings.compute_unit))
        fig.align_ylabels()
        fig.subplots_adjust(left=0.13, right=0.97, top=0.94, bottom=0.09 if axr is not None else 0.12)
    return fig


class _ScalingPanels:
    """The two panels of figure 1: loss vs compute (``ax``) and, with a baseline, the loss as a percentage of
    the baseline's fitted loss (``axr``)."""

    def __init__(self, ax: Any, axr: Any | None, base: Any | None, grid: np.ndarray):
        self.ax, self.axr, self.base, self.grid = ax, axr, base, grid

    def _relative(self, compute: np.ndarray, loss: np.ndarray) -> np.ndarray:
        return 100 * (loss / self.base.fit.law.loss(compute) - 1)

    def curve(self, c: Any) -> None:
        """A curve's fitted law (labelled with its variant's name with N, the law and any fit status) and its
        points, in its variant's look (with N only when the curve is one N of several)."""
        ax, axr, grid = self.ax, self.axr, self.grid
        named = c.curve_variant.as_named(c.curve)
        color, marker, ls = variant_color(named), variant_marker(named), variant_linestyle(named)
        x = np.array([p.compute for p in c.points])
        y = np.array([p.loss for p in c.points])
        status = "" if c.fit.status == "converged" else f" ({c.fit.status})"
        ax.plot(
            grid,
            c.fit.law.loss(grid),
            ls=ls,
            color=color,
            lw=1.5,
            label=f"{variant_label(c.curve_variant)}: L = {_law_text(c.fit.law)}{status}",
            zorder=2,
        )
        ax.scatter(x, y, marker=marker, s=34, color=color, edgecolor="white", linewidth=0.6, zorder=4)
        if axr is not None:
            ref = self.base.fit.law.loss(grid)
            axr.plot(grid, 100 * (c.fit.law.loss(grid) / ref - 1), ls=ls, color=color, lw=1.3, zorder=2)
            axr.scatter(
                x,
                self._relative(x, y),
                marker=marker,
                s=26,
                color=color,
                edgecolor="white",
                linewidth=0.5,
                zorder=4,
            )

    def runs(self, named: Variant, rx: np.ndarray, ry: np.ndarray) -> None:
        """The individual runs behind a curve's points (``named``: its variant as its name shows it), as small hollow
        markers."""
        color, marker = variant_color(named), variant_marker(named)
        style = {"marker": marker, "s": 10, "facecolor": "none", "edgecolor": color, "linewidth": 0.6, "alpha": 0.55}
        self.ax.scatter(rx, ry, **style, zorder=3)
        if self.axr is not None:
            self.axr.scatter(rx, self._relative(rx, ry), **style, zorder=3)


def _percent(settings: Any) -> int:
    """The intervals' level in percent (90), or 0 when there is no bootstrap and so no interval."""
    return int(round(settings.level * 100)) if has_intervals(settings) else 0


def _multiplier_box(ax: Any, sw: SweepFit, runs: pd.DataFrame | None, level: int) -> None:
    """The box of figure 1 with each variant's multiplier at its largest budget (none without multipliers);
    ``level``: the intervals' level in percent, 0 without a bootstrap."""
    # an interval the analysis marks unreliable is never shown without the mark (the report says why)
    lines = [
        multiplier_text(m.curve_variant, m.multiplier) + ("" if m.reliable else " (unreliable)") for m in sw.multipliers
    ]
    if not lines:
        return
    exps = sorted({m.exponent for m in sw.multipliers})
    ci = f"{level}% CI" if level else NO_INTERVAL
    head = f"M at the largest budget ({ci}, {' / '.join(exps)} exponent)"
    ax.text(
        0.02,
        0.04,
        "\n".join([head, *lines]),
        transform=ax.transAxes,
        fontsize=8.5,
        va="bottom",
        ha="left",
        bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "0.7", "alpha": 0.95},
        zorder=6,
    )


def _m_of_c(base_law: Any, var_law: Any, c: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return np.asarray(base_law.compute_for_loss(var_law.loss(c)), dtype=float) / c


def plot_multiplier(
    report: FitReport, sweep: str | None = None, *, runs: pd.DataFrame | None = None, paper_reference: bool = True
) -> Figure:
    """Figure 2: the effective compute multiplier M vs compute, one panel per variant.

    Points: M at each measured budget (the baseline fit inverted at the variant's measured loss) with its
    bootstrap interval, and beside it (hollow) M against the baseline's law fitted to its nearest budgets
    (analysis.estimates.local), which does not inherit the global fit's misfit. Lines: M from the fitted curves, the
    constant of the shared-exponent fit (with its interval as a band) and M(C) from the separate fits (its
    interval at the largest budget as an error bar); the headline one solid, the other dotted. A dashed line marks
    M = 1 (no gain); with ``paper_reference`` the paper's own M (from its published fits, their data) is a thin
    grey line for Full and Block.
    """
    import matplotlib.pyplot as plt

    sw = sweep_fit(report, sweep)
    if not sw.multipliers:
        raise MissingData(no_multiplier_reason(report, sw))
    settings = report.settings
    level = _percent(settings)
    mults = sorted(sw.multipliers, key=lambda m: (*m.curve_variant.order, m.variant))
    n = len(mults)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    with rc_context():
        fig, axes = plt.subplots(
            nrows, ncols, sharey=True, squeeze=False, figsize=(0.6 + 3.9 * ncols, 0.9 + 4.4 * nrows)
        )
        highs, lows = [1.0], [1.0]
        refs: list[tuple[Any, float | None]] = []
        for ax, m in zip(axes.flat, mults):
            _multiplier_panel(ax, sw, m, level, highs, lows)
            ax.axhline(1.0, color="0.35", lw=1.0, ls="--", label="M = 1 (no gain)", zorder=2)
            refs.append((ax, paper_multiplier(m.curve_variant) if paper_reference else None))
            ax.set_xscale("log")
            ax.set_title(f"{variant_label(m.curve_variant)} ({m.exponent} exponent)", fontsize=10)
            ax.set_xlabel(compute_label(settings.compute_unit))
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel("effective compute multiplier M\n(× the baseline's compute)")
        _paper_references(axes, refs, highs, lows)
        fig.suptitle(f"Effective compute multiplier over {settings.baseline}: sweep {sw.sweep}", fontsize=11)
        fig.tight_layout()
    return fig


def _local_points(ax: Any, m: Any, style: tuple[str, str], level: int, highs: list[float], lows: list[float]) -> None:
    """M at each budget against the baseline's law fitted to its nearest budgets (analysis.estimates.local), hollow and
    nudged right of the global one so that neither hides the other; ``style``: the variant's (color, marker)."""
    color, marker = style
    local = [(b.compute, b.local.multiplier) for b in m.budgets if b.local is not None]
    local = [(c, e) for c, e in local if math.isfinite(e.value)]
    if not local:
        return
    xs = np.array([c for c, _ in local]) * 1.12
    vals = np.array([e.value for _, e in local])
    lo = np.array([e.low for _, e in local])
    hi = np.array([e.high for _, e in local])
    # a percentile interval need not contain its point estimate (a local law refitted on resampled seeds)
    yerr = np.vstack([np.where(np.isfinite(lo), vals - lo, 0.0), np.where(np.isfinite(hi), hi - vals, 0.0)])
    yerr = np.clip(yerr, 0.0, None)
    what = f"{level}% CI" if level else NO_INTERVAL
    ax.errorbar(
        xs, vals, yerr=yerr, fmt=marker, color=color, mfc="white", mec=color, ms=5.0, capsize=2.0,
        lw=0.8, label=f"at each budget, local baseline law ({what})", zorder=4,
    )  # fmt: skip
    highs += [float(v) for v in np.concatenate([vals, hi[np.isfinite(hi)]])]
    lows += [float(v) for v in np.concatenate([vals, lo[np.isfinite(lo)]])]


def _multiplier_panel(ax: Any, sw: SweepFit, m: Any, level: int, highs: list[float], lows: list[float]) -> None:
    """One variant's panel of figure 2: M at each budget with its interval, and M from the shared and from
    the separate exponents (the headline solid); the values shown are added to ``highs`` and ``lows``."""
    named = m.curve_variant.as_named(m.variant)  # its look: N only when the curve is one N of several
    color = variant_color(named)
    base_law = sw.curve(m.baseline).fit.law
    var_law = sw.curve(m.variant).fit.law
    xs = np.array([b.compute for b in m.budgets])
    grid = np.geomspace(xs.min() / 1.3, xs.max() * 1.3, 120)
    vals = np.array([b.multiplier.value for b in m.budgets])
    lo = np.array([b.multiplier.low for b in m.budgets])
    hi = np.array([b.multiplier.high for b in m.budgets])
    ok = np.isfinite(vals)
    yerr = np.vstack([np.where(np.isfinite(lo), vals - lo, 0.0), np.where(np.isfinite(hi), hi - vals, 0.0)])[:, ok]
    ax.errorbar(
        xs[ok],
        vals[ok],
        yerr=yerr,
        fmt=variant_marker(named),
        color=color,
        ms=5.5,
        capsize=2.5,
        lw=1.0,
        mec="white",
        mew=0.5,
        label=f"at each budget ({level}% CI)" if level else f"at each budget ({NO_INTERVAL})",
        zorder=4,
    )
    highs += [float(v) for v in np.concatenate([vals[ok], hi[ok & np.isfinite(hi)]])]
    lows += [float(v) for v in np.concatenate([vals[ok], lo[ok & np.isfinite(lo)]])]
    _local_points(ax, m, (color, variant_marker(named)), level, highs, lows)
    shared_is_head = m.exponent == "shared"
    if m.multiplier_shared is not None and math.isfinite(m.multiplier_shared.value):
        s = m.multiplier_shared
        ax.plot(
            grid,
            np.full_like(grid, s.value),
            color=color,
            lw=1.6 if shared_is_head else 1.0,
            ls="-" if shared_is_head else ":",
            label=f"shared exponent: {s.text(3)}",
            zorder=3,
        )
        if s.has_interval and shared_is_head:
            ax.fill_between(grid, s.low, s.high, color=color, alpha=0.15, lw=0, zorder=1)
        if shared_is_head:
            highs.append(s.high if s.has_interval else s.value)
            lows.append(s.low if s.has_interval else s.value)
    curve_m = _m_of_c(base_law, var_law, grid)
    u = m.multiplier_unshared
    ax.plot(
        grid,
        curve_m,
        color=color,
        lw=1.6 if not shared_is_head else 1.0,
        ls="-" if not shared_is_head else ":",
        label=f"separate exponents, M(C); at largest C: {u.text(3)}",
        zorder=3,
    )
    if u.has_interval and math.isfinite(u.value):
        ax.errorbar(
            [m.compute * 1.12],
            [u.value],
            yerr=[[u.value - u.low], [u.high - u.value]],
            fmt="none",
            ecolor=color,
            elinewidth=1.0,
            capsize=4,
            alpha=0.8 if not shared_is_head else 0.45,
            zorder=3,
        )
        if not shared_is_head:
            highs.append(u.high)
            lows.append(u.low)


def _paper_references(axes: Any, refs: list[tuple[Any, float | None]], highs: list[float], lows: list[float]) -> None:
    """The shared y range of figure 2's panels, then in each the paper's multiplier (a line, or a legend entry
    when it is off the scale) and the legend."""
    top = max(h for h in highs if math.isfinite(h))
    bottom = min(v for v in lows if math.isfinite(v))
    span = max(top - bottom, 0.05)
    # the paper's value is drawn when it is near our data; far off, it would squash our points into a line
    near = [ref for _, ref in refs if ref is not None and bottom - span <= ref <= top + span]
    top, bottom = max([top, *near]), min([bottom, *near])
    span = max(top - bottom, 0.05)
    low, high = bottom - 0.08 * span, top + 0.08 * span
    axes[0, 0].set_ylim(low, high)  # the legends are below the panels
    for ax, ref in refs:
        # on the scale is within the final limits: another panel's reference can widen them past one thought far
        if ref is not None and low <= ref <= high:
            ax.axhline(
                ref,
                color="0.45",
                lw=1.0,
                ls=(0, (5, 2, 1, 2)),
                zorder=1,
                label=f"the paper's fits (their data): {ref:.2f}",
            )
        elif ref is not None:
            ax.plot([], [], " ", label=f"the paper's fits (their data): {ref:.2f}, off this scale")
        # below the panel (under its x label), so it never covers the data
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), fontsize=7.5, frameon=False, borderaxespad=0.0)


def _paper_name(name: str) -> str:
    """The legend name of one of the paper's fits (its Block AttnRes has about 8 blocks: ``N≈8``)."""
    if name == "block":
        return Variant("block", PAPER_BLOCK_N).title.replace(f"(N={PAPER_BLOCK_N})", f"(N≈{PAPER_BLOCK_N})")
    return Variant(name).title


def plot_paper_curves() -> Figure:
    """The paper's published fits (L = A C^-alpha, C in PFLOP/s-days) as a reference figure of their own:
    their data, their tokenizer and their FLOP count, so never on the same axes as our runs. The arrow marks
    the headline: at C = 5.6 the Block fit's loss needs C ~ 7.0 on the baseline fit (M ~ 1.25)."""
    import matplotlib.pyplot as plt

    grid = np.geomspace(PAPER_RANGE[0], 8.0, 200)
    with rc_context():
        fig, ax = plt.subplots(figsize=FIGSIZE)
        for name in ("baseline", "full", "block"):
            a, alpha = PAPER_FITS[name]
            ax.plot(
                grid,
                PowerLaw(a, alpha).loss(grid),
                color=variant_color(Variant(name)),
                ls=variant_linestyle(Variant(name)),
                lw=1.6,
                label=f"paper, {_paper_name(name)}: L = {a}$\\cdot C^{{-{alpha}}}$",
            )
        base, block = PowerLaw(*PAPER_FITS["baseline"]), PowerLaw(*PAPER_FITS["block"])
        target = float(block.loss(PAPER_HEADLINE_C))
        c_base = float(base.compute_for_loss(target))
        ax.annotate(
            "",
            xy=(c_base, target),
            xytext=(PAPER_HEADLINE_C, target),
            arrowprops={"arrowstyle": "->", "color": "0.3", "lw": 1.0},
        )
        ax.plot([PAPER_HEADLINE_C], [target], "o", color=variant_color(Variant("block")), ms=5)
        ax.plot([c_base], [target], "o", color=variant_color(Variant("baseline")), ms=5)
        ax.text(
            0.03,
            0.05,
            f"The headline: the Block fit's loss at C = {PAPER_HEADLINE_C} ({target:.3f}) needs C = {c_base:.2f}\n"
            f'on the baseline fit (arrow), so M = {c_base / PAPER_HEADLINE_C:.3f} ("{PAPER_M}x compute")',
            transform=ax.transAxes,
            fontsize=8.5,
            va="bottom",
            ha="left",
            bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "0.7"},
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(grid[0], grid[-1])
        ax.set_xlabel("training compute (PFLOP/s-days, the paper's FLOP count)")
        ax.set_ylabel("validation loss (nats/token, the paper's tokenizer)")
        ax.set_title("The paper's published fits (their data; not comparable with our runs)")
        readable_log_ticks(ax, "y")
        readable_log_ticks(ax, "x", values=[0.5, 1, 2, 3, 5, 8])
        ax.legend(loc="upper right")
        fig.tight_layout()
    return fig


__all__ = [
    "plot_scaling_curves",
    "plot_multiplier",
    "plot_paper_curves",
    "paper_multiplier",
    "compute_label",
    "multiplier_text",
]
