"""The optimiser of every fit: a smooth robust loss on log residuals, minimised from a grid of starting points.

Every fit minimises ``sum_i w_i rho_delta(log Lhat_i - log L_i)`` (a sum over points, not a mean; the weights w are
resampling counts, or 1) over the parameters of a model of :mod:`analysis.laws.models`, within the model's bounds. The
loss is the pseudo-Huber function ``rho(r) = delta^2 (sqrt(1 + (r / delta)^2) - 1)``: r^2 / 2 for residuals well
inside the scale ``delta``, growing like ``delta |r|`` far beyond it (one bad point pulls with a bounded force), and
strictly convex everywhere. That last property is why it replaced the Huber loss: Huber's linear pieces have no
curvature, and with its delta below most residuals a fit of a few points had a flat face of minimisers, so the
answer depended on where the solver started (and on the BLAS kernel; docs/analysis.md, "One answer per fit"). A
model that is linear in its parameters (the pure power law in log space, the envelope's parabola) now has exactly
one minimum.

``delta`` is set from the data by default (:func:`data_scale`): 1.345 robust standard deviations of the residuals of
a least-squares fit of the same model, floored at :data:`DELTA_FLOOR`, so that most residuals lie in the quadratic
part and a point several standard deviations out is down-weighted (Huber's tuning constant: 95 % efficiency under
Gaussian noise).

:func:`minimize` evaluates the objective on the model's grid of starting points at once, runs L-BFGS-B (tight
tolerances, analytic gradient) from the best ``n_starts`` of them, and polishes the best solution by a damped
Newton iteration on the same objective, which reaches the minimum to machine precision where L-BFGS-B stops early.
Its :class:`Solution` carries a status: ``converged``, ``hit_bound`` (a parameter sits on its bound: an exponent at
0, E at ~0, ...) or ``not_converged``. :func:`refit` refits bootstrap replicates by the same Newton iteration,
vectorised over replicates and warm-started at the point estimate, with L-BFGS-B as the fallback for the rare
replicate it does not settle. Pure numpy/scipy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize

DELTA_FLOOR = 1e-3  # the smallest scale: a fit whose residuals are all ~0 (noise-free data) is not made scale-free
AUTO = "auto"  # delta set from the data (data_scale)
HUBER_K = 1.345  # the scale in robust standard deviations of the residuals (Huber's constant)
LEAST_SQUARES_DELTA = 100.0  # a scale log-loss residuals never approach: least squares (to (r / 100)^2 ~ 1e-8)
STATUSES = ("converged", "hit_bound", "not_converged")
DEFAULT_STARTS = 8

_LBFGSB_OPTIONS = {"maxiter": 10_000, "maxfun": 50_000, "ftol": 1e-15, "gtol": 1e-12, "maxcor": 30}


def pseudo_huber(r: np.ndarray, delta: float) -> np.ndarray:
    """``delta^2 (sqrt(1 + (r / delta)^2) - 1)``: r^2 / 2 near 0, ``delta |r|`` (less a constant) far out."""
    r = np.asarray(r)
    u = r / delta
    return r * r / (1.0 + np.sqrt(1.0 + u * u))  # the same, without the cancellation of sqrt(1 + u^2) - 1


def psi(r: np.ndarray, delta: float) -> np.ndarray:
    """The loss's derivative: r / sqrt(1 + (r / delta)^2), bounded by delta."""
    u = np.asarray(r) / delta
    return r / np.sqrt(1.0 + u * u)


def curvature(r: np.ndarray, delta: float) -> np.ndarray:
    """The loss's second derivative, (1 + (r / delta)^2)^(-3/2): positive everywhere (strict convexity)."""
    u = np.asarray(r) / delta
    return (1.0 + u * u) ** -1.5


def robust_sd(residuals: Iterable[tuple[np.ndarray, int]]) -> float:
    """The pooled robust standard deviation of groups of least-squares residuals, each with the number of parameters
    fitted to it: 1.4826 x the median absolute residual, scaled by sqrt(n / (n - p)) for what the fits absorbed
    (n points, p parameters, summed over the groups). Groups without a degree of freedom are left out; 0 when none
    has one."""
    kept = [(np.abs(np.asarray(r, dtype=float)), p) for r, p in residuals if np.size(r) > p]
    if not kept:
        return 0.0
    n = sum(r.size for r, _ in kept)
    p = sum(p for _, p in kept)
    return float(1.4826 * np.median(np.concatenate([r for r, _ in kept])) * math.sqrt(n / (n - p)))


def data_scale(residuals: Iterable[tuple[np.ndarray, int]]) -> float:
    """The loss's scale for fits with these least-squares residuals (:func:`robust_sd`): ``max(DELTA_FLOOR, HUBER_K x
    robust sd)``."""
    return max(DELTA_FLOOR, HUBER_K * robust_sd(residuals))


@dataclass(frozen=True)
class Solution:
    """The best point a fit found: its parameters (internal coordinates), objective, status and how it ended."""

    theta: np.ndarray
    objective: float  # sum of the losses, unscaled
    status: str
    message: str


