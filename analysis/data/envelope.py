"""The learning-rate envelope: each (curve, size, budget)'s loss at its best learning rate, read off a curve fitted
to log loss against ln(rate) over the rates a grid swept, rather than the best of a few noisy runs.

The model, per cell (a curve's runs at one model shape and token budget): the run with seed s at rate r has

    ln L = a_s + b t + c t^2,      t = ln r - centre   (centre: the mean ln rate of the rates fitted)

a level per seed, because a seed (its init and its batches) shifts the whole curve, and one slope and curvature,
c >= 0. The parabola is fitted to the ``LOCAL_RATES`` (3) rates around the cell's best measured mean loss, not to
every rate swept: real loss-rate curves are asymmetric (too high a rate costs more than too low; the cpu_envelope
runs rise 5 % one step above their best and under 1 % one step below), and a parabola over a factor 8 of rates puts
the minimum where the steep side pulls it. Each cell is fitted on its own: a curvature shared by a variant's sizes
ties their minima together, which the paired M's spread over sizes cannot see (benchmarks/envelope_coverage.py
measured both choices; docs/analysis.md, "Learning-rate envelopes").

**One answer.** The fit is least squares with the curvature held at 0 or above: a linear model with a full-rank
design, so its solution is unique and found in closed form, the same on every machine and BLAS kernel to rounding.
(It replaced a Huber fit whose delta sat below most residuals: with 6 runs and 4 parameters that objective had a flat
face of minimisers, and the minimum it reported moved by up to 0.45 % with the solver's start; docs/log.md,
2026-12-04.) What a cell can identify: at 3 rates and one seed the parabola passes through the three runs (no noise
estimate, no outlier rule: its minimum is as noisy as its runs); at 3 rates and two seeds, per rate the mean of the
two seeds' runs (any loss that treats residuals symmetrically gives the same: the two runs' residuals are equal and
opposite), and 2 degrees of freedom of noise; more seeds or rates add both.

**One stalled run.** A run that ends far above its cell's fit without it (a stall, a divergence) is set aside and
the cell fitted again without it (:func:`_outlying_run`): its deleted residual must exceed :data:`OUTLIER_Z`
standard errors of the sweep's pooled per-run noise (a robust sd of every cell's residuals, so that one run cannot
inflate it) and :data:`OUTLIER_FLOOR` of log loss. Only runs above the fit are judged: with two seeds at a rate the
data cannot say which of the two is off, and a stall only ever raises a loss. Every run set aside is named in
fit.json and the report. The training-history stall detector (:mod:`analysis.data.stalls`) looks for the same failure
from the other end, and the headline is also given without the runs it flags.

The best rate is the vertex t* = -b / (2 c), restricted to the rates fitted: a vertex beyond the end of the swept
rates (or a curve with no curvature) puts t* at that end, and the cell is flagged (``edge``): its minimum lies
outside the rates tried, its loss is an upper bound of it, and the grid needs rates past that edge. Every cell's
minimum is the minimum of its fitted convex curve over the fitted rates: a convex cell's vertex may lie below all of
its runs, a concave one's is the end of its best line; no cell reads a raw run.

``--lr split`` fits each cell over every rate with a split parabola instead, ln L = a_s + c_low (t - v)^2 below
its vertex v and c_high (t - v)^2 above it: the shape of a curve that rises faster on one side, whose intervals
cover in the asymmetric scenarios where the symmetric parabola's do not (:func:`_fit_split`; docs/analysis.md). It
is least squares too, with the vertex found on a fixed grid and refined, so no starting point is involved.

Each seed's loss at t* (its fitted log loss there, exponentiated) is what the fits read: the point is their mean
(or median, or best), and the seeds stay paired across variants as single runs are. The paper's protocol reads a
variant's curves at the baseline's best rate of the same cell instead (restricted to the variant's swept range, and
flagged ``extrapolated`` where that clips it). docs/analysis.md, "Learning-rate envelopes", has the choices.

Pure numpy/scipy/pandas; never imports torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.base.bootstrap import json_number
from analysis.base.errors import FitInputError
from analysis.laws.optimizer import robust_sd

SHAPES = ("local", "split")  # lr="envelope" / lr="split" (analysis.data.points.LR_RULES)
MIN_RATES = 3  # distinct rates a cell needs for a vertex the data can place (the local parabola)
SPLIT_MIN_RATES = 4  # the split parabola: one more, for its second curvature
LOCAL_RATES = 3  # the parabola is fitted to this many rates around the best measured one
SPLIT_VERTICES = 41  # the split parabola's vertex: first the best of this many evenly over the swept ln rates
OUTLIER_Z = 4.0  # a run is set aside more than this many standard errors above its cell's fit without it ...
OUTLIER_FLOOR = 0.02  # ... and more than 2 % of loss above it (whatever the sweep's noise)
CELL_KEYS = ("sweep", "curve", "n_layer", "d_model", "tokens")


@dataclass(frozen=True)
class EnvelopeCell:
    """One (curve, model shape, budget)'s fitted loss-rate curve and its minimum within the swept rates."""

    sweep: str
    curve: str
    variant: str
    n_layer: int
    d_model: int
    tokens: float
    params: float  # non-embedding parameters (the runs' mean)
    rates: tuple[float, ...]  # the distinct rates swept, ascending
    rate_loss: tuple[float, ...]  # mean loss over the seeds at each rate, as measured
    seeds: tuple[int, ...]
    fitted: tuple[float, ...]  # the rates the parabola was fitted to (LOCAL_RATES around the best measured)
    levels: tuple[float, ...]  # a_s, one per seed
    slope: float  # b
    curvature: float  # c: log loss per (ln rate)^2
    centre: float  # the mean ln rate of the rates fitted
    best_lr: float  # the minimum's rate, within the swept range
    edge: str  # "" inside; "low" / "high": the vertex lies beyond that end of the swept rates (or no curvature)
    run_ids: tuple[str, ...]
    # the split parabola (lr="split"): levels are the seeds' log losses at the vertex t = vertex, curvature the
    # curvature below it, curvature_high above it, slope 0
    shape: str = "local"
    curvature_high: float = math.nan
    vertex: float = math.nan
    set_aside: tuple[SetAside, ...] = ()  # the run left out of the fit by the outlier rule, if any

    @property
    def key(self) -> tuple[str, str, int, int, float]:
        return (self.sweep, self.curve, self.n_layer, self.d_model, self.tokens)

    @property
    def size(self) -> str:
        return f"L{self.n_layer}-d{self.d_model}"

    def clip(self, lr: float) -> tuple[float, bool]:
        """``lr`` restricted to the swept range, and whether that moved it."""
        low, high = self.rates[0], self.rates[-1]
        inside = min(max(lr, low), high)
        return inside, not math.isclose(inside, lr, rel_tol=1e-12)

    def _log_curve(self, t: np.ndarray) -> np.ndarray:
        """Each seed's fitted log loss (rows) at each ``t`` = ln rate - centre (columns)."""
        levels = np.asarray(self.levels)[:, None]
        if self.shape == "split":
            d = t - self.vertex
            return levels + np.where(d < 0, self.curvature, self.curvature_high) * d * d
        return levels + self.slope * t + self.curvature * t * t

    def seed_log_losses(self, lr: float | None = None) -> np.ndarray:
        """Each seed's fitted log loss at ``lr`` (default: the best rate), ``lr`` restricted to the swept range."""
        t = math.log(self.clip(self.best_lr if lr is None else lr)[0]) - self.centre
        return self._log_curve(np.array([t]))[:, 0]

    def seed_losses(self, lr: float | None = None) -> np.ndarray:
        return np.exp(self.seed_log_losses(lr))

    @property
    def loss(self) -> float:
        """The minimum: the mean over seeds of their fitted losses at the best rate."""
        return float(self.seed_losses().mean())

    def curve_at(self, lrs: np.ndarray) -> np.ndarray:
        """The fitted loss (mean over seeds) at each rate of ``lrs`` (no restriction: for figures; it holds over
        :attr:`fitted` only)."""
        return np.exp(self._log_curve(np.log(np.asarray(lrs, dtype=float)) - self.centre)).mean(axis=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "size": self.size,
            "tokens": json_number(self.tokens),
            "params": json_number(self.params),
            "rates": [json_number(r) for r in self.rates],
            "rate_loss": [json_number(v) for v in self.rate_loss],
            "seeds": list(self.seeds),
            "best_lr": json_number(self.best_lr),
            "loss": json_number(self.loss),
            "edge": self.edge,
            "fitted": [json_number(r) for r in self.fitted],
            "curvature": json_number(self.curvature),
            # the split parabola's other side (absent for the local parabola: fit.json files before it stay the same)
            **({"curvature_high": json_number(self.curvature_high)} if self.shape == "split" else {}),
            **({"set_aside": [r.to_dict() for r in self.set_aside]} if self.set_aside else {}),
        }


