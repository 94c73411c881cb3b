"""The bootstrap study behind every multiplier: point fits of a set of curves, and replicates of all of them.

:func:`run_study` fits every curve (and the joint fit with a shared exponent), then builds each bootstrap
replicate once for all curves and refits every fit on it, so all statistics of one replicate
(:mod:`analysis.estimates.study_stats`) come from the same resampled data. A replicate resamples the runs behind each
point (``interval="seeds"``) or the curves' budget-level residuals at budgets drawn once for every curve
(``interval="budgets"``). Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.base._threads import single_threaded_blas
from analysis.base.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT, modified_residuals, residual_draws, run_draws
from analysis.base.errors import FitInputError
from analysis.laws.fit import CurveFit, curves_delta, fit_curve, fit_joint_curves
from analysis.laws.forms import law_params, normalize_form
from analysis.laws.optimizer import AUTO, DEFAULT_STARTS, refit

SEEDS = "seeds"
BUDGETS = "budgets"
INTERVAL_METHODS = (BUDGETS, SEEDS)
# below this many budgets (either form) the bootstrap over budgets is not calibrated and its interval is marked
# unreliable: at 4 budgets the paper's form covers 0.82 of a nominal 0.90 (docs/analysis.md, "Coverage study")
MIN_BUDGETS = 5


@dataclass
class CurveData:
    """The points of one curve as the study fits them.

    ``run_losses[i]`` holds the losses of the runs behind point i when they are to be resampled (two or
    more seeds), else None (one run, or an IsoFLOP minimum: the residual bootstrap is used). ``n_runs[i]``
    counts the runs behind point i for the tables.
    """

    label: str
    compute: np.ndarray
    loss: np.ndarray
    run_losses: list[np.ndarray | None] = field(default_factory=list)
    n_runs: np.ndarray | None = None
    aggregate: str = "mean"
    budget_keys: list[Any] | None = None  # what names point i's budget across curves (default: its rank)
    run_seeds: list[np.ndarray | None] | None = None  # the seeds of run_losses[i] (for pairing across curves)

    def __post_init__(self) -> None:
        self.compute = np.asarray(self.compute, dtype=float)
        self.loss = np.asarray(self.loss, dtype=float)
        if not self.run_losses:
            self.run_losses = [None] * self.compute.size
        if self.n_runs is None:
            self.n_runs = np.array([1 if r is None else len(r) for r in self.run_losses])
        if self.budget_keys is None:
            self.budget_keys = [int(k) for k in np.argsort(np.argsort(self.compute, kind="stable"), kind="stable")]
        if self.run_seeds is None:
            self.run_seeds = [None] * self.compute.size

    @property
    def n_budgets(self) -> int:
        """Distinct budgets (compute values) behind the curve: the units the ``budgets`` bootstrap resamples."""
        return int(np.unique(self.compute).size)

    @property
    def observations(self) -> int:
        """Independent observations behind the fit (runs resampled, or 1 per residual-bootstrapped point)."""
        return int(sum(1 if r is None or len(r) < 2 else len(r) for r in self.run_losses))


@dataclass
class Study:
    """Point fits and bootstrap replicates of a set of curves (internal; read through
    :mod:`analysis.estimates.study_stats`)."""

    form: str
    delta: float
    level: float
    n_boot: int
    data: dict[str, CurveData]
    fits: dict[str, CurveFit]
    theta: dict[str, np.ndarray]  # (B, p) replicate parameters of each curve's own fit
    ok: dict[str, np.ndarray]  # (B,) replicate refit converged
    y_point: dict[str, np.ndarray]  # (B, n) replicate log losses of the measured points
    joint: CurveFit | None = None
    joint_labels: tuple[str, ...] = ()
    joint_theta: np.ndarray | None = None
    joint_ok: np.ndarray | None = None
    interval: str = "seeds"

    def df(self, *labels: str, joint: bool = False) -> float:
        """Residual degrees of freedom behind a statistic of these curves (for the expanded percentile).

        ``seeds``: observations (runs) minus parameters, summed over the curves. ``budgets``: the budgets of
        the curves minus the parameters of one curve's law (2, or 3 with E): the replicates vary by the
        budgets' deviations from the law, of which there are that many independent ones; the curves share
        their budgets (and their deviations are resampled together), so their counts do not add up.
        """
        if self.interval == BUDGETS:
            labs = self.joint_labels if joint and self.joint is not None else labels
            if not labs:
                return math.inf
            n_law = law_params(self.form)
            return float(min(self.data[lab].n_budgets for lab in labs) - n_law)
        if joint and self.joint is not None:
            return float(sum(self.data[lab].observations for lab in self.joint_labels) - self.joint.model.n_params)
        return float(sum(self.data[lab].observations - self.fits[lab].model.n_params for lab in labels))


def run_study(
    curves: Sequence[CurveData],
    form: str,
    *,
    delta: float | str = AUTO,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    joint: bool = True,
    fits: dict[str, CurveFit] | None = None,
    n_starts: int = DEFAULT_STARTS,
    interval: str = SEEDS,
) -> Study:
    """Fit every curve (and the joint fit of all of them), then bootstrap all fits together.

    ``delta``: the robust loss's scale, or "auto" (one scale for every fit of the study, from the least-squares
    residuals of the curves fitted one by one: :func:`analysis.laws.optimizer.data_scale`); :attr:`Study.delta` holds
    the number used.

    Replicate b of every curve is built first, then every curve and the joint fit are refitted on replicate
    b, so all statistics of one replicate come from the same resampled data. ``fits`` may hold point fits
    already made (they are not redone). ``interval`` says how a replicate is built:

    * ``"seeds"``: the runs behind each point are resampled (a point with one run: fitted value plus a
      resampled residual). Only seed noise: the budgets' deviations from the law are held fixed.
    * ``"budgets"``: every point is its curve's fitted value plus a residual of that curve (leverage-corrected,
      centred) drawn at a resampled budget, the same budget for every curve that has the same budgets: a
      residual bootstrap over budgets. A budget's residual holds its seed noise (the mean of its seeds) and
      its deviation from the law, so both are covered; drawing the same budget for the baseline and each
      variant keeps what they share (the same seeds, i.e. the same init and batches, and any deviation common
      to all variants), which cancels in M.
    """
    form = normalize_form(form)
    if interval not in INTERVAL_METHODS:
        raise FitInputError(f"interval={interval!r}: use one of {', '.join(INTERVAL_METHODS)}")
    with single_threaded_blas():  # one scale for every fit of the study ("auto": from the curves' own residuals)
        delta = curves_delta([(c.compute, c.loss) for c in curves], form, delta, n_starts)
    if interval == BUDGETS:
        return _run_budget_study(curves, form, delta, level, n_boot, seed, joint, dict(fits or {}), n_starts)
    fits = dict(fits or {})
    rng = np.random.default_rng(seed)
    data = {c.label: c for c in curves}
    thetas, oks, y_points, y_fits = {}, {}, {}, {}
    with single_threaded_blas():
        _fit_missing(curves, fits, form, delta, n_starts)
        for c in curves:
            fit = fits[c.label]
            if n_boot == 0:
                continue
            draws = residual_draws(fit.resampling_residuals(), n_boot, rng)
            y_fit = fit.fitted + draws
            y_pt = fit.y + draws  # a single measured point varies by the curve's own noise
            for i, runs in enumerate(c.run_losses):
                if runs is not None and len(runs) >= 2:
                    y_fit[:, i] = y_pt[:, i] = run_draws(runs, n_boot, rng, c.aggregate)
            thetas[c.label], oks[c.label] = refit(fit.model, fit.theta, y_fit, None, delta)
            y_points[c.label], y_fits[c.label] = y_pt, y_fit
        study = Study(form, delta, level, n_boot, data, fits, thetas, oks, y_points)
        _add_joint(study, curves, joint, n_starts, lambda jf: np.concatenate([y_fits[c.label] for c in curves], axis=1))
    return study


def _fit_missing(
    curves: Sequence[CurveData], fits: dict[str, CurveFit], form: str, delta: float, n_starts: int
) -> None:
    """Fit, into ``fits``, every curve not fitted yet (both bootstrap methods start from the point fits)."""
    for c in curves:
        if c.label not in fits:
            fits[c.label] = fit_curve(c.compute, c.loss, form, delta, n_starts)


def _add_joint(
    study: Study, curves: Sequence[CurveData], joint: bool, n_starts: int, replicate: Callable[[CurveFit], np.ndarray]
) -> None:
    """The joint fit with a shared exponent, and its replicates: refitted on ``replicate(joint_fit)``, the (B, n)
    resampled log losses of all curves' points in the joint fit's order."""
    if not (joint and len(curves) >= 2):
        return
    labels = tuple(c.label for c in curves)
    study.joint = fit_joint_curves(
        [c.compute for c in curves], [c.loss for c in curves], study.form, study.delta, n_starts
    )
    study.joint_labels = labels
    if study.n_boot > 0:
        study.joint_theta, study.joint_ok = refit(
            study.joint.model, study.joint.theta, replicate(study.joint), None, study.delta
        )


def _run_budget_study(
    curves: Sequence[CurveData],
    form: str,
    delta: float,
    level: float,
    n_boot: int,
    seed: int,
    joint: bool,
    fits: dict[str, CurveFit],
    n_starts: int,
) -> Study:
    """:func:`run_study` with ``interval="budgets"``: budget-level residuals drawn at budgets resampled once
    per replicate for every curve with the same budgets as the first curve (the baseline), independently
    for the others. The joint fit is resampled from its own residuals at the same draws."""
    rng = np.random.default_rng(seed)
    data = {c.label: c for c in curves}
    thetas, oks, y_points, picks = {}, {}, {}, {}
    with single_threaded_blas():
        _fit_missing(curves, fits, form, delta, n_starts)
        ref_keys = list(curves[0].budget_keys) if curves else []
        shared = None
        if n_boot > 0 and ref_keys:
            shared = rng.integers(0, len(ref_keys), size=(n_boot, len(ref_keys)))
        for c in curves:
            fit = fits[c.label]
            if n_boot == 0:
                continue
            picks[c.label] = pick = _budget_picks(c, ref_keys, shared, n_boot, rng)
            draws = fit.resampling_residuals()[pick]
            thetas[c.label], oks[c.label] = refit(fit.model, fit.theta, fit.fitted + draws, None, delta)
            y_points[c.label] = fit.y + draws
        study = Study(form, delta, level, n_boot, data, fits, thetas, oks, y_points, interval=BUDGETS)
        _add_joint(study, curves, joint, n_starts, lambda jf: _joint_budget_draws(jf, curves, picks))
    return study


def _joint_budget_draws(jf: CurveFit, curves: Sequence[CurveData], picks: dict[str, np.ndarray]) -> np.ndarray:
    """(B, n) replicates of the joint fit: its fitted values plus its own residuals (leverage-corrected, centred
    per curve), each curve's drawn at the budgets ``picks`` drew for that curve's own fit."""
    _, jac = jf.model.predict(jf.theta[None], jac=True)
    resid = modified_residuals(jf.y - jf.fitted, jac[0])
    parts = []
    for g, c in enumerate(curves):
        r = resid[jf.model.group == g]
        parts.append((r - r.mean())[picks[c.label]])
    return jf.fitted + np.concatenate(parts, axis=1)


def _budget_picks(
    c: CurveData, ref_keys: list[Any], shared: np.ndarray | None, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """(B, n) indices into curve ``c``'s points: whose residual each point gets in each replicate."""
    keys = list(c.budget_keys)
    same = sorted(map(repr, keys)) == sorted(map(repr, ref_keys)) and len(set(map(repr, keys))) == len(keys)
    if shared is not None and same:
        # point i of this curve sits at budget ref_keys[slot[i]]; it gets this curve's residual at the budget
        # drawn for that slot
        where = {repr(k): i for i, k in enumerate(keys)}
        slot = np.array([[r for r, k in enumerate(ref_keys) if repr(k) == repr(key)][0] for key in keys])
        to_point = np.array([where[repr(k)] for k in ref_keys])
        return to_point[shared[:, slot]]
    return rng.integers(0, len(keys), size=(n_boot, len(keys)))
