"""The block-size ablation (figure 4): validation loss vs block size S, from S = 1 (Full AttnRes) to S = L
(one block), with the baseline as a horizontal line.

How the points are picked: among the finished runs of one sweep, the (n_layer, d_model, tokens) at which
Block AttnRes ran with at least two block sizes and the most distinct block sizes overall (Full AttnRes,
when it ran there, adds S = 1), ties going to a shape
with a baseline run, then to the largest training FLOPs. Each point is the fits' point for that
(variant, N): the mean over the chosen learning rate's seeds (or the best run), with the seeds' range as
an error bar. S is the longest block, ceil(L / N) with L = 2 n_layer sublayers (docs/method.md).
Takes DataFrames, returns a matplotlib Figure; never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attnres.variants import Variant
from reports.base.data import MissingData, Shape, sweep_points, sweep_runs
from reports.base.style import FIGSIZE, rc_context, variant_color, variant_marker

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

BLOCK_SIZE_LABEL = "block size S (sublayers per block)"
NEEDS = "the block-size ablation needs Block runs with at least two block sizes at one model size"


def block_size_points(
    runs: pd.DataFrame, *, sweep: str | None = None, select_method: str = "mean", points: pd.DataFrame | None = None
) -> tuple[Shape, pd.DataFrame]:
    """The reference shape and one row per block size: variant, n_blocks, S, loss, low, high (the seeds'
    range), n_runs, n_seeds; plus the baseline's row (S = NaN) when it ran at that shape. ``points``: the fit's points
    of the sweep (default: selected from ``runs`` by ``select_method``)."""
    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    if points.empty:
        raise MissingData(f"no finished runs; {NEEDS}")
    pts = points[points["variant"].isin(["block", "full", "baseline"])].copy()
    n_sub = 2 * pts["n_layer"].astype(int)
    nb = pd.to_numeric(pts["n_blocks"], errors="coerce")
    pts["S"] = np.where(pts["variant"] == "full", 1, np.ceil(n_sub / nb.where(nb > 0)))
    pts.loc[pts["variant"] == "baseline", "S"] = np.nan
    best, best_score = None, None
    for key, g in pts.groupby(["n_layer", "d_model", "tokens"], sort=True):
        attn = g[g["variant"] != "baseline"]
        if attn.loc[attn["variant"] == "block", "S"].nunique() < 2:
            continue
        sizes = attn["S"].dropna().nunique()
        score = (sizes, bool((g["variant"] == "baseline").any()), float(g["flops"].max()))
        if best_score is None or score > best_score:
            best, best_score = key, score
    if best is None:
        raise MissingData(NEEDS)
    g = pts[(pts["n_layer"] == best[0]) & (pts["d_model"] == best[1]) & (pts["tokens"] == best[2])]
    rows = []
    for r in g.itertuples():
        losses = np.asarray(r.run_losses, dtype=float)
        rows.append(
            {
                "variant": r.variant,
                "curve": r.curve,
                "n_blocks": None if pd.isna(r.n_blocks) else int(r.n_blocks),
                "S": None if pd.isna(r.S) else int(r.S),
                "loss": float(r.loss),
                "low": float(losses.min()),
                "high": float(losses.max()),
                "n_runs": int(r.n_runs),
                # an envelope's point holds every rate's runs: its seeds are what the error bar spans
                "n_seeds": int(r.n_runs) if r.run_seeds is None else len(set(r.run_seeds)),
                "params": float(r.params),
                "flops": float(r.flops),
            }
        )
    table = pd.DataFrame(rows).sort_values(["S", "n_blocks"], na_position="first", kind="stable").reset_index(drop=True)
    table["n_blocks"] = table["n_blocks"].astype("Int64")
    table["S"] = table["S"].astype("Int64")
    return Shape(int(best[0]), int(best[1]), int(best[2])), table


def plot_block_size_ablation(
    runs: pd.DataFrame, *, sweep: str | None = None, select_method: str = "mean", points: pd.DataFrame | None = None
) -> Figure:
    """Validation loss vs block size S (log2 axis, ticks at the measured S): Full AttnRes at S = 1, Block
    AttnRes at each N (labelled), the baseline as a horizontal line with its seeds' range shaded. ``points``:
    the fit's points of the sweep (default: selected from ``runs`` by ``select_method``)."""
    import matplotlib.pyplot as plt

    runs, sweep = sweep_runs(runs, sweep)
    shape, table = block_size_points(runs, sweep=sweep, select_method=select_method, points=points)
    n_sub = 2 * shape.n_layer
    attn = table[table["S"].notna()].sort_values("S", kind="stable")
    base = table[table["variant"] == "baseline"]
    with rc_context():
        fig, ax = plt.subplots(figsize=FIGSIZE)
        _draw_attnres_points(ax, attn)
        lo, hi = list(attn["low"]), list(attn["high"])
        if not base.empty:
            b = base.iloc[0]
            seeds = f", {b['n_seeds']} seeds" if b["n_seeds"] > 1 else ""
            ax.axhline(
                b["loss"],
                color=variant_color(Variant("baseline")),
                lw=1.5,
                label=f"baseline (no depth attention{seeds})",
                zorder=3,
            )
            if b["n_seeds"] > 1:
                ax.axhspan(b["low"], b["high"], color=variant_color(Variant("baseline")), alpha=0.1, lw=0, zorder=1)
            lo.append(float(b["low"]))
            hi.append(float(b["high"]))
        _block_size_axis(ax, attn["S"].to_numpy(float), n_sub)
        span = max(hi) - min(lo)
        pad = 0.12 * span if span > 0 else 0.01 * max(hi)
        ax.set_ylim(min(lo) - pad, max(hi) + 2.2 * pad)
        ax.set_xlabel(BLOCK_SIZE_LABEL)
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(
            f"Block-size ablation: sweep {sweep}, {shape.text()}\n"
            f"(L = {n_sub} sublayers; error bars: range over seeds)",
            fontsize=10.5,
        )
        ax.legend(loc="best")
        fig.tight_layout()
    return fig


