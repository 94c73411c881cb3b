"""Scaling laws as parameters only: the curves :class:`PowerLaw`, :class:`CurvedPowerLaw` and :class:`ChinchillaLaw`.

Curves (C: compute, N: non-embedding parameters, D: training tokens)::

    PowerLaw          L = A * C^-alpha  or  L = E + A * C^-alpha     (the forms "A*C^-alpha", "E+A*C^-alpha")
    CurvedPowerLaw    L = A * (C/C0)^-(alpha + beta ln(C/C0))        (the form "A*C^-(alpha+beta*lnC)")
    ChinchillaLaw     L(N, D) = E + A / N^alpha + B / D^beta

A curve holds its parameters in the user's units and evaluates or inverts itself. What a fit asks of a form (its
parameter count, its internal model, its formula in words) is the form's class in :mod:`analysis.laws.forms`; fitting
is :mod:`analysis.laws.fit`. Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PFLOP_S_DAY = 1e15 * 86400.0  # FLOPs in one PFLOP/s-day, the paper's compute unit
POWER = "A*C^-alpha"
OFFSET_POWER = "E+A*C^-alpha"
CURVED_POWER = "A*C^-(alpha+beta*lnC)"


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
class CurvedPowerLaw:
    """``L = A * (C/C0)^-(alpha + beta ln(C/C0))``: a power law whose log-slope changes linearly in log compute.

    In log-log coordinates a parabola, ``ln L = ln A - alpha u - beta u^2`` with ``u = ln(C/C0)``: A is the loss at
    the reference compute C0 (a fit takes the geometric mean of its points' compute, not a free parameter), alpha
    the log-slope there and beta half the slope's change per e-fold of compute (beta < 0: the curve flattens, as
    one approaching an irreducible loss does; beta > 0: it steepens). It is the second-order term every smooth law
    has in log-log coordinates, so it can tell a bend from a straight line at five budgets without E's
    asymptote. The fit is linear in (ln A, alpha, beta), so it has one minimum.
    """

    A: float
    alpha: float
    beta: float
    C0: float = 1.0

    @property
    def form(self) -> str:
        return CURVED_POWER

    def loss(self, compute: float | np.ndarray) -> float | np.ndarray:
        """The loss the curve predicts at ``compute``."""
        u = np.log(np.asarray(compute, dtype=float) / self.C0)
        return np.exp(math.log(self.A) - (self.alpha + self.beta * u) * u)

    def compute_for_loss(self, loss: float | np.ndarray) -> float | np.ndarray:
        """The compute at which the curve's falling branch reaches ``loss``: ``inf`` for a loss below the lowest
        the curve reaches (it flattens, beta < 0, and turns up), ``nan`` above the highest its falling branch has."""
        d = math.log(self.A) - np.log(np.asarray(loss, dtype=float))  # beta u^2 + alpha u - d = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            root = np.sqrt(self.alpha**2 + 4.0 * self.beta * d)
            # the root that tends to d / alpha as beta -> 0, written without the cancellation of -alpha + root
            u = 2.0 * d / (self.alpha + root)
            out = np.where(
                np.isfinite(root) & (self.alpha + root > 0), self.C0 * np.exp(u), np.where(d > 0, np.inf, np.nan)
            )
        return out if out.ndim else float(out)

    def in_units(self, unit: float) -> CurvedPowerLaw:
        """The same curve with compute measured in ``unit``: only the reference compute changes."""
        return CurvedPowerLaw(A=self.A, alpha=self.alpha, beta=self.beta, C0=self.C0 / unit)


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
