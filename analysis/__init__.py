"""Scaling-law analysis of AttnRes results: load runs, fit curves, compute multipliers with intervals.

Pure pandas/numpy/scipy on the parquet contract of :mod:`attnres.storage.schema` (or on plain arrays); never
imports torch. Names are resolved lazily, so ``import analysis`` (and the CLI's ``register``) stay cheap.

    from analysis import fit_power_law, compute_multiplier, PowerLaw
    base = fit_power_law(flops_base, loss_base)                 # L = A * C^-alpha, Huber in log space
    block = fit_power_law(flops_block, loss_block)
    m = compute_multiplier(base, block, at=flops_block.max())   # M = C_base(L_block(C)) / C, with a 90% CI
    print(m.multiplier[0].text())                                # "1.253 [1.201, 1.312]"

    report = analysis.fit_results("results/")                   # everything `attnres fit` prints and saves

See docs/analysis.md for the definitions and every choice made.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    # fitting on arrays
    "fit_power_law": "analysis.laws.fit",
    "fit_power_law_joint": "analysis.laws.fit",
    "fit_chinchilla": "analysis.laws.fit",
    "PowerLaw": "analysis.laws.laws",
    "CurvedPowerLaw": "analysis.laws.laws",
    "ChinchillaLaw": "analysis.laws.laws",
    "PowerLawFit": "analysis.laws.fit",
    "JointPowerLawFit": "analysis.laws.fit",
    "ChinchillaFit": "analysis.laws.fit",
    "DELTA_FLOOR": "analysis.laws.optimizer",
    "PFLOP_S_DAY": "analysis.laws.laws",
    "FORMS": "analysis.laws.forms",  # canonical form name -> its LawForm (iterating gives the names, as the tuple did)
    "LawForm": "analysis.laws.forms",
    "Estimate": "analysis.base.bootstrap",
    # multipliers
    "compute_multiplier": "analysis.estimates.multiplier",
    "wall_clock_multiplier": "analysis.estimates.multiplier",
    "MultiplierResult": "analysis.estimates.multiplier",
    # results trees
    "load_results": "analysis.data.load",
    "Results": "analysis.data.load",
    "Problem": "analysis.data.load",
    "select_points": "analysis.data.select",
    "isoflop_frontier": "analysis.data.select",
    "fit_results": "analysis.fitting.sweep_fits",
    "format_report": "analysis.tables.tables",
    "FitReport": "analysis.fitting.results",
    "FitSettings": "analysis.fitting.settings",
    "SweepFit": "analysis.fitting.results",
    "CurveResult": "analysis.fitting.results",
    "VariantMultiplier": "analysis.fitting.results",
    "BudgetMultiplier": "analysis.fitting.results",
    "ExponentTest": "analysis.fitting.results",
    # errors
    "AnalysisError": "analysis.base.errors",
    "FitInputError": "analysis.base.errors",
    "ResultsError": "analysis.base.errors",
    "OutputError": "analysis.base.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
