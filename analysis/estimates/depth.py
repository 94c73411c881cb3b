"""The depth trend: on a ladder whose sizes share one width (only n_layer moves), how a variant's paired loss gap
to the baseline changes with depth, with an interval.

At each depth k (x_k = 2 n_layer sublayers) the paired per-size estimate (:mod:`analysis.estimates.paired`) gives the
gap g_k = 100 (ln L_base - ln L_var), in % of the loss (> 0: the variant's loss is lower), and ln M_k. The trend is
the least-squares line of g on x (and of ln M on x), each depth weighted by its paired seeds, stated as its change
over the ladder, slope x (x_max - x_min). The depths are trained independently, so everything that moves one
depth's gap (its seeds, its learning-rate envelope, a stalled run) is in the residuals; a bias shared by every depth
moves the level of the line, not its slope. It needs 3 depths (one degree of freedom: a very wide interval).

**The noise behind the interval.** A ladder has few depths, and the scatter of 5 gaps about a line (3 degrees of
freedom) is itself a poor estimate of their noise: cpu_depth's was 0.25 % where two seeds of the same cells in
cpu_envelope spread by 0.61 % per seed, a spread that low happens by chance about 8 % of the time. So the interval
uses the larger of the residuals' sd and a floor, ``noise_floor`` (% of loss per seed of one depth's paired gap;
:data:`NOISE_FLOOR`, measured by benchmarks/depth_power.py in cpu_envelope at d_model 48), divided by sqrt(seeds):
with the residuals, a Student t on K - 2 degrees of freedom; with the floor, a normal quantile (a noise taken as
known from elsewhere). The trend says which it used and its degrees of freedom.

**Where the gap crosses 0.** The line's root x0 = x_mean - g_mean / slope, in sublayers, with Fieller's interval:
the depths x where 0 lies inside the line's own interval at x, {x : |g(x)| <= q sigma sqrt(1/W + (x - x_mean)^2 /
Sxx)}, the same noise and quantile as the trend's. It is a closed interval only where the slope is resolved from 0
(slope^2 > q^2 sigma^2 / Sxx); otherwise the set is unbounded and the crossing is "not resolved". It extrapolates the
line, so it reads as a depth only where a straight line in sublayers describes the ladder (the trend's residual sd
says how well it does).

The gap needs no fitted law; M_k uses the baseline law's local slope, which on a fixed-width ladder is fitted across
depths, so the trend of M is given as a point estimate (the slope's error tilts every M_k's line at once;
docs/analysis.md, "The depth trend").

Pure numpy/scipy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.base.bootstrap import Estimate, json_number
from analysis.estimates.paired import PairedMultiplier, budget_name
from analysis.estimates.study import Study

MIN_DEPTHS = 3
NOISE_FLOOR = 0.61  # % of loss per seed of one depth's paired gap: cpu_envelope, d_model 48 (depth_power.py)


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
    about their line (% of loss, per seed); ``noise``: the per-seed noise the interval was built from (the larger of
    ``residual_sd`` and the floor), ``basis`` which of the two it was ("residuals" or "floor"), ``df`` the residual
    degrees of freedom."""

    d_model: int
    points: tuple[DepthPoint, ...]
    gap_change: Estimate
    m_ratio: Estimate
    gap_at: tuple[float, float]
    residual_sd: float
    noise: float = math.nan
    basis: str = "residuals"
    df: int = 0
    crossing: Estimate | None = None  # where the line crosses 0, in sublayers (Fieller's interval; module doc)

    def crossing_text(self) -> str:
        """``at 31.2 [27.0, 38.9] sublayers``, or why there is no number."""
        c = self.crossing
        if c is None or not math.isfinite(c.value):
            return "no crossing: the line is flat"
        if not c.has_interval:
            return f"at {c.value:.1f} sublayers (a point estimate)"
        if not (math.isfinite(c.low) and math.isfinite(c.high)):
            return f"at {c.value:.1f} sublayers, not resolved: the slope's interval holds 0, so any depth may be it"
        low, high = self.span
        where = (
            "inside the ladder"
            if low <= c.low and c.high <= high
            else ("past the deepest size" if c.low > high else "reaching outside the ladder")
        )
        return f"at {c.value:.1f} [{c.low:.1f}, {c.high:.1f}] sublayers ({where})"

    def noise_text(self) -> str:
        """``noise 0.61 % a seed (the floor; residual sd 0.25 % on 3 df)``: what the interval was built from."""
        if self.basis == "floor":
            return f"noise {self.noise:.2f} % a seed (the floor; residual sd {self.residual_sd:.2f} % on {self.df} df)"
        return f"residual sd {self.residual_sd:.2f} % a seed on {self.df} df"

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
            "noise_pct": json_number(self.noise),
            "noise_basis": self.basis,
            "df": self.df,
            "verdict": self.verdict(),
            "crossing_sublayers": None if self.crossing is None else self.crossing.to_dict(),
            "depths": [p.to_dict() for p in self.points],
        }


