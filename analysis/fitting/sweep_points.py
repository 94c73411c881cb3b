"""A sweep's points as the fits take them, chosen and checked before any law is fitted (step 1 of
:mod:`analysis.fitting.sweep_fits`).

:func:`prepare_sweep` chooses one point per (curve, size, budget) from the finished runs under the fit's options
(:mod:`analysis.data.points`), or the IsoFLOP frontier when a budget has several sizes (:mod:`analysis.data.select`),
turns every curve with enough budgets for the form into :class:`analysis.estimates.study.CurveData`, and runs the checks
of :mod:`analysis.fitting.checks`: what no fit can support is a :class:`FitInputError` here, before the first law is
fitted, and what the data only lack (a curve with one budget, seeds missing at some budget) is a note. No I/O; never
imports torch.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.data.envelope import Envelopes
from analysis.data.points import choose_points
from analysis.data.select import isoflop_frontier, needs_frontier
from analysis.estimates.study import CurveData
from analysis.fitting.checks import MissingSeeds, check_budget_ranges, check_form_budgets, missing_seeds
from analysis.fitting.settings import COMPUTE_UNITS, UNIT_SHORT, FitSettings
from analysis.laws.forms import law_params


def collect_warnings(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call fn, re-emit its warnings, and return their texts too (they go into the report's notes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, [str(w.message) for w in caught]


@dataclass
class PreparedSweep:
    """A sweep's points, chosen and checked, before any law is fitted (:func:`prepare_sweep`)."""

    sweep: str
    points: pd.DataFrame
    conventions: tuple[str, ...]
    frontier: bool
    data: list[CurveData]
    rows: dict[str, pd.DataFrame]
    notes: list[str]
    missing_seeds: tuple[MissingSeeds, ...]
    runs: pd.DataFrame
    envelopes: Envelopes | None = None


def flop_conventions(runs: pd.DataFrame) -> tuple[str, ...]:
    """The FLOP conventions of a sweep's finished runs."""
    return tuple(sorted(runs.loc[runs["status"] == "done", "flops_convention"].dropna().astype(str).unique()))


def prepare_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> PreparedSweep:
    """Step 1 of :mod:`analysis.fitting.sweep_fits`, and the checks of :mod:`analysis.fitting.checks`: the points of
    every curve, a :class:`FitInputError` for what no fit can support, and the seeds missing at some budget."""
    notes: list[str] = []
    (points, envelopes), warned = collect_warnings(
        choose_points,
        runs,
        select=settings.select,
        lr=settings.lr,
        protocol=settings.protocol,
        baseline=settings.baseline,
    )
    notes += warned
    conventions = flop_conventions(runs)
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
    data, rows = _curve_data(curve_points, settings, notes, sweep)
    check_budget_ranges(sweep, data, settings.baseline, UNIT_SHORT[settings.compute_unit], settings.budget_rtol)
    return PreparedSweep(
        sweep, points, conventions, use_frontier, data, rows, notes, missing_seeds(points), runs, envelopes
    )


def curves_under(prepared: PreparedSweep, settings: FitSettings) -> list[CurveData]:
    """The sweep's curves under other settings (for the sensitivity table); its warnings and notes were
    already given once, under the report's own settings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prepare_sweep(prepared.runs, prepared.sweep, settings).data


def budgets_note(curve: str, budgets: int, n_params: int) -> str:
    """The note on a curve left unfitted for too few budgets."""
    return f"{curve}: not fitted, {budgets} budget(s) for a form with {n_params} parameters"


def _curve_data(
    curve_points: pd.DataFrame, settings: FitSettings, notes: list[str], sweep: str = ""
) -> tuple[list[CurveData], dict[str, pd.DataFrame]]:
    """The data of every curve with enough budgets for the form (baseline first, then by name), and each
    fitted curve's points; a curve with one budget gets a note, one with two under the form with E an error
    (:func:`analysis.fitting.checks.check_form_budgets`)."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    labels = sorted(curve_points["curve"].unique().tolist()) if not curve_points.empty else []
    if settings.baseline in labels:
        labels = [settings.baseline] + [lab for lab in labels if lab != settings.baseline]
    n_params = law_params(settings.form)
    data, rows = [], {}
    for label in labels:
        g = curve_points[curve_points["curve"] == label].sort_values("flops", kind="stable")
        distinct = g["flops"].nunique()
        check_form_budgets(sweep, label, distinct, settings.form)
        if distinct < n_params:
            notes.append(budgets_note(label, distinct, n_params))
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
                budget_keys=_budget_keys(g),
                # the seeds behind every point of runs, a single one too (the paired M pairs it by seed)
                run_seeds=[
                    np.asarray(r, dtype=int)
                    if isinstance(r, tuple) and (run_losses[i] is not None or len(r) == 1)
                    else None
                    for i, r in enumerate(g["run_seeds"] if "run_seeds" in g else [None] * len(g))
                ],
            )
        )
        rows[label] = g
    return data, rows


def _budget_keys(g: pd.DataFrame) -> list[Any] | None:
    """What names each point's budget across curves: its model shape and tokens (a variant's FLOPs differ
    from the baseline's at the same shape); None (the points' ranks) for IsoFLOP minima, whose shapes vary."""
    if "n_sizes" in g.columns or not {"n_layer", "d_model", "tokens"} <= set(g.columns):
        return None
    keys = [(int(r.n_layer), int(r.d_model), int(round(float(r.tokens)))) for r in g.itertuples()]
    return keys if len(set(keys)) == len(keys) else None
