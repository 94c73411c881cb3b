"""Scaling laws as parameters only: the curve forms, :class:`PowerLaw` and :class:`ChinchillaLaw`.

Forms (C: compute, N: non-embedding parameters, D: training tokens)::

    "A*C^-alpha"      L = A * C^-alpha                      the paper's form
    "E+A*C^-alpha"    L = E + A * C^-alpha                  with an irreducible loss E
    Chinchilla        L(N, D) = E + A / N^alpha + B / D^beta

A law holds its parameters in the user's units and evaluates or inverts itself; fitting one is
:mod:`analysis.fit`. Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.errors import FitInputError

PFLOP_S_DAY = 1e15 * 86400.0  # FLOPs in one PFLOP/s-day, the paper's compute unit
POWER = "A*C^-alpha"
OFFSET_POWER = "E+A*C^-alpha"
FORMS = (POWER, OFFSET_POWER)

_FORM_ALIASES = {
    "a*c^-alpha": POWER,
    "a*c**-alpha": POWER,
    "power": POWER,
    "paper": POWER,
    "e+a*c^-alpha": OFFSET_POWER,
    "e+a*c**-alpha": OFFSET_POWER,
    "offset": OFFSET_POWER,
}


def law_params(form: str) -> int:
    """The free parameters of one law of ``form``: A and alpha, and E for "E+A*C^-alpha". A curve needs more
    distinct budgets than that for its fit to have a residual, and at least that many for a fit at all."""
    return 3 if normalize_form(form) == OFFSET_POWER else 2


def normalize_form(form: str) -> str:
    """The canonical name of a curve form ("A*C^-alpha" or "E+A*C^-alpha"); spaces and case are ignored."""
    key = "".join(str(form).split()).lower()
    if key not in _FORM_ALIASES:
        raise FitInputError(f"unknown form {form!r}; use one of {', '.join(repr(f) for f in FORMS)}")
    return _FORM_ALIASES[key]


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