def depth_trend(
    study: Study,
    label: str,
    paired: PairedMultiplier | None,
    level: float,
    interval: bool = True,
    noise_floor: float = NOISE_FLOOR,
) -> DepthTrend | None:
    """The depth trend of curve ``label`` from its paired per-size M (None unless its sizes share one d_model
    and span at least 3 depths, one budget each). ``interval=False``: point estimates only; ``noise_floor``: the
    per-seed noise (% of loss) below which the interval does not go (0: the residuals alone)."""
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
    w = np.array([max(p.n_pairs, 1) for p in points], dtype=float)
    span = float(x[-1] - x[0])
    line = line_change(x, np.array([p.gap for p in points]), span, level, interval, w, noise_floor)
    log_m = line_change(x, np.log([p.multiplier for p in points]), span, level, False, w)
    m_ratio = Estimate(math.exp(log_m.change.value), level=level)
    return DepthTrend(
        widths.pop(),
        points,
        line.change,
        m_ratio,
        line.ends,
        line.residual_sd,
        line.noise,
        line.basis,
        line.df,
        line.root,
    )


@dataclass(frozen=True)
class Line:
    """A least-squares line's change over a span with its interval, its values at the ends of x, the residuals' sd
    per unit weight, the noise the interval used, which one ("residuals" or "floor"), and the residual df."""

    change: Estimate
    ends: tuple[float, float]
    residual_sd: float
    noise: float
    basis: str
    df: int
    root: Estimate | None = None  # where the line crosses 0, with Fieller's interval (module doc)


def _fieller_root(
    root: float, g_mean: float, slope: float, x_mean: float, weight: float, sxx: float, spread: float, level: float
) -> Estimate:
    """``root``, the caller's root of the line g(x) = g_mean + slope (x - x_mean), with the set of x at which 0 lies
    inside the line's interval there (``spread``: the quantile times the noise per unit weight): a closed interval
    where the slope is resolved from 0, otherwise unbounded on both sides (-inf, inf), since the complement of a
    bounded set is not an interval the caller could use."""
    a = slope * slope - spread * spread / sxx
    if not math.isfinite(spread) or a <= 0:
        return Estimate(root, -math.inf, math.inf, level)
    b, c = 2 * g_mean * slope, g_mean * g_mean - spread * spread / weight
    disc = math.sqrt(max(b * b - 4 * a * c, 0.0))
    return Estimate(root, x_mean + (-b - disc) / (2 * a), x_mean + (-b + disc) / (2 * a), level)


def line_change(
    x: np.ndarray,
    y: np.ndarray,
    span: float,
    level: float,
    interval: bool,
    weights: np.ndarray | None = None,
    noise_floor: float = 0.0,
) -> Line:
    """The weighted least-squares line of y on x (``weights``: each point's replicates, default 1; a point's
    variance is the noise per replicate over its weight): its change over ``span`` with an interval, its values at
    the ends of x, and the residuals' sd per unit weight. The interval uses the larger of that sd and
    ``noise_floor``: the residuals' with a Student t on len(x) - 2 degrees of freedom, the floor's with a normal
    quantile."""
    from scipy.stats import norm
    from scipy.stats import t as student_t

    w = np.ones_like(x, dtype=float) if weights is None else np.asarray(weights, dtype=float)
    xm, ym = float(w @ x / w.sum()), float(w @ y / w.sum())
    dx = x - xm
    sxx = float(w @ (dx * dx))
    slope = float(w @ (dx * (y - ym))) / sxx
    intercept = ym - slope * xm
    resid = y - (intercept + slope * x)
    df = x.size - 2
    sd = float(np.sqrt(w @ (resid * resid) / df)) if df > 0 else math.nan
    change = slope * span
    ends = (intercept + slope * float(x[0]), intercept + slope * float(x[-1]))
    use_floor = noise_floor > 0 and not (sd >= noise_floor)
    noise, basis = (noise_floor, "floor") if use_floor else (sd, "residuals")
    x0 = xm - ym / slope if slope != 0 else math.nan
    root = Estimate(x0, level=level)
    if not interval or not math.isfinite(noise):
        return Line(Estimate(change, level=level), ends, sd, noise, basis, df, root)
    quantile = float(norm.ppf(0.5 + level / 2) if use_floor else student_t.ppf(0.5 + level / 2, df))
    half = quantile * noise / math.sqrt(sxx) * span
    root = _fieller_root(x0, ym, slope, xm, float(w.sum()), sxx, quantile * noise, level)
    return Line(Estimate(change, change - half, change + half, level), ends, sd, noise, basis, df, root)
