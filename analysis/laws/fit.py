"""Scaling-law fits on arrays: the public fitting functions and the results they return.

    fit_power_law         L = A * C^-alpha, L = E + A * C^-alpha, ...  (the forms of :mod:`analysis.laws.forms`)
    fit_power_law_joint   one form over several curves, its shape shared (alpha, and E or beta), one A per curve
    fit_chinchilla        L(N, D) = E + A / N^alpha + B / D^beta

Each fit minimises a robust loss on log residuals (pseudo-Huber, its scale ``delta`` set from the residuals of a
least-squares fit unless given: :mod:`analysis.laws.optimizer`) over a model in internal coordinates
(:mod:`analysis.laws.models`), and reports its parameters in the user's units with bootstrap intervals
(:mod:`analysis.base.bootstrap`) and the optimiser's status, carried into every table: ``converged``, ``hit_bound``
or ``not_converged``. Bootstrap replicates are refitted warm-started at the point estimate
(:func:`analysis.laws.optimizer.refit`). The building blocks here (:class:`CurveFit`, :func:`fit_curve`,
:func:`fit_joint_curves`) are shared with the multiplier's bootstrap study (:mod:`analysis.estimates.study`).
Pure numpy/scipy on arrays: no torch, no I/O, no plotting.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.base._threads import single_threaded_blas
from analysis.base.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_N_BOOT,
    Estimate,
    estimate,
    json_number,
    modified_residuals,
    residual_draws,
)
from analysis.base.errors import FitInputError
from analysis.laws.forms import LawForm, law_for
from analysis.laws.laws import POWER, ChinchillaLaw
from analysis.laws.models import ChinchillaModel
from analysis.laws.optimizer import AUTO, DEFAULT_STARTS, Solution, check_delta, minimize, refit, resolve_delta

# ---------------------------------------------------------------------------------------------------------
# Fit results
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLawFit:
    """A power law fitted to (compute, loss) points, with bootstrap intervals on its parameters.

    ``law`` holds the point estimate at full precision (a :class:`PowerLaw`, or the curve of another form:
    :class:`analysis.laws.laws.CurvedPowerLaw`); ``A``, ``alpha`` and ``E`` the same values with their intervals (``E``
    is None for a form without it), ``extra`` the form's other parameters (beta, and the reference compute C0 as a
    value without an interval, for the curved form). The data are kept so that multipliers can be bootstrapped
    from the fit (:func:`analysis.compute_multiplier`).
    """

    form: str
    law: Any
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
    extra: Mapping[str, Estimate] = field(default_factory=dict)

    @property
    def n_points(self) -> int:
        return len(self.compute)

    @property
    def params(self) -> dict[str, Estimate]:
        """Every parameter with its interval, in the order fit.json writes them."""
        out = {"A": self.A, "alpha": self.alpha}
        if self.E is not None:
            out["E"] = self.E
        return {**out, **self.extra}

    def predict(self, compute: float | np.ndarray) -> float | np.ndarray:
        return self.law.loss(compute)

    def compute_for_loss(self, loss: float | np.ndarray) -> float | np.ndarray:
        return self.law.compute_for_loss(loss)

    def to_dict(self) -> dict[str, Any]:
        params = {name: est.to_dict() for name, est in self.params.items()}
        return {
            "form": self.form,
            "status": self.status,
            "message": self.message,
            "params": params,
            "objective": json_number(self.objective),
            "delta": json_number(self.delta),  # the loss's scale the fit used (set from the residuals by default)
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
    laws: Mapping[str, Any]
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
    extra: Mapping[str, Estimate] = field(default_factory=dict)  # the form's other shared parameters (beta)

    def multiplier(self, variant: str, baseline: str) -> Estimate:
        """M = (A_baseline / A_variant)^(1/alpha), with its interval (computed for every ordered pair; for a form
        whose M changes with compute, at the joint data's central compute)."""
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
    # two curves whose points are the same cells in the same order (analysis.estimates.frontier). Not written to
    # fit.json.
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
            "delta": json_number(self.delta),  # the loss's scale the fit used (set from the residuals by default)
            "n_points": self.n_points,
            "n_boot": self.n_boot,
            "n_boot_failed": self.n_boot_failed,
        }


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


