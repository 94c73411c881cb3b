"""Which point each (variant, size, budget) contributes to a fit, and the compute-optimal (IsoFLOP) frontier.

Pure pandas/numpy on the runs table of :func:`analysis.load_results`; never imports torch.

* A **curve** is what gets one fitted scaling law: the ``variant`` string, except that a variant run at one
  size with several ``n_blocks`` (a block-size ablation) is split into ``<variant>-N<n_blocks>`` curves.
* A **point** is one (curve, model shape, token budget): the finished runs of that curve with the same
  ``n_layer``, ``d_model`` and ``tokens``, across seeds and learning rates. The learning rate is chosen
  first (lowest mean loss over its seeds; with ``method="best"``, lowest single loss; ``"median"``, lowest
  median), then the point is the mean of that LR's seeds (``method="mean"``, the default), their median, or the
  best seed (``method="best"``). With ``rates`` (the paper's protocol on a grid that swept rates), every curve
  is read at the given rate of its cell instead of its own best. The learning-rate envelope
  (:mod:`analysis.data.envelope`) is the other way to pick a cell's rate.
* With several model sizes per compute budget (an IsoFLOP grid), a curve's point per budget is the minimum
  of a robust quadratic fit of log loss in log N over that budget's sizes; a budget whose lowest measured
  loss is at the smallest or largest size (the optimum is off the grid), or with fewer than three sizes,
  is dropped with a note.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.base.errors import AnalysisError
from analysis.laws.optimizer import AUTO, minimize, resolve_delta
from attnres.variants import Variant

SELECT_METHODS = ("mean", "median", "best")
POINT_COLUMNS = (
    "sweep",
    "curve",
    "variant",
    "n_blocks",
    "n_layer",
    "d_model",
    "params",
    "tokens",
    "flops",
    "flops_per_token",
    "loss",
    "lr",
    "n_runs",
    "n_runs_total",
    "run_ids",
    "run_losses",
    "run_seeds",
    "flops_per_s",
)


def aggregate_losses(losses: np.ndarray, method: str) -> float:
    """A point's loss from its seeds' losses: their mean, median, or the best (lowest)."""
    losses = np.asarray(losses, dtype=float)
    if method == "median":
        return float(np.median(losses))
    return float(losses.mean() if method == "mean" else losses.min())


def best_rate(group: pd.DataFrame, method: str) -> float:
    """The learning rate of ``group``'s runs whose seeds do best: lowest mean, median or best ``val_loss``."""
    by_lr = group.groupby("lr")["val_loss"]
    return {"mean": by_lr.mean, "median": by_lr.median, "best": by_lr.min}[method]().idxmin()


BUDGET_RTOL = 0.05  # runs whose FLOPs differ by less than this (relative) share a budget (steps are rounded)


