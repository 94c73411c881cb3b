"""The cells of an architecture sweep (sweeps/architecture.py; the paper's Fig. 7): every curve's loss per (depth,
heads) cell at one parameter count and one compute, the best cell of each, and each variant's loss against the
baseline's cell by cell.

A sweep is read as one when its finished runs hold at least two depths, some depth at two or more head counts, and
parameters and training FLOPs that each stay within a factor :data:`SPREAD` (a scaling ladder moves both by more).
A cell's loss is its seeds' mean (or median, or best: ``attnres fit --select``) at the rate whose seeds do best;
the cells are keyed on (n_layer, d_model, n_head), so two head counts of one shape stay two cells. Rows are the head
counts of a depth in increasing order (the grid's rows: ``heads`` or ``heads_per_layer``), named by their heads
where every depth has the same, else by their median n_head / n_layer.

Pure pandas; never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.base.bootstrap import Estimate, json_number
from analysis.data.select import aggregate_losses, best_rate, curve_labels, finished_runs
from analysis.estimates.depth import line_change

# a sweep whose parameters (and FLOPs) span less than this factor, with several depths and head counts, is one: a
# grid's tolerance is at most 0.2 (sweeps/architecture.py), and 1.2 / 0.8 = 1.5; a scaling ladder spans far more
SPREAD = 1.5
KEYS = ["curve", "n_layer", "d_model", "n_head"]


@dataclass(frozen=True)
class ArchitectureCell:
    """One curve's loss at one (depth, heads) cell, and its gap to the baseline's there."""

    curve: str
    n_layer: int
    d_model: int
    n_head: int
    row: int
    params: float
    tokens: float
    loss: float
    n_runs: int
    lr: float
    gap_pct: float  # 100 (ln L_var - ln L_base) at this cell: < 0 where the variant's loss is lower (nan: baseline)

    @property
    def name(self) -> str:
        return f"L{self.n_layer}-d{self.d_model}-h{self.n_head}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve,
            "cell": self.name,
            "n_layer": self.n_layer,
            "d_model": self.d_model,
            "n_head": self.n_head,
            "row": self.row,
            "params": json_number(self.params),
            "tokens": json_number(self.tokens),
            "loss": json_number(self.loss),
            "n_runs": self.n_runs,
            "lr": json_number(self.lr),
            "gap_pct": json_number(self.gap_pct),
        }


@dataclass(frozen=True)
class GapTrend:
    """A variant's gap to the baseline, its least-squares change from its shallowest to its deepest column, with the
    depths as the units (each depth's gap the mean over its head counts) and the line's residual df."""

    change: Estimate
    depths: tuple[int, int]
    df: int = 0

    def text(self) -> str:
        return f"{self.change.text(3)} from {self.depths[0]} to {self.depths[1]} layers ({self.df} df)"

    def to_dict(self) -> dict[str, Any]:
        return {**self.change.to_dict(), "depths": list(self.depths), "df": self.df}


@dataclass(frozen=True)
class ArchitectureGrid:
    """Every curve's cells, the rows' names, each curve's best cell, and per variant the least-squares change of
    its gap to the baseline from the shallowest to the deepest column: < 0 where the variant gains more from depth
    than the baseline does at this size, which moves its best shape deeper. The depths are its units: a depth's
    head counts share one learning rate (chosen per cell from the same grid of rates) and one depth's runs, so
    what moves one depth moves its cells together, and cells taken as independent points would claim 4 times the
    degrees of freedom they have; each depth's gap is the mean over its cells, and the t interval is on the depths'
    scatter about the line (n_depths - 2 df)."""

    cells: tuple[ArchitectureCell, ...]
    row_names: tuple[str, ...]
    baseline: str
    gap_change: Mapping[str, GapTrend] = field(default_factory=dict)

    @property
    def curves(self) -> list[str]:
        return list(dict.fromkeys(c.curve for c in self.cells))

    def of(self, curve: str) -> list[ArchitectureCell]:
        return [c for c in self.cells if c.curve == curve]

    def best(self, curve: str) -> ArchitectureCell:
        """The curve's cell of lowest loss."""
        return min(self.of(curve), key=lambda c: c.loss)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "rows": list(self.row_names),
            "best": {curve: self.best(curve).name for curve in self.curves},
            "gap_change_pct": {curve: trend.to_dict() for curve, trend in self.gap_change.items()},
            "cells": [c.to_dict() for c in self.cells],
        }


