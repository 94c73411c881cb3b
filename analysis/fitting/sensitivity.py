"""How much the headline multiplier depends on the analysis choices: M at the headline's budget, refitted under
each alternative choice, as point estimates (no bootstrap).

The choices (Porian et al. 2024 show each can move a fitted scaling law by more than its interval):

* the fit form: ``A*C^-alpha`` or ``E+A*C^-alpha``;
* the robust loss's scale on log-loss residuals (the headline's is set from the residuals): 1e-3 (at 1-2 %
  residuals close to least absolute deviations), 1e-1, and least squares (a scale no log residual reaches);
* the seed aggregation of a point: mean over seeds, their median, or the best run;
* leaving each budget out in turn (the same budget for every curve: a jackknife over budgets).

Every alternative changes one choice of the headline's and keeps the rest (exponent: shared or separate as the
headline's; the compute is the headline's, also when its budget is the one left out, so that row extrapolates).
Bootstrapping each alternative would multiply ``attnres fit``'s time by their number; the spread of the point
estimates is what the table is for, and the headline's interval says the rest.

Pure numpy; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from analysis.base.bootstrap import json_number
from analysis.base.errors import FitInputError
from analysis.estimates.paired import budget_name
from analysis.estimates.study import CurveData, run_study
from analysis.estimates.study_stats import curves_log_multiplier, shared_log_multiplier
from analysis.fitting.settings import FitSettings
from analysis.laws.forms import law_for, law_params
from analysis.laws.optimizer import AUTO, LEAST_SQUARES_DELTA

# ``multipliers`` below are analysis.fitting.results.VariantMultiplier objects: not imported, not even for type
# checking, because analysis.fitting.results imports this module (the import graph has no cycles)
VariantMultiplier = Any

DELTAS = (1e-3, 1e-1, LEAST_SQUARES_DELTA)


@dataclass(frozen=True)
class SensitivityRow:
    """M at the headline's compute under one alternative analysis choice (nan where it cannot be fitted)."""

    aspect: str  # "form", "loss scale", "points", "budgets"
    choice: str
    multiplier: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "aspect": self.aspect,
            "choice": self.choice,
            "multiplier": json_number(self.multiplier),
            "note": self.note,
        }


@dataclass(frozen=True)
class Sensitivity:
    """One variant's headline M (``multiplier``, under ``headline``: the choices it was made with) and M under
    every alternative choice (``rows``); ``low`` / ``high``: the range over the alternatives that could be
    fitted."""

    variant: str
    compute: float
    exponent: str
    headline: str
    multiplier: float
    rows: tuple[SensitivityRow, ...]

    @property
    def values(self) -> np.ndarray:
        values = np.array([r.multiplier for r in self.rows], dtype=float)
        return values[np.isfinite(values)]

    @property
    def low(self) -> float:
        return float(self.values.min()) if self.values.size else math.nan

    @property
    def high(self) -> float:
        return float(self.values.max()) if self.values.size else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "compute": json_number(self.compute),
            "exponent": self.exponent,
            "headline": self.headline,
            "multiplier": json_number(self.multiplier),
            "low": json_number(self.low),
            "high": json_number(self.high),
            "rows": [r.to_dict() for r in self.rows],
        }


def form_name(form: str) -> str:
    return law_for(form).short


def delta_name(delta: float, auto: bool = False) -> str:
    """The loss scale in words: ``least squares``, ``robust scale 0.1``, or (set from the residuals, ``auto``)
    ``robust scale 0.0042 from the residuals``."""
    if delta >= LEAST_SQUARES_DELTA:
        return "least squares"
    return f"robust scale {delta:.2g}" + (" from the residuals" if auto else "")


def select_name(select: str) -> str:
    return {"mean": "mean over seeds", "median": "median over seeds"}.get(select, "best run per point")


def headline_choice(settings: FitSettings, n_budgets: int, delta: float) -> str:
    """The choices the headline was made with, in words (``delta``: the scale its fits used): ``L = A C^-alpha,
    robust scale 0.0042 from the residuals, mean over seeds, all 5 budgets``."""
    return (
        f"{form_name(settings.form)}, {delta_name(delta, settings.delta == AUTO)}, {select_name(settings.select)}, "
        f"all {n_budgets} budgets"
    )


