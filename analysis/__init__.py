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
    "fit_power_law": "analysis.fit",
    "fit_power_law_joint": "analysis.fit",
    "fit_chinchilla": "analysis.fit",
    "PowerLaw": "analysis.laws",
    "CurvedPowerLaw": "analysis.laws",
    "ChinchillaLaw": "analysis.laws",
    "PowerLawFit": "analysis.fit",
    "JointPowerLawFit": "analysis.fit",
    "ChinchillaFit": "analysis.fit",
    "DELTA_FLOOR": "analysis.optimizer",
    "PFLOP_S_DAY": "analysis.laws",
    "FORMS": "analysis.forms",  # canonical form name -> its LawForm (iterating gives the names, as the tuple did)
    "LawForm": "analysis.forms",
    "Estimate": "analysis.bootstrap",
    # multipliers
    "compute_multiplier": "analysis.multiplier",
    "wall_clock_multiplier": "analysis.multiplier",
    "MultiplierResult": "analysis.multiplier",
    # results trees
    "load_results": "analysis.load",
    "Results": "analysis.load",
    "Problem": "analysis.load",
    "select_points": "analysis.select",
    "isoflop_frontier": "analysis.select",
    "fit_results": "analysis.sweep_fits",
    "format_report": "analysis.tables",
    "FitReport": "analysis.results",
    "FitSettings": "analysis.settings",
    "SweepFit": "analysis.results",
    "CurveResult": "analysis.results",
    "VariantMultiplier": "analysis.results",
    "BudgetMultiplier": "analysis.results",
    "ExponentTest": "analysis.results",
    # errors
    "AnalysisError": "analysis.errors",
    "FitInputError": "analysis.errors",
    "ResultsError": "analysis.errors",
    "OutputError": "analysis.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
