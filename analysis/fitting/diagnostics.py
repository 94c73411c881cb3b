"""Diagnostics of a variant's fit against the baseline's, beside its multiplier: the lack-of-fit test of each law,
whether the bootstrap can give a calibrated interval (reliability), the paired loss gap at each budget, and the
exponent test with the choice of the headline's exponent it drives. Each takes the bootstrap study of
:func:`analysis.estimates.study.run_study` and returns a result type of :mod:`analysis.fitting.results`.

Pure numpy/scipy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from analysis.base.bootstrap import estimate
from analysis.estimates.study import BUDGETS, MIN_BUDGETS, SEEDS, Study
from analysis.estimates.study_stats import bootstrap_p_value, exponent_difference
from analysis.fitting.results import BudgetGap, ExponentTest, LackOfFit
from analysis.fitting.settings import FitSettings
from analysis.laws.fit import JointPowerLawFit

EXPONENT_TEST_LEVEL = 0.99


def lack_of_fit(study: Study, label: str) -> LackOfFit:
    """The lack-of-fit test of one curve of a study (:class:`LackOfFit`)."""
    fit, data = study.fits[label], study.data[label]
    resid = fit.y - fit.fitted
    k, p = resid.size, fit.model.n_params
    rms = float(np.sqrt(np.mean(resid**2)))
    var_mean, df_seed = [], 0
    for runs in data.run_losses:
        if runs is not None and len(runs) >= 2:
            logs = np.log(np.asarray(runs, dtype=float))
            var_mean.append(float(np.var(logs, ddof=1)) / logs.size)
            df_seed += logs.size - 1
    if not var_mean or k <= p or df_seed == 0:
        return LackOfFit(rms, math.sqrt(np.mean(var_mean)) if var_mean else math.nan, math.nan, math.nan)
    from scipy.stats import f as f_dist

    noise = float(np.mean(var_mean))
    stat = float(np.sum(resid**2) / (k - p) / noise) if noise > 0 else math.inf
    return LackOfFit(rms, math.sqrt(noise), stat, float(f_dist.sf(stat, k - p, df_seed)))


def reliability(study: Study, label: str, base: str, tests: Mapping[str, LackOfFit]) -> tuple[bool, str]:
    """Whether the study can give ``label``'s multiplier a calibrated interval, and why not."""
    if study.n_boot == 0:
        return True, ""
    n_budgets = min(study.data[base].n_budgets, study.data[label].n_budgets)
    if study.interval == BUDGETS and n_budgets < MIN_BUDGETS:
        return False, (
            f"only {n_budgets} budgets: a bootstrap over budgets is calibrated from {MIN_BUDGETS} on (at 4 it covers "
            "about 82% where 90% is asked); run more budgets"
        )
    if study.interval == SEEDS:
        missed = [lab for lab in (base, label) if tests[lab].significant]
        if missed:
            t = tests[missed[0]]
            return False, (
                f"{missed[0]}'s law misses its budgets by {100 * t.rms:.2g}% RMS, more than its seeds explain "
                f"(seed SE {100 * t.seed_se:.2g}%, lack-of-fit p = {t.p_value:.2g}); the seeds interval ignores "
                "that, use --interval budgets"
            )
    return True, ""


