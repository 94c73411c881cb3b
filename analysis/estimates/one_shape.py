"""Variants against the baseline at one model shape: the sweeps of the paper's block-size figure and ablation table
(one size, one budget, many variants), where no scaling law can be fitted and the comparison is the result.

Per curve, its gap to the baseline in points of %: g = 100 (ln L_base - ln L_curve), > 0 where the curve's loss is
lower, the mean over the seeds both ran of the paired per-seed gap d_s (a seed fixes the batches, and the init of
the parameters both models have). Each seed's loss is the point's: at the chosen rate, or, with ``--lr envelope``,
the seed's fitted loss at its cell's envelope minimum (:mod:`analysis.data.envelope`).

The seeds are blocks of an additive model over every (curve, seed) that ran,

    100 ln L(curve, seed) = curve effect + seed effect + error,

and a curve's gap is the baseline's effect less its own (with every seed run by every curve: the mean of the paired
per-seed gaps). Its interval is Student t on the model's residual df, (V - 1)(S - 1) for V curves and S seeds:

    Var(g) = s^2 c' (X'X)^-1 c + cov_curve + cov_base

Two seeds give one curve a single degree of freedom of its own (a t quantile of 6.3), so the error variance s^2 is
pooled over the curves (they share the data, the shape and the recipe, so their seeds scatter alike); as a model,
not a pooled scatter of paired gaps, because the baseline's own seed noise is in every curve's gap, one draw that a
pooled scatter would count once per curve. s^2 holds each seed's init and batches and its own share of the
envelope's fitting error. What it cannot see is the error the seeds of a cell share, in two parts (``cov_curve``,
``cov_base``, one per cell). The envelope fits one slope and one curvature per cell to all its seeds, so an error
there moves them together: the first part is the covariance of two seeds' fitted minima under the parabola's
least-squares fit, sigma^2 w_s' (Z'Z)^-1 w_r (w_s: seed s's row of the design Z at the point's rate), sigma^2 the
residual variance about the parabolas pooled over the shape's cells. The second is the envelope's resolution: a
parabola through three rates misreads the minimum of an asymmetric loss-rate curve by an amount that depends on where
the best rate falls between the rates, the same for every seed; its sd is :data:`RESOLUTION` c h^2. (The split
parabola, ``--lr split``, adds neither.) benchmarks/one_shape_power.py measures the interval's coverage under the
noise the CPU studies measured, a stalled seed included; docs/analysis.md, "One-shape sweeps", has the numbers.

A curve whose envelope minimum sits at an end of the swept rates (``edge``) is read at that end: its loss is an upper
bound and its gap a lower bound. It stays out of both pools and its gap has no interval (a variant that failed to
train scatters as the others do not, and would widen every interval).

Pure numpy/scipy/pandas; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.base.bootstrap import Estimate, json_number
from analysis.data.envelope import EnvelopeCell, Envelopes

SHAPE_KEYS = ("n_layer", "d_model", "tokens")
ONE_SHAPE = "one model shape and one budget"  # the notes' name for such a sweep
# The envelope's resolution: the sd, per unit of c h^2 (c the cell's fitted curvature, h its fitted rates' spacing in
# ln rate), with which a parabola through three rates misreads the minimum of an asymmetric loss-rate curve, as the
# best rate falls anywhere between the rates; for curves as asymmetric as cpu_envelope measured (one factor 2 above
# the best rate costs 5 % of loss, one below 0.8 %). benchmarks/one_shape_power.py computes it (`--calibrate`).
RESOLUTION = 0.09


@dataclass(frozen=True)
class ShapeGap:
    """One curve at the shape: its loss and its paired gap to the baseline (points of %, > 0: lower loss)."""

    curve: str
    loss: float
    gap: Estimate
    n_pairs: int
    lr: float  # the rate its loss is read at (the envelope's minimum, or the chosen rate)
    edge: str = ""  # "low" / "high": the envelope's minimum sits at that end of the swept rates
    p_value: float = math.nan  # two-sided, of "the gap is 0", from the gap's t statistic (nan without an interval)
    p_holm: float = math.nan  # the same, Holm-adjusted over every gap of the sweep that has one (the family)

    def reading(self) -> str:
        """What the gap says once the family is accounted for: the Holm-adjusted p-value against 1 - the level."""
        if not self.gap.has_interval:
            return ""
        alpha = 1 - self.gap.level
        side = "lower loss" if self.gap.value > 0 else "higher loss"
        if self.p_holm < alpha:
            return f"{side}, resolved after Holm (p {self.p_holm:.2g})"
        if self.p_value < alpha:
            return f"not resolved after Holm (p {self.p_holm:.2g}; raw {self.p_value:.2g})"
        return "no detectable difference"

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "loss": json_number(self.loss),
            "gap": self.gap.to_dict(),
            "n_pairs": self.n_pairs,
            "lr": json_number(self.lr),
            "edge": self.edge,
            "p_value": json_number(self.p_value),
            "p_holm": json_number(self.p_holm),
        }


@dataclass(frozen=True)
class ShapeComparison:
    """Every curve of a one-shape sweep against its baseline."""

    n_layer: int
    d_model: int
    tokens: float
    baseline: str
    baseline_loss: float
    gaps: tuple[ShapeGap, ...]  # every curve but the baseline
    seed_sd: float  # s: the pooled sd of one paired seed's gap, points of %
    df: int
    curve_sd: float  # sigma: the residual sd about the envelopes' parabolas (nan without a local envelope)

    @property
    def shape(self) -> str:
        return f"L{self.n_layer}-d{self.d_model}"

    def gap(self, curve: str) -> ShapeGap:
        for g in self.gaps:
            if g.curve == curve:
                return g
        raise KeyError(f"no curve {curve!r} at {self.shape}; have: {[g.curve for g in self.gaps]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.shape,
            "tokens": json_number(self.tokens),
            "baseline": self.baseline,
            "baseline_loss": json_number(self.baseline_loss),
            "seed_sd": json_number(self.seed_sd),
            "df": self.df,
            "curve_sd": json_number(self.curve_sd),
            "gaps": [g.to_dict() for g in self.gaps],
        }


def one_shape_comparison(
    points: pd.DataFrame,
    runs: pd.DataFrame,
    envelopes: Envelopes | None,
    baseline: str,
    level: float,
    interval: bool = True,
) -> ShapeComparison | None:
    """The comparison of a sweep whose points all sit at one (n_layer, d_model, tokens) with the baseline among
    them and at least one other curve (None otherwise). ``runs``: the sweep's runs (their losses for the envelope's
    residuals). ``interval=False``: point estimates only (``--n-boot 0``)."""
    if points.empty or len(points.groupby(list(SHAPE_KEYS))) != 1:
        return None
    curves = [str(c) for c in dict.fromkeys(points["curve"])]
    if baseline not in curves or len(curves) < 2:
        return None
    by_curve = {str(r.curve): r for r in points.itertuples()}
    base = by_curve[baseline]
    n_layer, d_model, tokens = int(base.n_layer), int(base.d_model), float(base.tokens)
    cells = {c: envelopes.cell(c, n_layer, d_model, tokens) if envelopes is not None else None for c in curves}
    # A curve whose envelope minimum sits at an end of the swept rates has no minimum to read: its loss is an upper
    # bound, and a curve that failed to train there scatters as the others do not. It is kept out of both pools (it
    # would widen every other curve's interval) and gets its paired gap, a lower bound, without an interval.
    bounds = {c for c, cell in cells.items() if c != baseline and cell is not None and cell.edge}
    pooled = [c for c in curves if c not in bounds]
    local = [cells[c] for c in pooled if cells[c] is not None and cells[c].shape == "local"]
    sigma2 = _pooled_residual_variance(local, runs) if len(local) == len(pooled) else math.nan
    shared = {  # points of % squared: the error the seeds of a cell share, its fit's and its resolution's
        c: (_shared_covariance(cell, float(by_curve[c].lr), runs) * sigma2 + _resolution_variance(cell)) * 1e4
        for c, cell in cells.items()
        if cell is not None and math.isfinite(sigma2)
    }
    table = {c: _seed_losses(by_curve[c]) for c in curves}
    effects, cov, df, s2 = _seed_blocks(table, pooled)
    gaps = []
    p_values: dict[str, float] = {}
    for c in curves:
        if c == baseline:
            continue
        r, cell = by_curve[c], cells[c]
        n_pairs = len(set(table[c]) & set(table[baseline]))
        if c in bounds and n_pairs:  # the mean of the paired per-seed gaps, no interval
            both = sorted(set(table[c]) & set(table[baseline]))
            paired = [math.log(table[baseline][s]) - math.log(table[c][s]) for s in both]
            est = Estimate(100.0 * float(np.mean(paired)), level=level)
        elif effects is None or c not in effects or baseline not in effects:  # no seeds: the points' losses
            est = Estimate(100.0 * (math.log(float(base.loss)) - math.log(float(r.loss))), level=level)
        else:
            i, j = pooled.index(baseline), pooled.index(c)
            value = effects[baseline] - effects[c]
            est = Estimate(value, level=level)
            var = s2 * (cov[i, i] + cov[j, j] - 2 * cov[i, j]) + shared.get(c, 0.0) + shared.get(baseline, 0.0)
            if interval and df and math.isfinite(var) and var > 0:
                from scipy.stats import t as student_t

                half = float(student_t.ppf(0.5 + level / 2, df)) * math.sqrt(var)
                est = Estimate(value, value - half, value + half, level)
                p_values[c] = float(2 * student_t.sf(abs(value) / math.sqrt(var), df))
        gaps.append(ShapeGap(c, float(r.loss), est, n_pairs, float(r.lr), cell.edge if cell is not None else ""))
    holm = holm_adjusted(p_values)
    gaps = [replace(g, p_value=p_values.get(g.curve, math.nan), p_holm=holm.get(g.curve, math.nan)) for g in gaps]
    return ShapeComparison(
        n_layer,
        d_model,
        tokens,
        baseline,
        float(base.loss),
        tuple(gaps),
        math.sqrt(2 * s2) if df else math.nan,
        df,
        math.sqrt(sigma2) if math.isfinite(sigma2) else math.nan,
    )


def holm_adjusted(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): the k-th smallest is multiplied by the
    number of hypotheses not yet rejected (m - k + 1), and the adjusted values are made non-decreasing in that
    order and capped at 1. It controls the family-wise error rate at least as tightly as Bonferroni and rejects at
    least as much; a gap whose adjusted p is below 1 - level is resolved at that level for the family as a whole."""
    order = sorted(p_values, key=lambda k: p_values[k])
    m, running, out = len(order), 0.0, {}
    for k, name in enumerate(order):
        running = max(running, min(1.0, (m - k) * p_values[name]))
        out[name] = running
    return out


