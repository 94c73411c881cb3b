"""The depth trend: on a ladder whose sizes share one width (only n_layer moves), how a variant's paired loss gap
to the baseline changes with depth, with an interval.

At each depth k (x_k = 2 n_layer sublayers) the paired per-size estimate (:mod:`analysis.paired`) gives the gap
g_k = 100 (ln L_base - ln L_var), in % of the loss (> 0: the variant's loss is lower), and ln M_k. The trend is
the ordinary least-squares line of g on x (and of ln M on x), stated as its change over the ladder, slope x (x_max
- x_min), with a Student t interval on K - 2 degrees of freedom from the residuals. The depths are trained
independently, so everything that moves one depth's gap (its seeds, its learning-rate envelope, a stalled run) is
in the residuals; a bias shared by every depth moves the level of the line, not its slope. It needs 3 depths (one
degree of freedom: a very wide interval); read it from 5. The gap needs no fitted law; M_k uses the baseline law's
local slope, which on a fixed-width ladder is fitted across depths, so the trend of M is given as a point estimate
(the slope's error tilts every M_k's line at once; docs/analysis.md, "The depth trend").

Pure numpy/scipy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.bootstrap import Estimate, json_number
from analysis.paired import PairedMultiplier, budget_name
from analysis.study import Study

MIN_DEPTHS = 3


@dataclass(frozen=True)
class DepthPoint:
    """One depth of the ladder: its paired gap (% of loss, > 0: the variant lower) and paired M."""

    n_layer: int
    gap: float
    multiplier: float
    n_pairs: int

    @property
    def sublayers(self) -> int:
        return 2 * self.n_layer

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_layer": self.n_layer,
            "sublayers": self.sublayers,
            "gap_pct": json_number(self.gap),
            "multiplier": json_number(self.multiplier),
            "n_pairs": self.n_pairs,
        }


@dataclass(frozen=True)
class DepthTrend:
    """The least-squares trend of the gap and of ln M over the depths of a fixed-width ladder.

    ``gap_change``: the fitted gap at the deepest size minus at the shallowest, in points of % (> 0: the
    variant's advantage grows with depth); ``m_ratio``: the fitted M at the deepest size over M at the shallowest,
    a point estimate (an error in the baseline law's slope rescales every M_k at once and so tilts their line
    without showing in its residuals: a t interval from them would claim too much);
    ``gap_at``: the fitted gap at the shallowest and the deepest size; ``residual_sd``: the scatter of the gaps
    about their line (% of loss), the per-depth noise the interval is built from."""

    d_model: int
    points: tuple[DepthPoint, ...]
    gap_change: Estimate
    m_ratio: Estimate
    gap_at: tuple[float, float]
    residual_sd: float

    @property
    def span(self) -> tuple[int, int]:
        """The shallowest and the deepest size, in sublayers."""
        return self.points[0].sublayers, self.points[-1].sublayers

    def verdict(self) -> str:
        """What the interval of the gap's change says, in words."""
        if not self.gap_change.has_interval:
            return "no interval (--n-boot 0: point estimates only)"
        if self.gap_change.low > 0:
            return "the advantage grows with depth"
        if self.gap_change.high < 0:
            return "the advantage shrinks with depth"
        return "no trend resolved: the interval holds 0"

    def to_dict(self) -> dict[str, Any]:
        return {
            "d_model": self.d_model,
            "sublayers": list(self.span),
            "gap_change_pct": self.gap_change.to_dict(),
            "m_ratio": self.m_ratio.to_dict(),
            "gap_at_pct": [json_number(g) for g in self.gap_at],
            "residual_sd_pct": json_number(self.residual_sd),
            "verdict": self.verdict(),
            "depths": [p.to_dict() for p in self.points],
        }


def depth_trend(
    study: Study, label: str, paired: PairedMultiplier | None, level: float, interval: bool = True
) -> DepthTrend | None:
    """The depth trend of curve ``label`` from its paired per-size M (None unless its sizes share one d_model
    and span at least 3 depths, one budget each). ``interval=False``: point estimates only."""
    if paired is None:
        return None
    by_name = {s.budget: s for s in paired.sizes}
    keys = study.data[label].budget_keys
    if not all(isinstance(key, tuple) and len(key) == 3 for key in keys):
        return None
    widths = {int(key[1]) for key in keys}  # every size of the curve, paired or not: one width
    found = []
    for key in keys:
        size = by_name.get(budget_name(key, math.nan))
        if size is not None:
            found.append((int(key[0]), int(key[1]), size))
    depths = [n for n, _, _ in found]
    if len(widths) != 1 or len(set(depths)) != len(depths) or len(depths) < MIN_DEPTHS:
        return None
    found.sort(key=lambda f: f[0])
    points = tuple(DepthPoint(n, 100 * s.log_gap, s.multiplier, s.n_pairs) for n, _, s in found)
    x = np.array([p.sublayers for p in points], dtype=float)
    span = float(x[-1] - x[0])
    gap, fitted_gap, resid_sd = line_change(x, np.array([p.gap for p in points]), span, level, interval)
    log_m, _, _ = line_change(x, np.log([p.multiplier for p in points]), span, level, interval=False)
    m_ratio = Estimate(math.exp(log_m.value), level=level)
    return DepthTrend(widths.pop(), points, gap, m_ratio, fitted_gap, resid_sd)


def line_change(
    x: np.ndarray, y: np.ndarray, span: float, level: float, interval: bool
) -> tuple[Estimate, tuple[float, float], float]:
    """The least-squares line of y on x: its change over ``span`` with a t interval on len(x) - 2 degrees of
    freedom, its values at the ends of x, and the residuals' standard deviation."""
    from scipy.stats import t as student_t

    dx = x - x.mean()
    sxx = float(dx @ dx)
    slope = float(dx @ (y - y.mean())) / sxx
    intercept = float(y.mean()) - slope * float(x.mean())
    resid = y - (intercept + slope * x)
    df = x.size - 2
    sd = float(np.sqrt(resid @ resid / df))
    change = slope * span
    ends = (intercept + slope * float(x[0]), intercept + slope * float(x[-1]))
    if not interval:
        return Estimate(change, level=level), ends, sd
    half = float(student_t.ppf(0.5 + level / 2, df)) * sd / math.sqrt(sxx) * span
    return Estimate(change, change - half, change + half, level), ends, sd