def _check_settings(delta: float | str, level: float, n_boot: int) -> None:
    check_delta(delta, FitInputError)
    if not 0 < level < 1:
        raise FitInputError(f"level must be between 0 and 1 (e.g. 0.9 for a 90% interval), got {level!r}")
    if n_boot < 0:
        raise FitInputError(f"n_boot must be >= 0 (0 skips the bootstrap), got {n_boot!r}")


# ---------------------------------------------------------------------------------------------------------
# Building blocks shared with the multiplier and the results tables
# ---------------------------------------------------------------------------------------------------------


@dataclass
class CurveFit:
    """A fitted law in internal coordinates (used by :mod:`analysis.estimates.study` and the report): ``law`` is its
    form."""

    law: LawForm
    model: Any
    y: np.ndarray  # log loss of the points
    solution: Solution
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


def _curve_model(compute: np.ndarray, loss: np.ndarray, form: str | LawForm) -> tuple[Any, np.ndarray]:
    y = np.log(loss)
    return law_for(form).model(np.log(compute), np.zeros(y.size, dtype=int), 1, y), y


def fit_curve(
    compute: np.ndarray, loss: np.ndarray, form: str, delta: float, n_starts: int = DEFAULT_STARTS
) -> CurveFit:
    """Point fit of one curve (inputs already checked)."""
    model, y = _curve_model(compute, loss, form)
    return CurveFit(law=law_for(form), model=model, y=y, solution=minimize(model, y, None, delta, n_starts))


def curves_delta(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], form: str, delta: float | str, n_starts: int = DEFAULT_STARTS
) -> float:
    """The loss's scale for fits of these (compute, loss) curves: ``delta``, or for ``"auto"`` one scale from every
    curve's own least-squares residuals, pooled (:func:`analysis.laws.optimizer.resolve_delta`)."""
    return resolve_delta(delta, [_curve_model(c, l, form) for c, l in curves], n_starts)


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
    law = law_for(form)
    model = law.model(log_c, group, len(computes), y)
    return CurveFit(law=law, model=model, y=y, solution=minimize(model, y, None, delta, n_starts))


def curve_estimates(
    law: LawForm,
    curve: Any,
    samples: Mapping[str, np.ndarray] | None,
    level: float,
    df: float,
    failed: int,
) -> dict[str, Any]:
    """The parameter fields of a :class:`PowerLawFit` (``A``, ``alpha``, ``E``, ``extra``) from the point estimate
    ``curve`` of a form and the bootstrap replicates of its public parameters (None without a bootstrap)."""
    est = {
        name: estimate(getattr(curve, name), None if samples is None else samples[name], level, df, failed)
        for name in law.param_names
    }
    extra = {name: value for name, value in est.items() if name not in ("A", "alpha", "E")}
    if hasattr(curve, "C0"):  # a reference compute, not a free parameter: a value without an interval
        extra["C0"] = Estimate(float(curve.C0), level=level)
    return {"A": est["A"], "alpha": est["alpha"], "E": est.get("E"), "extra": extra}


