"""The law type (analysis.laws.forms): every form answers for itself, and the curved power law, added as one class, is
fitted, inverted and compared like the paper's form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import FitInputError, compute_multiplier, fit_power_law, fit_power_law_joint, fit_results
from analysis.cli import main
from analysis.laws.forms import FORMS, CurvedPowerForm, law_for, normalize_form
from analysis.laws.laws import CURVED_POWER, CurvedPowerLaw, PowerLaw
from tests.synthetic_results import write_synthetic_results

C = np.geomspace(1e15, 1e21, 7)
C0 = float(np.exp(np.log(C).mean()))  # the reference compute a fit of these points takes
TRUTH = CurvedPowerLaw(A=2.4, alpha=0.06, beta=-0.0015, C0=C0)  # flattening: the slope falls 0.003 per e-fold


def rel(a: float, b: float) -> float:
    return abs(a / b - 1.0)


@pytest.mark.parametrize("name", list(FORMS))
def test_every_form_answers_for_itself(name):
    law = FORMS[name]
    assert law_for(name) is law and normalize_form(f" {name.lower()} ") == name
    assert law.n_params == len(law.param_names) and set(law.shared_names) <= set(law.param_names)
    y = np.log(np.full(4, 3.0))
    model = law.model(np.log(C[:4]), np.zeros(4, dtype=int), 1, y)
    assert model.n_params == law.n_params  # one curve: the model's parameters are the law's
    assert law.alternative in FORMS and law.alternative != name
    assert law.words.startswith("L = ") and law.short.startswith("L = ")


def test_an_unknown_form_names_every_known_one():
    with pytest.raises(FitInputError, match="unknown form 'quadratic'") as err:
        law_for("quadratic")
    assert all(repr(name) in str(err.value) for name in FORMS)


def test_the_curved_law_is_found_by_its_aliases():
    for spelling in ("curved", "log-quadratic", "A*C^-(alpha + beta*ln(C))", CURVED_POWER):
        assert isinstance(law_for(spelling), CurvedPowerForm)


def test_curved_law_inverse_round_trips_and_says_where_the_curve_never_reaches():
    assert np.allclose(TRUTH.compute_for_loss(TRUTH.loss(C)), C, rtol=1e-10)
    lowest = TRUTH.loss(C0 * math.exp(-TRUTH.alpha / (2 * TRUTH.beta)))  # the vertex: the flattening curve's floor
    assert TRUTH.compute_for_loss(0.99 * lowest) == math.inf
    straight = CurvedPowerLaw(A=2.0, alpha=0.5, beta=0.0, C0=1.0)  # beta = 0 is the paper's form
    assert math.isclose(straight.compute_for_loss(PowerLaw(A=2.0, alpha=0.5).loss(100.0)), 100.0, rel_tol=1e-12)
    assert math.isclose(TRUTH.in_units(1e15).loss(C[3] / 1e15), TRUTH.loss(C[3]), rel_tol=1e-12)


def test_noise_free_curved_law_recovers_every_parameter():
    fit = fit_power_law(C, TRUTH.loss(C), "curved", n_boot=0)
    assert fit.form == CURVED_POWER and fit.status == "converged"
    assert isinstance(fit.law, CurvedPowerLaw) and rel(fit.law.C0, C0) < 1e-12
    for name in ("A", "alpha", "beta"):
        assert rel(getattr(fit.law, name), getattr(TRUTH, name)) < 1e-6, name
    assert fit.E is None and fit.params["beta"].value == fit.law.beta
    assert set(fit.to_dict()["params"]) == {"A", "alpha", "beta", "C0"}


def test_noisy_curved_fit_has_intervals_around_the_truth():
    rng = np.random.default_rng(2)
    loss = TRUTH.loss(C) * np.exp(rng.normal(0, 0.002, C.size))
    fit = fit_power_law(C, loss, "curved", n_boot=200, seed=1)
    assert fit.n_boot_failed == 0
    for name in ("A", "alpha", "beta"):
        est = fit.params[name]
        assert est.low < est.value < est.high, name
    assert fit.params["beta"].contains(TRUTH.beta) and fit.alpha.contains(TRUTH.alpha)


def test_joint_curved_fit_shares_alpha_and_beta_and_inverts_the_baseline_for_M():
    variant = CurvedPowerLaw(A=TRUTH.A * 0.97, alpha=TRUTH.alpha, beta=TRUTH.beta, C0=C0)  # 3 % lower everywhere
    joint = fit_power_law_joint({"baseline": (C, TRUTH.loss(C)), "block": (C, variant.loss(C))}, "curved", n_boot=0)
    assert joint.status == "converged" and rel(joint.alpha.value, TRUTH.alpha) < 1e-6
    assert rel(joint.extra["beta"].value, TRUTH.beta) < 1e-6
    want = TRUTH.compute_for_loss(variant.loss(C0)) / C0  # M at the joint data's central compute
    assert rel(joint.multiplier("block", "baseline").value, want) < 1e-6


def test_multiplier_of_two_curved_fits_is_the_baseline_inverted_at_the_variants_loss():
    variant = CurvedPowerLaw(A=TRUTH.A * 0.97, alpha=TRUTH.alpha * 1.02, beta=TRUTH.beta, C0=C0)
    base, var = (fit_power_law(C, law.loss(C), "curved", n_boot=0) for law in (TRUTH, variant))
    m = compute_multiplier(base, var, at=[1e17, 1e20], n_boot=0)
    want = TRUTH.compute_for_loss(variant.loss(np.array([1e17, 1e20]))) / np.array([1e17, 1e20])
    assert np.allclose(m.values, want, rtol=1e-6)
    shared = compute_multiplier(base, var, at=[1e17, 1e20], shared_exponent=True, n_boot=0)
    assert shared.method == "shared" and len(set(shared.values.round(12))) == 2  # M changes with compute
    bare = compute_multiplier(TRUTH, variant, at=[1e17, 1e20], n_boot=0)  # bare curves: no fit behind them
    assert np.allclose(bare.values, want, rtol=1e-12)


def test_a_results_tree_is_fitted_with_the_curved_law_end_to_end(tmp_path):
    write_synthetic_results(tmp_path, multipliers={"baseline": 1.0, "block": 1.2}, tables=False)
    report = fit_results(tmp_path, form="curved", n_boot=50)
    sweep = report.sweeps[0]
    assert report.settings.form == CURVED_POWER and sweep.curve("baseline").fit.form == CURVED_POWER
    # a pure power law is a curved one with beta = 0: the multiplier is the one written into the runs
    assert abs(sweep.curve("baseline").fit.law.beta) < 1e-3
    assert math.isclose(sweep.multiplier("block").multiplier.value, 1.2, rel_tol=0.02)
    assert report.to_dict()["settings"]["form"] == CURVED_POWER
    assert main(["fit", str(tmp_path), "--form", "curved", "--n-boot", "0", "--out", str(tmp_path / "f.json")]) == 0


def test_two_budgets_are_too_few_for_the_curved_law_one_clear_error(tmp_path, capsys):
    write_synthetic_results(tmp_path, budgets=[1e16, 1e17], tables=False)
    match = r"'baseline' has 2 budgets, too few for the form A\*C\^-\(alpha\+beta\*lnC\), which has 3 parameters"
    with pytest.raises(FitInputError, match=match):
        fit_results(tmp_path, form="curved", n_boot=0)
    assert main(["fit", str(tmp_path), "--form", "curved", "--n-boot", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "(A, alpha, beta); use --form 'A*C^-alpha'" in err and "\n" not in err
