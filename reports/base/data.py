"""Choosing what a figure shows from the DataFrames of :func:`analysis.load_results`.

The rules every figure shares, in one place:

* a figure shows one sweep (a designed study); ``sweep=None`` is allowed when the runs hold one sweep only;
* runs are the finished ones (status ``done`` with a finite loss), grouped into curves and points exactly as
  the fits do (:func:`analysis.select_points`: a curve is a variant, or ``<variant>-N<n_blocks>`` in a
  block-size ablation; a point is the chosen learning rate's seeds at one (n_layer, d_model, tokens)); the
  report passes the fit's own points (:attr:`analysis.SweepFit.points`), a figure drawn on its own selects
  them from the runs;
* the training-dynamics figures and the heatmaps compare variants at one **reference shape**: the
  (n_layer, d_model, tokens) with the most of the wanted curves having the data the figure needs, ties
  going to a shape with the baseline, then to the largest training FLOPs;
* "end of training" is the last step a run logged the table at (for a finished run, its final evaluation).

When the data for a figure are not there, :class:`MissingData` says why; the report builder lists it.
Pure pandas; never imports torch or matplotlib.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis import select_points
from analysis.data.slices import slices
from reports.base.style import compact_int

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport, SweepFit


class MissingData(ValueError):
    """The results hold no data for this figure or table; the message says what is missing."""


def sweep_runs(runs: pd.DataFrame, sweep: str | None) -> tuple[pd.DataFrame, str | None]:
    """The runs of one sweep (``sweep=None``: the only sweep there is)."""
    if runs is None or runs.empty:
        raise MissingData("no runs in the results")
    names = sorted(runs["sweep"].dropna().astype(str).unique().tolist())
    if sweep is None:
        if len(names) > 1:
            raise ValueError(f"the runs hold {len(names)} sweeps ({', '.join(names)}); pass sweep=")
        sweep = names[0] if names else None
        return runs, sweep
    out = runs[runs["sweep"].astype(str) == sweep]
    if out.empty and "@" in sweep:  # one training length of a sweep that has several (analysis.data.slices)
        out = _slice(runs, sweep)
    if out.empty:
        raise MissingData(f"no runs in sweep {sweep!r}")
    return out, sweep


def _slice(runs: pd.DataFrame, name: str) -> pd.DataFrame:
    """The runs of ``<sweep>@<r>tpp``, as :func:`analysis.data.slices.slices` cut them (empty if it did not)."""
    base = name.rsplit("@", 1)[0]
    of_base = runs[runs["sweep"].astype(str) == base]
    parts = dict(slices(base, of_base))
    if len(parts) == 1 and base in parts:  # already one slice's runs (a second lookup by the same figure)
        return of_base
    return parts.get(name, runs.iloc[0:0])


def table_rows(table: pd.DataFrame | None, sweep: str | None) -> pd.DataFrame:
    """The rows of a per-run table (metrics, layers, depth_attn) that belong to ``sweep``."""
    if table is None or table.empty:
        return pd.DataFrame() if table is None else table
    if sweep is None or "sweep" not in table.columns:
        return table
    rows = table[table["sweep"].astype(str) == sweep]
    if rows.empty and "@" in sweep:  # a slice (analysis.data.slices): its sweep's rows; the figures pick runs by run_id
        rows = table[table["sweep"].astype(str) == sweep.rsplit("@", 1)[0]]
    return rows


def select(runs: pd.DataFrame, method: str = "mean") -> pd.DataFrame:
    """:func:`analysis.select_points` without its warnings (the fit already reports dropped runs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return select_points(runs, method=method)


def sweep_points(
    runs: pd.DataFrame, sweep: str | None, select_method: str = "mean", points: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, str | None, pd.DataFrame]:
    """The runs of one sweep (:func:`sweep_runs`) and their points: ``points`` when given (the fit's, from
    :attr:`analysis.SweepFit.points`), else :func:`select` of those runs by ``select_method``."""
    runs, sweep = sweep_runs(runs, sweep)
    return runs, sweep, select(runs, select_method) if points is None else points


@dataclass(frozen=True)
class Shape:
    """A model shape and token budget: what "the same size" means when variants are compared."""

    n_layer: int
    d_model: int
    tokens: int

    def text(self) -> str:
        return f"n_layer={self.n_layer}, d_model={self.d_model}, {compact_int(self.tokens)} tokens"


def reference_points(
    points: pd.DataFrame,
    *,
    keep: Callable[[str], bool],
    has_data: Callable[[tuple[str, ...]], bool] = lambda ids: True,
    what: str = "the figure",
) -> tuple[Shape, pd.DataFrame]:
    """The reference shape and its points (one row per curve), among curves where ``keep(curve)`` and
    points whose runs pass ``has_data(run_ids)``; raises :class:`MissingData` when none qualifies."""
    if points.empty:
        raise MissingData(f"no finished runs for {what}")
    wanted = points[points["curve"].map(keep)]
    if wanted.empty:
        raise MissingData(f"no finished runs of the variants {what} shows")
    wanted = wanted[wanted["run_ids"].map(has_data)]
    if wanted.empty:
        raise MissingData(f"no finished run has the data {what} needs")
    scores = []
    for key, g in wanted.groupby(["n_layer", "d_model", "tokens"], sort=True):
        scores.append((g["curve"].nunique(), bool((g["curve"] == "baseline").any()), float(g["flops"].max()), key))
    _, _, _, best = max(scores, key=lambda s: s[:3])
    sel = wanted[(wanted["n_layer"] == best[0]) & (wanted["d_model"] == best[1]) & (wanted["tokens"] == best[2])]
    return Shape(int(best[0]), int(best[1]), int(best[2])), sel


def at_one_rate(row: Any, ids: list[str], runs: pd.DataFrame) -> tuple[list[str], float | None]:
    """The runs among ``ids`` that a figure draws for a point (``row``: one row of the points) as one curve's seeds,
    and their rate when the point spans several: a point read off a learning-rate envelope holds every swept rate's
    runs, and only the seeds at the swept rate nearest its best rate are one curve's seeds (None: one rate)."""
    rate = dict(zip(runs["run_id"].astype(str), pd.to_numeric(runs["lr"], errors="coerce")))
    known = {rate[i] for i in ids if i in rate and np.isfinite(rate[i]) and rate[i] > 0}
    best = row.get("lr", np.nan) if hasattr(row, "get") else np.nan
    if len(known) < 2 or not np.isfinite(best) or best <= 0:
        return ids, None
    nearest = min(known, key=lambda r: abs(np.log(r / best)))
    return [i for i in ids if rate.get(i) == nearest], float(nearest)


def last_step(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of each run's last logged step ("end of training")."""
    if table.empty:
        return table
    last = table.groupby("run_id")["step"].transform("max")
    return table[table["step"] == last]


def sweep_fit(report: FitReport, sweep: str | None) -> SweepFit:
    """One sweep of a fit report (``sweep=None``: the only one); :class:`MissingData` when it was not fitted."""
    if not report.sweeps:
        raise MissingData("no sweep was fitted (no finished runs)")
    if sweep is None:
        if len(report.sweeps) > 1:
            raise ValueError(f"the report holds {len(report.sweeps)} sweeps; pass sweep=")
        return report.sweeps[0]
    try:
        return report.sweep(sweep)
    except KeyError as err:
        raise MissingData(f"sweep {sweep!r} was not fitted") from err
