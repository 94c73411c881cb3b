"""Statistics of a bootstrap study (:mod:`analysis.study`), each as a point value and its replicates.

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

from analysis.bootstrap import Estimate, estimate
from analysis.errors import FitInputError
from analysis.models import PowerModel, law_arrays
from analysis.study import Study


def log_compute_for_loss(model: PowerModel, theta: np.ndarray, y: np.ndarray, g: int = 0) -> np.ndarray:
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


def log_loss_at(model: PowerModel, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
    """log L of curve g for a batch of theta (B, p) at log compute values (n,): (B, n)."""
    log_a, alpha, e_value = law_arrays(model, theta, g)
    power = log_a[:, None] - alpha[:, None] * np.asarray(log_c, dtype=float)[None, :]
    if not model.offset:
        return power
    with np.errstate(divide="ignore"):
        return np.logaddexp(np.log(e_value)[:, None], power)


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
    value = log_compute_for_loss(b.model, b.theta[None], np.log(v.loss)[None])[0] - log_c
    ok = replicates_ok(study, (baseline, variant))
    draws = None
    if ok is not None:
        draws = log_compute_for_loss(b.model, study.theta[baseline][ok], study.y_point[variant][ok]) - log_c
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def curves_log_multiplier(study: Study, variant: str, baseline: str, compute: np.ndarray) -> Statistic:
    """log M(C) from the two separately fitted curves at the given compute values."""
    b, v = study.fits[baseline], study.fits[variant]
    log_c = np.log(np.asarray(compute, dtype=float))
    y_v = log_loss_at(v.model, v.theta[None], log_c)
    value = log_compute_for_loss(b.model, b.theta[None], y_v)[0] - log_c
    ok = replicates_ok(study, (baseline, variant))
    draws = None
    if ok is not None:
        y_v = log_loss_at(v.model, study.theta[variant][ok], log_c)
        draws = log_compute_for_loss(b.model, study.theta[baseline][ok], y_v) - log_c
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(baseline, variant))


def shared_log_multiplier(study: Study, variant: str, baseline: str) -> Statistic:
    """log M = (log A_base - log A_var) / alpha from the joint fit (constant in C)."""
    if study.joint is None:
        raise FitInputError("the shared-exponent multiplier needs a joint fit of at least two curves")
    model, labels = study.joint.model, study.joint_labels
    gb, gv = labels.index(baseline), labels.index(variant)

    def stat(theta: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (model.log_a(theta, gb) - model.log_a(theta, gv)) / model.alpha(theta)

    value = stat(study.joint.theta[None])
    ok = replicates_ok(study, (), joint=True)
    draws = None if ok is None else stat(study.joint_theta[ok])[:, None]
    return Statistic(value, draws, 0 if ok is None else int((~ok).sum()), study.df(joint=True))


def exponent_difference(study: Study, variant: str, baseline: str) -> Statistic:
    """alpha_var - alpha_base from the separate fits (the test of a shared exponent)."""
    b, v = study.fits[baseline], study.fits[variant]
    value = v.model.alpha(v.theta[None]) - b.model.alpha(b.theta[None])
    ok = replicates_ok(study, (baseline, variant))
    draws = None
    if ok is not None:
        draws = (v.model.alpha(study.theta[variant][ok]) - b.model.alpha(study.theta[baseline][ok]))[:, None]
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
