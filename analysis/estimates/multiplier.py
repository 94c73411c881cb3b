"""The effective compute multiplier of a variant over the baseline, with bootstrap intervals.

    M(C) = C_base(L_var(C)) / C

where C_base(L) inverts the baseline's fitted curve: the compute the baseline needs to reach loss L. M > 1
means the variant reaches at C the loss the baseline reaches only with M * C. Three ways to evaluate it:

* ``points``: at every measured budget, from the variant's measured loss there;
* ``curves``: from the variant's fitted curve at any C (the two curves fitted separately, so M depends on C
  when the exponents differ);
* ``shared``: from a joint fit with a shared exponent (and E), where M = (A_base / A_var)^(1 / alpha) is
  a constant.

Intervals come from one seeded bootstrap shared by all three (:func:`analysis.estimates.study.run_study`): every
replicate resamples the runs behind each point (or the curve's residuals where a point stands for a single run),
refits every curve, and recomputes every multiplier (:mod:`analysis.estimates.study_stats`), so the statistics of one
replicate are consistent.

The wall-clock multiplier charges the variant its measured speed: W = M * R_var / R_base, with R = tokens/s
x training FLOPs/token (the run's measured FLOP/s). It is the baseline's time to reach the variant's loss
divided by the variant's time, assuming the baseline's FLOP/s at the larger compute equals its FLOP/s at the
variant's budget (same model size); the throughput is taken as measured, so W's interval is M's scaled.

Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.base._threads import single_threaded_blas
from analysis.base.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT, Estimate, json_number
from analysis.base.errors import FitInputError
from analysis.estimates.study import BUDGETS, CurveData, Study, run_study
from analysis.estimates.study_stats import (
    Statistic,
    multiplier_estimates,
    replicates_ok,
    shared_log_multiplier,
)
from analysis.laws.fit import CurveFit, PowerLawFit, clean_inputs, fit_curve
from analysis.laws.forms import LawForm, form_of_curve, law_for
from analysis.laws.laws import CurvedPowerLaw, PowerLaw
from analysis.laws.optimizer import AUTO, Solution


def curve_fit_from(fit: PowerLawFit) -> CurveFit:
    """The internal form of a :class:`PowerLawFit` (no refit: the point estimate is taken as it is)."""
    law = law_for(fit.form)
    c, l = np.asarray(fit.compute), np.asarray(fit.loss)
    y = np.log(l)
    model = law.model(np.log(c), np.zeros(y.size, dtype=int), 1, y)
    theta = law.theta_from_curve(model, fit.law)
    sol = Solution(theta=theta, objective=fit.objective, status=fit.status, message=fit.message)
    return CurveFit(law=law, model=model, y=y, solution=sol)


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
    law: PowerLaw | CurvedPowerLaw
    fit: CurveFit | None = None
    data: CurveData | None = None
    delta: float | str = AUTO

    @property
    def form(self) -> LawForm:
        return form_of_curve(self.law) if self.fit is None else self.fit.law

    def thetas(self, study: Study) -> tuple[Any, np.ndarray, np.ndarray | None]:
        """(model, point theta (1, p), replicate theta (B, p) or None without a bootstrap)."""
        if self.fit is not None:
            reps = study.theta[self.label] if study.n_boot > 0 else None
            return self.fit.model, self.fit.theta[None], reps
        model = self.form.model(np.zeros(1), np.zeros(1, dtype=int), 1, np.zeros(1))  # x0 = 0
        theta = self.form.theta_from_curve(model, self.law)[None]
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
    if isinstance(obj, (PowerLaw, CurvedPowerLaw)):
        form_of_curve(obj).check_curve(obj, label)
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
    points = not isinstance(variant, (PowerLawFit, PowerLaw, CurvedPowerLaw))
    var = _points_side(variant, base, notes) if points else _side(variant, "variant")
    if shared_exponent and (points or base.fit is None or var.fit is None or base.form != var.form):
        raise FitInputError(
            "compute_multiplier: shared_exponent=True needs two fits (from fit_power_law) of the same form"
        )
    at_values = _at_values(at, var, points)
    sides = [s for s in (base, var) if s.fit is not None]
    # the replicates refit every curve at one loss scale: two fits made at different scales (each "auto" scale is set
    # from its own curve's residuals) are refitted at one scale pooled from both
    one_scale = len({s.delta for s in sides}) <= 1
    study = run_study(
        [s.data for s in sides],
        base.form.name,
        delta=base.delta if one_scale else AUTO,
        level=level,
        n_boot=n_boot if sides else 0,
        seed=seed,
        joint=shared_exponent,
        fits={s.label: s.fit for s in sides} if one_scale else None,
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
    n_params = base.form.n_params
    if np.unique(data.compute).size > n_params:
        with single_threaded_blas():
            var.fit = fit_curve(data.compute, data.loss, base.form, base.delta)
        var.law = var.fit.law.curve(var.fit.model, var.fit.theta)
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
) -> tuple[Statistic, str]:
    """log M at ``at_values`` with its replicates, and the method: "shared", "points" or "curves"."""
    labels = [s.label for s in (base, var) if s.fit is not None]
    ok = replicates_ok(study, labels)
    failed = 0 if ok is None else int((~ok).sum())
    df = study.df(*labels) if labels else math.inf
    log_c = np.log(at_values)
    bm, bt, br = base.thetas(study)
    invert = base.form.log_compute_for_loss  # the baseline's compute at a loss
    if shared_exponent:
        stat = shared_log_multiplier(study, "variant", "baseline", at_values)
        if stat.value.size == at_values.size:  # M changes with compute: one value per compute already
            return stat, "shared"
        draws = None if stat.draws is None else np.repeat(stat.draws, at_values.size, axis=1)
        return Statistic(np.repeat(stat.value, at_values.size), draws, stat.failed, stat.df), "shared"
    if points:
        data = var.data
        value = invert(bm, bt, np.log(data.loss)[None])[0] - log_c
        draws = None
        if ok is not None:
            y_pt = (
                study.y_point["variant"][ok]
                if var.fit is not None
                else np.broadcast_to(np.log(data.loss), (int(ok.sum()), data.loss.size))
            )
            draws = invert(bm, br[ok], y_pt) - log_c
        return Statistic(value, draws, failed, df), "points"
    vm, vt, vr = var.thetas(study)
    at = var.form.log_loss_at  # the variant's loss at a compute
    value = invert(bm, bt, at(vm, vt, log_c))[0] - log_c
    draws = None if ok is None else invert(bm, br[ok], at(vm, vr[ok], log_c)) - log_c
    return Statistic(value, draws, failed, df), "curves"