def bootstrap_curve(
    fit: CurveFit, n_boot: int, rng: np.random.Generator, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Residual-bootstrap replicates of a single-curve fit: (theta (n_boot, p), ok (n_boot,))."""
    y_star = fit.fitted + residual_draws(fit.resampling_residuals(), n_boot, rng)
    return refit(fit.model, fit.theta, y_star, None, delta)


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


def fit_power_law(
    compute: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    form: str = POWER,
    *,
    delta: float | str = AUTO,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    run_ids: Sequence[str] | None = None,
    n_starts: int = DEFAULT_STARTS,
) -> PowerLawFit:
    """Fit one curve of ``form`` (any name or alias of :data:`analysis.laws.forms.FORMS`): ``L = A * C^-alpha``
    (``"A*C^-alpha"``, the default), ``L = E + A * C^-alpha`` (``"E+A*C^-alpha"``) or the curved power law
    (``"curved"``).

    ``compute`` and ``loss`` hold one value per run (any compute unit; the parameters are in that unit).
    Intervals (at ``level``) come from a seeded residual bootstrap with ``n_boot`` replicates (0: none).
    Rows with a NaN are dropped with a warning naming them (``run_ids`` if given); too few points,
    non-positive or infinite values raise :class:`analysis.FitInputError`.

    >>> fit = fit_power_law([1e18, 1e19, 1e20], [3.0, 2.6, 2.25])
    >>> round(fit.alpha.value, 3), fit.status
    (0.062, 'converged')
    """
    law = law_for(form)
    form = law.name
    _check_settings(delta, level, n_boot)
    n_params = law.n_params
    arrays, ids = clean_inputs(
        {"compute": compute, "loss": loss}, run_ids, n_params, f"fit_power_law({form})", ("compute",)
    )
    c, l = arrays["compute"], arrays["loss"]
    samples = None
    failed = 0
    with single_threaded_blas():
        delta = curves_delta([(c, l)], form, delta, n_starts)
        point = fit_curve(c, l, form, delta, n_starts)
        if n_boot > 0:
            theta, ok = bootstrap_curve(point, n_boot, np.random.default_rng(seed), delta)
            failed = int((~ok).sum())
            samples = law.draws(point.model, theta[ok])
    curve = law.curve(point.model, point.theta)
    df = c.size - n_params
    return PowerLawFit(
        form=form,
        law=curve,
        **curve_estimates(law, curve, samples, level, df, failed),
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
    delta: float | str = AUTO,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    n_starts: int = DEFAULT_STARTS,
) -> JointPowerLawFit:
    """Fit one form to several curves with a shared exponent (and shared E), one A per curve.

    ``data`` maps a curve name to ``(compute, loss)``. The multiplier of every ordered pair of curves,
    ``(A_b / A_v)^(1/alpha)``, comes with its residual-bootstrap interval.
    """
    law = law_for(form)
    form = law.name
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
    n_params = len(labels) + law.n_params - 1  # an A per curve, the shared shape (alpha, and E or beta)
    total = sum(c.size for c in computes)
    if total < n_params:
        raise FitInputError(f"fit_power_law_joint: {total} points for {n_params} parameters; give at least {n_params}")
    if np.unique(np.concatenate(computes)).size < law.n_params:
        raise FitInputError("fit_power_law_joint: the curves share too few distinct compute values to fit an exponent")
    failed = 0
    draws = None
    with single_threaded_blas():
        delta = curves_delta(list(zip(computes, losses)), form, delta, n_starts)
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
    return refit(model, point.theta, y_star, None, delta)


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
    law, model, theta = point.law, point.model, point.theta
    laws = {lab: law.curve(model, theta, g) for g, lab in enumerate(labels)}
    samples = {lab: None if draws is None else law.draws(model, draws, g) for g, lab in enumerate(labels)}
    multipliers = {}
    for gv, v in enumerate(labels):
        for gb, b in enumerate(labels):
            value, m_samples = law.joint_multiplier(model, theta, draws, gb, gv)
            multipliers[(v, b)] = estimate(value, m_samples, level, df, failed)
    first = labels[0]  # the shared parameters are the same on every curve

    def shared(name: str) -> Estimate:
        draws_of = None if samples[first] is None else samples[first][name]
        return estimate(getattr(laws[first], name), draws_of, level, df, failed)

    return JointPowerLawFit(
        form=form,
        labels=labels,
        laws=laws,
        A={
            lab: estimate(laws[lab].A, None if samples[lab] is None else samples[lab]["A"], level, df, failed)
            for lab in labels
        },
        alpha=shared("alpha"),
        E=shared("E") if "E" in law.shared_names else None,
        extra={name: shared(name) for name in law.shared_names if name not in ("alpha", "E")},
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
    delta: float | str = AUTO,
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
    model = ChinchillaModel(np.log(n), np.log(d), y)
    samples: dict[str, np.ndarray | None] = dict.fromkeys(("E", "A", "B", "alpha", "beta"))
    replicates = None
    failed = 0
    with single_threaded_blas():
        delta = resolve_delta(delta, [(model, y)], n_starts)
        sol = minimize(model, y, None, delta, n_starts)
        if n_boot > 0:
            rng = np.random.default_rng(seed)
            picks = rng.integers(0, y.size, size=(n_boot, y.size))
            counts = np.zeros((n_boot, y.size))
            np.add.at(counts, (np.arange(n_boot)[:, None], picks), 1.0)
            theta, ok = refit(model, sol.theta, y, counts, delta)
            failed = int((~ok).sum())
            with np.errstate(over="ignore", invalid="ignore"):  # a failed replicate's theta may be wild
                replicates = {k: np.where(ok, v, np.nan) for k, v in model.params(theta).items()}
            samples = {k: v[ok] for k, v in replicates.items()}
    law = model.law(sol.theta)
    values = {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta}
    df = y.size - 5
    return ChinchillaFit(
        law=law,
        **{k: estimate(values[k], samples[k], level, df, failed) for k in values},
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
