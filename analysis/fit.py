"""Scaling-law fits: a Huber loss on log residuals, minimised by L-BFGS-B from a grid of starting points.

Pure numpy/scipy on arrays: no torch, no I/O, no plotting. Forms (C: compute, N: non-embedding parameters,
D: training tokens)::

    "A*C^-alpha"      L = A * C^-alpha                      the paper's form
    "E+A*C^-alpha"    L = E + A * C^-alpha                  with an irreducible loss E
    joint             either form over several curves with shared E and alpha and one A per curve
    Chinchilla        L(N, D) = E + A / N^alpha + B / D^beta

Every fit minimises ``sum_i huber_delta(log Lhat_i - log L_i)`` (a sum over points, not a mean; delta
defaults to 1e-3 as in Hoffmann et al. 2022 and Besiroglu et al. 2024). The scale coefficients are fitted as
logs (``A = exp(a)``), so they stay positive; E is fitted as it is, bounded to [0, max L], because an
irreducible loss the data cannot tell from 0 must be able to reach 0 (with E = exp(e) the optimiser crawls
towards e = -inf instead). log C is centred on the data's mean inside the fit, which keeps the problem well
conditioned whatever the compute unit; the results are converted back to the user's units.

The optimiser: the objective is evaluated on a grid of starting points at once, L-BFGS-B (tight tolerances,
analytic gradient) runs from the best ``n_starts`` of them, and the best solution is polished by a damped
Gauss-Newton iteration on the same objective (iteratively reweighted for the Huber loss), which reaches
the minimum to machine precision where L-BFGS-B stops early. Each fit gets a status carried into every
table: ``converged``, ``hit_bound`` (a parameter sits on its bound: an exponent at 0, E at ~0, ...) or
``not_converged``. Bootstrap replicates are refitted by the same Gauss-Newton iteration, vectorised over
replicates and warm-started at the point estimate, with L-BFGS-B as the fallback for the rare replicate it
does not settle.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import minimize

from analysis._threads import single_threaded_blas
from analysis.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_N_BOOT,
    Estimate,
    estimate,
    json_number,
    modified_residuals,
    residual_draws,
)
from analysis.errors import FitInputError

HUBER_DELTA = 1e-3
PFLOP_S_DAY = 1e15 * 86400.0  # FLOPs in one PFLOP/s-day, the paper's compute unit
POWER = "A*C^-alpha"
OFFSET_POWER = "E+A*C^-alpha"
FORMS = (POWER, OFFSET_POWER)
STATUSES = ("converged", "hit_bound", "not_converged")
MAX_EXPONENT = 10.0  # upper bound of alpha and beta: nothing physical lies near it
DEFAULT_STARTS = 8

_LBFGSB_OPTIONS = {"maxiter": 10_000, "maxfun": 50_000, "ftol": 1e-15, "gtol": 1e-12, "maxcor": 30}
_FORM_ALIASES = {
    "a*c^-alpha": POWER,
    "a*c**-alpha": POWER,
    "power": POWER,
    "paper": POWER,
    "e+a*c^-alpha": OFFSET_POWER,
    "e+a*c**-alpha": OFFSET_POWER,
    "offset": OFFSET_POWER,
}


def normalize_form(form: str) -> str:
    """The canonical name of a curve form ("A*C^-alpha" or "E+A*C^-alpha"); spaces and case are ignored."""
    key = "".join(str(form).split()).lower()
    if key not in _FORM_ALIASES:
        raise FitInputError(f"unknown form {form!r}; use one of {', '.join(repr(f) for f in FORMS)}")
    return _FORM_ALIASES[key]


def huber(r: np.ndarray, delta: float) -> np.ndarray:
    """Huber loss: r^2 / 2 for |r| <= delta, delta * (|r| - delta / 2) beyond."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