def finished_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs with status ``done`` and a finite positive ``val_loss``; done runs without one are dropped with a
    warning naming them."""
    if runs.empty:
        return runs
    done = runs[runs["status"] == "done"]
    loss = pd.to_numeric(done["val_loss"], errors="coerce")
    bad = ~(loss.notna() & np.isfinite(loss) & (loss > 0))
    if bad.any():
        names = ", ".join(done.loc[bad, "run_id"].astype(str))
        warnings.warn(
            f"dropped {int(bad.sum())} finished run(s) with a missing or invalid val_loss: {names}", stacklevel=2
        )
    return done[~bad]


def curve_labels(runs: pd.DataFrame) -> pd.Series:
    """The curve each run belongs to: its variant, or ``<variant>-N<n_blocks>`` for a variant that has runs
    with different ``n_blocks`` at the same (sweep, n_layer, d_model, tokens)."""
    if runs.empty:
        return pd.Series([], dtype="str", index=runs.index)
    variant = runs["variant"].astype(str)
    n_blocks = pd.to_numeric(runs["n_blocks"], errors="coerce")
    key = [runs["sweep"].astype(str), variant, runs["n_layer"], runs["d_model"], runs["tokens"]]
    spread = n_blocks.groupby(key, dropna=False).transform(lambda s: s.nunique(dropna=True))
    split_variants = set(variant[spread > 1])
    labels = variant.copy()
    for v in split_variants:
        mask = (variant == v) & n_blocks.notna()
        labels[mask] = [Variant(v, n).curve() for n in n_blocks[mask].astype(int)]
    return labels


def curve_variants(points: pd.DataFrame) -> dict[str, Variant]:
    """The :class:`~attnres.variants.Variant` of every curve of a point table (or of runs with a ``curve`` column),
    made once per sweep for its results to carry, from the table's ``variant`` and ``n_blocks`` columns (the curve
    name is never read back): a curve split by N (its name is not its variant's, :func:`curve_labels`) is its
    variant with that N; an unsplit Block AttnRes curve (``block``, one N per size) has the most common
    ``n_blocks`` among its rows (None when none is known); any other curve is its variant, without N."""
    out = {}
    for curve, g in points.groupby("curve", sort=True):
        curve, name = str(curve), str(g["variant"].iloc[0])
        values = pd.to_numeric(g["n_blocks"], errors="coerce").dropna()
        n_blocks = None if values.empty else int(values.mode().iloc[0])
        out[curve] = Variant(name, n_blocks if curve != name or name == "block" else None)
    return out


def select_points(
    runs: pd.DataFrame, *, method: str = "mean", rates: Mapping[tuple[str, int, int, float], float] | None = None
) -> pd.DataFrame:
    """One row per (sweep, curve, n_layer, d_model, tokens) from the finished runs (see the module docstring).

    Columns: sweep, curve, variant, n_blocks, n_layer, d_model, params, tokens, flops, flops_per_token,
    loss, lr, n_runs (runs behind the point: the chosen LR's seeds), n_runs_total (finished runs of every
    LR), run_ids, run_losses and run_seeds (tuples, the chosen runs), flops_per_s (mean measured throughput,
    tokens_per_s x flops_per_token; NaN when not recorded).
    """
    if method not in SELECT_METHODS:
        raise AnalysisError(
            f"unknown selection {method!r}; use 'mean' (mean over seeds), 'median' (median over seeds) or 'best' "
            "(best run)"
        )
    runs = finished_runs(runs)
    columns = list(POINT_COLUMNS)
    if runs.empty:
        return pd.DataFrame(columns=columns)
    runs = runs.assign(curve=curve_labels(runs), val_loss=pd.to_numeric(runs["val_loss"]))
    rows = []
    for key, group in runs.groupby(["sweep", "curve", "n_layer", "d_model", "tokens"], sort=True):
        lr = best_rate(group, method)
        if rates is not None:
            lr = _rate_of(rates, key, group, lr)
        chosen = group[group["lr"] == lr].sort_values("run_id")
        losses = chosen["val_loss"].to_numpy(dtype=float)
        throughput = pd.to_numeric(chosen["tokens_per_s"], errors="coerce") * chosen["flops_per_token"]
        n_blocks = pd.to_numeric(chosen["n_blocks"], errors="coerce").iloc[0]
        rows.append(
            {
                "sweep": key[0],
                "curve": key[1],
                "variant": str(chosen["variant"].iloc[0]),
                "n_blocks": None if pd.isna(n_blocks) else int(n_blocks),
                "n_layer": int(key[2]),
                "d_model": int(key[3]),
                "params": float(chosen["params"].mean()),
                "tokens": float(key[4]),
                "flops": float(chosen["flops"].mean()),
                "flops_per_token": float(chosen["flops_per_token"].mean()),
                "loss": aggregate_losses(losses, method),
                "lr": float(lr),
                "n_runs": int(losses.size),
                "n_runs_total": int(len(group)),
                "run_ids": tuple(chosen["run_id"].astype(str)),
                "run_losses": tuple(float(v) for v in losses),
                "run_seeds": tuple(int(v) for v in pd.to_numeric(chosen["seed"], errors="coerce").fillna(-1)),
                "flops_per_s": float(throughput.mean()) if throughput.notna().any() else math.nan,
            }
        )
    return (
        pd.DataFrame(rows, columns=columns)
        .sort_values(["sweep", "curve", "flops"], kind="stable")
        .reset_index(drop=True)
    )


def _rate_of(rates: Mapping[tuple[str, int, int, float], float], key: tuple, group: pd.DataFrame, own: float) -> float:
    """The rate a cell is read at under ``rates`` (its own best where ``rates`` has no entry for it); a rate the
    curve was not trained at is an error naming the cell."""
    sweep, curve, n_layer, d_model, tokens = key
    wanted = next(
        (
            lr
            for (s, nl, dm, tok), lr in rates.items()
            if (s, nl, dm) == (sweep, n_layer, d_model) and math.isclose(tok, float(tokens), rel_tol=1e-9)
        ),
        None,
    )
    if wanted is None:
        return own
    trained = group["lr"].astype(float).to_numpy()
    match = trained[np.isclose(trained, wanted, rtol=1e-9)]
    if match.size == 0:
        raise AnalysisError(
            f"--protocol paper: {sweep}/{curve} at L{n_layer}-d{d_model}, {float(tokens):,.0f} tokens, has no run at "
            f"the baseline's best rate {wanted:.4g} (its rates: {', '.join(f'{r:.4g}' for r in sorted(set(trained)))})"
            "; train it there, or fit with --lr envelope, which reads its fitted curve at that rate"
        )
    return float(match[0])


def budget_groups(flops: np.ndarray, rtol: float = BUDGET_RTOL) -> np.ndarray:
    """An integer budget id per value: sorted FLOPs within ``rtol`` of a group's first value share its id."""
    flops = np.asarray(flops, dtype=float)
    order = np.argsort(flops, kind="stable")
    ids = np.empty(flops.size, dtype=int)
    current, first = -1, None
    for i in order:
        if first is None or flops[i] > first * (1.0 + rtol):
            current += 1
            first = flops[i]
        ids[i] = current
    return ids


def needs_frontier(points: pd.DataFrame, rtol: float = BUDGET_RTOL) -> bool:
    """Whether any curve has more than one model shape at one budget (an IsoFLOP grid)."""
    for _, group in points.groupby(["sweep", "curve"]):
        ids = budget_groups(group["flops"].to_numpy(), rtol)
        shapes = (
            group.assign(budget=ids).groupby("budget")[["n_layer", "d_model"]].apply(lambda g: len(g.drop_duplicates()))
        )
        if (shapes > 1).any():
            return True
    return False


def isoflop_frontier(
    points: pd.DataFrame, *, rtol: float = BUDGET_RTOL, delta: float | str = AUTO
) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The compute-optimal point of every (curve, budget) of an IsoFLOP grid, and notes on dropped budgets.

    Per budget: log loss is fitted as a quadratic in log N (the robust loss of every fit here, its scale from this
    budget's least-squares residuals unless ``delta`` is given); the frontier
    point is the vertex (N*, L*). Budgets with fewer than three sizes, whose lowest measured loss is at an
    end of the size grid, or whose fitted curvature is not positive are dropped, with a note saying why.
    Returned columns: those of :func:`select_points` (params = N*, tokens = D* interpolated in log-log,
    run_losses None, n_runs = runs in the budget) plus ``n_sizes`` and ``shape`` (n_layer, d_model of the
    measured size nearest N*, for matching throughputs).
    """
    notes: list[str] = []
    rows = []
    for (sweep, curve), group in points.groupby(["sweep", "curve"], sort=True):
        group = group.assign(budget=budget_groups(group["flops"].to_numpy(), rtol))
        for _, b in group.groupby("budget"):
            b = b.sort_values("params", kind="stable")
            c_mean = float(np.exp(np.log(b["flops"]).mean()))
            where = f"{sweep}/{curve} at C={c_mean:.3g}"
            sizes = b["params"].to_numpy(dtype=float)
            if np.unique(sizes).size < 3:
                notes.append(
                    f"{where}: dropped, {np.unique(sizes).size} model size(s); an IsoFLOP minimum needs at least 3"
                )
                continue
            loss = b["loss"].to_numpy(dtype=float)
            k = int(np.argmin(loss))
            if sizes[k] in (sizes.min(), sizes.max()):
                end = "smallest" if sizes[k] == sizes.min() else "largest"
                notes.append(
                    f"{where}: dropped, the lowest loss is at the {end} size (the optimum is off the grid; extend it)"
                )
                continue
            x = np.log(sizes)
            centre, scale = float(x.mean()), float(x.std()) or 1.0
            t = (x - centre) / scale
            model, y = _QuadraticModel(t), np.log(loss)
            sol = minimize(model, y, None, resolve_delta(delta, [(model, y)], n_starts=1), n_starts=1)
            c0, c1, c2 = sol.theta
            if sol.status != "converged":
                notes.append(
                    f"{where}: the quadratic fit of the IsoFLOP minimum has status {sol.status} ({sol.message})"
                )
            if not c2 > 0:
                notes.append(f"{where}: dropped, the loss is not convex in log N over this budget's sizes")
                continue
            t_star = -c1 / (2 * c2)
            x_star = centre + scale * t_star
            log_tokens = np.polyfit(x, np.log(b["tokens"].to_numpy(dtype=float)), 1)
            nearest = b.iloc[int(np.argmin(np.abs(x - x_star)))]
            rows.append(
                {
                    "sweep": sweep,
                    "curve": curve,
                    "variant": str(b["variant"].iloc[0]),
                    "n_blocks": b["n_blocks"].iloc[0],
                    "n_layer": int(nearest["n_layer"]),
                    "d_model": int(nearest["d_model"]),
                    "params": float(np.exp(x_star)),
                    "tokens": float(np.exp(np.polyval(log_tokens, x_star))),
                    "flops": c_mean,
                    "flops_per_token": float(nearest["flops_per_token"]),
                    "loss": float(np.exp(c0 - c1 * c1 / (4 * c2))),
                    "lr": math.nan,
                    "n_runs": int(b["n_runs"].sum()),
                    "n_runs_total": int(b["n_runs_total"].sum()),
                    "run_ids": tuple(r for ids in b["run_ids"] for r in ids),
                    "run_losses": None,
                    "run_seeds": None,
                    "flops_per_s": float(nearest["flops_per_s"]),
                    "n_sizes": int(np.unique(sizes).size),
                    "fit_status": sol.status,
                }
            )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = frame.sort_values(["sweep", "curve", "flops"], kind="stable").reset_index(drop=True)
    return frame, tuple(notes)


class _QuadraticModel:
    """log L = c0 + c1 t + c2 t^2 (t: standardised log N), for the IsoFLOP minima."""

    n_params = 3
    names = ["c0", "c1", "c2"]
    bounds = [(None, None)] * 3
    lower = np.full(3, -np.inf)
    upper = np.full(3, np.inf)

    def __init__(self, t: np.ndarray):
        self.design = np.vander(np.asarray(t, dtype=float), 3, increasing=True)  # (n, 3)

    def predict(self, theta: np.ndarray, jac: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        theta = np.atleast_2d(theta)
        pred = theta @ self.design.T
        return pred, (np.repeat(self.design[None], theta.shape[0], axis=0) if jac else None)

    def starts(self, y: np.ndarray) -> np.ndarray:
        return np.linalg.lstsq(self.design, y, rcond=None)[0][None]