@dataclass(frozen=True)
class Envelopes:
    """Every cell's envelope of one sweep (or slice)."""

    cells: tuple[EnvelopeCell, ...]

    def cell(self, curve: str, n_layer: int, d_model: int, tokens: float) -> EnvelopeCell | None:
        for c in self.cells:
            if (c.curve, c.n_layer, c.d_model) == (curve, n_layer, d_model) and math.isclose(
                c.tokens, tokens, rel_tol=1e-9
            ):
                return c
        return None

    @property
    def edges(self) -> tuple[EnvelopeCell, ...]:
        return tuple(c for c in self.cells if c.edge)

    def to_dict(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.cells]


def rates_per_cell(runs: pd.DataFrame) -> pd.Series:
    """Distinct learning rates per (sweep, curve, n_layer, d_model, tokens) of finished runs with a curve column."""
    return runs.groupby(list(CELL_KEYS))["lr"].nunique()


def has_rate_sweeps(runs: pd.DataFrame) -> bool:
    """Whether some cell of these runs was trained at several learning rates (a grid with an lr: list)."""
    return not runs.empty and bool((rates_per_cell(runs) >= 2).any())


def unfinished_cells(runs: pd.DataFrame, shape: str = "local") -> tuple[pd.DataFrame, list[str]]:
    """``runs`` without the cells of a study in progress: a cell with fewer rates than the shape needs, in a sweep
    where another cell has them (the grid sweeps rates; this cell's runs have not all finished), and one note per
    cell left out. A sweep where no cell has enough rates is kept whole, for :func:`fit_envelopes`' error."""
    if runs.empty:
        return runs, []
    need = SPLIT_MIN_RATES if shape == "split" else MIN_RATES
    counts = rates_per_cell(runs)
    short = [
        key
        for key, n in counts.items()
        if n < need and int(counts[counts.index.get_level_values("sweep") == key[0]].max()) >= need
    ]
    if not short:
        return runs, []
    notes = [
        f"{curve} at L{n_layer}-d{d_model}, {tokens:,.0f} tokens: left out, {int(counts[key])} of its rates "
        f"finished where its sweep's other cells have {need} or more (finish its runs with `attnres sweep run`)"
        for key in short
        for _, curve, n_layer, d_model, tokens in [key]
    ]
    keys = pd.MultiIndex.from_frame(runs[list(CELL_KEYS)])
    return runs[~keys.isin(short)], notes


