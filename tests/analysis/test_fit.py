"""Fits on arrays: parameter recovery, units, statuses, and the errors for bad input (analysis.laws.fit)."""

from __future__ import annotations

import doctest
import math
import warnings

import numpy as np
import pytest

import analysis
from analysis import FitInputError, PowerLaw, fit_chinchilla, fit_power_law, fit_power_law_joint
from analysis.laws.laws import PFLOP_S_DAY

C = np.geomspace(1e15, 1e21, 7)


def rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


@pytest.mark.parametrize(
    ("form", "A", "alpha", "E"),
    [("A*C^-alpha", 25.0, 0.057, 0.0), ("E+A*C^-alpha", 400.0, 0.15, 1.7), ("E+A*C^-alpha", 9.0, 0.08, 0.5)],
)
def test_noise_free_power_law_recovers_every_parameter(form, A, alpha, E):
    fit = fit_power_law(C, E + A * C**-alpha, form, n_boot=0)
    assert fit.status == "converged"
    assert rel(fit.law.A, A) < 1e-6 and rel(fit.law.alpha, alpha) < 1e-6
    if E:
        assert rel(fit.law.E, E) < 1e-6
    assert fit.A.value == fit.law.A and fit.alpha.value == fit.law.alpha


def test_noise_free_chinchilla_recovers_every_parameter():
    n = np.repeat(np.geomspace(1e7, 1e9, 5), 6)
    d = np.tile(np.geomspace(1e9, 1e11, 6), 5)
    truth = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
    loss = truth["E"] + truth["A"] / n ** truth["alpha"] + truth["B"] / d ** truth["beta"]
    fit = fit_chinchilla(n, d, loss, n_boot=0)
    assert fit.status == "converged"
    for name, value in truth.items():
        assert rel(getattr(fit.law, name), value) < 1e-6, name


def test_noise_free_joint_fit_recovers_shared_exponent_and_multiplier():
    law = PowerLaw(A=300.0, alpha=0.12, E=1.2)
    data = {"baseline": (C, law.loss(C)), "block": (C, law.loss(1.25 * C)), "full": (C, law.loss(1.4 * C))}
    joint = fit_power_law_joint(data, "E+A*C^-alpha", n_boot=0)
    assert joint.status == "converged"
    assert rel(joint.alpha.value, 0.12) < 1e-6 and rel(joint.E.value, 1.2) < 1e-6
    assert rel(joint.multiplier("block", "baseline").value, 1.25) < 1e-6
    assert rel(joint.multiplier("full", "baseline").value, 1.4) < 1e-6
    assert rel(joint.laws["block"].A, 300.0 * 1.25**-0.12) < 1e-6


def test_compute_unit_only_rescales_A():
    rng = np.random.default_rng(0)
    loss = 25.0 * C**-0.057 * np.exp(rng.normal(0, 0.003, C.size))
    in_flops = fit_power_law(C, loss, n_boot=0)
    in_days = fit_power_law(C / PFLOP_S_DAY, loss, n_boot=0)
    assert rel(in_days.alpha.value, in_flops.alpha.value) < 1e-9
    assert rel(in_flops.law.in_units(PFLOP_S_DAY).A, in_days.law.A) < 1e-9


def test_noisy_fit_has_intervals_that_contain_the_estimate_and_are_reproducible():
    rng = np.random.default_rng(1)
    loss = (1.7 + 400.0 * C**-0.15) * np.exp(rng.normal(0, 0.003, C.size))
    a = fit_power_law(C, loss, "E+A*C^-alpha", n_boot=300, seed=3)
    b = fit_power_law(C, loss, "E+A*C^-alpha", n_boot=300, seed=3)
    assert a == b  # seeded bootstrap: the same inputs give the same numbers
    for est in (a.A, a.alpha, a.E):
        assert est.low < est.value < est.high
    assert a.alpha.contains(0.15) and a.n_boot_failed == 0