def point_multipliers(
    data: Sequence[CurveData], form: str, delta: float, baseline: str, wanted: dict[str, tuple[str, float]]
) -> dict[str, float]:
    """M of each variant of ``wanted`` (label -> (exponent "shared" | "unshared", compute)) from point fits of
    ``data`` (no bootstrap); nan for a variant (or baseline) not in ``data``."""
    n_law = law_params(form)
    short = [c for c in data if c.n_budgets < n_law and c.label in (baseline, *wanted)]
    if short:  # the internal fit would interpolate them: a number that means nothing
        raise FitInputError(f"{short[0].label}: {short[0].n_budgets} budgets left for a form with {n_law} parameters")
    labels = [c.label for c in data]
    out = {v: math.nan for v in wanted}
    if baseline not in labels:
        return out
    study = run_study(data, form, delta=delta, n_boot=0, joint=len(data) >= 2)
    for v, (exponent, compute) in wanted.items():
        if v not in labels:
            continue
        if exponent == "shared" and study.joint is not None:
            stat = shared_log_multiplier(study, v, baseline, np.array([compute]))
        else:
            stat = curves_log_multiplier(study, v, baseline, np.array([compute]))
        out[v] = float(np.exp(stat.value[0]))
    return out


def without_budget(data: Sequence[CurveData], key: Any) -> list[CurveData]:
    """Every curve without its point at budget ``key`` (curves with too few points left are kept: the fit
    refuses them, and that row says so)."""
    out = []
    for c in data:
        keep = [i for i, k in enumerate(c.budget_keys) if repr(k) != repr(key)]
        out.append(
            CurveData(
                c.label,
                c.compute[keep],
                c.loss[keep],
                [c.run_losses[i] for i in keep],
                None if c.n_runs is None else c.n_runs[keep],
                c.aggregate,
                budget_keys=[c.budget_keys[i] for i in keep],
                run_seeds=[c.run_seeds[i] for i in keep],
            )
        )
    return out


def sweep_sensitivity(
    data: Sequence[CurveData],
    settings: FitSettings,
    multipliers: Sequence[VariantMultiplier],
    prepare: Callable[[FitSettings], list[CurveData]],
    delta: float,
) -> tuple[Sensitivity, ...]:
    """The sensitivity of every variant's headline in one sweep. ``data``: the curves the headline was fitted
    to, with the loss scale ``delta``; ``prepare(settings)``: the curves under other settings (another form or seed
    aggregation), raising :class:`FitInputError` when they cannot be fitted so. The alternatives that keep the
    headline's scale setting apply it to their own data (an "auto" scale is set from their residuals)."""
    if not multipliers:
        return ()
    base = settings.baseline
    wanted = {m.variant: (m.exponent, m.compute) for m in multipliers}
    rows: dict[str, list[SensitivityRow]] = {v: [] for v in wanted}

    def add(aspect: str, choice: str, fit: Callable[[], dict[str, float]]) -> None:
        try:
            values, note = fit(), ""
        except FitInputError as err:
            values, note = {}, str(err)
        for v in wanted:
            value = values.get(v, math.nan)
            rows[v].append(
                SensitivityRow(aspect, choice, value, note or ("" if math.isfinite(value) else "not fitted"))
            )

    other_form = law_for(settings.form).alternative
    add(
        "form",
        form_name(other_form),
        lambda: point_multipliers(
            prepare(replace(settings, form=other_form)), other_form, settings.delta, base, wanted
        ),
    )
    for other in DELTAS:
        if not math.isclose(other, delta):
            add(
                "loss scale",
                delta_name(other),
                lambda d=other: point_multipliers(data, settings.form, d, base, wanted),
            )
    for other_select in [s for s in ("mean", "median", "best") if s != settings.select]:
        add(
            "points",
            select_name(other_select),
            lambda o=other_select: point_multipliers(
                prepare(replace(settings, select=o)), settings.form, settings.delta, base, wanted
            ),
        )
    reference = next(c for c in data if c.label == base)
    for key, compute in sorted(zip(reference.budget_keys, reference.compute), key=lambda kc: kc[1]):
        add(
            "budgets",
            f"without {budget_name(key, compute)}",
            lambda k=key: point_multipliers(without_budget(data, k), settings.form, settings.delta, base, wanted),
        )
    n_budgets = reference.n_budgets
    return tuple(
        Sensitivity(
            m.variant,
            m.compute,
            m.exponent,
            headline_choice(settings, n_budgets, delta),
            m.multiplier.value,
            tuple(rows[m.variant]),
        )
        for m in multipliers
    )