def fit_envelopes(runs: pd.DataFrame, *, shape: str = "local") -> Envelopes:
    """The envelope of every cell of ``runs``: finished runs with a ``curve`` column (:func:`analysis.data.select
    .finished_runs` and ``curve_labels``). ``shape``: "local", the parabola over the rates around each cell's best
    (``--lr envelope``), or "split", a parabola with its own curvature each side of its vertex over every rate of the
    cell (``--lr split``). A cell with fewer rates than the shape needs (:data:`MIN_RATES`,
    :data:`SPLIT_MIN_RATES`) is a :class:`FitInputError` naming it and the fix, before anything is fitted.

    Every cell is fitted by least squares (one answer: the module docstring), then once more without the run that
    :func:`_outlying_run` sets aside, if any; the noise scale that rule reads is pooled over the cells of each sweep."""
    if shape not in SHAPES:
        raise ValueError(f"shape={shape!r}: use one of {', '.join(SHAPES)}")
    if runs.empty:
        return Envelopes(())
    need = SPLIT_MIN_RATES if shape == "split" else MIN_RATES
    counts = rates_per_cell(runs)
    few = counts[counts < need]
    if not few.empty:
        sweep, curve, n_layer, d_model, tokens = few.index[0]
        rule, fallback = (
            ("split", "--lr envelope (3 rates) or --lr best") if shape == "split" else ("envelope", "--lr best")
        )
        raise FitInputError(
            f"--lr {rule}: {sweep}/{curve} at L{n_layer}-d{d_model}, {tokens:,.0f} tokens, was trained at "
            f"{int(few.iloc[0])} learning rate(s) ({len(few)} such cell(s)); this envelope needs at least {need} "
            "per cell: give the grid an lr: list (or {centre, factor, count}), or fit with " + fallback
        )
    runs = runs.assign(
        seed=pd.to_numeric(runs["seed"], errors="coerce").fillna(-1).astype(int),
        y=np.log(pd.to_numeric(runs["val_loss"]).astype(float)),
        x=np.log(runs["lr"].astype(float)),
    )
    fit = _fit_split if shape == "split" else _fit_cell
    cells = []
    for _, sweep_runs in runs.groupby("sweep", sort=True):
        groups = [g.sort_values(["lr", "seed", "run_id"]) for _, g in sweep_runs.groupby(list(CELL_KEYS), sort=True)]
        first = [fit(g) for g in groups]
        scale = robust_sd((c.residuals, c.n_params) for c, _ in first)
        for g, (cell, design) in zip(groups, first):
            odd = _outlying_run(cell, design, scale)
            if odd is None:
                cells.append(cell.envelope)
                continue
            kept, _ = fit(g[g["run_id"].astype(str) != odd.run_id])
            cells.append(replace(kept.envelope, set_aside=(odd,)))
    return Envelopes(tuple(cells))