def test_status_hit_bound_when_the_data_have_no_irreducible_loss():
    fit = fit_power_law(C, 25.0 * C**-0.057, "E+A*C^-alpha", n_boot=0)
    assert fit.status == "hit_bound" and fit.law.E < 1e-12
    assert "E at its lower bound" in fit.message
    assert rel(fit.law.alpha, 0.057) < 1e-6


def test_status_hit_bound_for_flat_loss():
    fit = fit_power_law(C, np.full(C.size, 2.0), n_boot=0)
    assert fit.status == "hit_bound" and fit.law.alpha < 1e-12
    assert "alpha at its lower bound" in fit.message


@pytest.mark.parametrize(
    ("compute", "loss", "form", "match"),
    [
        ([1e18], [2.0], "A*C^-alpha", "1 point.* 2 parameters"),
        ([1e18, 1e19], [2.0, 1.9], "E+A*C^-alpha", "2 point.* 3 parameters"),
        ([1e18, 1e18, 1e18], [2.0, 1.9, 1.8], "A*C^-alpha", "distinct value"),
        ([1e18, -1e19, 1e20], [2.0, 1.9, 1.8], "A*C^-alpha", "compute must be positive"),
        ([1e18, 0.0, 1e20], [2.0, 1.9, 1.8], "A*C^-alpha", "compute must be positive"),
        ([1e18, 1e19, 1e20], [2.0, 0.0, 1.8], "A*C^-alpha", "loss must be positive"),
        ([1e18, 1e19, 1e20], [2.0, np.inf, 1.8], "A*C^-alpha", "loss must be positive and finite"),
        ([np.nan, np.nan], [np.nan, 2.0], "A*C^-alpha", "no usable points"),
        ([1e18, 1e19], [2.0], "A*C^-alpha", "different lengths"),
        ([1e18, 1e19, 1e20], [2.0, 1.9, 1.8], "L = B * C", "unknown form"),
    ],
)
def test_bad_input_raises_one_clear_error(compute, loss, form, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FitInputError, match=match):
            fit_power_law(compute, loss, form, n_boot=0)


def test_fit_input_error_is_a_value_error():
    assert issubclass(FitInputError, ValueError)


def test_chinchilla_needs_as_many_points_as_parameters():
    with pytest.raises(FitInputError, match="5 parameters"):
        fit_chinchilla([1e7, 1e8, 1e9, 1e7], [1e9, 1e10, 1e11, 1e10], [3.0, 2.5, 2.2, 2.9], n_boot=0)


def test_nan_rows_are_dropped_with_a_warning_naming_the_runs():
    loss = 25.0 * C**-0.057
    loss[2] = np.nan
    compute = C.copy()
    compute[5] = np.nan
    ids = [f"run-{i}" for i in range(C.size)]
    with pytest.warns(UserWarning, match=r"dropped 2 point\(s\).*run-2, run-5"):
        fit = fit_power_law(compute, loss, run_ids=ids, n_boot=0)
    assert fit.n_points == 5 and "run-2" not in fit.run_ids
    assert rel(fit.law.alpha, 0.057) < 1e-6


def test_nan_rows_without_run_ids_are_named_by_row():
    loss = 25.0 * C**-0.057
    loss[0] = np.nan
    with pytest.warns(UserWarning, match="row 0"):
        fit_power_law(C, loss, n_boot=0)


def test_result_objects_are_frozen():
    fit = fit_power_law(C, 25.0 * C**-0.057, n_boot=0)
    with pytest.raises(AttributeError):
        fit.status = "x"  # type: ignore[misc]


def test_docstring_examples_run():
    import analysis.estimates.multiplier
    import analysis.laws.fit

    for module in (analysis.laws.fit, analysis.estimates.multiplier):
        failed, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert failed == 0, module.__name__


def test_power_law_inverse_and_asymptote():
    law = PowerLaw(A=2.0, alpha=0.5, E=1.0)
    assert math.isclose(law.compute_for_loss(law.loss(100.0)), 100.0, rel_tol=1e-12)
    assert law.compute_for_loss(1.0) == math.inf and law.compute_for_loss(0.5) == math.inf


def test_public_names_resolve():
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None
