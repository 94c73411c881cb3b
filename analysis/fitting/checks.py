"""Checks of a sweep's points before any scaling law is fitted: what the data cannot support is said up front.

* :func:`check_form_budgets`: a curve with fewer budgets than the form has parameters (two under a three-parameter
  form such as ``E+A*C^-alpha``) cannot be fitted; that is the user's choice of form against the data, so it is a
  :class:`FitInputError` (a curve with one budget, an ablation point, is fitted in no form and only gets a note).
* :func:`check_budget_ranges`: a curve whose compute range does not overlap the baseline's would get every
  multiplier by extrapolating the baseline's law beyond its data: a :class:`FitInputError`.
* :func:`missing_seeds`: a (curve, budget) without a seed that another curve ran at the same budget. Not an
  error: a run that failed or is still running is a fact of the study (listed under "runs left out"), and a
  design with fewer seeds at the large budgets gives every curve the same seeds, which is not flagged. But the
  point is then a mean over other seeds than the baseline's, so the fit says so instead of dropping it silently.
* :func:`check_variant_names`: a baseline that names no variant of the runs (a typo would otherwise give a report
  without multipliers) is refused before any fitting, with the closest name (:func:`did_you_mean`).

Pure numpy/pandas; never imports torch.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.base.errors import AnalysisError, FitInputError
from analysis.data.select import BUDGET_RTOL, curve_labels
from analysis.fitting.settings import DEFAULT_BASELINE, FitSettings
from analysis.laws.forms import law_for
from analysis.laws.laws import POWER

if TYPE_CHECKING:  # pragma: no cover
    from analysis.estimates.study import CurveData


def check_form_budgets(sweep: str, label: str, n_budgets: int, form: str) -> None:
    """Refuse a curve with fewer budgets than the form has parameters (one budget is no scaling curve at all: it
    only gets a note), the user's choice of form against the data."""
    law = law_for(form)
    if 1 < n_budgets < law.n_params:
        more = "a third budget" if law.n_params - n_budgets == 1 and n_budgets == 2 else "more budgets"
        raise FitInputError(
            f"sweep {sweep!r}: {label!r} has {n_budgets} budgets, too few for the form {law.name}, which has "
            f"{law.n_params} parameters ({law.params_text}); use --form '{POWER}', run it at {more}, or leave the "
            "sweep out with --sweep"
        )


def check_budget_ranges(
    sweep: str, curves: Sequence[CurveData], baseline: str, unit: str = "FLOPs", rtol: float = BUDGET_RTOL
) -> None:
    """Refuse a curve whose compute range does not overlap the baseline's (the curves to be fitted). Ranges
    within ``rtol`` of each other overlap: a variant pays a few % more FLOPs than the baseline at one size."""
    base = next((c for c in curves if c.label == baseline), None)
    if base is None:
        return
    b_lo, b_hi = float(np.min(base.compute)), float(np.max(base.compute))
    for c in curves:
        lo, hi = float(np.min(c.compute)), float(np.max(c.compute))
        if c.label != baseline and (lo > b_hi * (1 + rtol) or hi * (1 + rtol) < b_lo):
            raise FitInputError(
                (f"sweep {sweep!r}: " if sweep else "")
                + f"{c.label!r} was run at {lo:.3g} to {hi:.3g} {unit}, the baseline {baseline!r} at "
                f"{b_lo:.3g} to {b_hi:.3g}: the ranges do not overlap, so every multiplier would extrapolate the "
                f"baseline's law beyond its data; run {c.label!r} at budgets inside the baseline's range (or the "
                "baseline at its budgets), or fit it in a sweep of its own"
            )


@dataclass(frozen=True)
class MissingSeeds:
    """One (curve, budget) that lacks seeds other curves ran at the same budget (model shape and tokens)."""

    curve: str
    n_layer: int
    d_model: int
    tokens: float
    flops: float
    missing: tuple[int, ...]
    have: tuple[int, ...]
    others: tuple[str, ...]  # the curves that ran the missing seeds there

    def text(self) -> str:
        have = ", ".join(map(str, self.have)) or "none"
        return (
            f"{self.curve} at L{self.n_layer}-d{self.d_model}, {self.tokens:.3g} tokens (C = {self.flops:.3g} FLOPs): "
            f"no finished run of seed(s) {', '.join(map(str, self.missing))}, which {', '.join(self.others)} ran; "
            f"its point is the mean of seed(s) {have}, and the paired gap there uses the seeds both ran"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "n_layer": self.n_layer,
            "d_model": self.d_model,
            "tokens": self.tokens,
            "flops": self.flops,
            "missing": list(self.missing),
            "have": list(self.have),
            "others": list(self.others),
        }


def missing_seeds(points: pd.DataFrame) -> tuple[MissingSeeds, ...]:
    """Every (curve, budget) of a sweep's points (:func:`analysis.select_points`) that lacks a seed some other
    curve has at the same model shape and tokens (seeds of the chosen learning rate; unknown seeds are skipped)."""
    if points.empty or "run_seeds" not in points:
        return ()
    out = []
    for (n_layer, d_model, tokens), g in points.groupby(["n_layer", "d_model", "tokens"], sort=True):
        seeds = {
            str(r.curve): {int(s) for s in r.run_seeds if int(s) >= 0}
            for r in g.itertuples()
            if isinstance(r.run_seeds, tuple)
        }
        if len(seeds) < 2:
            continue
        every = set().union(*seeds.values())
        for r in g.sort_values("curve").itertuples():
            have = seeds.get(str(r.curve))
            if have is None or have == every:
                continue
            missing = tuple(sorted(every - have))
            others = tuple(sorted(c for c, s in seeds.items() if s & set(missing)))
            flops = float(r.flops) if math.isfinite(float(r.flops)) else math.nan
            out.append(
                MissingSeeds(
                    str(r.curve), int(n_layer), int(d_model), float(tokens), flops, missing, tuple(sorted(have)), others
                )
            )
    return tuple(out)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'baseline'?)`` when ``name`` is close to one of ``choices``, else ""."""
    hint = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def variant_names(runs: pd.DataFrame) -> list[str]:
    """The variant names a fit option may name in these runs: every ``variant`` and every curve label
    (``<variant>-N<n_blocks>`` where a block-size ablation splits a variant)."""
    if runs.empty:
        return []
    return sorted(set(runs["variant"].dropna().astype(str)) | set(curve_labels(runs).astype(str)))


def check_variant_names(settings: FitSettings, runs: pd.DataFrame, root: Path) -> None:
    """Refuse, before any fitting, a baseline that names no variant of the runs to fit (a typo would otherwise
    give a report without multipliers). An empty tree has nothing to check, and the default name ("baseline")
    is not refused: a tree without baseline runs still gets its curves fitted, with a note."""
    found = variant_names(runs)
    if found and settings.baseline not in found and settings.baseline != DEFAULT_BASELINE:
        raise AnalysisError(
            f"baseline {settings.baseline!r} is not a variant of the runs under {root}"
            + did_you_mean(settings.baseline, found)
            + f"; variants found: {', '.join(found)} (choose with --baseline)"
        )