@dataclass(frozen=True)
class SetAside:
    """A run left out of its cell's envelope: ``excess`` (log loss) above the cell's fit without it, ``z`` that
    excess in standard errors of such a prediction (the sweep's pooled noise), and the threshold it passed."""

    run_id: str
    lr: float
    seed: int
    excess: float
    z: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "lr": json_number(self.lr),
            "seed": self.seed,
            "excess": json_number(self.excess),
            "z": json_number(self.z),
        }


@dataclass(frozen=True)
class _CellFit:
    """A cell's least-squares fit before the outlier rule: its envelope, the runs fitted (in the design's row order)
    with their residuals, and the parameter count."""

    envelope: EnvelopeCell
    run_ids: tuple[str, ...]
    lrs: np.ndarray
    seeds: np.ndarray
    residuals: np.ndarray
    n_params: int


def _outlying_run(fit: _CellFit, design: np.ndarray, scale: float) -> SetAside | None:
    """The run a cell sets aside: the one whose loss lies furthest ABOVE the cell's fit without it (its deleted
    residual, r_i / (1 - h_ii), the leverage h from the fit's design), if that is more than :data:`OUTLIER_Z` standard
    errors (scale sqrt(1 / (1 - h_ii)), ``scale`` the sweep's pooled noise per run) and more than
    :data:`OUTLIER_FLOOR` of log loss. Only upward: a stalled or diverging run ends high, never low; with two seeds
    at a rate the two runs' deleted residuals are equal and opposite, so "up" is what says which one stalled. A run
    whose removal leaves the fit unidentified (h_ii = 1: a one-seed cell at three rates, the only run of a seed) is
    not judged; neither is any run of a sweep without a noise estimate (``scale`` 0)."""
    if not scale > 0 or design.shape[0] <= design.shape[1]:
        return None
    hat = np.einsum("ij,ji->i", design, np.linalg.pinv(design))
    free = hat < 1 - 1e-9
    if not free.any():
        return None
    deleted = np.where(free, fit.residuals / np.where(free, 1 - hat, 1.0), -np.inf)
    i = int(np.argmax(deleted))
    z = deleted[i] * math.sqrt(1 - hat[i]) / scale
    if not (z > OUTLIER_Z and deleted[i] > OUTLIER_FLOOR):
        return None
    return SetAside(fit.run_ids[i], float(fit.lrs[i]), int(fit.seeds[i]), float(deleted[i]), float(z))