def _seed_losses(point: Any) -> dict[int, float]:
    seeds, losses = point.run_seeds, point.run_losses
    if seeds is None or losses is None or len(seeds) != len(losses):
        return {}
    return {int(s): float(v) for s, v in zip(seeds, losses)}


def _seed_blocks(
    table: dict[str, dict[int, float]], curves: list[str]
) -> tuple[dict[str, float] | None, np.ndarray, int, float]:
    """The additive model 100 ln L = curve effect + seed effect + error over every (curve, seed) that ran: each
    curve's effect, the effects' covariance per unit error variance, the residual df and the error variance (None
    when no curve has a seed)."""
    seeds = sorted({s for losses in table.values() for s in losses})
    cells = [(i, s, 100.0 * math.log(v)) for i, c in enumerate(curves) for s, v in sorted(table[c].items())]
    if not cells:
        return None, np.empty((0, 0)), 0, math.nan
    design = np.zeros((len(cells), len(curves) + len(seeds) - 1))
    for row, (i, s, _) in enumerate(cells):
        design[row, i] = 1.0
        k = seeds.index(s)
        if k:  # the first seed is the reference level
            design[row, len(curves) + k - 1] = 1.0
    y = np.array([v for _, _, v in cells])
    theta, *_ = np.linalg.lstsq(design, y, rcond=None)
    rank = int(np.linalg.matrix_rank(design))
    df = len(cells) - rank
    s2 = float(np.sum((y - design @ theta) ** 2) / df) if df > 0 else math.nan
    cov = np.linalg.pinv(design.T @ design)
    present = {c for c in curves if table[c]}
    return {c: float(theta[i]) for i, c in enumerate(curves) if c in present}, cov, max(df, 0), s2


