"""The effective compute multiplier: the paper's numbers, exact recovery, identical variants, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import Estimate, FitInputError, PowerLaw, compute_multiplier, fit_power_law, wall_clock_multiplier

C = np.geomspace(1e15, 1e18, 7)
PAPER = {
    "baseline": PowerLaw(A=1.891, alpha=0.057),
    "block": PowerLaw(A=1.870, alpha=0.058),
    "full": PowerLaw(A=1.865, alpha=0.057),
}


def test_paper_block_over_baseline_at_5_6_pflops_days_is_1_25():
    m = compute_multiplier(PAPER["baseline"], PAPER["block"], at=5.6)
    assert abs(m.multiplier[0].value - 1.25) < 0.01
    # the paper's reading: Block's loss at 5.6 is 1.692, which the baseline reaches at ~7.02
    assert abs(PAPER["block"].loss(5.6) - 1.692) < 5e-4
    assert abs(PAPER["baseline"].compute_for_loss(PAPER["block"].loss(5.6)) - 7.02) < 0.01
    assert m.method == "curves" and math.isnan(m.multiplier[0].low)  # published curves carry no data to resample


def test_paper_full_over_baseline_at_5_6_pflops_days_is_1_27():
    m = compute_multiplier(PAPER["baseline"], PAPER["full"], at=5.6)
    assert abs(m.multiplier[0].value - 1.27) < 0.01
    # equal exponents: the multiplier is (A_base / A_full)^(1 / alpha) at every C
    assert math.isclose(m.multiplier[0].value, (1.891 / 1.865) ** (1 / 0.057), rel_tol=1e-12)


@pytest.mark.parametrize("form", ["A*C^-alpha", "E+A*C^-alpha"])
def test_noise_free_multiplier_is_exact_by_every_method(form):
    law = PowerLaw(A=25.0, alpha=0.057) if form == "A*C^-alpha" else PowerLaw(A=60.0, alpha=0.12, E=1.0)
    base = fit_power_law(C, law.loss(C), form, n_boot=0)
    var = fit_power_law(C, law.loss(1.3 * C), form, n_boot=0)
    curves = compute_multiplier(base, var, at=[1e14, 1e16, 1e20], n_boot=0)
    shared = compute_multiplier(base, var, shared_exponent=True, n_boot=0)
    points = compute_multiplier(base, (C, law.loss(1.3 * C)), n_boot=0)
    for result in (curves, shared, points):
        assert np.allclose(result.values, 1.3, rtol=1e-6), result.method
    assert points.compute == tuple(C)


def test_identical_data_give_exactly_one_inside_the_interval():
    rng = np.random.default_rng(5)
    loss = 25.0 * C**-0.057 * np.exp(rng.normal(0, 0.003, C.size))
    a = fit_power_law(C, loss, n_boot=0)
    for shared in (False, True):
        m = compute_multiplier(a, a, at=C[-1], shared_exponent=shared, n_boot=500)
        assert math.isclose(m.multiplier[0].value, 1.0, rel_tol=1e-9)
        assert m.multiplier[0].contains(1.0)


def test_identical_variants_with_independent_noise_include_one():
    rng = np.random.default_rng(11)
    law = PowerLaw(A=25.0, alpha=0.057)
    base = fit_power_law(C, law.loss(C) * np.exp(rng.normal(0, 0.003, C.size)), n_boot=0)
    twin = fit_power_law(C, law.loss(C) * np.exp(rng.normal(0, 0.003, C.size)), n_boot=0)
    for shared in (False, True):
        assert compute_multiplier(base, twin, at=C[-1], shared_exponent=shared, n_boot=500).multiplier[0].contains(1.0)


def test_bootstrap_is_seeded_and_reports_its_size():
    rng = np.random.default_rng(2)
    law = PowerLaw(A=25.0, alpha=0.057)
    base = fit_power_law(C, law.loss(C) * np.exp(rng.normal(0, 0.003, C.size)), n_boot=0)
    var = fit_power_law(C, law.loss(1.25 * C) * np.exp(rng.normal(0, 0.003, C.size)), n_boot=0)
    one = compute_multiplier(base, var, n_boot=300, seed=4)
    two = compute_multiplier(base, var, n_boot=300, seed=4)
    other = compute_multiplier(base, var, n_boot=300, seed=5)
    assert one == two and one != other
    assert one.n_boot == 300 and one.n_runs_baseline == 7 and one.n_runs_variant == (7,) * 7
    assert all(m.low < m.value < m.high for m in one.multiplier)


def test_variant_points_with_too_few_points_use_the_baseline_uncertainty_only():
    rng = np.random.default_rng(3)
    law = PowerLaw(A=25.0, alpha=0.057)
    base = fit_power_law(C, law.loss(C) * np.exp(rng.normal(0, 0.003, C.size)), n_boot=0)
    m = compute_multiplier(base, ([1e17, 1e18], law.loss(np.array([1.25e17, 1.25e18]))), n_boot=200)
    assert m.method == "points" and "baseline fit only" in m.note
    assert all(x.has_interval for x in m.multiplier)


def test_wall_clock_multiplier_charges_the_measured_speed():
    m = Estimate(1.25, 1.2, 1.3, 0.9)
    w = wall_clock_multiplier(m, variant_flops_per_s=0.9e12, baseline_flops_per_s=1e12)
    assert math.isclose(w.value, 1.125) and math.isclose(w.low, 1.08) and math.isclose(w.high, 1.17)
    assert math.isnan(wall_clock_multiplier(m, math.nan, 1.0).value)


def test_multiplier_input_errors():
    law = PowerLaw(A=25.0, alpha=0.057)
    with pytest.raises(FitInputError, match="give `at=`"):
        compute_multiplier(law, law)
    with pytest.raises(FitInputError, match="PowerLawFit"):
        compute_multiplier("baseline", law, at=1.0)
    with pytest.raises(FitInputError, match="shared_exponent"):
        compute_multiplier(law, law, at=1.0, shared_exponent=True)
    with pytest.raises(FitInputError, match="positive"):
        compute_multiplier(law, law, at=-1.0)


def _calibration(form: str, draws: int, n_boot: int, shared: bool) -> tuple[float, float]:
    """(median estimate / truth, coverage of the 90% interval) of M at the largest of 7 budgets."""
    truth = 1.25
    law = PowerLaw(A=25.0, alpha=0.057) if form == "A*C^-alpha" else PowerLaw(A=60.0, alpha=0.12, E=1.0)
    rng = np.random.default_rng(2024)
    estimates, covered = [], 0
    for k in range(draws):
        base = fit_power_law(C, law.loss(C) * np.exp(rng.normal(0, 0.003, C.size)), form, n_boot=0)
        var = fit_power_law(C, law.loss(truth * C) * np.exp(rng.normal(0, 0.003, C.size)), form, n_boot=0)
        m = compute_multiplier(base, var, at=C[-1], shared_exponent=shared, n_boot=n_boot, seed=k).multiplier[0]
        estimates.append(m.value)
        covered += m.contains(truth)
    return float(np.median(estimates)) / truth, covered / draws


@pytest.mark.integration  # a calibration over hundreds of simulated studies (a minute): pytest -m integration
def test_calibration_fast():
    """0.3% noise in log loss, 7 budgets, M = 1.25: median within 3%, 90% interval covers ~90% (fast version)."""
    median, coverage = _calibration("A*C^-alpha", draws=80, n_boot=300, shared=True)
    assert abs(median - 1.0) < 0.03
    assert 0.8 <= coverage <= 0.98, coverage


@pytest.mark.slow
@pytest.mark.parametrize("form", ["A*C^-alpha", "E+A*C^-alpha"])
@pytest.mark.parametrize("shared", [True, False])
def test_calibration_slow(form, shared):
    median, coverage = _calibration(form, draws=400, n_boot=1000, shared=shared)
    assert abs(median - 1.0) < 0.03
    assert 0.85 <= coverage <= 0.95, coverage