def _cell_fit(
    cell: pd.DataFrame, g: pd.DataFrame, design: np.ndarray, theta: np.ndarray, seeds: tuple[int, ...], **fit
) -> tuple[_CellFit, np.ndarray]:
    """A fitted cell (``g``: the runs the design's rows stand for) and its design."""
    y = g["y"].to_numpy(float)
    residuals = y - design @ theta
    envelope = _described(cell, seeds, **fit)
    found = _CellFit(
        envelope,
        tuple(g["run_id"].astype(str)),
        g["lr"].to_numpy(float),
        g["seed"].to_numpy(int),
        residuals,
        int(np.linalg.matrix_rank(design)) + (fit.get("shape") == "split"),  # the split parabola's vertex too
    )
    return found, design


def _fit_cell(cell: pd.DataFrame) -> tuple[_CellFit, np.ndarray]:
    """One cell's parabola over the rates around its best measured mean, and its minimum: least squares with the
    curvature held at 0 or above (a cell whose three rates are concave gets the best line, and its minimum at an
    end: every cell's minimum is that of the best convex parabola)."""
    g = _window(cell)
    seeds = tuple(int(s) for s in sorted(g["seed"].unique()))
    centre = float(np.mean(np.unique(g["x"])))
    t = g["x"].to_numpy(float) - centre
    design = np.column_stack([t * t, t] + [(g["seed"].to_numpy() == s).astype(float) for s in seeds])
    theta = _least_squares(design, g["y"].to_numpy(float), nonnegative=(0,))
    c, b, levels = float(theta[0]), float(theta[1]), tuple(float(v) for v in theta[2:])
    fitted = np.sort(g["lr"].unique())
    swept = np.sort(cell["lr"].unique())
    t_star, edge = quadratic_minimum(
        b, c, math.log(fitted[0]) - centre, math.log(fitted[-1]) - centre, float(np.mean(levels))
    )
    best = {"low": fitted[0], "high": fitted[-1]}.get(edge, math.exp(centre + t_star))
    if edge and best != swept[0 if edge == "low" else -1]:
        edge = ""  # the end of the window inside the swept rates: the minimum lies in the grid, near that rate
    return _cell_fit(
        cell, g, design, theta, seeds,
        fitted=fitted, levels=levels, slope=b, curvature=c, centre=centre, best_lr=best, edge=edge,
    )  # fmt: skip


def _least_squares(design: np.ndarray, y: np.ndarray, nonnegative: tuple[int, ...]) -> np.ndarray:
    """The least-squares coefficients with those of ``nonnegative`` held at 0 or above: the unconstrained solution
    of each set of those coefficients fixed at 0, the feasible one with the smallest sum of squares (the objective is
    convex, so that is the constrained minimum; it is unique when the design has full rank)."""
    best, best_rss = None, math.inf
    for k in range(len(nonnegative) + 1):
        for fixed in itertools.combinations(nonnegative, k):
            free = [j for j in range(design.shape[1]) if j not in fixed]
            theta = np.zeros(design.shape[1])
            theta[free] = np.linalg.lstsq(design[:, free], y, rcond=None)[0]
            if any(theta[j] < 0 for j in nonnegative):
                continue
            rss = float(np.sum((design @ theta - y) ** 2))
            if rss < best_rss * (1 - 1e-12):  # ties (a coefficient fitted to 0 either way): the first, fewest fixed
                best, best_rss = theta, rss
    assert best is not None  # every coefficient of nonnegative fixed at 0 is always feasible
    return best


def _described(
    cell: pd.DataFrame, seeds: tuple[int, ...], *, fitted: np.ndarray, best_lr: float, **fit
) -> EnvelopeCell:
    """An :class:`EnvelopeCell` of ``cell``'s runs (what they are and measured) and of what was fitted (``fit``)."""
    swept = np.sort(cell["lr"].unique())
    by_rate = cell.groupby("lr")["val_loss"].mean()
    first = cell.iloc[0]
    return EnvelopeCell(
        sweep=str(first["sweep"]),
        curve=str(first["curve"]),
        variant=str(first["variant"]),
        n_layer=int(first["n_layer"]),
        d_model=int(first["d_model"]),
        tokens=float(first["tokens"]),
        params=float(cell["params"].astype(float).mean()),
        rates=tuple(float(r) for r in swept),
        rate_loss=tuple(float(by_rate[r]) for r in swept),
        seeds=seeds,
        fitted=tuple(float(r) for r in fitted),
        best_lr=float(best_lr),
        run_ids=tuple(cell["run_id"].astype(str)),
        **fit,
    )


