"""The optimiser on its own (analysis.laws.optimizer): the pseudo-Huber loss's two regimes and its strict convexity, the
scale set from the data, recovery of known parameters, one minimum whatever the start, agreement of its two
iterations, parameters on a bound, and replicate refits that equal fits from scratch."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.laws.models import ChinchillaModel, PowerModel
from analysis.laws.optimizer import (
    DELTA_FLOOR,
    HUBER_K,
    at_bound,
    curvature,
    data_scale,
    gauss_newton,
    lbfgsb,
    minimize,
    objective,
    pseudo_huber,
    psi,
    refit,
    resolve_delta,
    robust_sd,
)

HUBER_DELTA = 1e-3  # a small scale, so that the tests below have residuals far beyond it

C = np.geomspace(1e15, 1e21, 7)


def power_model(y: np.ndarray, offset: bool, compute: np.ndarray = C) -> PowerModel:
    return PowerModel(np.log(compute), np.zeros(compute.size, dtype=int), 1, offset, y)


def noisy_power_law(offset: bool, seed: int = 0) -> np.ndarray:
    """log L of a power law with seed-like noise and one outlier far beyond delta (so both regimes of the Huber
    loss are in play)."""
    rng = np.random.default_rng(seed)
    loss = (0.5 if offset else 0.0) + 9.0 * C ** -(0.08 if offset else 0.057)
    y = np.log(loss) + rng.normal(0.0, 2 * HUBER_DELTA, C.size)
    y[2] += 10 * HUBER_DELTA
    return y


def test_pseudo_huber_is_quadratic_near_zero_linear_far_out_and_strictly_convex():
    delta = 0.1
    small = np.linspace(-1e-3, 1e-3, 41)
    np.testing.assert_allclose(pseudo_huber(small, delta), 0.5 * small**2, rtol=1e-4)
    far = np.array([10.0, 50.0, 400.0])
    # far beyond delta the slope tends to delta: an outlier's loss grows like |r|, not r^2
    np.testing.assert_allclose(np.diff(pseudo_huber(far, delta)) / np.diff(far), delta, rtol=1e-4)
    np.testing.assert_allclose(psi(far, delta), delta, rtol=1e-4)
    r = np.linspace(-3.0, 3.0, 601)
    assert np.array_equal(pseudo_huber(-r, delta), pseudo_huber(r, delta))
    # psi and the curvature are the loss's derivatives, and the curvature is positive everywhere
    h = 1e-6
    np.testing.assert_allclose((pseudo_huber(r + h, delta) - pseudo_huber(r - h, delta)) / (2 * h), psi(r, delta),
                               rtol=1e-6, atol=1e-12)  # fmt: skip
    np.testing.assert_allclose((psi(r + h, delta) - psi(r - h, delta)) / (2 * h), curvature(r, delta), rtol=1e-5)
    assert (curvature(r, delta) > 0).all()


def test_the_scale_is_set_from_the_least_squares_residuals():
    """1.345 robust sds of the residuals (1.4826 x their median absolute value, corrected for the parameters
    fitted), pooled over problems, never below the floor; one wild residual does not move it."""
    rng = np.random.default_rng(3)
    r = rng.normal(0.0, 0.01, 4000)
    assert robust_sd([(r, 2)]) == pytest.approx(0.01, rel=0.05)
    wild = r.copy()
    wild[0] = 5.0
    assert robust_sd([(wild, 2)]) == pytest.approx(robust_sd([(r, 2)]), rel=1e-3)
    assert data_scale([(r, 2)]) == pytest.approx(HUBER_K * robust_sd([(r, 2)]))
    assert robust_sd([(r[:2000], 1), (r[2000:], 1)]) == pytest.approx(robust_sd([(r, 2)]), rel=1e-6)
    assert data_scale([(np.zeros(7), 2)]) == DELTA_FLOOR  # noise-free data: the floor
    assert data_scale([(np.ones(2), 2)]) == DELTA_FLOOR  # no degree of freedom: the floor
    # resolve_delta: a number is kept; "auto" fits each problem by least squares first
    y = noisy_power_law(offset=False)
    model = power_model(y, offset=False)
    assert resolve_delta(0.02, [(model, y)]) == 0.02
    x = model.x
    fitted = np.polyval(np.polyfit(x, y, 1), x)
    assert resolve_delta("auto", [(model, y)]) == pytest.approx(data_scale([(y - fitted, 2)]), rel=1e-7)


@pytest.mark.parametrize("offset", [False, True])
def test_one_minimum_whatever_the_start(offset):
    """The flat face the Huber loss had (residuals beyond delta count linearly, so a few points leave a direction in
    which the objective does not change): with the pseudo-Huber loss the minimum is unique, and L-BFGS-B from
    twenty scattered starts, polished, finds the same parameters."""
    y = noisy_power_law(offset)
    model = power_model(y, offset)
    best = minimize(model, y, None, HUBER_DELTA).theta
    rng = np.random.default_rng(0)
    for _ in range(20):
        start = np.clip(best * (1 + rng.normal(0, 0.3, best.size)) + rng.normal(0, 0.05, best.size), model.lower,
                        model.upper)  # fmt: skip
        res = lbfgsb(model, start, y, None, HUBER_DELTA)
        theta, ok = gauss_newton(model, res.x[None], y, None, HUBER_DELTA)
        assert ok[0]
        np.testing.assert_allclose(theta[0], best, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(("offset", "A", "alpha", "E"), [(False, 25.0, 0.057, 0.0), (True, 9.0, 0.08, 0.5)])
def test_minimize_recovers_a_noiseless_power_law(offset, A, alpha, E):
    y = np.log(E + A * C**-alpha)
    model = power_model(y, offset)
    sol = minimize(model, y, None, HUBER_DELTA)
    law = model.law(sol.theta)
    assert sol.status == "converged"
    assert law.A == pytest.approx(A, rel=1e-9) and law.alpha == pytest.approx(alpha, rel=1e-9)
    assert law.E == pytest.approx(E, rel=1e-9, abs=1e-12)
    assert sol.objective < 1e-25  # every residual ~0: the minimum of a sum of non-negative terms


def test_minimize_recovers_a_noiseless_chinchilla_surface():
    n = np.repeat(np.geomspace(1e7, 1e9, 4), 4)
    d = np.tile(np.geomspace(1e9, 1e11, 4), 4)
    E, A, B, alpha, beta = 1.69, 406.4, 410.7, 0.34, 0.28
    y = np.log(E + A / n**alpha + B / d**beta)
    model = ChinchillaModel(np.log(n), np.log(d), y)
    sol = minimize(model, y, None, HUBER_DELTA)
    law = model.law(sol.theta)
    assert sol.status == "converged"
    for got, want in zip((law.E, law.A, law.B, law.alpha, law.beta), (E, A, B, alpha, beta)):
        assert got == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("offset", [False, True])
def test_gauss_newton_and_lbfgsb_reach_the_same_minimum(offset):
    y = noisy_power_law(offset)
    model = power_model(y, offset)
    starts = np.clip(model.starts(y), model.lower, model.upper)
    start = starts[np.argmin(objective(model, starts, y, None, HUBER_DELTA))]
    res = lbfgsb(model, start, y, None, HUBER_DELTA)
    theta, ok = gauss_newton(model, start[None], y, None, HUBER_DELTA)
    assert ok[0]  # (L-BFGS-B may end "ABNORMAL": its line search fails at the minimum, which is why minimize polishes)
    residuals = model.predict(theta)[0][0] - y
    assert (np.abs(residuals) > HUBER_DELTA).any() and (np.abs(residuals) < HUBER_DELTA).any()  # both regimes
    f_gn = objective(model, theta, y, None, HUBER_DELTA)[0]
    f_lbfgsb = objective(model, res.x[None], y, None, HUBER_DELTA)[0]
    assert f_gn == pytest.approx(f_lbfgsb, rel=1e-9)
    np.testing.assert_allclose(theta[0], res.x, rtol=1e-6, atol=1e-8)


def test_a_parameter_at_its_bound_is_reported_at_the_bound():
    # loss that rises with compute: the best exponent is negative, so alpha stops at its lower bound 0
    y = np.log(2.0 * C**0.05)
    model = power_model(y, offset=False)
    sol = minimize(model, y, None, HUBER_DELTA)
    assert sol.status == "hit_bound"
    assert sol.theta[model.i_alpha] == 0.0
    assert sol.message.startswith("alpha at its lower bound 0;")
    assert at_bound(model, sol.theta).tolist() == [True, False]  # alpha on its bound, log A free
    # the irreducible loss of a pure power law sits at its bound 0 too
    y = np.log(25.0 * C**-0.057)
    model = power_model(y, offset=True)
    sol = minimize(model, y, None, HUBER_DELTA)
    assert sol.status == "hit_bound" and sol.message.startswith("E at its lower bound")
    assert at_bound(model, sol.theta).tolist() == [True, False, False]


def test_refit_of_a_batch_equals_each_replicate_fitted_alone():
    y = noisy_power_law(offset=False)
    model = power_model(y, offset=False)
    point = minimize(model, y, None, HUBER_DELTA)
    rng = np.random.default_rng(1)
    y_star = model.predict(point.theta[None])[0] + rng.normal(0.0, 2 * HUBER_DELTA, (5, C.size))
    theta, ok = refit(model, point.theta, y_star, None, HUBER_DELTA)
    assert ok.all()
    for b in range(5):
        alone = minimize(model, y_star[b], None, HUBER_DELTA)
        np.testing.assert_allclose(theta[b], alone.theta, rtol=1e-7, atol=1e-9)


def test_weights_count_points():
    # a resampling count w_i is the point taken w_i times: the objective, and so the fit, are the same
    y = noisy_power_law(offset=True)
    counts = np.array([2.0, 0.0, 1.0, 3.0, 1.0, 0.0, 1.0])
    take = np.repeat(np.arange(C.size), counts.astype(int))
    model = power_model(y, offset=True)
    repeated = power_model(y[take], offset=True, compute=C[take])
    theta = np.array([[0.3, 0.07, -1.0], [0.5, 0.08, -1.2]])
    # each model centres log C on its own points' mean, so the same curve has another log A coordinate in each
    shift = repeated.x0 - model.x0
    theta_rep = theta.copy()
    theta_rep[:, 2] -= theta[:, 1] * shift
    np.testing.assert_allclose(
        objective(model, theta, y, counts, HUBER_DELTA),
        objective(repeated, theta_rep, y[take], None, HUBER_DELTA),
        rtol=1e-12,
    )
    weighted, ok = refit(model, minimize(model, y, None, HUBER_DELTA).theta, y, counts[None], HUBER_DELTA)
    assert ok[0]
    got = model.law(weighted[0])
    want = repeated.law(minimize(repeated, y[take], None, HUBER_DELTA).theta)
    assert (got.E, got.A, got.alpha) == pytest.approx((want.E, want.A, want.alpha), rel=1e-7)
