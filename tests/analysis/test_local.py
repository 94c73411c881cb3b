"""Local M at each budget: the variant's measured loss against the baseline's own point there, with the slope of
the baseline's nearest budgets (analysis.estimates.local)."""

from __future__ import annotations

import json
import math

import numpy as np

from analysis import PowerLaw, fit_results, format_report
from tests.synthetic_results import write_synthetic_results

TRUTH = {"baseline": 1.0, "full": 1.27, "block": 1.25}


def test_on_a_pure_power_law_local_m_is_the_truth_at_every_budget(tmp_path):
    write_synthetic_results(tmp_path, multipliers=TRUTH, tables=False)
    for m in fit_results(tmp_path, n_boot=0).sweeps[0].multipliers:
        for b in m.budgets:
            assert math.isclose(b.local.multiplier.value, TRUTH[m.variant], rel_tol=1e-9), (m.variant, b.compute)
            assert len(b.local.baseline_compute) == 3 and not b.local.fixed_exponent
            assert math.isclose(b.local.alpha, 0.057, rel_tol=1e-9)


def test_local_m_does_not_inherit_the_misfit_of_the_global_law(tmp_path):
    """A bending baseline (L = E + A C^-alpha) fitted with the pure form: the global law misses its points, and M
    from inverting it ranges from 0.7 to 1.9 for a true 1.27; local M stays near 1.27."""
    write_synthetic_results(
        tmp_path, law=PowerLaw(A=400.0, alpha=0.2, E=1.5), multipliers={"baseline": 1.0, "full": 1.27}, tables=False
    )
    (m,) = fit_results(tmp_path, n_boot=0).sweeps[0].multipliers
    global_m = np.array([b.multiplier.value for b in m.budgets])
    local_m = np.array([b.local.multiplier.value for b in m.budgets])
    assert global_m.min() < 0.8 and global_m.max() > 1.8
    assert np.all(np.abs(local_m / 1.27 - 1) < 0.06)  # the end budgets' slope is taken one budget inwards
    assert np.all(np.abs(local_m[1:-1] / 1.27 - 1) < 0.01)


def test_its_interval_resamples_seeds_and_covers_the_truth(tmp_path):
    write_synthetic_results(tmp_path, multipliers=TRUTH, seeds=3, noise=0.002, tables=False, rng_seed=2)
    report = fit_results(tmp_path, n_boot=400)
    block = report.sweeps[0].multiplier("block")
    assert all(b.local.multiplier.has_interval for b in block.budgets)
    covered = [b.local.multiplier.contains(1.25) for b in block.budgets]
    assert sum(covered) >= 5, [b.local.multiplier for b in block.budgets]
    assert "local M [90% CI]" in format_report(report)
    saved = json.loads(report.to_json())["sweeps"][0]["multipliers"]
    local = next(m for m in saved if m["variant"] == "block")["budgets"][0]["local"]
    assert set(local) == {"multiplier", "alpha", "fixed_exponent", "baseline_compute"}
    assert local["multiplier"]["value"] == block.budgets[0].local.multiplier.value


def test_one_seed_gives_no_interval_and_two_budgets_fix_the_exponent(tmp_path):
    write_synthetic_results(tmp_path, multipliers=TRUTH, budgets=[1e16, 1e17], tables=False)
    report = fit_results(tmp_path, n_boot=100)
    for m in report.sweeps[0].multipliers:
        for b in m.budgets:
            assert b.local.fixed_exponent and not b.local.multiplier.has_interval
            assert math.isclose(b.local.multiplier.value, TRUTH[m.variant], rel_tol=1e-6)
    assert "(fixed alpha)" in format_report(report)