def _fit_split(cell: pd.DataFrame) -> tuple[_CellFit, np.ndarray]:
    """One cell's split parabola over every rate swept: ln L = a_s + c_low (t - v)^2 below the vertex v and
    c_high (t - v)^2 above it, both curvatures >= 0, v within the swept range, by least squares.

    For a given v the model is linear in (c_low, c_high, a_s), with one answer (:func:`_least_squares`); v is the
    best of a grid of :data:`SPLIT_VERTICES` vertices over the swept range, refined between the grid's neighbours of
    the best. No starting point is involved, so the answer is a function of the data alone. A vertex at an end of
    the swept rates is an edge, as for the local parabola."""
    from scipy.optimize import minimize_scalar

    seeds = tuple(int(s) for s in sorted(cell["seed"].unique()))
    swept = np.sort(cell["lr"].unique())
    centre = float(np.mean(np.log(swept)))
    t = cell["x"].to_numpy(float) - centre
    y = cell["y"].to_numpy(float)
    levels = np.column_stack([(cell["seed"].to_numpy() == s).astype(float) for s in seeds])
    lo, hi = math.log(swept[0]) - centre, math.log(swept[-1]) - centre

    def design(v: float) -> np.ndarray:
        d = t - v
        return np.column_stack([np.where(d < 0, d * d, 0.0), np.where(d >= 0, d * d, 0.0), levels])

    def solve(v: float) -> tuple[np.ndarray, float]:
        x = design(v)
        theta = _least_squares(x, y, nonnegative=(0, 1))
        return theta, float(np.sum((x @ theta - y) ** 2))

    grid = np.linspace(lo, hi, SPLIT_VERTICES)
    losses = [solve(v)[1] for v in grid]
    i = int(np.argmin(losses))
    v = float(grid[i])
    if 0 < i < len(grid) - 1:
        refined = minimize_scalar(
            lambda u: solve(u)[1], bounds=(grid[i - 1], grid[i + 1]), method="bounded", options={"xatol": 1e-9}
        )
        if refined.fun <= losses[i]:
            v = float(refined.x)
    theta, _ = solve(v)
    edge = "low" if v <= lo + 1e-9 else "high" if v >= hi - 1e-9 else ""
    return _cell_fit(
        cell, cell, design(v), theta, seeds,
        fitted=swept, levels=tuple(float(a) for a in theta[2:]), slope=0.0, curvature=float(theta[0]),
        centre=centre, best_lr=math.exp(centre + v), edge=edge, shape="split", curvature_high=float(theta[1]),
        vertex=v,
    )  # fmt: skip


