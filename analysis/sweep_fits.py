"""Everything ``attnres fit`` prints and saves, computed once: :func:`fit_results` returns a :class:`FitReport`.

The report package and the CLI both read these numbers instead of recomputing them: ``FitReport.to_dict()``
is exactly what ``fit.json`` holds, and ``analysis.format_report(report)`` is exactly what the CLI prints (its tables
are built by :mod:`analysis.tables`, which the report's tables are made from too).
Per sweep (a sweep is one designed study; sweeps are never pooled):

1. points: one per (curve, size, budget) from the finished runs (:mod:`analysis.select`; kept in
   :attr:`SweepFit.points`), or the IsoFLOP frontier when a budget has several sizes;
2. one power law per curve, the joint fit with a shared exponent, and one bootstrap shared by all of them
   (:func:`analysis.multiplier.run_study`);
3. per variant: M at every measured budget, M at the largest budget from the curves (shared or separate
   exponents, chosen by the exponent test), the wall-clock multiplier, the exponent test;
4. the Chinchilla surface per curve where N and D vary independently.

No I/O here beyond loading a results tree when given a path; no plotting; never imports torch.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT, Estimate, estimate, json_number
from analysis.errors import AnalysisError, FitInputError
from analysis.fit import (
    HUBER_DELTA,
    OFFSET_POWER,
    PFLOP_S_DAY,
    POWER,
    ChinchillaFit,
    JointPowerLawFit,
    PowerLawFit,
    fit_chinchilla,
    joint_result,
    law_arrays,
    normalize_form,
)
from analysis.load import Problem, Results, load_results
from analysis.multiplier import (
    CurveData,
    Study,
    bootstrap_p_value,
    curves_log_multiplier,
    exponent_difference,
    multiplier_estimates,
    points_log_multiplier,
    run_study,
    shared_log_multiplier,
    wall_clock_multiplier,
)
from analysis.select import BUDGET_RTOL, SELECT_METHODS, isoflop_frontier, needs_frontier, select_points

FORMAT = "attnres-fit/1"
COMPUTE_UNITS = {"flops": 1.0, "pflops_days": PFLOP_S_DAY}
UNIT_NAMES = {"flops": "training FLOPs", "pflops_days": "PFLOP/s-days (1e15 * 86400 training FLOPs)"}
EXPONENT_MODES = ("auto", "shared", "unshared")
FRONTIER_MODES = ("auto", "on", "off")

TUNING_SUFFIX = "-tune"  # the sweep name `attnres tune` gives its trials


@dataclass(frozen=True)
class FitSettings:
    """The options a report was made with (all of them are written into fit.json)."""

    form: str = POWER
    select: str = "mean"
    baseline: str = "baseline"
    level: float = DEFAULT_LEVEL
    n_boot: int = DEFAULT_N_BOOT
    seed: int = 0
    delta: float = HUBER_DELTA
    exponent: str = "auto"
    frontier: str = "auto"
    compute_unit: str = "flops"
    budget_rtol: float = BUDGET_RTOL
    chinchilla: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class CurvePoint:
    """One fitted point: its compute (in the report's unit), loss and the runs behind it."""

    compute: float
    loss: float
    n_runs: int
    run_ids: tuple[str, ...]
    params: float
    tokens: float
    flops_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": json_number(self.compute),
            "loss": json_number(self.loss),
            "n_runs": self.n_runs,
            "run_ids": list(self.run_ids),
            "params": json_number(self.params),
            "tokens": json_number(self.tokens),
            "flops_per_s": json_number(self.flops_per_s),
        }


@dataclass(frozen=True)
class CurveResult:
    """A curve's power-law fit (intervals from the report's shared bootstrap) and its points."""

    curve: str
    variant: str
    fit: PowerLawFit
    points: tuple[CurvePoint, ...]

    @property
    def n_runs(self) -> int:
        return sum(p.n_runs for p in self.points)

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "variant": self.variant,
            **self.fit.to_dict(),
            "n_runs": self.n_runs,
            "points": [p.to_dict() for p in self.points],
        }


