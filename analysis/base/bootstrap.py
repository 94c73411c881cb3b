"""Bootstrap resampling for the fits and multipliers, and :class:`Estimate`, the value-with-interval they produce.

Two ways of making a replicate data set, both in log loss and both seeded (same inputs, same numbers):

* **run resampling**, for a point that stands for several runs (seeds): draw that many runs with
  replacement and aggregate them as the point was (mean of the losses, or the best);
* **residual bootstrap**, for a point that stands for one run (or a frontier minimum): the fitted value plus a
  residual drawn with replacement from the curve's own residuals, leverage-corrected
  (``r_i / sqrt(1 - h_ii)``) and centred (Davison & Hinkley 1997, alg. 6.3), because raw residuals of a fit
  with p parameters to n points are too small by about ``sqrt((n - p) / n)`` and would give short intervals.

Intervals are percentile intervals of the replicates. Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_LEVEL = 0.9
DEFAULT_N_BOOT = 1000
# an interval whose replicates failed more often than this is marked unreliable: a bootstrap that silently drops the
# replicates its refit could not settle is biased toward the easy ones (the data sets that look most like the fit)
FAILED_LIMIT = 0.05


@dataclass(frozen=True)
class Estimate:
    """A point estimate at full precision with its bootstrap confidence interval (``nan`` when there is none), and how
    many of the ``replicates`` drawn for it were left out because a refit behind them failed (``failed``): said
    beside the interval wherever it is printed or saved, and above :data:`FAILED_LIMIT` of them the interval is not
    :attr:`reliable`."""

    value: float
    low: float = math.nan
    high: float = math.nan
    level: float = DEFAULT_LEVEL
    failed: int = 0
    replicates: int = 0

    @property
    def failed_share(self) -> float:
        return self.failed / self.replicates if self.replicates else 0.0

    @property
    def reliable(self) -> bool:
        """Whether few enough replicates failed for the interval to mean what it says (:data:`FAILED_LIMIT`)."""
        return self.failed_share <= FAILED_LIMIT

    def failed_note(self) -> str:
        """``41 of 1000 replicates failed`` (``, unreliable`` beyond the limit); empty when none did."""
        if not self.failed:
            return ""
        return f"{self.failed} of {self.replicates} replicates failed" + ("" if self.reliable else ", unreliable")

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies inside the interval (ends included)."""
        return bool(self.low <= x <= self.high)

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    def text(self, digits: int = 4) -> str:
        """``1.253 [1.201, 1.312]`` (the value alone when there is no interval)."""
        value = _fmt(self.value, digits)
        if not self.has_interval:
            return value
        note = self.failed_note()
        return f"{value} [{_fmt(self.low, digits)}, {_fmt(self.high, digits)}]" + (f" ({note})" if note else "")

    def to_dict(self) -> dict[str, float | str | None]:
        out = {"value": json_number(self.value), "low": json_number(self.low), "high": json_number(self.high)}
        if self.failed:  # only where some did: the files of fits where none failed keep their shape
            out |= {"failed": self.failed, "replicates": self.replicates}
        return out


def _fmt(x: float, digits: int) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def json_number(x: float | int | None) -> float | int | str | None:
    """A number for JSON at full precision: ``nan`` becomes null, infinities become the strings "inf" / "-inf"."""
    if x is None:
        return None
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    x = float(x)
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def tail_probability(level: float, df: float | None = None) -> float:
    """The lower-tail probability of a central ``level`` interval, expanded for ``df`` residual degrees of freedom.

    Without ``df``: (1 - level) / 2. With it, the "expanded percentile" interval (Hesterberg 2015): the
    percentiles are taken at Phi(t_{df, (1 - level)/2}) instead, which widens the interval as a Student t
    interval is wider than a normal one. A plain percentile interval from a fit of 7 points with 2
    parameters covers ~84% where 90% is asked; the expansion restores the nominal level.
    """
    tail = (1.0 - level) / 2.0
    if df is None or not np.isfinite(df):
        return tail
    from scipy.special import ndtr, stdtrit

    return float(ndtr(stdtrit(max(float(df), 1.0), tail)))