def objective(model: Any, theta: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float) -> np.ndarray:
    """The (weighted) sum of the losses of the log residuals, for a batch of theta (B, p): (B,)."""
    pred, _ = model.predict(theta)
    loss = pseudo_huber(pred - y, delta)
    return (loss if w is None else w * loss).sum(axis=-1)


def gauss_newton(
    model: Any,
    theta0: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None,
    delta: float,
    max_iter: int = 300,
    xtol: float = 1e-13,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the objective for a batch of replicates at once; returns (theta (B, p), converged (B,)).

    Each iteration tries two Levenberg-Marquardt steps and keeps the better one if it does not increase
    the replicate's objective: an iteratively-reweighted step (weights ``psi(r) / r``: the quadratic majoriser of
    the loss, robust far from the minimum) and a Gauss-Newton step on the loss's own curvature (which converges
    quadratically near the minimum, where the reweighted step alone converges only linearly). Steps are projected
    onto the bounds.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # wild trial steps are rejected below
        return _gauss_newton_steps(model, theta0, y, w, delta, max_iter, xtol)


def _gauss_newton_steps(
    model: Any, theta0: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float, max_iter: int, xtol: float
) -> tuple[np.ndarray, np.ndarray]:
    theta = np.clip(np.array(theta0, dtype=float), model.lower, model.upper)
    b = theta.shape[0]
    n = np.atleast_2d(y).shape[-1]
    y = np.broadcast_to(np.atleast_2d(y), (b, n))
    w = np.ones((b, n)) if w is None else np.broadcast_to(np.atleast_2d(w), (b, n))
    pred, J = model.predict(theta, jac=True)
    r = pred - y
    f = (w * pseudo_huber(r, delta)).sum(axis=1)
    lam = np.full(b, 1e-3)
    done = np.zeros(b, dtype=bool)
    ok = np.zeros(b, dtype=bool)
    eye = np.eye(theta.shape[1])
    for _ in range(max_iter):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        ra, wa, Ja, th, ya = r[act], w[act], J[act], theta[act], y[act]
        u = ra / delta
        g = np.einsum("bnp,bn->bp", Ja, wa * psi(ra, delta))
        H_irls = np.einsum("bnp,bn,bnq->bpq", Ja, wa / np.sqrt(1.0 + u * u), Ja)
        H_newton = np.einsum("bnp,bn,bnq->bpq", Ja, wa * curvature(ra, delta), Ja)
        # parameters on a bound that the gradient pushes against stay there: solve for the others only
        # (a projected step that includes them would be clipped and distort the step of the rest)
        fixed = ((th <= model.lower) & (g > 0)) | ((th >= model.upper) & (g < 0))
        free = ~fixed
        g = np.where(free, g, 0.0)
        pair = free[:, :, None] & free[:, None, :]
        H_irls = np.where(pair, H_irls, 0.0) + fixed[:, :, None] * eye
        H_newton = np.where(pair, H_newton, 0.0) + fixed[:, :, None] * eye
        diag = np.einsum("bpp->bp", H_irls)
        damp = (lam[act, None] * diag + 1e-12 * (diag.max(axis=1, keepdims=True) + 1e-300))[:, :, None] * eye
        best_f = np.full(act.size, np.inf)
        best = (th, J[act], ra)
        for H in (H_irls, H_newton):
            try:
                step = -np.linalg.solve(H + damp, g[:, :, None])[:, :, 0]
            except np.linalg.LinAlgError:
                continue
            new = np.clip(th + step, model.lower, model.upper)
            pred_n, J_n = model.predict(new, jac=True)
            r_n = pred_n - ya
            f_n = (wa * pseudo_huber(r_n, delta)).sum(axis=1)
            f_n = np.where(np.isfinite(f_n), f_n, np.inf)
            better = f_n < best_f
            best_f = np.where(better, f_n, best_f)
            best = tuple(
                np.where(better.reshape((-1,) + (1,) * (a.ndim - 1)), a_new, a)
                for a, a_new in zip(best, (new, J_n, r_n))
            )
        new, J_n, r_n = best
        accept = best_f <= f[act]
        moved = np.max(np.abs(new - th) / (1.0 + np.abs(th)), axis=1)
        keep = act[accept]
        theta[keep], J[keep], r[keep], f[keep] = new[accept], J_n[accept], r_n[accept], best_f[accept]
        lam[keep] = np.maximum(lam[keep] * 0.3, 1e-15)
        lam[act[~accept]] *= 10.0
        converged = accept & (moved <= xtol)
        stuck = ~accept & (lam[act] > 1e12)  # no descent direction left at this precision: a minimum
        done[act[converged | stuck]] = True
        ok[act[converged | stuck]] = True
    return theta, ok


