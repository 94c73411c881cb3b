"""The fits' models in internal coordinates: log Lhat and its Jacobian for a batch of parameter vectors.

The optimiser (:mod:`analysis.laws.optimizer`) sees a model only through ``predict(theta, jac)`` (theta (B, p) ->
log Lhat (B, n) and dlog Lhat / dtheta (B, n, p)), ``starts(y)``, ``bounds`` / ``lower`` / ``upper`` and ``names``.
The coordinates keep the problem well posed: the scale coefficients are fitted as logs (``A = exp(a)``), so they
stay positive; E is fitted as it is, bounded to [0, max L], because an irreducible loss the data cannot tell
from 0 must be able to reach 0 (with E = exp(e) the optimiser crawls towards e = -inf instead). log C (log N,
log D) is centred on the data's mean, which keeps the problem well conditioned whatever the unit; ``law(theta)``
converts back to the user's units. Pure numpy; never imports torch.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.laws.laws import ChinchillaLaw, CurvedPowerLaw, PowerLaw

MAX_EXPONENT = 10.0  # upper bound of alpha and beta: nothing physical lies near it


class PowerModel:
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


class CurvedPowerModel:
    """``log L = a_g - alpha x - beta x^2``, x = log C - x0, g the curve: linear in its parameters, so its robust fit
    has one minimum. theta = alpha, beta, a_0, ..., a_{k-1}; curve g's reference compute C0 is exp(x0)."""

    i_alpha, i_beta, i_a = 0, 1, 2

    def __init__(self, log_compute: np.ndarray, group: np.ndarray, n_groups: int, y: np.ndarray):
        self.x0 = float(np.mean(log_compute))
        self.x = np.asarray(log_compute, dtype=float) - self.x0
        self.group = np.asarray(group, dtype=int)
        self.k = n_groups
        self.n_params = 2 + n_groups
        # alpha is the log-slope at the data's centre: a falling curve has it >= 0; beta is free in sign
        self.bounds = [(0.0, MAX_EXPONENT), (-MAX_EXPONENT, MAX_EXPONENT)] + [(None, None)] * n_groups
        self.lower = np.array([-np.inf if lo is None else lo for lo, _ in self.bounds])
        self.upper = np.array([np.inf if hi is None else hi for _, hi in self.bounds])
        self.names = ["alpha", "beta"] + (["A"] if n_groups == 1 else [f"A[{g}]" for g in range(n_groups)])
        self._rows = np.arange(self.x.size)
        self._design = np.zeros((self.x.size, self.n_params))
        self._design[:, 0] = -self.x
        self._design[:, 1] = -self.x * self.x
        self._design[self._rows, 2 + self.group] = 1.0

    def predict(self, theta: np.ndarray, jac: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        theta = np.atleast_2d(theta)
        pred = theta @ self._design.T  # (B, n)
        return pred, (np.broadcast_to(self._design, (theta.shape[0],) + self._design.shape).copy() if jac else None)

    def starts(self, y: np.ndarray) -> np.ndarray:
        # least squares (the natural start of a linear problem) and the straight lines through the data
        rows = [list(np.linalg.lstsq(self._design, y, rcond=None)[0])]
        for alpha in (0.01, 0.03, 0.1, 0.3, 1.0):
            rows.append(
                [alpha, 0.0] + [np.median(y[self.group == g] + alpha * self.x[self.group == g]) for g in range(self.k)]
            )
        return np.array(rows, dtype=float)

    def law(self, theta: np.ndarray, g: int = 0) -> CurvedPowerLaw:
        theta = np.asarray(theta, dtype=float).reshape(-1)
        return CurvedPowerLaw(
            A=float(np.exp(theta[self.i_a + g])),
            alpha=float(theta[self.i_alpha]),
            beta=float(theta[self.i_beta]),
            C0=float(np.exp(self.x0)),
        )


class ChinchillaModel:
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


def law_arrays(model: PowerModel, theta: np.ndarray, g: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log A, alpha, E) of curve g for a batch of theta; E = 0 for the paper's form."""
    return model.log_a(theta, g), model.alpha(theta), model.e(theta)