def percentile_interval(
    samples: np.ndarray, level: float = DEFAULT_LEVEL, axis: int = 0, df: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The central ``level`` percentile interval of ``samples`` along ``axis``, ignoring NaN replicates.

    ``df``: residual degrees of freedom behind the replicates, for the expanded percentile interval (see
    :func:`tail_probability`). Infinite replicates (a multiplier past the baseline's asymptote) are kept:
    they are real outcomes of the resampling and push the upper end to ``inf`` when they are frequent enough.
    """
    samples = np.asarray(samples, dtype=float)
    tail = tail_probability(level, df)
    with np.errstate(invalid="ignore"):
        # "linear" interpolates between neighbours, which gives nan between two infinities; "higher"/"lower"
        # are used only there.
        q = np.nanquantile(samples, [tail, 1.0 - tail], axis=axis, method="linear")
        if np.isnan(q).any() and np.isinf(samples).any():
            lo = np.nanquantile(samples, tail, axis=axis, method="lower")
            hi = np.nanquantile(samples, 1.0 - tail, axis=axis, method="higher")
            q = np.where(np.isnan(q), np.stack([lo, hi]), q)
    return q[0], q[1]


def estimate(
    value: float, samples: np.ndarray | None, level: float, df: float | None = None, failed: int = 0
) -> Estimate:
    """An :class:`Estimate` from a point value and its replicates (None or empty: no interval); ``failed``: the
    replicates left out of ``samples`` because a refit behind them failed.

    ``df`` below 1 (no more observations than parameters: the fit interpolates its points) gives no
    interval either: the replicates of an exact fit do not vary, and a zero-width interval would claim a
    certainty the data cannot give.
    """
    if samples is None or np.size(samples) == 0 or np.all(np.isnan(samples)) or (df is not None and df < 1):
        return Estimate(float(value), math.nan, math.nan, level)
    samples = np.asarray(samples, dtype=float)
    low, high = percentile_interval(samples, level, df=df)
    return Estimate(float(value), float(low), float(high), level, failed, samples.shape[0] + failed)


def modified_residuals(residuals: np.ndarray, jacobian: np.ndarray) -> np.ndarray:
    """Leverage-corrected, centred residuals ``r_i / sqrt(1 - h_ii)`` (h: the hat matrix of the Jacobian)."""
    residuals = np.asarray(residuals, dtype=float)
    n, p = jacobian.shape
    if n <= p:
        return np.zeros_like(residuals)  # an exact fit: there is no residual variation to resample
    q, _ = np.linalg.qr(jacobian)
    leverage = np.clip(np.sum(q * q, axis=1), 0.0, 0.99)  # 0.99: a point the fit interpolates is not blown up
    modified = residuals / np.sqrt(1.0 - leverage)
    return modified - modified.mean()


def residual_draws(residuals: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n)`` residuals drawn with replacement from ``residuals``."""
    residuals = np.asarray(residuals, dtype=float)
    return residuals[rng.integers(0, residuals.size, size=(n_boot, residuals.size))]


def run_draws(run_losses: np.ndarray, n_boot: int, rng: np.random.Generator, aggregate: str) -> np.ndarray:
    """``(n_boot,)`` log losses of a point whose m runs are resampled with replacement and aggregated again.

    ``aggregate`` is "mean" (mean of the losses, then the log), "median" or "best" (the lowest loss). For "mean" the
    runs' deviations from their mean are scaled by sqrt(m / (m - 1)) before resampling, because the
    bootstrap variance of a mean of m draws is (m - 1) / m of the sample variance (a third too small for
    three seeds). The minimum ("best") is resampled as it is.
    """
    run_losses = np.asarray(run_losses, dtype=float)
    m = run_losses.size
    if aggregate == "mean" and m > 1:
        centre = run_losses.mean()
        run_losses = centre + math.sqrt(m / (m - 1)) * (run_losses - centre)
    picked = run_losses[rng.integers(0, m, size=(n_boot, m))]
    if aggregate == "median":
        value = np.median(picked, axis=1)
    else:
        value = picked.mean(axis=1) if aggregate == "mean" else picked.min(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log(value)