@dataclass(frozen=True)
class ExponentTest:
    """Do the variant's and the baseline's exponents differ? alpha_var - alpha_base from the separate fits,
    its bootstrap interval, the two-sided bootstrap p-value, and ``differ``: the interval excludes 0."""

    difference: Estimate
    p_value: float
    differ: bool

    def to_dict(self) -> dict[str, Any]:
        return {"difference": self.difference.to_dict(), "p_value": json_number(self.p_value), "differ": self.differ}


@dataclass(frozen=True)
class BudgetMultiplier:
    """M at one measured budget of the variant: the baseline fit inverted at the variant's measured loss."""

    compute: float
    loss: float
    n_runs_variant: int
    n_runs_baseline: int
    multiplier: Estimate
    wall_clock: Estimate
    throughput_ratio: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": json_number(self.compute),
            "loss": json_number(self.loss),
            "n_runs_variant": self.n_runs_variant,
            "n_runs_baseline": self.n_runs_baseline,
            "multiplier": self.multiplier.to_dict(),
            "wall_clock": self.wall_clock.to_dict(),
            "throughput_ratio": json_number(self.throughput_ratio),
        }


@dataclass(frozen=True)
class VariantMultiplier:
    """Everything about one variant against the baseline.

    ``multiplier`` is the headline: M at the variant's largest budget ``compute``, from the joint fit with a
    shared exponent (``exponent == "shared"``) or from the separate fits (``"unshared"``); both are kept.
    """

    variant: str
    baseline: str
    exponent: str
    exponent_reason: str
    exponent_test: ExponentTest
    compute: float
    multiplier: Estimate
    multiplier_shared: Estimate | None
    multiplier_unshared: Estimate
    wall_clock: Estimate
    throughput_ratio: float
    budgets: tuple[BudgetMultiplier, ...]
    n_runs_variant: int
    n_runs_baseline: int
    n_boot_failed: int
    baseline_status: str
    variant_status: str
    joint_status: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "baseline": self.baseline,
            "exponent": self.exponent,
            "exponent_reason": self.exponent_reason,
            "exponent_test": self.exponent_test.to_dict(),
            "largest_budget": {
                "compute": json_number(self.compute),
                "multiplier": self.multiplier.to_dict(),
                "multiplier_shared": None if self.multiplier_shared is None else self.multiplier_shared.to_dict(),
                "multiplier_unshared": self.multiplier_unshared.to_dict(),
                "wall_clock": self.wall_clock.to_dict(),
                "throughput_ratio": json_number(self.throughput_ratio),
            },
            "budgets": [b.to_dict() for b in self.budgets],
            "n_runs_variant": self.n_runs_variant,
            "n_runs_baseline": self.n_runs_baseline,
            "n_boot_failed": self.n_boot_failed,
            "status": {"baseline": self.baseline_status, "variant": self.variant_status, "joint": self.joint_status},
        }