def _draw_attnres_points(ax: Any, attn: pd.DataFrame) -> None:
    """Full AttnRes (S = 1) and Block AttnRes at each block size, with the seeds' range as error bars, the
    Block points joined by a dashed line and labelled with their N."""
    blocks = attn[attn["variant"] == "block"]
    ax.plot(
        blocks["S"].to_numpy(float),
        blocks["loss"].to_numpy(float),
        color=variant_color(Variant("block")),
        lw=1.2,
        ls="--",
        zorder=2,
    )
    for variant, label in (("full", "Full AttnRes (S = 1)"), ("block", "Block AttnRes")):
        g = attn[attn["variant"] == variant]
        if g.empty:
            continue
        gy = g["loss"].to_numpy(float)
        err = np.vstack([gy - g["low"].to_numpy(float), g["high"].to_numpy(float) - gy])
        ax.errorbar(
            g["S"].to_numpy(float),
            gy,
            yerr=err,
            fmt=variant_marker(Variant(variant)),
            color=variant_color(Variant(variant)),
            ms=7,
            capsize=3,
            mec="white",
            mew=0.6,
            lw=1.0,
            label=label,
            zorder=4,
        )
    for r in blocks.itertuples():
        ax.annotate(
            f"N={int(r.n_blocks)}",
            (r.S, r.loss),
            xytext=(5, 4),
            textcoords="offset points",
            ha="left",
            va="bottom",
            fontsize=8,
            color="0.25",
        )


def _block_size_axis(ax: Any, sizes: np.ndarray, n_sub: int) -> None:
    """A log2 block-size axis with ticks at the measured sizes, 1 and L (= ``n_sub``, one block)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(s) for s in sizes) | {1, n_sub})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda v, _p: f"{int(round(v))}" + ("\n(L, one block)" if int(round(v)) == n_sub else ""))
    )
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(0.75, n_sub * 1.3)