# ---------------------------------------------------------------------------------------------------------
# Curves (parameters only) and fit results
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLaw:
    """``L = E + A * C^-alpha`` (E = 0: the paper's form ``L = A * C^-alpha``); C in the unit it was fitted in."""

    A: float
    alpha: float
    E: float = 0.0

    @property
    def form(self) -> str:
        return POWER if self.E == 0.0 else OFFSET_POWER

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        """The loss the curve predicts at ``compute``."""
        return self.E + self.A * np.asarray(compute, dtype=float) ** -self.alpha

    def compute_for_loss(self, loss: float | np.ndarray) -> float | np.ndarray:
        """The compute at which the curve reaches ``loss`` (``inf`` at or below the asymptote E)."""
        loss = np.asarray(loss, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            gap = loss - self.E
            out = np.where(
                gap > 0, np.exp((math.log(self.A) - np.log(np.where(gap > 0, gap, 1.0))) / self.alpha), np.inf
            )
        return out if out.ndim else float(out)

    def in_units(self, unit: float) -> PowerLaw:
        """The same curve with compute measured in ``unit`` (e.g. ``PowerLaw(...).in_units(PFLOP_S_DAY)``)."""
        return PowerLaw(A=self.A * unit**-self.alpha, alpha=self.alpha, E=self.E)


@dataclass(frozen=True)
class ChinchillaLaw:
    """``L(N, D) = E + A / N^alpha + B / D^beta`` (N: non-embedding parameters, D: training tokens)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n_params: float | np.ndarray, n_tokens: float | np.ndarray) -> float | np.ndarray:
        n = np.asarray(n_params, dtype=float)
        d = np.asarray(n_tokens, dtype=float)
        return self.E + self.A * n**-self.alpha + self.B * d**-self.beta

    def compute_optimal(
        self, compute: float | np.ndarray, flops_per_param_token: float = 6.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """(N*, D*) minimising the loss at ``compute = flops_per_param_token * N * D`` (Hoffmann et al. eq. 4)."""
        c = np.asarray(compute, dtype=float) / flops_per_param_token
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        n_opt = g * c ** (self.beta / (self.alpha + self.beta))
        return n_opt, c / n_opt


@dataclass(frozen=True)
class PowerLawFit:
    """A power law fitted to (compute, loss) points, with bootstrap intervals on its parameters.

    ``law`` holds the point estimate at full precision; ``A``, ``alpha`` and ``E`` the same values with
    their intervals (``E`` is None for the paper's form). The data are kept so that multipliers can be
    bootstrapped from the fit (:func:`analysis.compute_multiplier`).
    """

    form: str
    law: PowerLaw
    A: Estimate
    alpha: Estimate
    E: Estimate | None
    status: str
    message: str
    objective: float
    compute: tuple[float, ...]
    loss: tuple[float, ...]
    run_ids: tuple[str, ...] | None
    delta: float
    level: float
    n_boot: int
    n_boot_failed: int
    seed: int

    @property
    def n_points(self) -> int:
        return len(self.compute)

    def predict(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.law.loss(compute)

    def compute_for_loss(self, loss: float | np.ndarray) -> float | np.ndarray:
        return self.law.compute_for_loss(loss)

    def to_dict(self) -> dict[str, Any]:
        params = {"A": self.A.to_dict(), "alpha": self.alpha.to_dict()}
        if self.E is not None:
            params["E"] = self.E.to_dict()
        return {
            "form": self.form,
            "status": self.status,
            "message": self.message,
            "params": params,
            "objective": json_number(self.objective),
            "n_points": self.n_points,
            "n_boot": self.n_boot,
            "n_boot_failed": self.n_boot_failed,
        }


@dataclass(frozen=True)
class JointPowerLawFit:
    """One power-law form fitted to several curves at once, with shared ``alpha`` (and ``E``), one A per curve.

    With a shared exponent the compute multiplier of curve v over curve b is the constant
    ``(A_b / A_v)^(1 / alpha)`` (:meth:`multiplier`), for either form.
    """

    form: str
    labels: tuple[str, ...]
    laws: Mapping[str, PowerLaw]
    A: Mapping[str, Estimate]
    alpha: Estimate
    E: Estimate | None
    multipliers: Mapping[tuple[str, str], Estimate]
    status: str
    message: str
    objective: float
    n_points: Mapping[str, int]
    delta: float
    level: float
    n_boot: int
    n_boot_failed: int
    seed: int

    def multiplier(self, variant: str, baseline: str) -> Estimate:
        """M = (A_baseline / A_variant)^(1/alpha), with its interval (computed for every ordered pair)."""
        return self.multipliers[(variant, baseline)]


@dataclass(frozen=True)
class ChinchillaFit:
    """The Chinchilla surface fitted to (N, D, loss) points; intervals from resampling the points."""

    law: ChinchillaLaw
    E: Estimate
    A: Estimate
    B: Estimate
    alpha: Estimate
    beta: Estimate
    status: str
    message: str
    objective: float
    n_params: tuple[float, ...]
    n_tokens: tuple[float, ...]
    loss: tuple[float, ...]
    run_ids: tuple[str, ...] | None
    delta: float
    level: float
    n_boot: int
    n_boot_failed: int
    seed: int
    # E, A, B, alpha, beta of every bootstrap replicate (nan where a refit failed), in draw order: every surface
    # fitted to the same number of points with the same seed drew the same points, which pairs the replicates of
    # two curves whose points are the same cells in the same order (analysis.frontier). Not written to fit.json.
    replicates: Mapping[str, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @property
    def n_points(self) -> int:
        return len(self.loss)

    def predict(self, n_params: float | np.ndarray, n_tokens: float | np.ndarray) -> float | np.ndarray:
        return self.law.loss(n_params, n_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "message": self.message,
            "params": {k: getattr(self, k).to_dict() for k in ("E", "A", "B", "alpha", "beta")},
            "objective": json_number(self.objective),
            "n_points": self.n_points,
            "n_boot": self.n_boot,
            "n_boot_failed": self.n_boot_failed,
        }


# ---------------------------------------------------------------------------------------------------------
# Models in internal coordinates: log Lhat and its Jacobian for a batch of parameter vectors theta (B, p)
# ---------------------------------------------------------------------------------------------------------


class _PowerModel:
    """``log L = a_g - alpha x`` or ``log L = log(E + exp(a_g - alpha x))``, x = log C - x0, g the curve.

    theta = [E,] alpha, a_0, ..., a_{k-1}.
    """

    def __init__(self, log_compute: np.ndarray, group: np.ndarray, n_groups: int, offset: bool, y: np.ndarray):
        self.x0 = float(np.mean(log_compute))
        self.x = np.asarray(log_compute, dtype=float) - self.x0
        self.group = np.asarray(group, dtype=int)
        self.k = n_groups
        self.offset = offset
        self.i_alpha = 1 if offset else 0
        self.i_a = self.i_alpha + 1
        self.n_params = self.i_a + n_groups
        bounds: list[tuple[float | None, float | None]] = []
        if offset:
            bounds.append((0.0, float(np.exp(np.max(y)))))
        bounds.append((0.0, MAX_EXPONENT))
        bounds += [(None, None)] * n_groups
        self.bounds = bounds
        self.lower = np.array([-np.inf if lo is None else lo for lo, _ in bounds])
        self.upper = np.array([np.inf if hi is None else hi for _, hi in bounds])
        self.names = (
            (["E"] if offset else []) + ["alpha"] + (["A"] if n_groups == 1 else [f"A[{g}]" for g in range(n_groups)])
        )
        self._rows = np.arange(self.x.size)

    def predict(self, theta: np.ndarray, jac: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        theta = np.atleast_2d(theta)
        b, n = theta.shape[0], self.x.size
        alpha = theta[:, self.i_alpha, None]
        t = theta[:, self.i_a :][:, self.group] - alpha * self.x  # (B, n)
        if not self.offset:
            if not jac:
                return t, None
            J = np.zeros((b, n, self.n_params))
            J[:, :, self.i_alpha] = -self.x
            J[:, self._rows, self.i_a + self.group] = 1.0
            return t, J
        with np.errstate(divide="ignore"):
            pred = np.logaddexp(np.log(theta[:, 0, None]), t)  # E = 0 gives log 0 = -inf: pred = t
        if not jac:
            return pred, None
        se, st = np.exp(-pred), np.exp(t - pred)
        J = np.zeros((b, n, self.n_params))
        J[:, :, 0] = se
        J[:, :, self.i_alpha] = -self.x * st
        J[:, self._rows, self.i_a + self.group] = st
        return pred, J

    def starts(self, y: np.ndarray) -> np.ndarray:
        alphas = np.array([0.01, 0.03, 0.1, 0.3, 1.0])
        rows = []
        if not self.offset:
            for alpha in alphas:
                rows.append(
                    [alpha] + [np.median(y[self.group == g] + alpha * self.x[self.group == g]) for g in range(self.k)]
                )
            # least squares with a common slope, the natural start of a linear problem
            design = np.zeros((y.size, 1 + self.k))
            design[:, 0] = -self.x
            design[self._rows, 1 + self.group] = 1.0
            sol = np.linalg.lstsq(design, y, rcond=None)[0]
            rows.append(list(sol))
            return np.array(rows, dtype=float)
        loss = np.exp(y)
        for q in (0.0, 0.05, 0.3, 0.5, 0.7, 0.85, 0.95):
            e_value = q * loss.min()
            for alpha in alphas:
                a = [
                    np.median(np.log(loss[self.group == g] - e_value) + alpha * self.x[self.group == g])
                    for g in range(self.k)
                ]
                rows.append([e_value, alpha] + a)
        return np.array(rows, dtype=float)

    def log_a(self, theta: np.ndarray, g: int) -> np.ndarray:
        """log A of curve g in the caller's compute unit."""
        theta = np.atleast_2d(theta)
        return theta[:, self.i_a + g] + theta[:, self.i_alpha] * self.x0

    def alpha(self, theta: np.ndarray) -> np.ndarray:
        return np.atleast_2d(theta)[:, self.i_alpha]

    def e(self, theta: np.ndarray) -> np.ndarray:
        """E (not its log) of a batch of theta; 0 for the paper's form."""
        theta = np.atleast_2d(theta)
        return theta[:, 0] if self.offset else np.zeros(theta.shape[0])

    def law(self, theta: np.ndarray, g: int = 0) -> PowerLaw:
        theta = np.asarray(theta, dtype=float)
        return PowerLaw(
            A=float(np.exp(self.log_a(theta, g)[0])),
            alpha=float(self.alpha(theta)[0]),
            E=float(theta[0]) if self.offset else 0.0,
        )


class _ChinchillaModel:
    """``log L = log(E + exp(a - alpha u) + exp(b - beta v))``, u = log N - u0, v = log D - v0.

    theta = E, a, b, alpha, beta.
    """

    n_params = 5
    names = ["E", "A", "B", "alpha", "beta"]

    def __init__(self, log_n: np.ndarray, log_d: np.ndarray, y: np.ndarray):
        self.u0, self.v0 = float(np.mean(log_n)), float(np.mean(log_d))
        self.u, self.v = np.asarray(log_n) - self.u0, np.asarray(log_d) - self.v0
        self.bounds = [
            (0.0, float(np.exp(np.max(y)))),
            (None, None),
            (None, None),
            (0.0, MAX_EXPONENT),
            (0.0, MAX_EXPONENT),
        ]
        self.lower = np.array([-np.inf if lo is None else lo for lo, _ in self.bounds])
        self.upper = np.array([np.inf if hi is None else hi for _, hi in self.bounds])

    def predict(self, theta: np.ndarray, jac: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        theta = np.atleast_2d(theta)
        e_value, a, b, alpha, beta = (theta[:, i, None] for i in range(5))
        t1, t2 = a - alpha * self.u, b - beta * self.v  # (B, n)
        with np.errstate(divide="ignore"):
            log_e = np.broadcast_to(np.log(e_value), t1.shape)
        top = np.maximum(np.maximum(t1, t2), log_e)
        pred = top + np.log(np.exp(t1 - top) + np.exp(t2 - top) + np.exp(log_e - top))
        if not jac:
            return pred, None
        s1, s2 = np.exp(t1 - pred), np.exp(t2 - pred)
        J = np.stack([np.exp(-pred), s1, s2, -self.u * s1, -self.v * s2], axis=-1)
        return pred, J

    def starts(self, y: np.ndarray) -> np.ndarray:
        loss = np.exp(y)
        centre = float(np.exp(np.median(y)))
        rows = []
        for q in (0.1, 0.3, 0.5, 0.7, 0.9):
            e_value = q * loss.min()
            rest = max(centre - e_value, 1e-3 * centre)
            for alpha in (0.1, 0.3, 0.6, 1.0):
                for beta in (0.1, 0.3, 0.6, 1.0):
                    for f in (0.2, 0.5, 0.8):
                        rows.append([e_value, math.log(f * rest), math.log((1 - f) * rest), alpha, beta])
        return np.array(rows, dtype=float)

    def law(self, theta: np.ndarray) -> ChinchillaLaw:
        e, a, b, alpha, beta = (float(v) for v in np.asarray(theta, dtype=float).reshape(-1)[:5])
        return ChinchillaLaw(
            E=e, A=math.exp(a + alpha * self.u0), B=math.exp(b + beta * self.v0), alpha=alpha, beta=beta
        )

    def params(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        """Public parameters (E, A, B, alpha, beta) of a batch of theta."""
        theta = np.atleast_2d(theta)
        return {
            "E": theta[:, 0],
            "A": np.exp(theta[:, 1] + theta[:, 3] * self.u0),
            "B": np.exp(theta[:, 2] + theta[:, 4] * self.v0),
            "alpha": theta[:, 3],
            "beta": theta[:, 4],
        }


# ---------------------------------------------------------------------------------------------------------
# The optimiser
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Solution:
    theta: np.ndarray
    objective: float  # sum of Huber losses, unscaled
    status: str
    message: str


def _objective(model: Any, theta: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float) -> np.ndarray:
    pred, _ = model.predict(theta)
    loss = huber(pred - y, delta)
    return (loss if w is None else w * loss).sum(axis=-1)


def _gauss_newton(
    model: Any,
    theta0: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None,
    delta: float,
    max_iter: int = 300,
    xtol: float = 1e-13,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the Huber objective for a batch of replicates at once; returns (theta (B, p), converged (B,)).

    Each iteration tries two Levenberg-Marquardt steps and keeps the better one if it does not increase
    the replicate's objective: an iteratively-reweighted step (weights ``min(1, delta / |r|)``: the
    quadratic majoriser of the Huber loss, robust far from the minimum) and a Newton step (weight 1 inside
    ``delta``, 0 outside: the Huber loss's own curvature, which reaches the minimum in a few steps once the
    points inside ``delta`` are settled, where the reweighted step alone converges only linearly). Steps
    are projected onto the bounds.
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
    f = (w * huber(r, delta)).sum(axis=1)
    lam = np.full(b, 1e-3)
    done = np.zeros(b, dtype=bool)
    ok = np.zeros(b, dtype=bool)
    eye = np.eye(theta.shape[1])
    for _ in range(max_iter):
        act = np.flatnonzero(~done)
        if act.size == 0:
            break
        ra, wa, Ja, th, ya = r[act], w[act], J[act], theta[act], y[act]
        absr = np.abs(ra)
        inside = absr <= delta
        g = np.einsum("bnp,bn->bp", Ja, wa * np.clip(ra, -delta, delta))
        H_irls = np.einsum("bnp,bn,bnq->bpq", Ja, wa * np.where(inside, 1.0, delta / np.maximum(absr, 1e-300)), Ja)
        H_newton = np.einsum("bnp,bn,bnq->bpq", Ja, wa * inside, Ja)
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
            f_n = (wa * huber(r_n, delta)).sum(axis=1)
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


def _lbfgsb(model: Any, theta0: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float) -> Any:
    scale = 1.0 / (delta * delta)  # objective in units of delta^2, so the tolerances mean the same for any delta

    def fun(th: np.ndarray) -> tuple[float, np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            pred, J = model.predict(th[None], jac=True)
        r = pred[0] - y
        hub = huber(r, delta)
        psi = np.clip(r, -delta, delta)
        if w is not None:
            hub, psi = w * hub, w * psi
        value = float(hub.sum() * scale)
        grad = J[0].T @ psi * scale
        if not (math.isfinite(value) and np.all(np.isfinite(grad))):
            return math.inf, np.zeros_like(th)  # outside the region where the model is defined: L-BFGS-B backtracks
        return value, grad

    x0 = np.clip(theta0, model.lower, model.upper)
    return minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=model.bounds, options=_LBFGSB_OPTIONS)


def _at_bound(model: Any, theta: np.ndarray) -> np.ndarray:
    tol = 1e-9 * (1.0 + np.abs(theta))
    return (theta - model.lower <= tol) | (model.upper - theta <= tol)


def _minimize(
    model: Any, y: np.ndarray, w: np.ndarray | None, delta: float, n_starts: int = DEFAULT_STARTS
) -> _Solution:
    """Multi-start L-BFGS-B, polished by Gauss-Newton; the status of the best solution."""
    starts = np.clip(model.starts(y), model.lower, model.upper)
    values = _objective(model, starts, y, w, delta)
    order = np.argsort(np.where(np.isfinite(values), values, np.inf), kind="stable")[: max(1, n_starts)]
    best = None
    for i in order:
        res = _lbfgsb(model, starts[i], y, w, delta)
        if best is None or res.fun < best.fun:
            best = res
    theta = np.asarray(best.x, dtype=float)
    polished, ok = _gauss_newton(model, theta[None], y, w, delta)
    f_lbfgs = float(_objective(model, theta[None], y, w, delta)[0])
    f_polished = float(_objective(model, polished, y, w, delta)[0])
    gn_ok = bool(ok[0])
    if f_polished <= f_lbfgs:
        theta, objective = polished[0], f_polished
    else:
        theta, objective, gn_ok = theta, f_lbfgs, False
    message = f"L-BFGS-B: {best.message}; Gauss-Newton polish: {'converged' if gn_ok else 'no improvement'}"
    bound = _at_bound(model, theta)
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
    return _Solution(theta=theta, objective=objective, status=status, message=message)


def _refit(
    model: Any, theta_hat: np.ndarray, y: np.ndarray, w: np.ndarray | None, delta: float, xtol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray]:
    """Refit a batch of bootstrap replicates warm-started at ``theta_hat``; returns (theta (B, p), ok (B,)).

    ``y`` is (B, n) or (n,) and ``w`` (replicate weights, e.g. resampling counts) (B, n) or None.
    Replicates the vectorised iteration does not settle are refitted one by one with L-BFGS-B.
    """
    y2 = np.atleast_2d(y)
    b = max(y2.shape[0], 1 if w is None else np.atleast_2d(w).shape[0])
    start = np.broadcast_to(np.asarray(theta_hat, dtype=float), (b, theta_hat.size)).copy()
    theta, ok = _gauss_newton(model, start, y2, w, delta, max_iter=200, xtol=xtol)
    for i in np.flatnonzero(~ok):
        yi = y2[i] if y2.shape[0] > 1 else y2[0]
        wi = None if w is None else np.atleast_2d(w)[i]
        res = _lbfgsb(model, np.asarray(theta_hat, dtype=float), yi, wi, delta)
        th, ok_i = _gauss_newton(model, res.x[None], yi, wi, delta, max_iter=100, xtol=xtol)
        theta[i] = th[0]
        ok[i] = bool(ok_i[0] or res.success)
    return theta, ok


# ---------------------------------------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------------------------------------


def clean_inputs(
    columns: Mapping[str, Any], run_ids: Sequence[str] | None, n_params: int, what: str, distinct: Sequence[str] = ()
) -> tuple[dict[str, np.ndarray], tuple[str, ...] | None]:
    """Check the arrays of a fit: equal lengths, NaN rows dropped with a warning naming them, the rest positive.

    Raises :class:`FitInputError` for all-NaN input, non-positive or infinite values, or fewer points (or
    fewer distinct values of a ``distinct`` column) than the fit has parameters.
    """
    arrays = {}
    for name, values in columns.items():
        try:
            arr = np.asarray(values, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            raise FitInputError(f"{what}: {name} must be numbers, got {values!r:.80}") from None
        arrays[name] = arr
    lengths = {name: arr.size for name, arr in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise FitInputError(f"{what}: the inputs have different lengths {lengths}; pass one value per run")
    n = next(iter(lengths.values()))
    ids = None
    if run_ids is not None:
        ids = tuple(str(r) for r in run_ids)
        if len(ids) != n:
            raise FitInputError(f"{what}: {len(ids)} run_ids for {n} points; pass one id per point")
    names = ids if ids is not None else tuple(f"row {i}" for i in range(n))
    nan = np.zeros(n, dtype=bool)
    for arr in arrays.values():
        nan |= np.isnan(arr)
    if n == 0 or nan.all():
        raise FitInputError(f"{what}: no usable points ({n} given, all missing/NaN); pass finite positive numbers")
    if nan.any():
        dropped = [names[i] for i in np.flatnonzero(nan)]
        warnings.warn(f"{what}: dropped {len(dropped)} point(s) with a NaN value: {', '.join(dropped)}", stacklevel=3)
        arrays = {name: arr[~nan] for name, arr in arrays.items()}
        names = tuple(nm for nm, bad in zip(names, nan) if not bad)
        if ids is not None:
            ids = names
    for name, arr in arrays.items():
        bad = ~np.isfinite(arr) | (arr <= 0)
        if bad.any():
            shown = ", ".join(f"{names[i]}={arr[i]!r}" for i in np.flatnonzero(bad)[:5])
            raise FitInputError(
                f"{what}: {name} must be positive and finite, got {shown}"
                + (" ..." if bad.sum() > 5 else "")
                + "; remove those points or fix the units"
            )
    m = next(iter(arrays.values())).size
    if m < n_params:
        raise FitInputError(f"{what}: {m} point(s) for a fit with {n_params} parameters; give at least {n_params}")
    for name in distinct:
        k = np.unique(arrays[name]).size
        need = n_params if len(distinct) == 1 else 2
        if k < need:
            raise FitInputError(f"{what}: only {k} distinct value(s) of {name}; the fit needs at least {need}")
    return arrays, ids


def _check_settings(delta: float, level: float, n_boot: int) -> None:
    if not (delta > 0 and math.isfinite(delta)):
        raise FitInputError(f"delta must be a positive number, got {delta!r}")
    if not 0 < level < 1:
        raise FitInputError(f"level must be between 0 and 1 (e.g. 0.9 for a 90% interval), got {level!r}")
    if n_boot < 0:
        raise FitInputError(f"n_boot must be >= 0 (0 skips the bootstrap), got {n_boot!r}")


# ---------------------------------------------------------------------------------------------------------
# Building blocks shared with the multiplier and the results tables
# ---------------------------------------------------------------------------------------------------------


@dataclass
class CurveFit:
    """A fitted power law in internal coordinates (used by :mod:`analysis.multiplier` and the report)."""

    model: _PowerModel
    y: np.ndarray  # log loss of the points
    solution: _Solution
    extra: dict = field(default_factory=dict)

    @property
    def theta(self) -> np.ndarray:
        return self.solution.theta

    @property
    def fitted(self) -> np.ndarray:
        return self.model.predict(self.theta[None])[0][0]

    def resampling_residuals(self) -> np.ndarray:
        """Modified (leverage-corrected, centred) residuals ``y - yhat`` for the residual bootstrap."""
        _, J = self.model.predict(self.theta[None], jac=True)
        return modified_residuals(self.y - self.fitted, J[0])


def fit_curve(
    compute: np.ndarray, loss: np.ndarray, form: str, delta: float, n_starts: int = DEFAULT_STARTS
) -> CurveFit:
    """Point fit of one curve (inputs already checked)."""
    y = np.log(loss)
    model = _PowerModel(np.log(compute), np.zeros(y.size, dtype=int), 1, form == OFFSET_POWER, y)
    return CurveFit(model=model, y=y, solution=_minimize(model, y, None, delta, n_starts))


def fit_joint_curves(
    computes: Sequence[np.ndarray],
    losses: Sequence[np.ndarray],
    form: str,
    delta: float,
    n_starts: int = DEFAULT_STARTS,
) -> CurveFit:
    """Point fit of several curves with a shared exponent (and E); group g is the g-th curve."""
    log_c = np.concatenate([np.log(c) for c in computes])
    y = np.concatenate([np.log(v) for v in losses])
    group = np.concatenate([np.full(len(c), g) for g, c in enumerate(computes)])
    model = _PowerModel(log_c, group, len(computes), form == OFFSET_POWER, y)
    return CurveFit(model=model, y=y, solution=_minimize(model, y, None, delta, n_starts))


def law_arrays(model: _PowerModel, theta: np.ndarray, g: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log A, alpha, E) of curve g for a batch of theta; E = 0 for the paper's form."""
    return model.log_a(theta, g), model.alpha(theta), model.e(theta)


def bootstrap_curve(
    fit: CurveFit, n_boot: int, rng: np.random.Generator, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Residual-bootstrap replicates of a single-curve fit: (theta (n_boot, p), ok (n_boot,))."""
    y_star = fit.fitted + residual_draws(fit.resampling_residuals(), n_boot, rng)
    return _refit(fit.model, fit.theta, y_star, None, delta)


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


def fit_power_law(
    compute: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    form: str = POWER,
    *,
    delta: float = HUBER_DELTA,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    run_ids: Sequence[str] | None = None,
    n_starts: int = DEFAULT_STARTS,
) -> PowerLawFit:
    """Fit ``L = A * C^-alpha`` (``form="A*C^-alpha"``) or ``L = E + A * C^-alpha`` (``form="E+A*C^-alpha"``).

    ``compute`` and ``loss`` hold one value per run (any compute unit; the parameters are in that unit).
    Intervals (at ``level``) come from a seeded residual bootstrap with ``n_boot`` replicates (0: none).
    Rows with a NaN are dropped with a warning naming them (``run_ids`` if given); too few points,
    non-positive or infinite values raise :class:`analysis.FitInputError`.

    >>> fit = fit_power_law([1e18, 1e19, 1e20], [3.0, 2.6, 2.25])
    >>> round(fit.alpha.value, 3), fit.status
    (0.062, 'converged')
    """
    form = normalize_form(form)
    _check_settings(delta, level, n_boot)
    n_params = 2 if form == POWER else 3
    arrays, ids = clean_inputs(
        {"compute": compute, "loss": loss}, run_ids, n_params, f"fit_power_law({form})", ("compute",)
    )
    c, l = arrays["compute"], arrays["loss"]
    samples: dict[str, np.ndarray | None] = {"A": None, "alpha": None, "E": None}
    failed = 0
    with single_threaded_blas():
        point = fit_curve(c, l, form, delta, n_starts)
        if n_boot > 0:
            theta, ok = bootstrap_curve(point, n_boot, np.random.default_rng(seed), delta)
            failed = int((~ok).sum())
            log_a, alpha, e_value = law_arrays(point.model, theta[ok])
            samples = {"A": np.exp(log_a), "alpha": alpha, "E": e_value}
    law = point.model.law(point.theta)
    df = c.size - n_params
    return PowerLawFit(
        form=form,
        law=law,
        A=estimate(law.A, samples["A"], level, df),
        alpha=estimate(law.alpha, samples["alpha"], level, df),
        E=estimate(law.E, samples["E"], level, df) if form == OFFSET_POWER else None,
        status=point.solution.status,
        message=point.solution.message,
        objective=point.solution.objective,
        compute=tuple(float(v) for v in c),
        loss=tuple(float(v) for v in l),
        run_ids=ids,
        delta=delta,
        level=level,
        n_boot=n_boot,
        n_boot_failed=failed,
        seed=seed,
    )


def fit_power_law_joint(
    data: Mapping[str, tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray]],
    form: str = POWER,
    *,
    delta: float = HUBER_DELTA,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    n_starts: int = DEFAULT_STARTS,
) -> JointPowerLawFit:
    """Fit one form to several curves with a shared exponent (and shared E), one A per curve.

    ``data`` maps a curve name to ``(compute, loss)``. The multiplier of every ordered pair of curves,
    ``(A_b / A_v)^(1/alpha)``, comes with its residual-bootstrap interval.
    """
    form = normalize_form(form)
    _check_settings(delta, level, n_boot)
    if len(data) < 1:
        raise FitInputError("fit_power_law_joint: no curves given; pass {name: (compute, loss), ...}")
    labels = tuple(data)
    computes, losses = [], []
    for label in labels:
        compute, loss = data[label]
        arrays, _ = clean_inputs({"compute": compute, "loss": loss}, None, 1, f"fit_power_law_joint[{label}]")
        computes.append(arrays["compute"])
        losses.append(arrays["loss"])
    n_params = len(labels) + (2 if form == OFFSET_POWER else 1)
    total = sum(c.size for c in computes)
    if total < n_params:
        raise FitInputError(f"fit_power_law_joint: {total} points for {n_params} parameters; give at least {n_params}")
    if np.unique(np.concatenate(computes)).size < (3 if form == OFFSET_POWER else 2):
        raise FitInputError("fit_power_law_joint: the curves share too few distinct compute values to fit an exponent")
    failed = 0
    draws = None
    with single_threaded_blas():
        point = fit_joint_curves(computes, losses, form, delta, n_starts)
        if n_boot > 0:
            draws, ok = bootstrap_joint(point, n_boot, np.random.default_rng(seed), delta)
            failed = int((~ok).sum())
            draws = draws[ok]
    return joint_result(point, labels, form, delta, level, n_boot, failed, seed, draws, total - n_params)


def bootstrap_joint(
    point: CurveFit, n_boot: int, rng: np.random.Generator, delta: float, y_star: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of a joint fit: residuals resampled within each curve (curves may differ in noise)."""
    model = point.model
    if y_star is None:
        fitted, resid = point.fitted, point.resampling_residuals()
        y_star = np.empty((n_boot, fitted.size))
        for g in range(model.k):
            idx = np.flatnonzero(model.group == g)
            y_star[:, idx] = fitted[idx] + residual_draws(resid[idx] - resid[idx].mean(), n_boot, rng)
    return _refit(model, point.theta, y_star, None, delta)


def joint_result(
    point: CurveFit,
    labels: tuple[str, ...],
    form: str,
    delta: float,
    level: float,
    n_boot: int,
    failed: int,
    seed: int,
    draws: np.ndarray | None,
    df: float | None,
) -> JointPowerLawFit:
    model, theta = point.model, point.theta
    alpha_hat = float(model.alpha(theta)[0])
    log_a_hat = {lab: float(model.log_a(theta, g)[0]) for g, lab in enumerate(labels)}
    laws = {lab: model.law(theta, g) for g, lab in enumerate(labels)}
    alpha_s = None if draws is None else model.alpha(draws)
    log_a_s = {lab: None if draws is None else model.log_a(draws, g) for g, lab in enumerate(labels)}
    multipliers = {}
    for v in labels:
        for b in labels:
            value = math.exp((log_a_hat[b] - log_a_hat[v]) / alpha_hat) if alpha_hat > 0 else math.nan
            samples = None
            if draws is not None:
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    samples = np.exp((log_a_s[b] - log_a_s[v]) / alpha_s)
            multipliers[(v, b)] = estimate(value, samples, level, df)
    return JointPowerLawFit(
        form=form,
        labels=labels,
        laws=laws,
        A={lab: estimate(laws[lab].A, None if draws is None else np.exp(log_a_s[lab]), level, df) for lab in labels},
        alpha=estimate(alpha_hat, alpha_s, level, df),
        E=(estimate(float(theta[0]), None if draws is None else draws[:, 0], level, df) if model.offset else None),
        multipliers=multipliers,
        status=point.solution.status,
        message=point.solution.message,
        objective=point.solution.objective,
        n_points={lab: int((model.group == g).sum()) for g, lab in enumerate(labels)},
        delta=delta,
        level=level,
        n_boot=n_boot,
        n_boot_failed=failed,
        seed=seed,
    )


def fit_chinchilla(
    n_params: Sequence[float] | np.ndarray,
    n_tokens: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    *,
    delta: float = HUBER_DELTA,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    run_ids: Sequence[str] | None = None,
    n_starts: int = DEFAULT_STARTS,
) -> ChinchillaFit:
    """Fit the Chinchilla surface ``L(N, D) = E + A / N^alpha + B / D^beta`` (Hoffmann et al. 2022, approach 3).

    One value per run. Intervals come from a seeded bootstrap over the runs (each replicate refits the
    points drawn with replacement), as in Besiroglu et al. 2024.
    """
    _check_settings(delta, level, n_boot)
    arrays, ids = clean_inputs(
        {"n_params": n_params, "n_tokens": n_tokens, "loss": loss},
        run_ids,
        5,
        "fit_chinchilla",
        ("n_params", "n_tokens"),
    )
    n, d, l = arrays["n_params"], arrays["n_tokens"], arrays["loss"]
    y = np.log(l)
    model = _ChinchillaModel(np.log(n), np.log(d), y)
    samples: dict[str, np.ndarray | None] = dict.fromkeys(("E", "A", "B", "alpha", "beta"))
    replicates = None
    failed = 0
    with single_threaded_blas():
        sol = _minimize(model, y, None, delta, n_starts)
        if n_boot > 0:
            rng = np.random.default_rng(seed)
            picks = rng.integers(0, y.size, size=(n_boot, y.size))
            counts = np.zeros((n_boot, y.size))
            np.add.at(counts, (np.arange(n_boot)[:, None], picks), 1.0)
            theta, ok = _refit(model, sol.theta, y, counts, delta)
            failed = int((~ok).sum())
            with np.errstate(over="ignore", invalid="ignore"):  # a failed replicate's theta may be wild
                replicates = {k: np.where(ok, v, np.nan) for k, v in model.params(theta).items()}
            samples = {k: v[ok] for k, v in replicates.items()}
    law = model.law(sol.theta)
    values = {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta}
    df = y.size - 5
    return ChinchillaFit(
        law=law,
        **{k: estimate(values[k], samples[k], level, df) for k in values},
        status=sol.status,
        message=sol.message,
        objective=sol.objective,
        n_params=tuple(float(v) for v in n),
        n_tokens=tuple(float(v) for v in d),
        loss=tuple(float(v) for v in l),
        run_ids=ids,
        delta=delta,
        level=level,
        n_boot=n_boot,
        n_boot_failed=failed,
        seed=seed,
        replicates=replicates,
    )