def is_architecture_sweep(runs: pd.DataFrame) -> bool:
    """Whether a sweep's finished runs form an architecture sweep (the module docstring's rule)."""
    done = finished_runs(runs)
    if done.empty or done["n_layer"].nunique() < 2:
        return False
    if done.groupby("n_layer")["n_head"].nunique().max() < 2:
        return False
    for column in ("params", "flops"):
        values = pd.to_numeric(done[column], errors="coerce").dropna()
        if values.empty or values.max() / values.min() > SPREAD:
            return False
    return True


def architecture_grid(
    runs: pd.DataFrame, baseline: str, select: str = "mean", level: float = 0.9, interval: bool = True
) -> ArchitectureGrid | None:
    """The cells of an architecture sweep's runs (None when they do not form one); ``level``: of the gap trend's
    interval (``interval=False``: its point estimate only)."""
    if not is_architecture_sweep(runs):
        return None
    done = finished_runs(runs)
    done = done.assign(curve=curve_labels(done), val_loss=pd.to_numeric(done["val_loss"]))
    rows, row_names = _rows(done[["n_layer", "n_head"]].drop_duplicates())
    found = []
    for (curve, n_layer, d_model, n_head), g in done.groupby(KEYS, sort=True):
        lr = float(best_rate(g, select))
        chosen = g[g["lr"] == lr]
        found.append(
            dict(
                curve=str(curve),
                n_layer=int(n_layer),
                d_model=int(d_model),
                n_head=int(n_head),
                row=int(rows[(n_layer, n_head)]),
                params=float(chosen["params"].mean()),
                tokens=float(chosen["tokens"].mean()),
                loss=aggregate_losses(chosen["val_loss"].to_numpy(float), select),
                n_runs=len(chosen),
                lr=lr,
            )
        )
    base = {(f["n_layer"], f["n_head"]): f["loss"] for f in found if f["curve"] == baseline}
    cells = tuple(
        ArchitectureCell(
            **f,
            gap_pct=np.nan
            if f["curve"] == baseline or (f["n_layer"], f["n_head"]) not in base
            else 100 * float(np.log(f["loss"]) - np.log(base[(f["n_layer"], f["n_head"])])),
        )
        for f in sorted(found, key=lambda f: (f["curve"] != baseline, f["curve"], f["n_layer"], f["row"]))
    )
    return ArchitectureGrid(cells, row_names, baseline, _gap_changes(cells, baseline, level, interval))


def _gap_changes(
    cells: tuple[ArchitectureCell, ...], baseline: str, level: float, interval: bool
) -> dict[str, GapTrend]:
    """Per variant with cells at 3 depths or more: its gap's least-squares change over the columns, each depth's gap
    the mean over its cells (:class:`ArchitectureGrid`: the depths are the units)."""
    out = {}
    for curve in dict.fromkeys(c.curve for c in cells if c.curve != baseline):
        own = [c for c in cells if c.curve == curve and np.isfinite(c.gap_pct)]
        depths = sorted({c.n_layer for c in own})
        if len(depths) < 3:
            continue
        x = np.array(depths, dtype=float)
        y = np.array([np.mean([c.gap_pct for c in own if c.n_layer == n]) for n in depths])
        line = line_change(x, y, float(x[-1] - x[0]), level, interval)
        out[curve] = GapTrend(line.change, (depths[0], depths[-1]), line.df)
    return out


def _rows(heads: pd.DataFrame) -> tuple[dict[tuple[int, int], int], tuple[str, ...]]:
    """Each (n_layer, n_head)'s row and the rows' names. The rows are the head counts of the depths that have the
    most (the complete columns), by rank: their n_head where those depths share one set of head counts (a grid's
    ``heads:``), else their n_head / n_layer (``heads_per_layer``); every cell then goes to the row nearest to it
    in log scale, so a missing cell leaves a hole instead of moving the cells above it down."""
    heads = heads.astype(int).sort_values(["n_layer", "n_head"])
    per_depth = {n: tuple(g["n_head"]) for n, g in heads.groupby("n_layer")}
    most = max(len(h) for h in per_depth.values())
    complete = [h for h in per_depth.values() if len(h) == most]
    if len(set(complete)) == 1:
        centres = np.array(complete[0], dtype=float)
        names = tuple(f"{int(h)} head{'s' if h > 1 else ''}" for h in centres)
        value = {(n, h): float(h) for n, h in zip(heads["n_layer"], heads["n_head"])}
    else:
        ratios = np.array([[h / n for h in per_depth[n]] for n in per_depth if len(per_depth[n]) == most])
        centres = np.median(ratios, axis=0)
        names = tuple(f"n_head / n_layer ~ {r:.2g}" for r in centres)
        value = {(n, h): h / n for n, h in zip(heads["n_layer"], heads["n_head"])}
    rows = {key: int(np.argmin(np.abs(np.log(v) - np.log(centres)))) for key, v in value.items()}
    return rows, names
