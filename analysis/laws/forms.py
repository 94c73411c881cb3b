"""The law type: each curve form a class, asked by the fits, the multiplier, the bootstrap and the report.

    form                        class                 curve            parameters
    "A*C^-alpha"                :class:`PowerForm`        PowerLaw         A, alpha            (the paper's)
    "E+A*C^-alpha"              :class:`OffsetPowerForm`  PowerLaw         A, alpha, E
    "A*C^-(alpha+beta*lnC)"     :class:`CurvedPowerForm`  CurvedPowerLaw   A, alpha, beta      (C0 not free)

A form answers every question the rest of :mod:`analysis` has about a law: how many free parameters it has (a curve
needs at least that many budgets), its formula in words, the internal model the optimiser fits
(:mod:`analysis.laws.models`), the curve a parameter vector stands for and back, the public parameters of a batch of
bootstrap replicates, the loss at a compute and the compute at a loss (the multiplier's inverse), the shared-exponent
multiplier of a joint fit, the exponent the exponent test compares and the local log-slope. No module branches on a
form's name: adding a law is one class here (with its internal model and its curve, when it has new ones) and its
tests, registered in :data:`FORMS` under the name the CLI's ``--form`` and fit.json use.

Every method takes the internal model and a batch of parameter vectors theta (B, p), and returns arrays with one
row per replicate. Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from analysis.base.errors import FitInputError
from analysis.laws.laws import CURVED_POWER, OFFSET_POWER, POWER, CurvedPowerLaw, PowerLaw
from analysis.laws.models import CurvedPowerModel, PowerModel


class LawForm:
    """One curve form: what the fits, the multiplier, the bootstrap and the report ask of it (module docstring)."""

    name: ClassVar[str]  # the canonical name: --form, fit.json's "form"
    aliases: ClassVar[tuple[str, ...]] = ()  # other spellings --form accepts (compared without spaces, in lower case)
    param_names: ClassVar[tuple[str, ...]]  # the free parameters, in the order the tables and fit.json show them
    params_text: ClassVar[str]  # the same, as the messages name them
    shared_names: ClassVar[tuple[str, ...]]  # the parameters a joint fit shares (every curve has its own A)
    words: ClassVar[str]  # the formula in words (the settings' description, the report's provenance)
    short: ClassVar[str]  # the formula, short (the sensitivity table)
    alternative: ClassVar[str]  # the form the sensitivity table refits the headline under

    @property
    def n_params(self) -> int:
        """The free parameters of one curve: a curve needs more distinct budgets than that for its fit to have a
        residual, and at least that many for a fit at all."""
        return len(self.param_names)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # --- the internal model and the curve it stands for -----------------------------------------------------

    def model(self, log_compute: np.ndarray, group: np.ndarray, n_groups: int, y: np.ndarray) -> Any:
        """The internal model of ``n_groups`` curves (point i on curve ``group[i]``) with log losses ``y``."""
        raise NotImplementedError

    def curve(self, model: Any, theta: np.ndarray, g: int = 0) -> Any:
        """Curve g of one parameter vector, in the user's units."""
        return model.law(theta, g)

    def theta_from_curve(self, model: Any, curve: Any) -> np.ndarray:
        """The parameter vector of ``model`` (one curve) that stands for ``curve`` (no fit: taken as it is)."""
        raise NotImplementedError

    def check_curve(self, curve: Any, label: str) -> None:
        """Refuse a curve given by hand that cannot be inverted (the multiplier's bare laws)."""

    def legend(self, curve: Any) -> str:
        """A fitted curve's formula with its numbers, in matplotlib's mathtext (the scaling figure's legend)."""
        raise NotImplementedError

    def draws(self, model: Any, theta: np.ndarray, g: int = 0) -> dict[str, np.ndarray]:
        """The public parameters (:attr:`param_names`) of curve g for a batch of theta (B, p): each (B,)."""
        raise NotImplementedError

    # --- what the multiplier and its bootstrap ask ----------------------------------------------------------

    def log_loss_at(self, model: Any, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
        """log L of curve g for a batch of theta (B, p) at log compute values (n,): (B, n)."""
        raise NotImplementedError

    def log_compute_for_loss(self, model: Any, theta: np.ndarray, y: np.ndarray, g: int = 0) -> np.ndarray:
        """log C at which curve g of a batch of theta (B, p) reaches log loss y (B, n) or (n,): (B, n); +inf where
        the curve never gets that low."""
        raise NotImplementedError

    def shared_log_multiplier(
        self, model: Any, theta: np.ndarray, gb: int, gv: int, log_c: np.ndarray | None = None
    ) -> np.ndarray:
        """log M of curve gv over curve gb of a joint fit, for a batch of theta (B, p): (B, n) at the log compute
        values ``log_c`` (n,), or (B, 1) where M is the same at every compute (:attr:`constant_shared`). Without
        ``log_c``, M at the joint data's central compute."""
        log_c = np.array([model.x0]) if log_c is None else np.asarray(log_c, dtype=float)
        y_v = self.log_loss_at(model, theta, log_c, gv)
        return self.log_compute_for_loss(model, theta, y_v, gb) - log_c[None, :]

    constant_shared: ClassVar[bool] = False  # whether a joint fit's M is one number at every compute

    def joint_multiplier(
        self, model: Any, theta: np.ndarray, draws: np.ndarray | None, gb: int, gv: int
    ) -> tuple[float, np.ndarray | None]:
        """M of curve gv over gb of a joint fit (point value, and its replicates from ``draws`` (B, p))."""
        value = float(np.exp(self.shared_log_multiplier(model, np.atleast_2d(theta), gb, gv)[0, 0]))
        samples = None
        if draws is not None:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                samples = np.exp(self.shared_log_multiplier(model, draws, gb, gv)[:, 0])
        return value, samples

    def exponent(self, model: Any, theta: np.ndarray) -> np.ndarray:
        """The exponent the exponent test compares between two curves fitted apart: alpha, (B,)."""
        return np.atleast_2d(theta)[:, model.i_alpha]

    def log_slope(self, model: Any, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
        """-d log L / d log C of curve g for a batch of theta (B, p) at log compute values (n,): (B, n)."""
        raise NotImplementedError

    def point_log_slope(self, model: Any, theta: np.ndarray, log_c: float) -> float:
        """:meth:`log_slope` of one parameter vector at one compute."""
        return float(self.log_slope(model, np.atleast_2d(theta), np.array([log_c]))[0, 0])


class _PowerFamily(LawForm):
    """``L = E + A * C^-alpha``: the paper's form (E = 0) and the form with E share one internal model."""

    offset: ClassVar[bool]
    constant_shared = True  # with one alpha (and E), the curves differ by a factor in compute

    def model(self, log_compute: np.ndarray, group: np.ndarray, n_groups: int, y: np.ndarray) -> PowerModel:
        return PowerModel(log_compute, group, n_groups, self.offset, y)

    def theta_from_curve(self, model: PowerModel, curve: PowerLaw) -> np.ndarray:
        alpha = curve.alpha
        a = math.log(curve.A) - alpha * model.x0
        return np.array([curve.E, alpha, a] if model.offset else [alpha, a], dtype=float)

    def check_curve(self, curve: Any, label: str) -> None:
        if not (curve.A > 0 and curve.alpha > 0 and curve.E >= 0):
            raise FitInputError(f"compute_multiplier: {label} curve needs A > 0, alpha > 0 and E >= 0, got {curve}")

    def legend(self, curve: PowerLaw) -> str:
        core = f"{curve.A:.4g}$\\cdot C^{{-{curve.alpha:.4g}}}$"
        return f"{curve.E:.3g} + {core}" if curve.E else core

    def arrays(self, model: PowerModel, theta: np.ndarray, g: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log A, alpha, E) of curve g for a batch of theta; E = 0 for the paper's form."""
        return model.log_a(theta, g), model.alpha(theta), model.e(theta)

    def draws(self, model: PowerModel, theta: np.ndarray, g: int = 0) -> dict[str, np.ndarray]:
        log_a, alpha, e_value = self.arrays(model, theta, g)
        return {"A": np.exp(log_a), "alpha": alpha, "E": e_value}

    def log_compute_for_loss(self, model: PowerModel, theta: np.ndarray, y: np.ndarray, g: int = 0) -> np.ndarray:
        log_a, alpha, e_value = self.arrays(model, theta, g)
        y = np.asarray(y, dtype=float)
        y = y if y.ndim == 2 else np.broadcast_to(y, (log_a.size,) + y.shape[-1:])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if model.offset:
                gap = np.exp(y) - e_value[:, None]
                log_gap = np.where(gap > 0, np.log(np.where(gap > 0, gap, 1.0)), -np.inf)
            else:
                log_gap = y
            return (log_a[:, None] - log_gap) / alpha[:, None]

    def log_loss_at(self, model: PowerModel, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
        log_a, alpha, e_value = self.arrays(model, theta, g)
        power = log_a[:, None] - alpha[:, None] * np.asarray(log_c, dtype=float)[None, :]
        if not model.offset:
            return power
        with np.errstate(divide="ignore"):
            return np.logaddexp(np.log(e_value)[:, None], power)

    def shared_log_multiplier(
        self, model: PowerModel, theta: np.ndarray, gb: int, gv: int, log_c: np.ndarray | None = None
    ) -> np.ndarray:
        # M = (A_base / A_var)^(1 / alpha) at every compute, for either form
        with np.errstate(divide="ignore", invalid="ignore"):
            return ((model.log_a(theta, gb) - model.log_a(theta, gv)) / model.alpha(theta))[:, None]

    def joint_multiplier(
        self, model: PowerModel, theta: np.ndarray, draws: np.ndarray | None, gb: int, gv: int
    ) -> tuple[float, np.ndarray | None]:
        alpha_hat = float(model.alpha(theta)[0])
        value = (
            math.exp((float(model.log_a(theta, gb)[0]) - float(model.log_a(theta, gv)[0])) / alpha_hat)
            if alpha_hat > 0
            else math.nan
        )
        samples = None
        if draws is not None:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                samples = np.exp((model.log_a(draws, gb) - model.log_a(draws, gv)) / model.alpha(draws))
        return value, samples

    def log_slope(self, model: PowerModel, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
        log_a, alpha, e_value = self.arrays(model, theta, g)
        power = np.exp(log_a[:, None] - alpha[:, None] * np.asarray(log_c, dtype=float)[None, :])
        return alpha[:, None] * power / (power + e_value[:, None])

    def point_log_slope(self, model: PowerModel, theta: np.ndarray, log_c: float) -> float:
        log_a, alpha, e_value = (float(v[0]) for v in self.arrays(model, np.atleast_2d(theta)))
        power = math.exp(log_a - alpha * log_c)
        return alpha * power / (power + e_value)


class PowerForm(_PowerFamily):
    """``L = A * C^-alpha``, the paper's form."""

    name = POWER
    aliases = ("a*c**-alpha", "power", "paper")
    param_names = ("A", "alpha")
    params_text = "A, alpha"
    shared_names = ("alpha",)
    words = "L = A * C^-alpha (the paper's form)"
    short = "L = A C^-alpha"
    alternative = OFFSET_POWER
    offset = False


class OffsetPowerForm(_PowerFamily):
    """``L = E + A * C^-alpha``, with an irreducible loss E (fitted as it is, bounded to [0, max L])."""

    name = OFFSET_POWER
    aliases = ("e+a*c**-alpha", "offset")
    param_names = ("A", "alpha", "E")
    params_text = "E, A, alpha"
    shared_names = ("alpha", "E")
    words = "L = E + A * C^-alpha"
    short = "L = E + A C^-alpha"
    alternative = POWER
    offset = True


class CurvedPowerForm(LawForm):
    """``L = A * (C/C0)^-(alpha + beta ln(C/C0))`` (:class:`analysis.laws.laws.CurvedPowerLaw`): a straight line in
    log-log with a curvature term, linear in its parameters (one minimum). A joint fit shares alpha and beta and the
    reference C0; its M changes with compute unless beta = 0, so the shared-exponent M is taken at the compute asked
    for (the headline's: the variant's largest budget). The exponent test compares the curves' log-slopes alpha, each
    at its own data's centre."""

    name = CURVED_POWER
    aliases = ("a*c^-(alpha+beta*ln(c))", "curved", "log-quadratic")
    param_names = ("A", "alpha", "beta")
    params_text = "A, alpha, beta"
    shared_names = ("alpha", "beta")
    words = "L = A * (C/C0)^-(alpha + beta * ln(C/C0)) (a curved power law; C0 the points' central compute)"
    short = "L = A (C/C0)^-(alpha + beta ln C/C0)"
    alternative = POWER

    def model(self, log_compute: np.ndarray, group: np.ndarray, n_groups: int, y: np.ndarray) -> CurvedPowerModel:
        return CurvedPowerModel(log_compute, group, n_groups, y)

    def theta_from_curve(self, model: CurvedPowerModel, curve: CurvedPowerLaw) -> np.ndarray:
        s = model.x0 - math.log(curve.C0)  # the model's centre in the curve's u = ln(C / C0)
        a = math.log(curve.A) - curve.alpha * s - curve.beta * s * s
        return np.array([curve.alpha + 2.0 * curve.beta * s, curve.beta, a], dtype=float)

    def check_curve(self, curve: Any, label: str) -> None:
        if not (curve.A > 0 and curve.C0 > 0 and math.isfinite(curve.alpha) and math.isfinite(curve.beta)):
            raise FitInputError(
                f"compute_multiplier: {label} curve needs A > 0, C0 > 0, finite alpha and beta: {curve}"
            )

    def legend(self, curve: CurvedPowerLaw) -> str:
        return f"{curve.A:.4g}$\\cdot (C/C_0)^{{-({curve.alpha:.4g} {curve.beta:+.3g}\\,\\ln C/C_0)}}$"

    def draws(self, model: CurvedPowerModel, theta: np.ndarray, g: int = 0) -> dict[str, np.ndarray]:
        theta = np.atleast_2d(theta)
        return {"A": np.exp(theta[:, model.i_a + g]), "alpha": theta[:, model.i_alpha], "beta": theta[:, model.i_beta]}

    def log_loss_at(self, model: CurvedPowerModel, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
        theta = np.atleast_2d(theta)
        x = np.asarray(log_c, dtype=float)[None, :] - model.x0
        alpha, beta = theta[:, model.i_alpha, None], theta[:, model.i_beta, None]
        return theta[:, model.i_a + g, None] - (alpha + beta * x) * x

    def log_compute_for_loss(self, model: CurvedPowerModel, theta: np.ndarray, y: np.ndarray, g: int = 0) -> np.ndarray:
        theta = np.atleast_2d(theta)
        alpha, beta = theta[:, model.i_alpha, None], theta[:, model.i_beta, None]
        d = theta[:, model.i_a + g, None] - np.asarray(y, dtype=float)  # beta x^2 + alpha x - d = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            root = np.sqrt(alpha * alpha + 4.0 * beta * d)
            x = 2.0 * d / (alpha + root)  # the falling branch's root, without cancellation (laws.CurvedPowerLaw)
            ok = np.isfinite(root) & (alpha + root > 0)
            return np.where(ok, model.x0 + x, np.where(d > 0, np.inf, np.nan))

    def log_slope(self, model: CurvedPowerModel, theta: np.ndarray, log_c: np.ndarray, g: int = 0) -> np.ndarray:
        theta = np.atleast_2d(theta)
        x = np.asarray(log_c, dtype=float)[None, :] - model.x0
        return theta[:, model.i_alpha, None] + 2.0 * theta[:, model.i_beta, None] * x


FORMS: Mapping[str, LawForm] = {f.name: f for f in (PowerForm(), OffsetPowerForm(), CurvedPowerForm())}
_ALIASES = {
    "".join(spelling.split()).lower(): form for form in FORMS.values() for spelling in (form.name, *form.aliases)
}


def law_for(form: str | LawForm) -> LawForm:
    """The form named ``form`` (any spelling of :data:`FORMS`' names or aliases; spaces and case ignored)."""
    if isinstance(form, LawForm):
        return form
    key = "".join(str(form).split()).lower()
    if key not in _ALIASES:
        raise FitInputError(f"unknown form {form!r}; use one of {', '.join(repr(f) for f in FORMS)}")
    return _ALIASES[key]


def normalize_form(form: str) -> str:
    """The canonical name of a curve form (a key of :data:`FORMS`); spaces and case are ignored."""
    return law_for(form).name


def law_params(form: str) -> int:
    """The free parameters of one law of ``form`` (:attr:`LawForm.n_params`)."""
    return law_for(form).n_params


def form_of_curve(curve: Any) -> LawForm:
    """The form a curve object (:class:`PowerLaw`, :class:`CurvedPowerLaw`) belongs to."""
    return law_for(curve.form)
