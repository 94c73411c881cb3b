"""The effective compute multiplier of a variant over the baseline, with bootstrap intervals.

    M(C) = C_base(L_var(C)) / C

where C_base(L) inverts the baseline's fitted curve: the compute the baseline needs to reach loss L. M > 1
means the variant reaches at C the loss the baseline reaches only with M * C. Three ways to evaluate it:

* ``points``: at every measured budget, from the variant's measured loss there;
* ``curves``: from the variant's fitted curve at any C (the two curves fitted separately, so M depends on C
  when the exponents differ);
* ``shared``: from a joint fit with a shared exponent (and E), where M = (A_base / A_var)^(1 / alpha) is
  a constant.

Intervals come from one seeded bootstrap shared by all three (:func:`run_study`): every replicate
resamples the runs behind each point (or the curve's residuals where a point stands for a single run),
refits every curve, and recomputes every multiplier, so the statistics of one replicate are consistent.

The wall-clock multiplier charges the variant its measured speed: W = M * R_var / R_base, with R = tokens/s
x training FLOPs/token (the run's measured FLOP/s). It is the baseline's time to reach the variant's loss
divided by the variant's time, assuming the baseline's FLOP/s at the larger compute equals its FLOP/s at the
variant's budget (same model size); the throughput is taken as measured, so W's interval is M's scaled.

Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis._threads import single_threaded_blas
from analysis.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_N_BOOT,
    Estimate,
    estimate,
    json_number,
    modified_residuals,
    residual_draws,
    run_draws,
)
from analysis.errors import FitInputError
from analysis.fit import (
    DEFAULT_STARTS,
    HUBER_DELTA,
    OFFSET_POWER,
    POWER,
    CurveFit,
    PowerLaw,
    PowerLawFit,
    _PowerModel,
    _refit,
    _Solution,
    clean_inputs,
    fit_curve,
    fit_joint_curves,
    law_arrays,
    normalize_form,
)

# ---------------------------------------------------------------------------------------------------------
# The bootstrap study: point fits of every curve, and replicates of all of them at once
# ---------------------------------------------------------------------------------------------------------

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
    """Point fits and bootstrap replicates of a set of curves (internal; read through the functions below)."""

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
            n_law = 3 if self.form == OFFSET_POWER else 2
            return float(min(self.data[lab].n_budgets for lab in labs) - n_law)
        if joint and self.joint is not None:
            return float(sum(self.data[lab].observations for lab in self.joint_labels) - self.joint.model.n_params)
        return float(sum(self.data[lab].observations - self.fits[lab].model.n_params for lab in labels))


def _theta_from_law(model: _PowerModel, law: PowerLaw) -> np.ndarray:
    alpha = law.alpha
    a = math.log(law.A) - alpha * model.x0
    return np.array([law.E, alpha, a] if model.offset else [alpha, a], dtype=float)


def curve_fit_from(fit: PowerLawFit) -> CurveFit:
    """The internal form of a :class:`PowerLawFit` (no refit: the point estimate is taken as it is)."""
    c, l = np.asarray(fit.compute), np.asarray(fit.loss)
    y = np.log(l)
    model = _PowerModel(np.log(c), np.zeros(y.size, dtype=int), 1, fit.form == OFFSET_POWER, y)
    theta = _theta_from_law(model, fit.law)
    sol = _Solution(theta=theta, objective=fit.objective, status=fit.status, message=fit.message)
    return CurveFit(model=model, y=y, solution=sol)


def run_study(
    curves: Sequence[CurveData],
    form: str,
    *,
    delta: float = HUBER_DELTA,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    joint: bool = True,
    fits: dict[str, CurveFit] | None = None,
    n_starts: int = DEFAULT_STARTS,
    interval: str = SEEDS,
) -> Study:
    """Fit every curve (and the joint fit of all of them), then bootstrap all fits together.

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
            thetas[c.label], oks[c.label] = _refit(fit.model, fit.theta, y_fit, None, delta)
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
        study.joint_theta, study.joint_ok = _refit(
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
            thetas[c.label], oks[c.label] = _refit(fit.model, fit.theta, fit.fitted + draws, None, delta)
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


# ---------------------------------------------------------------------------------------------------------
# Statistics of a study (point value and replicates, in log space)
# ---------------------------------------------------------------------------------------------------------


def log_compute_for_loss(model: _PowerModel, theta: np.ndarray, y: np.ndarray, g: int = 0) -> np.ndarray:
    """log C at which curve g of a batch of theta (B, p) reaches log loss y (B, n); +inf at or below E."""
    log_a, alpha, e_value = law_arrays(model, theta, g)
    y = np.asarray(y, dtype=float)
    y = y if y.ndim == 2 else np.broadcast_to(y, (log_a.size,) + y.shape[-1:])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if model.offset:
            gap = np.exp(y) - e_value[:, None]
            log_gap = np.where(gap > 0, np.log(np.where(gap > 0, gap, 1.0)), -np.inf)
        else:
            log_gap = y
        return (log_a[:, None] - log_gap) / alpha[:, None]


def log_loss_at(model: _PowerModel, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
    """log L of curve g for a batch of theta (B, p) at log compute values (n,): (B, n)."""
    log_a, alpha, e_value = law_arrays(model, theta, g)
    power = log_a[:, None] - alpha[:, None] * np.asarray(log_c, dtype=float)[None, :]
    if not model.offset:
        return power
    with np.errstate(divide="ignore"):
        return np.logaddexp(np.log(e_value)[:, None], power)


@dataclass(frozen=True)
class _Stat:
    value: np.ndarray  # (n,) point estimates (log M, or a parameter)
    draws: np.ndarray | None  # (B_ok, n) replicates
    failed: int
    df: float


def _mask(study: Study, labels: Sequence[str], joint: bool = False) -> np.ndarray | None:
    if study.n_boot == 0:
        return None
    ok = np.ones(study.n_boot, dtype=bool)
    for lab in labels:
        ok &= study.ok[lab]
    if joint and study.joint_ok is not None:
        ok &= study.joint_ok
    return ok


def points_log_multiplier(study: Study, variant: str, baseline: str) -> _Stat:
    """log M at each measured point of ``variant``: the baseline curve inverted at the measured loss."""
    b, v = study.fits[baseline], study.data[variant]
    log_c = np.log(v.compute)
    value = log_compute_for_loss(b.model, b.theta[None], np.log(v.loss)[None])[0] - log_c
    ok = _mask(study, (baseline, variant))
    draws = None
    if ok is not None:
        draws = log_compute_for_loss(b.model, study.theta[baseline][ok], study.y_point[variant][ok]) - log_c
    return _Stat(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def curves_log_multiplier(study: Study, variant: str, baseline: str, compute: np.ndarray) -> _Stat:
    """log M(C) from the two separately fitted curves at the given compute values."""
    b, v = study.fits[baseline], study.fits[variant]
    log_c = np.log(np.asarray(compute, dtype=float))
    y_v = log_loss_at(v.model, v.theta[None], log_c)
    value = log_compute_for_loss(b.model, b.theta[None], y_v)[0] - log_c
    ok = _mask(study, (baseline, variant))
    draws = None
    if ok is not None:
        y_v = log_loss_at(v.model, study.theta[variant][ok], log_c)
        draws = log_compute_for_loss(b.model, study.theta[baseline][ok], y_v) - log_c
    return _Stat(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def shared_log_multiplier(study: Study, variant: str, baseline: str) -> _Stat:
    """log M = (log A_base - log A_var) / alpha from the joint fit (constant in C)."""
    if study.joint is None:
        raise FitInputError("the shared-exponent multiplier needs a joint fit of at least two curves")
    model, labels = study.joint.model, study.joint_labels
    gb, gv = labels.index(baseline), labels.index(variant)

    def stat(theta: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (model.log_a(theta, gb) - model.log_a(theta, gv)) / model.alpha(theta)

    value = stat(study.joint.theta[None])
    ok = _mask(study, (), joint=True)
    draws = None if ok is None else stat(study.joint_theta[ok])[:, None]
    return _Stat(value, draws, 0 if ok is None else int((~ok).sum()), study.df(joint=True))


def exponent_difference(study: Study, variant: str, baseline: str) -> _Stat:
    """alpha_var - alpha_base from the separate fits (the test of a shared exponent)."""
    b, v = study.fits[baseline], study.fits[variant]
    value = v.model.alpha(v.theta[None]) - b.model.alpha(b.theta[None])
    ok = _mask(study, (baseline, variant))
    draws = None
    if ok is not None:
        draws = (v.model.alpha(study.theta[variant][ok]) - b.model.alpha(study.theta[baseline][ok]))[:, None]
    return _Stat(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def multiplier_estimates(stat: _Stat, level: float) -> list[Estimate]:
    """exp of a log-multiplier statistic, as Estimates (percentiles commute with exp)."""
    out = []
    for i, value in enumerate(stat.value):
        draws = None if stat.draws is None else np.exp(stat.draws[:, i])
        out.append(estimate(float(np.exp(value)), draws, level, stat.df))
    return out


def bootstrap_p_value(draws: np.ndarray | None) -> float:
    """Two-sided bootstrap p-value of "the statistic is 0": twice the smaller share of replicates on either side."""
    if draws is None or draws.size == 0:
        return math.nan
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return math.nan
    return float(min(1.0, 2.0 * min(np.mean(draws <= 0), np.mean(draws >= 0))))


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultiplierResult:
    """Compute multipliers M of a variant over the baseline at ``compute``, with intervals.

    ``method``: "points" (the variant's measured losses, one M per point), "curves" (the variant's fitted
    curve, separate exponents) or "shared" (a joint fit with a shared exponent: M is the same at every C).
    Intervals are NaN when neither side carries data to resample (both given as bare :class:`PowerLaw`).
    """

    compute: tuple[float, ...]
    multiplier: tuple[Estimate, ...]
    method: str
    level: float
    n_boot: int
    n_boot_failed: int
    n_runs_baseline: int
    n_runs_variant: tuple[int, ...]
    note: str = ""

    @property
    def values(self) -> np.ndarray:
        return np.array([m.value for m in self.multiplier])

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "level": self.level,
            "n_boot": self.n_boot,
            "n_boot_failed": self.n_boot_failed,
            "n_runs_baseline": self.n_runs_baseline,
            "points": [
                {"compute": json_number(c), "multiplier": m.to_dict(), "n_runs_variant": n}
                for c, m, n in zip(self.compute, self.multiplier, self.n_runs_variant)
            ],
            "note": self.note,
        }


def wall_clock_multiplier(
    multiplier: Estimate | float, variant_flops_per_s: float, baseline_flops_per_s: float
) -> Estimate:
    """W = M * R_var / R_base: the baseline's wall time to reach the variant's loss over the variant's.

    R is a run's measured training throughput in FLOP/s (tokens_per_s * flops_per_token); both at the same
    model size. A variant 10% slower per FLOP keeps ~0.9 of its compute multiplier in wall-clock terms.
    """
    m = multiplier if isinstance(multiplier, Estimate) else Estimate(float(multiplier))
    ratio = float(variant_flops_per_s) / float(baseline_flops_per_s)
    if not (math.isfinite(ratio) and ratio > 0):
        return Estimate(math.nan, math.nan, math.nan, m.level)
    return Estimate(m.value * ratio, m.low * ratio, m.high * ratio, m.level)


@dataclass
class _Side:
    """One side of :func:`compute_multiplier`: a curve, and its data and fit when it has them."""

    label: str
    law: PowerLaw
    fit: CurveFit | None = None
    data: CurveData | None = None
    delta: float = HUBER_DELTA

    @property
    def form(self) -> str:
        return self.law.form if self.fit is None else (OFFSET_POWER if self.fit.model.offset else POWER)

    def thetas(self, study: Study) -> tuple[_PowerModel, np.ndarray, np.ndarray | None]:
        """(model, point theta (1, p), replicate theta (B, p) or None without a bootstrap)."""
        if self.fit is not None:
            reps = study.theta[self.label] if study.n_boot > 0 else None
            return self.fit.model, self.fit.theta[None], reps
        model = _PowerModel(np.zeros(1), np.zeros(1, dtype=int), 1, self.law.E != 0.0, np.zeros(1))  # x0 = 0
        theta = _theta_from_law(model, self.law)[None]
        reps = np.broadcast_to(theta, (study.n_boot, theta.shape[1])) if study.n_boot > 0 else None
        return model, theta, reps


def _side(obj: Any, label: str) -> _Side:
    if isinstance(obj, PowerLawFit):
        return _Side(
            label,
            obj.law,
            curve_fit_from(obj),
            CurveData(label, np.asarray(obj.compute), np.asarray(obj.loss)),
            obj.delta,
        )
    if isinstance(obj, PowerLaw):
        if not (obj.A > 0 and obj.alpha > 0 and obj.E >= 0):
            raise FitInputError(f"compute_multiplier: {label} curve needs A > 0, alpha > 0 and E >= 0, got {obj}")
        return _Side(label, obj)
    raise FitInputError(
        f"compute_multiplier: {label} must be a PowerLawFit (from fit_power_law) or a PowerLaw"
        + (", or for the variant a pair (compute, loss)" if label == "variant" else "")
        + f"; got {type(obj).__name__}"
    )


def compute_multiplier(
    baseline: PowerLawFit | PowerLaw,
    variant: PowerLawFit | PowerLaw | tuple[Sequence[float], Sequence[float]],
    at: float | Sequence[float] | None = None,
    *,
    shared_exponent: bool = False,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    resample: str = BUDGETS,
) -> MultiplierResult:
    """The effective compute multiplier M(C) = C_base(L_var(C)) / C of ``variant`` over ``baseline``.

    * ``variant`` a fit or a :class:`PowerLaw`: M from the curves at ``at`` (one compute value or several;
      default: the variant's measured compute values). With ``shared_exponent=True`` (two fits of the same
      form) their data are refitted jointly with one exponent and M is a constant.
    * ``variant`` a pair ``(compute, loss)`` of measured points: M at each point, by inverting the
      baseline curve at the measured loss (``at`` is not used).

    Compute is in the unit the baseline was fitted in. Intervals come from a seeded bootstrap of every side
    that carries data (a :class:`PowerLawFit`, or measured points, whose noise is estimated from a fit to
    them when there are more points than parameters); a bare :class:`PowerLaw`, such as a published fit,
    is taken as exact, so two bare curves give no interval. ``resample``: how a replicate is made, "budgets"
    (default, as ``attnres fit``: each budget's deviation from the law resampled over budgets) or "seeds"
    (:func:`run_study`).

    >>> base = PowerLaw(A=1.891, alpha=0.057)            # the paper's fits, C in PFLOP/s-days
    >>> block = PowerLaw(A=1.870, alpha=0.058)
    >>> round(compute_multiplier(base, block, at=5.6).multiplier[0].value, 2)
    1.25
    """
    if not 0 < level < 1:
        raise FitInputError(f"level must be between 0 and 1 (e.g. 0.9 for a 90% interval), got {level!r}")
    if n_boot < 0:
        raise FitInputError(f"n_boot must be >= 0 (0 skips the bootstrap), got {n_boot!r}")
    base = _side(baseline, "baseline")
    notes: list[str] = []
    points = not isinstance(variant, (PowerLawFit, PowerLaw))
    var = _points_side(variant, base, notes) if points else _side(variant, "variant")
    if shared_exponent and (points or base.fit is None or var.fit is None or base.form != var.form):
        raise FitInputError(
            "compute_multiplier: shared_exponent=True needs two fits (from fit_power_law) of the same form"
        )
    at_values = _at_values(at, var, points)
    sides = [s for s in (base, var) if s.fit is not None]
    study = run_study(
        [s.data for s in sides],
        base.form,
        delta=base.delta,
        level=level,
        n_boot=n_boot if sides else 0,
        seed=seed,
        joint=shared_exponent,
        fits={s.label: s.fit for s in sides},
        interval=resample,
    )
    stat, method = _log_multiplier(study, base, var, at_values, shared_exponent, points)
    n_var = 1 if points else (var.data.compute.size if var.data is not None else 0)
    return MultiplierResult(
        compute=tuple(float(c) for c in at_values),
        multiplier=tuple(multiplier_estimates(stat, level)),
        method=method,
        level=level,
        n_boot=study.n_boot,
        n_boot_failed=stat.failed,
        n_runs_baseline=base.data.compute.size if base.data is not None else 0,
        n_runs_variant=tuple(n_var for _ in at_values),
        note="; ".join(notes),
    )


def _points_side(variant: Any, base: _Side, notes: list[str]) -> _Side:
    """The variant side of :func:`compute_multiplier` from measured points ``(compute, loss)``: fitted in the
    baseline's form when there are more points than parameters (to estimate their noise), else the
    baseline's curve with a note."""
    try:
        compute, loss = variant
    except (TypeError, ValueError):
        raise FitInputError(
            "compute_multiplier: variant must be a fit, a PowerLaw, or a pair (compute, loss)"
        ) from None
    arrays, _ = clean_inputs({"compute": compute, "loss": loss}, None, 1, "compute_multiplier(variant points)")
    data = CurveData("variant", arrays["compute"], arrays["loss"])
    var = _Side("variant", base.law, None, data, base.delta)
    n_params = 3 if base.form == OFFSET_POWER else 2
    if np.unique(data.compute).size > n_params:
        with single_threaded_blas():
            var.fit = fit_curve(data.compute, data.loss, base.form, base.delta)
        var.law = var.fit.model.law(var.fit.theta)
    else:
        notes.append("too few variant points to estimate their noise: the interval reflects the baseline fit only")
    return var


def _at_values(at: float | Sequence[float] | None, var: _Side, points: bool) -> np.ndarray:
    """The compute values M is computed at: the measured points, ``at``, or the variant's measured compute."""
    if points:
        return var.data.compute
    if at is None:
        if var.data is None:
            raise FitInputError("compute_multiplier: give `at=` (compute values) when the variant is a bare PowerLaw")
        return np.unique(var.data.compute)
    at_values = np.atleast_1d(np.asarray(at, dtype=float)).reshape(-1)
    if at_values.size == 0 or not np.all(np.isfinite(at_values) & (at_values > 0)):
        raise FitInputError(f"compute_multiplier: `at` must be positive, finite compute values, got {at!r}")
    return at_values


def _log_multiplier(
    study: Study, base: _Side, var: _Side, at_values: np.ndarray, shared_exponent: bool, points: bool
) -> tuple[_Stat, str]:
    """log M at ``at_values`` with its replicates, and the method: "shared", "points" or "curves"."""
    labels = [s.label for s in (base, var) if s.fit is not None]
    ok = _mask(study, labels)
    failed = 0 if ok is None else int((~ok).sum())
    df = study.df(*labels) if labels else math.inf
    log_c = np.log(at_values)
    bm, bt, br = base.thetas(study)
    if shared_exponent:
        stat = shared_log_multiplier(study, "variant", "baseline")
        draws = None if stat.draws is None else np.repeat(stat.draws, at_values.size, axis=1)
        return _Stat(np.repeat(stat.value, at_values.size), draws, stat.failed, stat.df), "shared"
    if points:
        data = var.data
        value = log_compute_for_loss(bm, bt, np.log(data.loss)[None])[0] - log_c
        draws = None
        if ok is not None:
            y_pt = (
                study.y_point["variant"][ok]
                if var.fit is not None
                else np.broadcast_to(np.log(data.loss), (int(ok.sum()), data.loss.size))
            )
            draws = log_compute_for_loss(bm, br[ok], y_pt) - log_c
        return _Stat(value, draws, failed, df), "points"
    vm, vt, vr = var.thetas(study)
    value = log_compute_for_loss(bm, bt, log_loss_at(vm, vt, log_c))[0] - log_c
    draws = None if ok is None else log_compute_for_loss(bm, br[ok], log_loss_at(vm, vr[ok], log_c)) - log_c
    return _Stat(value, draws, failed, df), "curves"
