"""The multiplier's interval covers a known multiplier at its level on simulated studies (a short version of
``benchmarks/coverage_study.py``, which runs 1,000 replicates per scenario; see docs/analysis.md)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from analysis.settings import FitSettings
from analysis.sweep_fits import fit_curves
from benchmarks import coverage_study as cs


def test_the_budgets_interval_covers_a_pure_law_and_budget_deviations_common_to_the_variants():
    for name in ("a-power", "c-common"):
        r = cs.coverage(cs.SCENARIOS[name], "budgets", reps=200, n_boot=200)
        assert 0.80 <= r["coverage"] <= 0.97, (name, r)
        assert r["unreliable"] == 0.0
        assert abs(r["bias"] - 1) < 0.02


def test_seeds_interval_undercovers_budget_deviations_and_says_it_is_unreliable():
    r = cs.coverage(cs.SCENARIOS["c-indep"], "seeds", reps=60, n_boot=100)
    assert r["coverage"] < 0.7
    assert r["unreliable"] > 0.8  # the lack-of-fit test catches what the seeds interval ignores


def test_three_budgets_are_marked_unreliable():
    data = cs.simulate(replace(cs.SCENARIOS["a-power"], budgets=3), np.random.default_rng(0))
    _, _, (m,) = fit_curves(data, FitSettings(n_boot=50, chinchilla=False, resample="budgets"))
    assert not m.reliable and "3 budgets" in m.why
    assert m.to_dict()["reliable"] is False and m.to_dict()["why"] == m.why


def test_paired_gap_uses_shared_seeds():
    data = cs.simulate(cs.SCENARIOS["a-power"], np.random.default_rng(1))
    _, _, (m,) = fit_curves(data, FitSettings(n_boot=100, chinchilla=False))
    assert len(m.gaps) == 5 and all(g.paired and g.n_seeds == 3 for g in m.gaps)
    base, var = data
    expected = np.mean(var.run_losses[4] - base.run_losses[4])
    assert np.isclose(m.gaps[4].gap.value, expected)
    assert m.gaps[4].gap.low <= m.gaps[4].gap.value <= m.gaps[4].gap.high
