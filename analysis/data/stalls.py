"""Stalled runs: a run whose training loss lags the other seeds of its cell early in training.

A seed that stalls (its loss plateaus for a while, then recovers partly) ends several % above its siblings, and a
mean over seeds carries that into the fits; in the committed cpu_wsd study one baseline seed did so at two of five
sizes and decided the headline. This module finds such runs from their training-loss histories:

* a run's **history** is its own ``metrics.parquet`` (train rows), or, for a WSD branch, its trunk's: the branch's
  first steps are the trunk's (a branch logs from its branch point on);
* its **cell** is every finished run of the same sweep, curve, model shape, learning rate (and, for runs that are
  not branches, budget): the runs that differ by their seed only;
* its **lag** is the median, over the logged steps between ``STALL_WINDOW`` (10 % and 50 %) of the history, of its
  log training loss minus the mean log training loss of the other histories of its cell at that step; the median
  of many steps, because one logged step is one batch (a few % of noise, the same for every run of a seed);
* a run is **flagged** when its lag exceeds ln(1 + ``STALL_MARGIN``): 5 %, about three times the spread of the lags
  of the runs that did not stall in cpu_wsd (docs/analysis.md, "Stalled runs").

With two seeds a cell cannot say which seed is the odd one; the one behind is flagged. Cells with one history are
not judged. Pure pandas/numpy; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.base.bootstrap import json_number
from attnres.storage.schema import METRICS_FILE, SchemaError, read_table

STALL_MARGIN = 0.05
STALL_WINDOW = (0.1, 0.5)
TRUNK_SUFFIX = "-trunk"
_HISTORY_KEYS = ("variant", "n_blocks", "n_layer", "d_model", "lr", "seed")


@dataclass(frozen=True)
class Stall:
    """A flagged run: how far its training loss lagged its cell's other seeds (``lag``, relative) and which
    run's history showed it (its trunk's, for a WSD branch)."""

    run_id: str
    sweep: str
    curve: str
    n_layer: int
    d_model: int
    tokens: float
    lr: float
    seed: int
    lag: float
    history: str

    @property
    def size(self) -> str:
        return f"L{self.n_layer}-d{self.d_model}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "curve": self.curve,
            "size": self.size,
            "tokens": json_number(self.tokens),
            "lr": json_number(self.lr),
            "seed": self.seed,
            "lag": json_number(self.lag),
            "history": self.history,
        }


def _trunk_folders(all_runs: pd.DataFrame, sweep: str) -> dict[tuple, str]:
    """The trunk run folder of each (variant, n_blocks, n_layer, d_model, lr, seed) of ``sweep``'s trunks."""
    trunks = all_runs[all_runs["sweep"] == sweep + TRUNK_SUFFIX]
    return {_history_key(r): str(r["path"]) for _, r in trunks.iterrows()}


def _history_key(row: pd.Series) -> tuple:
    n_blocks = pd.to_numeric(row["n_blocks"], errors="coerce")
    return (
        str(row["variant"]),
        None if pd.isna(n_blocks) else int(n_blocks),
        int(row["n_layer"]),
        int(row["d_model"]),
        float(row["lr"]),
        int(row["seed"]),
    )


def _train_loss(root: Path, folder: str) -> pd.Series | None:
    """A history's log training loss by step (None when it cannot be read)."""
    try:
        table = read_table(root / folder / METRICS_FILE)
    except (OSError, SchemaError, ValueError):
        return None
    frame = table.select(["step", "split", "loss"]).to_pandas()
    train = frame[(frame["split"] == "train") & (frame["loss"] > 0)]
    if train.empty:
        return None
    return np.log(train.groupby("step")["loss"].mean())


def has_seeds_to_compare(points: pd.DataFrame) -> bool:
    """Whether any point of a sweep holds runs of two seeds or more, so that the detector had a cell to judge (a
    point's ``n_runs`` is no guide: under ``--lr envelope`` it counts the runs of every rate)."""
    if "run_seeds" not in points:
        return False
    return any(seeds is not None and len(set(seeds)) > 1 for seeds in points["run_seeds"])


def find_stalls(
    root: str | Path,
    runs: pd.DataFrame,
    all_runs: pd.DataFrame,
    *,
    margin: float = STALL_MARGIN,
    window: tuple[float, float] = STALL_WINDOW,
) -> tuple[Stall, ...]:
    """The stalled runs among ``runs`` (finished runs of one sweep with a ``curve`` column and their ``path``);
    ``all_runs``: every run of the results tree (their trunks are found there)."""
    if runs.empty or margin <= 0 or "path" not in runs:
        return ()
    root = Path(root)
    histories: dict[str, str] = {}  # run_id -> the folder whose training loss it shares
    cells: dict[tuple, set[str]] = {}  # cell -> the history folders of its runs
    trunks_by_sweep: dict[str, dict[tuple, str]] = {}
    for _, r in runs.iterrows():
        sweep = str(r["sweep"])
        trunks = trunks_by_sweep.setdefault(sweep, _trunk_folders(all_runs, sweep))
        trunk = trunks.get(_history_key(r))
        history = trunk if trunk is not None else str(r["path"])
        histories[str(r["run_id"])] = history
        budget = None if trunk is not None else float(r["tokens"])  # a trunk serves every budget of its cell
        cell = (sweep, str(r["curve"]), int(r["n_layer"]), int(r["d_model"]), float(r["lr"]), budget)
        cells.setdefault(cell, set()).add(history)
    lag_of: dict[str, float] = {}
    for folders in cells.values():
        if len(folders) < 2:
            continue
        losses = {f: _train_loss(root, f) for f in sorted(folders)}
        lag_of.update(_lags({f: s for f, s in losses.items() if s is not None}, window))
    threshold = math.log1p(margin)
    found = []
    for _, r in runs.iterrows():
        history = histories[str(r["run_id"])]
        lag = lag_of.get(history, math.nan)
        if lag > threshold:
            found.append(
                Stall(
                    run_id=str(r["run_id"]),
                    sweep=str(r["sweep"]),
                    curve=str(r["curve"]),
                    n_layer=int(r["n_layer"]),
                    d_model=int(r["d_model"]),
                    tokens=float(r["tokens"]),
                    lr=float(r["lr"]),
                    seed=int(r["seed"]),
                    lag=math.expm1(lag),
                    history=history,
                )
            )
    return tuple(sorted(found, key=lambda s: (s.curve, s.n_layer, s.d_model, s.tokens, s.lr, s.seed)))


def _lags(losses: dict[str, pd.Series], window: tuple[float, float]) -> dict[str, float]:
    """Each history's median lag (log loss) behind the mean of the others over the window of their common steps."""
    if len(losses) < 2:
        return {}
    table = pd.DataFrame(losses).dropna()
    if table.empty:
        return {}
    last = float(table.index.max())
    inside = table[(table.index >= window[0] * last) & (table.index <= window[1] * last)]
    if inside.empty:
        return {}
    out = {}
    for f in inside.columns:
        others = inside.drop(columns=f).mean(axis=1)
        out[f] = float(np.median(inside[f] - others))
    return out