@dataclass(frozen=True)
class SweepFit:
    """The fits and multipliers of one sweep, and the points they were fitted to.

    ``points`` is the table of :func:`analysis.select_points` for the sweep's runs (one row per curve, model
    shape and budget; compute in FLOPs as stored), before any IsoFLOP frontier (the points each curve was
    fitted to are its :attr:`CurveResult.points`). The report's figures and tables read it instead of
    selecting the points again; it is not written to fit.json.
    """

    sweep: str
    flops_convention: tuple[str, ...]
    frontier: bool
    curves: tuple[CurveResult, ...]
    joint: JointPowerLawFit | None
    multipliers: tuple[VariantMultiplier, ...]
    chinchilla: Mapping[str, ChinchillaFit]
    notes: tuple[str, ...]
    points: pd.DataFrame = field(repr=False, compare=False)

    def curve(self, label: str) -> CurveResult:
        for c in self.curves:
            if c.curve == label:
                return c
        raise KeyError(f"no fitted curve {label!r} in sweep {self.sweep!r}; fitted: {[c.curve for c in self.curves]}")

    def multiplier(self, variant: str) -> VariantMultiplier:
        for m in self.multipliers:
            if m.variant == variant:
                return m
        raise KeyError(
            f"no multiplier for {variant!r} in sweep {self.sweep!r}; have: {[m.variant for m in self.multipliers]}"
        )

    def to_dict(self) -> dict[str, Any]:
        joint = None
        if self.joint is not None:
            params: dict[str, Any] = {"alpha": self.joint.alpha.to_dict()}
            if self.joint.E is not None:
                params["E"] = self.joint.E.to_dict()
            params["A"] = {lab: est.to_dict() for lab, est in self.joint.A.items()}
            joint = {
                "form": self.joint.form,
                "status": self.joint.status,
                "message": self.joint.message,
                "params": params,
                "objective": json_number(self.joint.objective),
                "n_points": dict(self.joint.n_points),
                "n_boot_failed": self.joint.n_boot_failed,
            }
        return {
            "sweep": self.sweep,
            "flops_convention": list(self.flops_convention),
            "frontier": self.frontier,
            "notes": list(self.notes),
            "curves": [c.to_dict() for c in self.curves],
            "joint": joint,
            "multipliers": [m.to_dict() for m in self.multipliers],
            "chinchilla": {lab: fit.to_dict() for lab, fit in self.chinchilla.items()},
        }


