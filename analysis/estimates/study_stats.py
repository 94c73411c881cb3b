"""Statistics of a bootstrap study (:mod:`analysis.estimates.study`), each as a point value and its replicates.

The log multipliers of a variant over the baseline (M = C_base(L_var(C)) / C, in log space, where percentiles
commute with exp): at the variant's measured points, from the two separately fitted curves, and from the joint
fit with a shared exponent; and the difference of the curves' exponents with its bootstrap p-value. A replicate
whose refit failed on any curve behind a statistic is left out of that statistic and counted. Pure numpy; never
imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.base.bootstrap import Estimate, estimate
from analysis.base.errors import FitInputError
from analysis.estimates.study import Study


@dataclass(frozen=True)
class Statistic:
    """A statistic of a study: its point value, its replicates, the replicates left out, and its degrees of freedom."""

    value: np.ndarray  # (n,) point estimates (log M, or a parameter)
    draws: np.ndarray | None  # (B_ok, n) replicates
    failed: int
    df: float


def replicates_ok(study: Study, labels: Sequence[str], joint: bool = False) -> np.ndarray | None:
    """(B,) whether every refit behind a statistic of these curves (and the joint fit) converged; None without a
    bootstrap."""
    if study.n_boot == 0:
        return None
    ok = np.ones(study.n_boot, dtype=bool)
    for lab in labels:
        ok &= study.ok[lab]
    if joint and study.joint_ok is not None:
        ok &= study.joint_ok
    return ok


def points_log_multiplier(study: Study, variant: str, baseline: str) -> Statistic:
    """log M at each measured point of ``variant``: the baseline curve inverted at the measured loss."""
    b, v = study.fits[baseline], study.data[variant]
    log_c = np.log(v.compute)
    value = b.law.log_compute_for_loss(b.model, b.theta[None], np.log(v.loss)[None])[0] - log_c
    ok = replicates_ok(study, (baseline, variant))
    draws = None
    if ok is not None:
        draws = b.law.log_compute_for_loss(b.model, study.theta[baseline][ok], study.y_point[variant][ok]) - log_c
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def curves_log_multiplier(study: Study, variant: str, baseline: str, compute: np.ndarray) -> Statistic:
    """log M(C) from the two separately fitted curves at the given compute values."""
    b, v = study.fits[baseline], study.fits[variant]
    log_c = np.log(np.asarray(compute, dtype=float))
    y_v = v.law.log_loss_at(v.model, v.theta[None], log_c)
    value = b.law.log_compute_for_loss(b.model, b.theta[None], y_v)[0] - log_c
    ok = replicates_ok(study, (baseline, variant))
    draws = None
    if ok is not None:
        y_v = v.law.log_loss_at(v.model, study.theta[variant][ok], log_c)
        draws = b.law.log_compute_for_loss(b.model, study.theta[baseline][ok], y_v) - log_c
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def shared_log_multiplier(study: Study, variant: str, baseline: str, compute: np.ndarray | None = None) -> Statistic:
    """log M from the joint fit: one value where the form's M is the same at every C (the power laws: (log A_base -
    log A_var) / alpha), else one per ``compute`` (:meth:`analysis.laws.forms.LawForm.shared_log_multiplier`)."""
    if study.joint is None:
        raise FitInputError("the shared-exponent multiplier needs a joint fit of at least two curves")
    law, model, labels = study.joint.law, study.joint.model, study.joint_labels
    gb, gv = labels.index(baseline), labels.index(variant)
    log_c = None if compute is None else np.log(np.asarray(compute, dtype=float))

    def stat(theta: np.ndarray) -> np.ndarray:
        return law.shared_log_multiplier(model, theta, gb, gv, log_c)

    value = stat(study.joint.theta[None])[0]
    ok = replicates_ok(study, (), joint=True)
    draws = None if ok is None else stat(study.joint_theta[ok])
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(joint=True))


def exponent_difference(study: Study, variant: str, baseline: str) -> Statistic:
    """alpha_var - alpha_base from the separate fits (the test of a shared exponent)."""
    b, v = study.fits[baseline], study.fits[variant]
    value = v.law.exponent(v.model, v.theta[None]) - b.law.exponent(b.model, b.theta[None])
    ok = replicates_ok(study, (baseline, variant))
    draws = None
    if ok is not None:
        draws = (
            v.law.exponent(v.model, study.theta[variant][ok]) - b.law.exponent(b.model, study.theta[baseline][ok])
        )[:, None]
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def multiplier_estimates(stat: Statistic, level: float) -> list[Estimate]:
    """exp of a log-multiplier statistic, as Estimates (percentiles commute with exp)."""
    out = []
    for i, value in enumerate(stat.value):
        draws = None if stat.draws is None else np.exp(stat.draws[:, i])
        out.append(estimate(float(np.exp(value)), draws, level, stat.df, stat.failed))
    return out


def bootstrap_p_value(draws: np.ndarray | None) -> float:
    """Two-sided bootstrap p-value of "the statistic is 0": twice the smaller share of replicates on either side."""
    if draws is None or draws.size == 0:
        return math.nan
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return math.nan
    return float(min(1.0, 2.0 * min(np.mean(draws <= 0), np.mean(draws >= 0))))
