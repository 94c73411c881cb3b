"""The fits of one sweep's curves and every variant's multiplier over the baseline, from the curves' data.

:func:`fit_curves` is what ``attnres fit`` computes per sweep once its points are chosen (the module docstring of
:mod:`analysis.fitting.sweep_fits`, steps 2-3): one law per curve, the joint fit with a shared exponent and one
bootstrap shared by all of them (:func:`analysis.estimates.study.run_study`), then per variant M at every measured
budget and at the largest budget, the wall-clock M, the exponent test, local M and the loss gaps
(:class:`VariantMultiplier`). The coverage studies call it on simulated points. No I/O, no plotting; never imports
torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pandas as pd

from analysis.base.bootstrap import Estimate
from analysis.data.select import curve_variants
from analysis.data.throughput import throughput_ratios
from analysis.estimates.local import local_multipliers
from analysis.estimates.multiplier import wall_clock_multiplier
from analysis.estimates.study import CurveData, Study, run_study
from analysis.estimates.study_stats import (
    curves_log_multiplier,
    multiplier_estimates,
    points_log_multiplier,
    shared_log_multiplier,
)
from analysis.fitting.checks import check_budget_ranges
from analysis.fitting.diagnostics import budget_gaps, choose_exponent, exponent_test, lack_of_fit, reliability
from analysis.fitting.results import (
    BudgetMultiplier,
    CurvePoint,
    CurveResult,
    VariantMultiplier,
)
from analysis.fitting.settings import COMPUTE_UNITS, UNIT_SHORT, FitSettings
from analysis.laws.fit import JointPowerLawFit, PowerLawFit, curve_estimates, joint_result
from attnres.variants import Variant


def _power_fit(study: Study, label: str, settings: FitSettings) -> PowerLawFit:
    cf, data = study.fits[label], study.data[label]
    curve = cf.law.curve(cf.model, cf.theta)
    samples = None
    failed = 0
    if study.n_boot > 0:
        ok = study.ok[label]
        failed = int((~ok).sum())
        samples = cf.law.draws(cf.model, study.theta[label][ok])
    df = study.df(label)
    return PowerLawFit(
        form=study.form,
        law=curve,
        **curve_estimates(cf.law, curve, samples, settings.level, df, failed),
        status=cf.solution.status,
        message=cf.solution.message,
        objective=cf.solution.objective,
        compute=tuple(float(c) for c in data.compute),
        loss=tuple(float(v) for v in data.loss),
        run_ids=None,
        delta=study.delta,
        level=settings.level,
        n_boot=study.n_boot,
        n_boot_failed=failed,
        seed=settings.seed,
    )


def fit_curves(
    data: list[CurveData],
    settings: FitSettings,
    rows: dict[str, pd.DataFrame] | None = None,
    throughput: dict[tuple[str, int, int], float] | None = None,
    notes: list[str] | None = None,
    variants: Mapping[str, Variant] | None = None,
) -> tuple[Study, JointPowerLawFit | None, list[VariantMultiplier]]:
    """The fits, the shared bootstrap and every variant's multiplier from the curves' data: what
    ``attnres fit`` computes per sweep once its points are chosen (the coverage study calls it on simulated
    points). ``rows`` / ``throughput`` (the curves' point tables, FLOP/s per shape) give the wall-clock
    multipliers; without them those are nan. ``variants``: the curves' variants
    (:func:`analysis.data.select.curve_variants` of their points; by default of ``rows``, and a simulated curve
    without rows is the variant named by its label as it is)."""
    notes = [] if notes is None else notes
    if variants is None:
        variants = curve_variants(pd.concat(rows.values())) if rows else {}
    check_budget_ranges("", data, settings.baseline, UNIT_SHORT[settings.compute_unit], settings.budget_rtol)
    study = run_study(
        data,
        settings.form,
        delta=settings.delta,
        level=settings.level,
        n_boot=settings.n_boot,
        seed=settings.seed,
        joint=len(data) >= 2,
        interval=settings.resample,
    )
    joint = _joint_fit(study, settings)
    multipliers = []
    labels = [d.label for d in data]
    if settings.baseline not in labels:
        notes.append(
            f"no fitted baseline curve {settings.baseline!r}: no multipliers (set the baseline with --baseline)"
        )
    else:
        for label in labels:
            if label != settings.baseline:
                variant = variants.get(label) or Variant(label)
                multipliers.append(
                    _variant_multiplier(study, variant, label, settings, rows, throughput or {}, joint, notes)
                )
    return study, joint, multipliers


def point_wall_clock(m: VariantMultiplier) -> VariantMultiplier:
    """``m`` with its wall-clock multipliers (headline and per budget) as point estimates, their intervals dropped."""

    def point(e: Estimate) -> Estimate:
        return Estimate(e.value, math.nan, math.nan, e.level)

    budgets = tuple(replace(b, wall_clock=point(b.wall_clock)) for b in m.budgets)
    return replace(m, wall_clock=point(m.wall_clock), budgets=budgets)


def curve_result(
    study: Study, variant: Variant, label: str, g: pd.DataFrame, settings: FitSettings, notes: list[str]
) -> CurveResult:
    """A fitted curve (``variant``: what it stands for) with its points (``g``: the curve's rows of points); a fit
    that did not converge gets a note."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    pts = tuple(
        CurvePoint(
            float(r.flops) / unit,
            float(r.loss),
            int(r.n_runs),
            tuple(r.run_ids),
            float(r.params),
            float(r.tokens),
            float(r.flops_per_s),
        )
        for r in g.itertuples()
    )
    fit = _power_fit(study, label, settings)
    if fit.status != "converged":
        notes.append(f"{label}: fit status {fit.status} ({fit.message})")
    return CurveResult(label, str(g["variant"].iloc[0]), variant, fit, pts)


def _joint_fit(study: Study, settings: FitSettings) -> JointPowerLawFit | None:
    """The joint fit with a shared exponent, with the study's bootstrap intervals (None without one)."""
    if study.joint is None:
        return None
    draws, failed = None, 0
    if study.n_boot > 0:
        failed = int((~study.joint_ok).sum())
        draws = study.joint_theta[study.joint_ok]
    return joint_result(
        study.joint,
        study.joint_labels,
        settings.form,
        study.delta,
        settings.level,
        study.n_boot,
        failed,
        settings.seed,
        draws,
        study.df(joint=True),
    )


def _variant_multiplier(
    study: Study,
    variant: Variant,
    label: str,
    settings: FitSettings,
    rows: dict[str, pd.DataFrame] | None,
    throughput: dict[tuple[str, int, int], float],
    joint: JointPowerLawFit | None,
    notes: list[str],
) -> VariantMultiplier:
    """Everything about one variant (curve ``label``, standing for ``variant``) against the baseline (module
    docstring, step 3)."""
    base = settings.baseline
    level = settings.level
    per_point = points_log_multiplier(study, label, base)
    m_points = multiplier_estimates(per_point, level)
    data = study.data[label]
    c_max = float(data.compute.max())
    unshared = multiplier_estimates(curves_log_multiplier(study, label, base, np.array([c_max])), level)[0]
    shared = None
    if study.joint is not None:
        shared = multiplier_estimates(shared_log_multiplier(study, label, base, np.array([c_max])), level)[0]
    test = exponent_test(study, label, base, level)
    tests = {lab: lack_of_fit(study, lab) for lab in (base, label)}
    reliable, why = reliability(study, label, base, tests)
    exponent, reason = choose_exponent(settings, test, shared is not None, joint, reliable)
    headline = shared if exponent == "shared" else unshared
    if reliable and study.n_boot > 0:
        reliable, why = _interval_reliability(study, label, base, exponent, headline)
    data = study.data[label]
    if rows is None:
        ratios = [math.nan] * data.compute.size
    else:
        ratios = throughput_ratios(label, base, rows[label], throughput, notes)
    n_runs_base = int(study.data[base].n_runs.sum())
    local = local_multipliers(study, label, base, level, study.n_boot, np.random.default_rng([settings.seed, 2]))
    budgets = tuple(
        BudgetMultiplier(
            compute=float(c),
            loss=float(l),
            n_runs_variant=int(n),
            n_runs_baseline=n_runs_base,
            multiplier=m,
            wall_clock=wall_clock_multiplier(m, ratio, 1.0),
            throughput_ratio=ratio,
            local=near,
        )
        for c, l, n, m, ratio, near in zip(data.compute, data.loss, data.n_runs, m_points, ratios, local)
    )
    top_ratio = ratios[int(np.argmax(data.compute))]
    return VariantMultiplier(
        variant=label,
        curve_variant=variant,
        baseline=base,
        exponent=exponent,
        exponent_reason=reason,
        exponent_test=test,
        compute=c_max,
        multiplier=headline,
        multiplier_shared=shared,
        multiplier_unshared=unshared,
        wall_clock=wall_clock_multiplier(headline, top_ratio, 1.0),
        throughput_ratio=top_ratio,
        budgets=budgets,
        n_runs_variant=int(data.n_runs.sum()),
        n_runs_baseline=n_runs_base,
        n_boot_failed=headline.failed,
        baseline_status=study.fits[base].solution.status,
        variant_status=study.fits[label].solution.status,
        joint_status=None if joint is None else joint.status,
        interval=study.interval,
        reliable=reliable,
        why=why,
        lack_of_fit=tests,
        gaps=budget_gaps(study, label, base, np.random.default_rng([settings.seed, 1])),
    )


def _interval_reliability(study: Study, label: str, base: str, exponent: str, headline: Estimate) -> tuple[bool, str]:
    """Whether the headline's own interval can be read: it exists (the fit left degrees of freedom for one), and few
    of its replicates failed (:data:`analysis.base.bootstrap.FAILED_LIMIT`)."""
    if not headline.has_interval:
        df = study.df(joint=True) if exponent == "shared" else study.df(base, label)
        return False, (
            f"no interval: {df:g} degree(s) of freedom left after fitting the law "
            f"({min(study.data[base].n_budgets, study.data[label].n_budgets)} budgets); run more budgets"
        )
    if not headline.reliable:
        return False, (
            f"{headline.failed} of {headline.replicates} bootstrap replicates failed to refit "
            f"({100 * headline.failed_share:.0f} %): an interval from the rest is biased toward the data sets that "
            "fit easily"
        )
    return True, ""