def _mean_draws(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap means of ``values`` (deviations scaled by sqrt(m / (m - 1)))."""
    m = values.size
    centre = values.mean()
    scaled = centre + math.sqrt(m / (m - 1)) * (values - centre)
    return scaled[rng.integers(0, m, size=(n_boot, m))].mean(axis=1)


def budget_gaps(study: Study, label: str, base: str, rng: np.random.Generator) -> tuple[BudgetGap, ...]:
    """Per budget the variant shares with the baseline (same budget key), the paired loss gap."""
    v, b = study.data[label], study.data[base]
    where = {repr(k): i for i, k in enumerate(b.budget_keys)}
    level, n_boot = study.level, study.n_boot
    out = []
    for i, key in enumerate(v.budget_keys):
        j = where.get(repr(key))
        if j is None:
            continue
        rv, rb = v.run_losses[i], b.run_losses[j]
        rv = np.array([v.loss[i]]) if rv is None else np.asarray(rv, dtype=float)
        rb = np.array([b.loss[j]]) if rb is None else np.asarray(rb, dtype=float)
        sv, sb = v.run_seeds[i], b.run_seeds[j]
        common = [] if sv is None or sb is None else sorted(set(map(int, sv)) & set(map(int, sb)))
        base_mean = float(rb.mean())
        paired = len(common) >= 2
        draws = None
        if paired:
            iv = [list(map(int, sv)).index(x) for x in common]
            ib = [list(map(int, sb)).index(x) for x in common]
            diff, base_vals = rv[iv] - rb[ib], rb[ib]
            value, base_mean, n, df = float(diff.mean()), float(base_vals.mean()), len(common), len(common) - 1
            if n_boot > 0:
                pick = rng.integers(0, n, size=(n_boot, n))
                scale = math.sqrt(n / (n - 1))
                d = diff.mean() + scale * (diff - diff.mean())
                bv = base_vals.mean() + scale * (base_vals - base_vals.mean())
                draws = (d[pick].mean(axis=1), bv[pick].mean(axis=1))
        else:
            value, n = float(rv.mean() - rb.mean()), min(rv.size, rb.size)
            df = rv.size + rb.size - 2
            if n_boot > 0 and rv.size >= 2 and rb.size >= 2:
                mb = _mean_draws(rb, n_boot, rng)
                draws = (_mean_draws(rv, n_boot, rng) - mb, mb)
        gap = estimate(value, None if draws is None else draws[0], level, df)
        pct = estimate(100 * value / base_mean, None if draws is None else 100 * draws[0] / draws[1], level, df)
        out.append(BudgetGap(float(v.compute[i]), float(b.compute[j]), n, paired, gap, pct))
    return tuple(out)


def exponent_test(study: Study, label: str, base: str, level: float) -> ExponentTest:
    """alpha_var - alpha_base from the separate fits, with its interval and bootstrap p-value."""
    d = exponent_difference(study, label, base)
    diff = estimate(float(d.value[0]), None if d.draws is None else d.draws[:, 0], level, d.df, d.failed)
    scale = max(abs(float(f.law.exponent(f.model, f.theta[None])[0])) for f in (study.fits[base], study.fits[label]))
    # "differ" needs strong evidence (the 99% interval excludes 0), not the table's level: the headline switches
    # to the separate fits when it does, and given a switch by chance their interval covers a third to a half
    # of the time (docs/analysis.md, "Exponent test")
    draws = None if d.draws is None else d.draws[:, 0]
    strict = estimate(float(d.value[0]), draws, EXPONENT_TEST_LEVEL, d.df, d.failed)
    # a difference at rounding level (exact data give a zero-width interval next to 0) is no difference
    differ = strict.has_interval and not strict.contains(0.0) and abs(diff.value) > 1e-9 * max(scale, 1e-12)
    return ExponentTest(diff, bootstrap_p_value(None if d.draws is None else d.draws[:, 0]), differ)


def choose_exponent(
    settings: FitSettings, test: ExponentTest, has_shared: bool, joint: JointPowerLawFit | None, reliable: bool
) -> tuple[str, str]:
    """The headline's exponent, "shared" or "unshared", and why (``settings.exponent``, then the test).

    An interval marked unreliable comes from a bootstrap that is not calibrated, and so is the test's: it does
    not move the headline off the shared exponent (at 4 budgets it finds "differ" with p = 0 on equal exponents).
    """
    pct = int(round(EXPONENT_TEST_LEVEL * 100))
    joint_ok = joint is not None and joint.status != "not_converged"  # E or alpha on a bound is still a fit
    if settings.exponent == "unshared" or not has_shared:
        return "unshared", "requested" if settings.exponent == "unshared" else "no joint fit"
    if settings.exponent == "shared":
        return "shared", "requested"
    if test.differ and not reliable:
        return "shared", (
            f"the {pct}% interval of alpha_var - alpha_base excludes 0, but this bootstrap is not calibrated (the "
            "interval is marked unreliable), so the test does not move the headline off the shared exponent"
        )
    if test.differ:
        return "unshared", f"the exponents differ ({pct}% interval of alpha_var - alpha_base excludes 0)"
    if not joint_ok:
        return "unshared", f"the joint fit did not converge cleanly ({joint.status if joint else 'none'})"
    if not test.difference.has_interval:
        return "shared", "no bootstrap to test the exponents; shared by default"
    return "shared", f"the exponents do not differ ({pct}% interval of alpha_var - alpha_base contains 0)"