def _cell_design(cell: EnvelopeCell, runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The parabola's design (t^2, t, one column per seed) over the runs it was fitted to, and their log losses."""
    g = runs[runs["run_id"].astype(str).isin(cell.run_ids)]
    g = g[np.isin(g["lr"].astype(float).to_numpy(), cell.fitted)]
    g = g[pd.to_numeric(g["seed"], errors="coerce").isin(cell.seeds)]
    t = np.log(g["lr"].astype(float).to_numpy()) - cell.centre
    seeds = pd.to_numeric(g["seed"]).astype(int).to_numpy()
    design = np.column_stack([t * t, t] + [(seeds == s).astype(float) for s in cell.seeds])
    return design, np.log(pd.to_numeric(g["val_loss"]).astype(float).to_numpy())


def _pooled_residual_variance(cells: list[EnvelopeCell], runs: pd.DataFrame) -> float:
    """Residual variance of log loss about the cells' fitted parabolas, pooled over the cells."""
    squares, df = 0.0, 0
    for cell in cells:
        design, y = _cell_design(cell, runs)
        theta = np.array([cell.curvature, cell.slope, *cell.levels])
        squares += float(np.sum((y - design @ theta) ** 2))
        df += design.shape[0] - design.shape[1]
    return squares / df if df > 0 else math.nan


def _shared_covariance(cell: EnvelopeCell, lr: float, runs: pd.DataFrame) -> float:
    """The mean covariance of two different seeds' fitted log losses at ``lr`` (the point's rate), in units of the
    residual variance (0 for one seed, or a fit that is not the local parabola)."""
    n = len(cell.seeds)
    if cell.shape != "local" or n < 2:
        return 0.0
    design, _ = _cell_design(cell, runs)
    t = math.log(cell.clip(lr)[0]) - cell.centre
    rows = np.column_stack([np.full(n, t * t), np.full(n, t), np.eye(n)])
    cov = rows @ np.linalg.pinv(design.T @ design) @ rows.T
    return float((cov.sum() - np.trace(cov)) / (n * (n - 1)))


def _resolution_variance(cell: EnvelopeCell) -> float:
    """The variance (log loss squared) of the local parabola's misreading of an asymmetric curve's minimum
    (:data:`RESOLUTION`); 0 for the split parabola, which fits each side's curvature, and for a curve not convex."""
    if cell.shape != "local" or len(cell.fitted) < 3 or not cell.curvature > 0:
        return 0.0
    h = float(np.mean(np.diff(np.log(cell.fitted))))
    return (RESOLUTION * cell.curvature * h * h) ** 2