@dataclass(frozen=True)
class FitReport:
    """All sweeps of a results tree, fitted; ``to_dict()`` is fit.json, :func:`analysis.format_report` of it the
    CLI's output."""

    results_dir: str
    inputs_hash: str
    settings: FitSettings
    sweeps: tuple[SweepFit, ...]
    problems: tuple[Problem, ...]
    n_runs: int

    def sweep(self, name: str) -> SweepFit:
        for s in self.sweeps:
            if s.sweep == name:
                return s
        raise KeyError(f"no sweep {name!r}; have {[s.sweep for s in self.sweeps]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "results_dir": self.results_dir,
            "inputs_hash": self.inputs_hash,
            "n_runs": self.n_runs,
            "compute_unit": UNIT_NAMES[self.settings.compute_unit],
            "settings": self.settings.to_dict(),
            "problems": [p.to_dict() for p in self.problems],
            "sweeps": [s.to_dict() for s in self.sweeps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Computing a report
# ---------------------------------------------------------------------------------------------------------


def _power_fit(study: Study, label: str, settings: FitSettings) -> PowerLawFit:
    cf, data = study.fits[label], study.data[label]
    law = cf.model.law(cf.theta)
    samples: dict[str, np.ndarray | None] = {"A": None, "alpha": None, "E": None}
    failed = 0
    if study.n_boot > 0:
        ok = study.ok[label]
        failed = int((~ok).sum())
        log_a, alpha, e_value = law_arrays(cf.model, study.theta[label][ok])
        samples = {"A": np.exp(log_a), "alpha": alpha, "E": e_value}
    df = study.df(label)
    return PowerLawFit(
        form=study.form,
        law=law,
        A=estimate(law.A, samples["A"], settings.level, df),
        alpha=estimate(law.alpha, samples["alpha"], settings.level, df),
        E=estimate(law.E, samples["E"], settings.level, df) if study.form == OFFSET_POWER else None,
        status=cf.solution.status,
        message=cf.solution.message,
        objective=cf.solution.objective,
        compute=tuple(float(c) for c in data.compute),
        loss=tuple(float(v) for v in data.loss),
        run_ids=None,
        delta=study.delta,
        level=settings.level,
        n_boot=study.n_boot,
        n_boot_failed=failed,
        seed=settings.seed,
    )


def _collect_warnings(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call fn, re-emit its warnings, and return their texts too (they go into the report's notes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, [str(w.message) for w in caught]


def _fit_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> SweepFit:
    """Points, curves, joint fit, multipliers and Chinchilla surfaces of one sweep (the module docstring's
    steps 1-4); every note on the way goes into the sweep's notes."""
    notes: list[str] = []
    points, warned = _collect_warnings(select_points, runs, method=settings.select)
    notes += warned
    conventions = tuple(sorted(runs.loc[runs["status"] == "done", "flops_convention"].dropna().astype(str).unique()))
    if len(conventions) > 1:
        notes.append(
            f"runs use {len(conventions)} different FLOP conventions; compute values are not comparable across them"
        )
    use_frontier = settings.frontier == "on" or (
        settings.frontier == "auto" and needs_frontier(points, settings.budget_rtol)
    )
    curve_points = points
    if use_frontier and not points.empty:
        curve_points, frontier_notes = isoflop_frontier(points, rtol=settings.budget_rtol, delta=settings.delta)
        notes += list(frontier_notes)
    data, rows = _curve_data(curve_points, settings, notes)
    if not data:
        notes.append("no curve could be fitted")
        return SweepFit(sweep, conventions, use_frontier, (), None, (), {}, tuple(notes), points)
    fitted = [d.label for d in data]
    study = run_study(
        data,
        settings.form,
        delta=settings.delta,
        level=settings.level,
        n_boot=settings.n_boot,
        seed=settings.seed,
        joint=len(data) >= 2,
    )
    curves = [_curve_result(study, label, rows[label], settings, notes) for label in fitted]
    joint = _joint_fit(study, settings)
    multipliers = []
    if settings.baseline not in fitted:
        notes.append(
            f"no fitted baseline curve {settings.baseline!r}: no multipliers (set the baseline with --baseline)"
        )
    else:
        throughput = _throughput_by_shape(points)
        for label in fitted:
            if label != settings.baseline:
                multipliers.append(_variant_multiplier(study, label, settings, rows, throughput, joint, notes))
    chinchilla = {}
    if settings.chinchilla and not points.empty:
        chinchilla = _chinchilla_fits(points, fitted, settings, notes)
    return SweepFit(
        sweep, conventions, use_frontier, tuple(curves), joint, tuple(multipliers), chinchilla, tuple(notes), points
    )


def _curve_data(
    curve_points: pd.DataFrame, settings: FitSettings, notes: list[str]
) -> tuple[list[CurveData], dict[str, pd.DataFrame]]:
    """The data of every curve with enough budgets for the form (baseline first, then by name), and each
    fitted curve's points; a curve with too few budgets gets a note."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    labels = sorted(curve_points["curve"].unique().tolist()) if not curve_points.empty else []
    if settings.baseline in labels:
        labels = [settings.baseline] + [lab for lab in labels if lab != settings.baseline]
    n_params = 3 if settings.form == OFFSET_POWER else 2
    data, rows = [], {}
    for label in labels:
        g = curve_points[curve_points["curve"] == label].sort_values("flops", kind="stable")
        distinct = g["flops"].nunique()
        if distinct < n_params:
            notes.append(f"{label}: not fitted, {distinct} budget(s) for a form with {n_params} parameters")
            continue
        run_losses = [
            np.asarray(r, dtype=float)
            if r is not None and not (isinstance(r, float) and math.isnan(r)) and len(r) >= 2
            else None
            for r in g["run_losses"]
        ]
        data.append(
            CurveData(
                label,
                g["flops"].to_numpy(float) / unit,
                g["loss"].to_numpy(float),
                run_losses,
                g["n_runs"].to_numpy(int),
                settings.select,
            )
        )
        rows[label] = g
    return data, rows


def _curve_result(study: Study, label: str, g: pd.DataFrame, settings: FitSettings, notes: list[str]) -> CurveResult:
    """A fitted curve with its points (``g``: the curve's rows of points); a fit that did not converge gets a
    note."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    pts = tuple(
        CurvePoint(
            float(r.flops) / unit,
            float(r.loss),
            int(r.n_runs),
            tuple(r.run_ids),
            float(r.params),
            float(r.tokens),
            float(r.flops_per_s),
        )
        for r in g.itertuples()
    )
    fit = _power_fit(study, label, settings)
    if fit.status != "converged":
        notes.append(f"{label}: fit status {fit.status} ({fit.message})")
    return CurveResult(label, str(g["variant"].iloc[0]), fit, pts)


def _joint_fit(study: Study, settings: FitSettings) -> JointPowerLawFit | None:
    """The joint fit with a shared exponent, with the study's bootstrap intervals (None without one)."""
    if study.joint is None:
        return None
    draws, failed = None, 0
    if study.n_boot > 0:
        failed = int((~study.joint_ok).sum())
        draws = study.joint_theta[study.joint_ok]
    return joint_result(
        study.joint,
        study.joint_labels,
        settings.form,
        settings.delta,
        settings.level,
        study.n_boot,
        failed,
        settings.seed,
        draws,
        study.df(joint=True),
    )


def _throughput_by_shape(points: pd.DataFrame) -> dict[tuple[str, int, int], float]:
    """Median measured FLOP/s per (curve, n_layer, d_model) over the points of that shape."""
    out = {}
    for (curve, n_layer, d_model), g in points.groupby(["curve", "n_layer", "d_model"]):
        values = g["flops_per_s"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        out[(str(curve), int(n_layer), int(d_model))] = float(np.median(values)) if values.size else math.nan
    return out


def _variant_multiplier(
    study: Study,
    label: str,
    settings: FitSettings,
    rows: dict[str, pd.DataFrame],
    throughput: dict[tuple[str, int, int], float],
    joint: JointPowerLawFit | None,
    notes: list[str],
) -> VariantMultiplier:
    """Everything about one variant against the baseline (module docstring, step 3)."""
    base = settings.baseline
    level = settings.level
    per_point = points_log_multiplier(study, label, base)
    m_points = multiplier_estimates(per_point, level)
    data = study.data[label]
    c_max = float(data.compute.max())
    unshared = multiplier_estimates(curves_log_multiplier(study, label, base, np.array([c_max])), level)[0]
    shared = None
    if study.joint is not None:
        shared = multiplier_estimates(shared_log_multiplier(study, label, base), level)[0]
    test = _exponent_test(study, label, base, level)
    exponent, reason = _choose_exponent(settings, test, shared is not None, joint)
    headline = shared if exponent == "shared" else unshared
    ratios = _throughput_ratios(label, base, rows[label], throughput, notes)
    n_runs_base = int(study.data[base].n_runs.sum())
    budgets = tuple(
        BudgetMultiplier(
            compute=float(c),
            loss=float(l),
            n_runs_variant=int(n),
            n_runs_baseline=n_runs_base,
            multiplier=m,
            wall_clock=wall_clock_multiplier(m, ratio, 1.0),
            throughput_ratio=ratio,
        )
        for c, l, n, m, ratio in zip(data.compute, data.loss, data.n_runs, m_points, ratios)
    )
    top_ratio = ratios[int(np.argmax(data.compute))]
    return VariantMultiplier(
        variant=label,
        baseline=base,
        exponent=exponent,
        exponent_reason=reason,
        exponent_test=test,
        compute=c_max,
        multiplier=headline,
        multiplier_shared=shared,
        multiplier_unshared=unshared,
        wall_clock=wall_clock_multiplier(headline, top_ratio, 1.0),
        throughput_ratio=top_ratio,
        budgets=budgets,
        n_runs_variant=int(data.n_runs.sum()),
        n_runs_baseline=n_runs_base,
        n_boot_failed=per_point.failed,
        baseline_status=study.fits[base].solution.status,
        variant_status=study.fits[label].solution.status,
        joint_status=None if joint is None else joint.status,
    )


def _exponent_test(study: Study, label: str, base: str, level: float) -> ExponentTest:
    """alpha_var - alpha_base from the separate fits, with its interval and bootstrap p-value."""
    d = exponent_difference(study, label, base)
    diff = estimate(float(d.value[0]), None if d.draws is None else d.draws[:, 0], level, d.df)
    scale = max(
        abs(float(m.alpha(study.fits[lab].theta[None])[0]))
        for lab, m in ((base, study.fits[base].model), (label, study.fits[label].model))
    )
    # a difference at rounding level (exact data give a zero-width interval next to 0) is no difference
    differ = diff.has_interval and not diff.contains(0.0) and abs(diff.value) > 1e-9 * max(scale, 1e-12)
    return ExponentTest(diff, bootstrap_p_value(None if d.draws is None else d.draws[:, 0]), differ)


def _choose_exponent(
    settings: FitSettings, test: ExponentTest, has_shared: bool, joint: JointPowerLawFit | None
) -> tuple[str, str]:
    """The headline's exponent, "shared" or "unshared", and why (``settings.exponent``, then the test)."""
    pct = int(round(settings.level * 100))
    joint_ok = joint is not None and joint.status != "not_converged"  # E or alpha on a bound is still a fit
    if settings.exponent == "unshared" or not has_shared:
        return "unshared", "requested" if settings.exponent == "unshared" else "no joint fit"
    if settings.exponent == "shared":
        return "shared", "requested"
    if test.differ:
        return "unshared", f"the exponents differ ({pct}% interval of alpha_var - alpha_base excludes 0)"
    if not joint_ok:
        return "unshared", f"the joint fit did not converge cleanly ({joint.status if joint else 'none'})"
    if not test.difference.has_interval:
        return "shared", "no bootstrap to test the exponents; shared by default"
    return "shared", f"the exponents do not differ ({pct}% interval of alpha_var - alpha_base contains 0)"


def _throughput_ratios(
    label: str,
    base: str,
    g_var: pd.DataFrame,
    throughput: dict[tuple[str, int, int], float],
    notes: list[str],
) -> list[float]:
    """Per point of the variant (``g_var``), its measured FLOP/s over the baseline's at the same model size
    (nan where either is missing, with a note)."""
    ratios = []
    for r in g_var.itertuples():
        r_var = throughput.get((label, int(r.n_layer), int(r.d_model)), math.nan)
        r_base = throughput.get((base, int(r.n_layer), int(r.d_model)), math.nan)
        ratios.append(r_var / r_base if r_base and math.isfinite(r_base) and math.isfinite(r_var) else math.nan)
    if any(math.isnan(x) for x in ratios):
        notes.append(
            f"{label}: no throughput of the baseline at the same model size for some budgets; "
            "wall-clock multiplier is nan there"
        )
    return ratios


def _chinchilla_fits(
    points: pd.DataFrame, fitted: list[str], settings: FitSettings, notes: list[str]
) -> dict[str, ChinchillaFit]:
    """The Chinchilla surface of every curve whose N and D vary independently (an IsoFLOP or N x D grid)."""
    out = {}
    for label in fitted:
        g = points[points["curve"] == label]
        log_n, log_d = np.log(g["params"].to_numpy(float)), np.log(g["tokens"].to_numpy(float))
        if len(g) < 8 or np.unique(log_n).size < 3 or np.unique(log_d).size < 3:
            continue
        if abs(np.corrcoef(log_n, log_d)[0, 1]) > 0.99:
            continue  # N and D move together (one size per budget): the surface is not identifiable
        try:
            fit, warned = _collect_warnings(
                fit_chinchilla,
                g["params"],
                g["tokens"],
                g["loss"],
                delta=settings.delta,
                level=settings.level,
                n_boot=settings.n_boot,
                seed=settings.seed,
                run_ids=["+".join(ids) for ids in g["run_ids"]],
            )
        except FitInputError as err:
            notes.append(f"{label}: Chinchilla surface not fitted ({err})")
            continue
        notes += warned
        out[label] = fit
    return out


def fit_results(
    results: Results | str | Path,
    *,
    form: str = POWER,
    select: str = "mean",
    baseline: str = "baseline",
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    delta: float = HUBER_DELTA,
    exponent: str = "auto",
    frontier: str = "auto",
    compute_unit: str = "flops",
    sweeps: Iterable[str] | None = None,
    chinchilla: bool = True,
    budget_rtol: float = BUDGET_RTOL,
) -> FitReport:
    """Fit every sweep of a results tree: curves, joint fit, multipliers with intervals, Chinchilla surfaces.

    ``results``: a :class:`Results` from :func:`analysis.load_results`, or a results directory. ``form``:
    "A*C^-alpha" (the paper's) or "E+A*C^-alpha". ``select``: "mean" over seeds (default) or "best" run
    per point. ``exponent``: "auto" (shared unless the exponent test says they differ), "shared" or
    "unshared" for the headline multiplier. ``frontier``: "auto" (IsoFLOP minima when a budget has several
    sizes), "on" or "off". ``compute_unit``: "flops" (as stored) or "pflops_days" (the paper's unit).
    ``sweeps``: restrict to these sweep names (default: every sweep, each fitted on its own, except the
    learning-rate searches of ``attnres tune``, whose sweeps are named ``<sweep>-tune``).
    """
    settings = FitSettings(
        form=normalize_form(form),
        select=select,
        baseline=baseline,
        level=level,
        n_boot=n_boot,
        seed=seed,
        delta=delta,
        exponent=exponent,
        frontier=frontier,
        compute_unit=compute_unit,
        budget_rtol=budget_rtol,
        chinchilla=chinchilla,
    )
    _check(settings)
    if not isinstance(results, Results):
        results = load_results(results, tables=())
    runs = results.runs
    # learning-rate searches (``attnres tune`` writes them to ``<sweep>-tune``) are not scaling studies
    names = [name for name in results.sweeps if not name.endswith(TUNING_SUFFIX)]
    if sweeps is not None:
        wanted = list(sweeps)
        missing = [s for s in wanted if s not in results.sweeps]
        if missing:
            raise AnalysisError(f"sweep(s) {missing} not found in {results.root}; available: {names}")
        names = wanted
    fitted = tuple(_fit_sweep(runs[runs["sweep"] == name], name, settings) for name in names)
    return FitReport(
        results_dir=str(results.root),
        inputs_hash=results.inputs_hash,
        settings=settings,
        sweeps=fitted,
        problems=tuple(p for p in results.problems if _sweep_of(p) in names or _sweep_of(p) not in results.sweeps),
        n_runs=len(runs),
    )


def _sweep_of(problem: Problem) -> str:
    """The sweep folder a problem run lies in (problems of sweeps left out of the fits are not reported)."""
    return problem.path.split("/")[0]


def _check(s: FitSettings) -> None:
    if s.select not in SELECT_METHODS:
        raise AnalysisError(f"select={s.select!r}: use 'mean' (mean over seeds) or 'best' (best run)")
    if s.exponent not in EXPONENT_MODES:
        raise AnalysisError(f"exponent={s.exponent!r}: use one of {', '.join(EXPONENT_MODES)}")
    if s.frontier not in FRONTIER_MODES:
        raise AnalysisError(f"frontier={s.frontier!r}: use one of {', '.join(FRONTIER_MODES)}")
    if s.compute_unit not in COMPUTE_UNITS:
        raise AnalysisError(f"compute_unit={s.compute_unit!r}: use one of {', '.join(COMPUTE_UNITS)}")
    if not 0 < s.level < 1:
        raise AnalysisError(f"level must be between 0 and 1 (e.g. 0.9 for a 90% interval), got {s.level!r}")
    if s.n_boot < 0:
        raise AnalysisError(f"n_boot must be >= 0 (0 skips the bootstrap), got {s.n_boot!r}")
    if not s.delta > 0:
        raise AnalysisError(f"delta must be positive, got {s.delta!r}")