def _window(g: pd.DataFrame) -> pd.DataFrame:
    """A cell's runs at the LOCAL_RATES consecutive rates centred on its best mean loss (shifted inside the grid)."""
    rates = np.sort(g["lr"].unique())
    if rates.size <= LOCAL_RATES:
        return g
    best = int(np.argmin(g.groupby("lr")["val_loss"].mean().reindex(rates).to_numpy()))
    first = min(max(best - LOCAL_RATES // 2, 0), rates.size - LOCAL_RATES)
    return g[g["lr"].isin(rates[first : first + LOCAL_RATES])]


def quadratic_minimum(b: float, c: float, lo: float, hi: float, a: float) -> tuple[float, str]:
    """The minimum of a + b t + c t^2 over [lo, hi], and which end it sits on ("" when inside)."""
    if c > 0:
        t = -b / (2 * c)
        if t < lo:
            return lo, "low"
        if t > hi:
            return hi, "high"
        return t, ""
    # not convex: the lower of the two ends
    at_lo, at_hi = a + b * lo + c * lo * lo, a + b * hi + c * hi * hi
    return (lo, "low") if at_lo <= at_hi else (hi, "high")


def envelope_points(
    runs: pd.DataFrame,
    envelopes: Envelopes,
    *,
    method: str = "mean",
    rates: Mapping[tuple[str, int, int, float], float] | None = None,
) -> pd.DataFrame:
    """One point per cell from its envelope, in the columns of :func:`analysis.data.select.select_points` plus
    ``lr_edge`` and ``lr_extrapolated``.

    ``rates``: the rate to read each cell at, by (sweep, n_layer, d_model, tokens) (the paper's protocol: the
    baseline's best rates); default each cell's own best rate. ``method``: "mean", "median" or "best" over the
    seeds' fitted losses there.
    """
    from analysis.data.select import POINT_COLUMNS, aggregate_losses

    rows = []
    for cell in envelopes.cells:
        g = runs[runs["run_id"].astype(str).isin(cell.run_ids)]
        lr, extrapolated = cell.best_lr, False
        if rates is not None:
            wanted = _lookup(rates, cell)
            if wanted is not None:
                lr, extrapolated = cell.clip(wanted)
        losses = cell.seed_losses(lr)
        throughput = pd.to_numeric(g["tokens_per_s"], errors="coerce") * g["flops_per_token"]
        n_blocks = pd.to_numeric(g["n_blocks"], errors="coerce").iloc[0]
        rows.append(
            {
                "sweep": cell.sweep,
                "curve": cell.curve,
                "variant": cell.variant,
                "n_blocks": None if pd.isna(n_blocks) else int(n_blocks),
                "n_layer": cell.n_layer,
                "d_model": cell.d_model,
                "params": float(g["params"].mean()),
                "tokens": cell.tokens,
                "flops": float(g["flops"].mean()),
                "flops_per_token": float(g["flops_per_token"].mean()),
                "loss": aggregate_losses(losses, method),
                "lr": float(lr),
                "n_runs": len(g),
                "n_runs_total": len(g),
                "run_ids": tuple(sorted(cell.run_ids)),
                "run_losses": tuple(float(v) for v in losses),
                "run_seeds": cell.seeds,
                "flops_per_s": float(throughput.mean()) if throughput.notna().any() else math.nan,
                "lr_edge": cell.edge if rates is None or lr == cell.best_lr else "",
                "lr_extrapolated": extrapolated,
            }
        )
    columns = [*POINT_COLUMNS, "lr_edge", "lr_extrapolated"]
    if not rows:
        return pd.DataFrame(columns=columns)
    return (
        pd.DataFrame(rows, columns=columns)
        .sort_values(["sweep", "curve", "flops"], kind="stable")
        .reset_index(drop=True)
    )


def _lookup(rates: Mapping[tuple[str, int, int, float], float], cell: EnvelopeCell) -> float | None:
    for (sweep, n_layer, d_model, tokens), lr in rates.items():
        if (sweep, n_layer, d_model) == (cell.sweep, cell.n_layer, cell.d_model) and math.isclose(
            tokens, cell.tokens, rel_tol=1e-9
        ):
            return lr
    return None


def best_rates(envelopes: Envelopes, curve: str) -> dict[tuple[str, int, int, float], float]:
    """``curve``'s best rate per cell (the paper's protocol reads every variant there)."""
    return {(c.sweep, c.n_layer, c.d_model, c.tokens): c.best_lr for c in envelopes.cells if c.curve == curve}


@dataclass(frozen=True)
class RateLaw:
    """A curve's best learning rate against its parameters, lr* = lr_ref (N / N_ref)^exponent, fitted by least
    squares in log-log to its cells' best rates (``edges`` of them at an end of their swept rates: a bound, not a
    minimum, so the law is only as good as the cells inside)."""

    curve: str
    lr_ref: float
    params_ref: float
    exponent: float
    n_cells: int
    edges: int

    def lr_at(self, params: float | np.ndarray) -> float | np.ndarray:
        return self.lr_ref * (np.asarray(params, dtype=float) / self.params_ref) ** self.exponent

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "lr_ref": json_number(self.lr_ref),
            "params_ref": json_number(self.params_ref),
            "exponent": json_number(self.exponent),
            "n_cells": self.n_cells,
            "edges": self.edges,
        }


def rate_law(envelopes: Envelopes, curve: str) -> RateLaw | None:
    """The power law of ``curve``'s best rates in its parameters (None with fewer than two sizes)."""
    cells = [c for c in envelopes.cells if c.curve == curve]
    if len({round(c.params) for c in cells}) < 2:
        return None
    x = np.log([c.params for c in cells])
    y = np.log([c.best_lr for c in cells])
    slope, intercept = np.polyfit(x - x.mean(), y, 1)
    ref = float(np.exp(x.mean()))
    return RateLaw(curve, float(np.exp(intercept)), ref, float(slope), len(cells), sum(bool(c.edge) for c in cells))
