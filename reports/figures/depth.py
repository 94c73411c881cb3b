"""The depth-trend figure of a fixed-width depth ladder (analysis/estimates/depth.py): each variant's paired loss gap to
the baseline at each depth, its least-squares line over the depths, and the line's t band; a second panel with the
paired M per depth.

Takes the :class:`analysis.FitReport` and a sweep name and returns a matplotlib Figure; nothing here reads or writes
files. Never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnres.variants import curve_order
from reports.base.data import MissingData, sweep_fit
from reports.base.style import FIGSIZE, rc_context, variant_color, variant_label, variant_marker

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from analysis import FitReport


def plot_depth_trend(report: FitReport, sweep: str | None = None) -> Figure:
    """Left: the paired gap 100 (ln L_base - ln L_var) per depth (> 0: the variant's loss is lower) with each
    variant's line and its band (the fitted mean's t interval); right: the paired M per depth."""
    import matplotlib.pyplot as plt
    from scipy.stats import t as student_t

    sw = sweep_fit(report, sweep)
    trends = {m.variant: m.depth for m in sw.multipliers if m.depth is not None}
    if not trends:
        raise MissingData("no depth trend (a ladder of one width at 3 depths or more, with a baseline)")
    level = report.settings.level
    with rc_context():
        fig, (gap_ax, m_ax) = plt.subplots(1, 2, figsize=(FIGSIZE[0] * 1.45, FIGSIZE[1]))
        for curve in curve_order(trends, sw.curve_variants):
            t, named = trends[curve], sw.curve_variants[curve].as_named(curve)  # N only where the curve's name has it
            color, label = variant_color(named), variant_label(named)
            x = np.array([p.sublayers for p in t.points], dtype=float)
            gaps = np.array([p.gap for p in t.points])
            gap_ax.plot(x, gaps, variant_marker(named), color=color, ms=6)
            line_x = np.linspace(x[0], x[-1], 50)
            slope = (t.gap_at[1] - t.gap_at[0]) / (x[-1] - x[0])
            line = t.gap_at[0] + slope * (line_x - x[0])
            text = f"{label}: {t.gap_change.text(3)} points from {t.span[0]} to {t.span[1]} sublayers"
            gap_ax.plot(line_x, line, "-", color=color, lw=1.3, label=text)
            if t.gap_change.has_interval and x.size > 2:
                dx = x - x.mean()
                se = t.residual_sd * np.sqrt(1 / x.size + (line_x - x.mean()) ** 2 / float(dx @ dx))
                half = float(student_t.ppf(0.5 + level / 2, x.size - 2)) * se
                gap_ax.fill_between(line_x, line - half, line + half, color=color, alpha=0.15, lw=0)
            m_ax.plot(x, [p.multiplier for p in t.points], variant_marker(named) + "-", color=color, ms=6, label=label)
        gap_ax.axhline(0, color="#888888", lw=0.8)
        gap_ax.set_xlabel("depth (sublayers, 2 per transformer block)")
        gap_ax.set_ylabel("paired gap 100 (ln L_base - ln L_var), %\n> 0: the variant's loss is lower")
        gap_ax.set_xticks(sorted({p.sublayers for t in trends.values() for p in t.points}))
        gap_ax.legend(fontsize=7, loc="best")
        m_ax.axhline(1, color="#888888", lw=0.8)
        m_ax.set_xlabel("depth (sublayers)")
        m_ax.set_ylabel("paired M at this depth")
        m_ax.set_xticks(gap_ax.get_xticks())
        d_model = next(iter(trends.values())).d_model
        fig.suptitle(f"{sw.sweep}: the gap to the baseline against depth at d_model {d_model}", fontsize=10)
        fig.tight_layout()
    return fig