def lbfgsb(model: Any, theta0: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float) -> Any:
    """One L-BFGS-B run from ``theta0`` within the model's bounds (scipy's ``OptimizeResult``)."""
    scale = 1.0 / (delta * delta)  # objective in units of delta^2, so the tolerances mean the same for any delta

    def fun(th: np.ndarray) -> tuple[float, np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            pred, J = model.predict(th[None], jac=True)
        r = pred[0] - y
        loss, slope = pseudo_huber(r, delta), psi(r, delta)
        if w is not None:
            loss, slope = w * loss, w * slope
        value = float(loss.sum() * scale)
        grad = J[0].T @ slope * scale
        if not (math.isfinite(value) and np.all(np.isfinite(grad))):
            return math.inf, np.zeros_like(th)  # outside the region where the model is defined: L-BFGS-B backtracks
        return value, grad

    x0 = np.clip(theta0, model.lower, model.upper)
    return optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=model.bounds, options=_LBFGSB_OPTIONS)


def resolve_delta(
    delta: float | str, problems: Iterable[tuple[Any, np.ndarray]], n_starts: int = DEFAULT_STARTS
) -> float:
    """The loss's scale: ``delta`` itself, or for ``"auto"`` the :func:`data_scale` of the least-squares residuals of
    each (model, log loss) problem, every one fitted on its own (pooled, so that a sweep's curves share one scale)."""
    if delta != AUTO:
        return float(delta)
    residuals = []
    for model, y in problems:
        sol = minimize(model, y, None, LEAST_SQUARES_DELTA, n_starts)
        residuals.append((y - model.predict(sol.theta[None])[0][0], model.n_params))
    return data_scale(residuals)


def check_delta(delta: float | str, error: type[Exception] = ValueError) -> None:
    """One clear error for a scale no fit can use."""
    if delta == AUTO:
        return
    if isinstance(delta, str) or not (delta > 0 and math.isfinite(delta)):
        raise error(f"delta must be 'auto' (set from the residuals) or a positive number, got {delta!r}")


def at_bound(model: Any, theta: np.ndarray) -> np.ndarray:
    """Which parameters of ``theta`` sit on a bound of the model (within a relative 1e-9)."""
    tol = 1e-9 * (1.0 + np.abs(theta))
    return (theta - model.lower <= tol) | (model.upper - theta <= tol)


def minimize(model: Any, y: np.ndarray, w: np.ndarray | None, delta: float, n_starts: int = DEFAULT_STARTS) -> Solution:
    """Multi-start L-BFGS-B, polished by Newton; the status of the best solution."""
    starts = np.clip(model.starts(y), model.lower, model.upper)
    values = objective(model, starts, y, w, delta)
    order = np.argsort(np.where(np.isfinite(values), values, np.inf), kind="stable")[: max(1, n_starts)]
    best = None
    for i in order:
        res = lbfgsb(model, starts[i], y, w, delta)
        if best is None or res.fun < best.fun:
            best = res
    theta = np.asarray(best.x, dtype=float)
    polished, ok = gauss_newton(model, theta[None], y, w, delta)
    f_lbfgs = float(objective(model, theta[None], y, w, delta)[0])
    f_polished = float(objective(model, polished, y, w, delta)[0])
    gn_ok = bool(ok[0])
    if f_polished <= f_lbfgs:
        theta, f_best = polished[0], f_polished
    else:
        theta, f_best, gn_ok = theta, f_lbfgs, False
    message = f"L-BFGS-B: {best.message}; Gauss-Newton polish: {'converged' if gn_ok else 'no improvement'}"
    bound = at_bound(model, theta)
    if bound.any():
        names = getattr(model, "names", [f"theta[{i}]" for i in range(theta.size)])
        which = ", ".join(
            f"{names[i]} at its {'lower' if theta[i] - model.lower[i] <= model.upper[i] - theta[i] else 'upper'} bound "
            f"{min(max(theta[i], model.lower[i]), model.upper[i]):.6g}"
            for i in np.flatnonzero(bound)
        )
        status, message = "hit_bound", f"{which}; {message}"
    elif best.success or gn_ok:
        status = "converged"
    else:
        status = "not_converged"
    return Solution(theta=theta, objective=f_best, status=status, message=message)


def refit(
    model: Any, theta_hat: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float, xtol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray]:
    """Refit a batch of bootstrap replicates warm-started at ``theta_hat``; returns (theta (B, p), ok (B,)).

    ``y`` is (B, n) or (n,) and ``w`` (replicate weights, e.g. resampling counts) (B, n) or None.
    Replicates the vectorised iteration does not settle are refitted one by one with L-BFGS-B.
    """
    y2 = np.atleast_2d(y)
    b = max(y2.shape[0], 1 if w is None else np.atleast_2d(w).shape[0])
    start = np.broadcast_to(np.asarray(theta_hat, dtype=float), (b, theta_hat.size)).copy()
    theta, ok = gauss_newton(model, start, y2, w, delta, max_iter=200, xtol=xtol)
    for i in np.flatnonzero(~ok):
        yi = y2[i] if y2.shape[0] > 1 else y2[0]
        wi = None if w is None else np.atleast_2d(w)[i]
        res = lbfgsb(model, np.asarray(theta_hat, dtype=float), yi, wi, delta)
        th, ok_i = gauss_newton(model, res.x[None], yi, wi, delta, max_iter=100, xtol=xtol)
        theta[i] = th[0]
        ok[i] = bool(ok_i[0] or res.success)
    return theta, ok
