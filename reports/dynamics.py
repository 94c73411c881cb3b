"""Training-dynamics figures (figure 3): validation loss vs tokens, and per transformer block the output
magnitude and the parameter-gradient norm vs depth at the end of training.

The variants are compared at one reference shape (:func:`reports.data.reference_points`); by default the
figures show baseline, Full and Block AttnRes (every N), or every variant when none of those ran.
Definitions (docs/method.md, "Diagnostics"): the block output magnitude is the RMS over tokens and channels
of the hidden state a transformer block hands on (the next block's input; for the baseline the residual
stream); the gradient magnitude is the L2 norm of the gradients of the block's parameters before gradient
clipping (runs written before schema version 2 logged it after clipping; the figure says so when it draws one).
Both are read from ``layers.parquet`` rows of kind ``block`` at each run's last logged step. Every function takes
DataFrames and returns a matplotlib Figure; nothing here reads files. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from attnres.storage.schema import PRE_CLIP_LAYER_GRADS
from attnres.variants import Variant, curve_order
from reports.data import (
    MissingData,
    Shape,
    last_step,
    n_blocks_of,
    reference_points,
    sweep_points,
    sweep_runs,
    table_rows,
)
from reports.style import (
    FIGSIZE,
    compact_ticks,
    rc_context,
    readable_log_ticks,
    variant_color,
    variant_label,
    variant_linestyle,
    variant_marker,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

BLOCK_OUTPUT_LABEL = "RMS of block output"
BLOCK_GRAD_LABEL = "L2 norm of block parameter gradients (before clipping)"
DEPTH_LABEL = "transformer block (1 = nearest the embedding)"


def _keep(points: pd.DataFrame, variants: Sequence[str] | None):
    if variants is not None:
        wanted = set(variants)
        return lambda curve: curve in wanted or Variant.of_curve(curve).name in wanted
    if points["curve"].map(_is_main).any():
        return _is_main
    return lambda curve: True


def _is_main(curve: str) -> bool:
    return Variant.of_curve(curve).is_main


def plot_loss_curves(
    runs: pd.DataFrame,
    metrics: pd.DataFrame,
    *,
    sweep: str | None = None,
    variants: Sequence[str] | None = None,
    select_method: str = "mean",
    split: str | None = None,
    points: pd.DataFrame | None = None,
) -> Figure:
    """Validation loss (nats/token) vs training tokens for each variant at the reference shape: every seed of
    the chosen learning rate as its own line. Left: the whole run (log tokens); right: the second half of
    training on linear axes, where the variants separate.

    ``split``: "val" or "train"; ``None`` takes "val" unless the runs logged fewer than 3 validation points
    (then the training loss, and the axis label says so). ``points``: the fit's points of the sweep (default:
    selected from ``runs`` by ``select_method``)."""
    import matplotlib.pyplot as plt

    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    m = table_rows(metrics, sweep)
    if m.empty:
        raise MissingData("no metrics.parquet in the results")
    keep = _keep(points, variants)
    if split is None:
        split = _loss_split(m, points, keep)
    # the whole-run panel starts at each run's first logged step: validation is logged every eval_interval
    # steps (the first at step 200, say), the training loss from the first steps on, so it is drawn there too
    train = m[m["split"].astype(str) == "train"] if split == "val" else m.iloc[:0]
    m = m[m["split"].astype(str) == split]
    available = set(m["run_id"].astype(str).unique())
    shape, sel = reference_points(
        points, keep=keep, has_data=lambda ids: any(i in available for i in ids), what="the loss curves"
    )
    ylabel = "validation loss (nats/token)" if split == "val" else "training loss (nats/token)"
    with rc_context():
        fig, (ax, axz) = plt.subplots(1, 2, figsize=(10.5, 4.4), gridspec_kw={"width_ratios": [1, 1], "wspace": 0.22})
        zoom_lo, zoom_hi = _draw_loss_curves(ax, axz, m, sel, points, available)
        with_train = _draw_training_loss(ax, train, sel, available)
        ax.set_xscale("log")
        if with_train:
            ax.set_yscale("log")  # from the first steps' loss down to the end's, and the end still readable
            readable_log_ticks(ax, "y", max_ticks=10)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("loss (nats/token)" if with_train else ylabel)
        ax.set_title(
            "whole run (log tokens; thin lines: training loss)" if with_train else "whole run (log tokens)",
            fontsize=10,
        )
        axz.set_xlabel("training tokens")
        axz.set_ylabel(ylabel)
        axz.set_title("second half of training", fontsize=10)
        if zoom_lo:
            lo, hi = min(zoom_lo), max(zoom_hi)
            pad = 0.05 * (hi - lo if hi > lo else max(abs(hi), 1e-3))
            axz.set_ylim(lo - pad, hi + pad)
        compact_ticks(ax, "x", log=True)
        compact_ticks(axz, "x", log=False)
        axz.legend(loc="upper right")
        what = "Validation loss" if split == "val" else "Training loss (too few validation points)"
        fig.suptitle(f"{what} during training: sweep {sweep}, {shape.text()}", fontsize=11)
        fig.subplots_adjust(left=0.07, right=0.98, top=0.86, bottom=0.13)
    return fig


def _loss_split(m: pd.DataFrame, points: pd.DataFrame, keep: Callable[[str], bool]) -> str:
    """The loss to draw: "val", unless the runs at the reference shape logged fewer than 3 validation points
    and some run logged at least 3 training points ("train")."""
    counts = {s: m[m["split"].astype(str) == s].groupby("run_id").size() for s in ("val", "train")}
    try:
        _, sel = reference_points(
            points,
            keep=keep,
            has_data=lambda ids: any(i in counts["val"].index for i in ids),
            what="the loss curves",
        )
        ids = [i for ids in sel["run_ids"] for i in ids if i in counts["val"].index]
        few = int(counts["val"].reindex(ids).min()) < 3
    except MissingData:
        few = True
    return "train" if few and len(counts["train"]) and int(counts["train"].max()) >= 3 else "val"


def _draw_loss_curves(
    ax: Any, axz: Any, m: pd.DataFrame, sel: pd.DataFrame, points: pd.DataFrame, available: set[str]
) -> tuple[list[float], list[float]]:
    """One line per run of each curve at the reference shape (``sel``): the whole run on ``ax``, the second
    half of training on ``axz``; returns the lowest and highest loss of each second half."""
    many = m.groupby("run_id").size().max() > 40
    zoom_lo, zoom_hi = [], []
    for curve in curve_order(sel["curve"]):
        row = sel[sel["curve"] == curve].iloc[0]
        ids = [i for i in row["run_ids"] if i in available]
        n = n_blocks_of(points, curve)
        style = {
            "color": variant_color(curve),
            "ls": variant_linestyle(curve),
            "lw": 1.4,
            "alpha": 0.9,
            "marker": None if many else variant_marker(curve),
            "ms": 3.5,
        }
        label = variant_label(curve, n) + (f" ({len(ids)} seeds)" if len(ids) > 1 else "")
        for k, rid in enumerate(sorted(ids)):
            d = m[m["run_id"].astype(str) == rid].sort_values("step")
            x = d["tokens"].to_numpy(float)
            y = d["loss"].to_numpy(float)
            pos = x > 0
            ax.plot(x[pos], y[pos], **style, label=label if k == 0 else None)
            half = x >= 0.5 * x.max()
            axz.plot(x[half], y[half], **style, label=label if k == 0 else None)
            if half.any():
                zoom_lo.append(float(y[half].min()))
                zoom_hi.append(float(y[half].max()))
    return zoom_lo, zoom_hi


def _draw_training_loss(ax: Any, train: pd.DataFrame, sel: pd.DataFrame, available: set[str]) -> bool:
    """The training loss of each run drawn in validation loss (``available``) at the reference shape, as thin
    lines on the whole-run panel from the first logged step; returns whether any was drawn."""
    if train.empty:
        return False
    drawn = False
    for curve in curve_order(sel["curve"]):
        row = sel[sel["curve"] == curve].iloc[0]
        for rid in sorted(i for i in row["run_ids"] if i in available):
            d = train[train["run_id"].astype(str) == rid].sort_values("step")
            x = d["tokens"].to_numpy(float)
            # per-batch losses are noisy: a short running mean, that keeps the first logged step
            window = max(1, len(d) // 25)
            y = d["loss"].rolling(window, min_periods=1).mean().to_numpy(float)
            pos = (x > 0) & np.isfinite(y)
            if pos.any():
                ax.plot(
                    x[pos],
                    y[pos],
                    color=variant_color(curve),
                    ls=variant_linestyle(curve),
                    lw=0.8,
                    alpha=0.45,
                    zorder=1,
                )
                drawn = True
    return drawn


def _block_profiles(
    runs: pd.DataFrame,
    layers: pd.DataFrame,
    column: str,
    sweep: str | None,
    variants: Sequence[str] | None,
    select_method: str,
    what: str,
    points: pd.DataFrame | None,
) -> tuple[
    str | None, Shape, list[tuple[str, int | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, list[str]]]
]:
    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    lay = table_rows(layers, sweep)
    if lay.empty:
        raise MissingData("no layers.parquet in the results")
    lay = lay[(lay["kind"].astype(str) == "block") & pd.to_numeric(lay[column], errors="coerce").notna()]
    if lay.empty:
        raise MissingData(f"layers.parquet has no per-block {column} rows")
    lay = last_step(lay)
    available = set(lay["run_id"].astype(str).unique())
    shape, sel = reference_points(
        points, keep=_keep(points, variants), has_data=lambda ids: any(i in available for i in ids), what=what
    )
    out = []
    for curve in curve_order(sel["curve"]):
        row = sel[sel["curve"] == curve].iloc[0]
        ids = sorted(i for i in row["run_ids"] if i in available)
        d = lay[lay["run_id"].astype(str).isin(ids)]
        table = d.pivot_table(index="layer", columns="run_id", values=column, aggfunc="mean").sort_index()
        values = table.to_numpy(float)
        step = int(d["step"].max())
        out.append(
            (
                curve,
                n_blocks_of(points, curve),
                table.index.to_numpy(int) + 1,
                np.nanmean(values, axis=1),
                np.nanmin(values, axis=1),
                np.nanmax(values, axis=1),
                len(ids),
                step,
                ids,
            )
        )
    return sweep, shape, out


def _plot_profiles(
    profiles, shape: Shape, sweep: str | None, ylabel: str, title: str, log_y: bool | None, note: str = ""
) -> Figure:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with rc_context():
        fig, ax = plt.subplots(figsize=FIGSIZE)
        lows, highs = [], []
        for curve, n, x, mean, lo, hi, n_runs, _step, _ids in profiles:
            color = variant_color(curve)
            label = variant_label(curve, n) + (f" (mean of {n_runs} seeds)" if n_runs > 1 else "")
            ax.plot(
                x,
                mean,
                color=color,
                ls=variant_linestyle(curve),
                marker=variant_marker(curve),
                ms=5,
                lw=1.5,
                label=label,
                zorder=3,
            )
            if n_runs > 1:
                ax.fill_between(x, lo, hi, color=color, alpha=0.15, lw=0, zorder=1)
            lows.append(float(np.nanmin(lo)))
            highs.append(float(np.nanmax(hi)))
        positive = [v for v in lows if v > 0]
        if log_y is None:
            log_y = bool(positive) and len(positive) == len(lows) and max(highs) / min(positive) > 20
        if log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(DEPTH_LABEL)
        ax.set_ylabel(ylabel)
        steps = sorted({p[7] for p in profiles})
        at = f"step {steps[0]}" if len(steps) == 1 else "each run's last step"
        ax.set_title(f"{title} at the end of training\nsweep {sweep}, {shape.text()}, {at}{note}", fontsize=10.5)
        ax.legend(loc="best")
        fig.tight_layout()
    return fig


def plot_block_output_rms(
    runs: pd.DataFrame,
    layers: pd.DataFrame,
    *,
    sweep: str | None = None,
    variants: Sequence[str] | None = None,
    select_method: str = "mean",
    log_y: bool | None = None,
    points: pd.DataFrame | None = None,
) -> Figure:
    """Per transformer block, the RMS of the hidden state it hands on, vs depth, at the end of training
    (baseline: grows with depth; AttnRes: stays bounded). Mean over the chosen seeds, their range shaded.
    ``log_y=None`` uses a log axis when the values span more than a factor 20. ``points``: the fit's points
    of the sweep (default: selected from ``runs`` by ``select_method``)."""
    sweep, shape, profiles = _block_profiles(
        runs, layers, "output_rms", sweep, variants, select_method, "the block output magnitude figure", points
    )
    return _plot_profiles(profiles, shape, sweep, BLOCK_OUTPUT_LABEL, "Output magnitude per transformer block", log_y)


def plot_block_grad_norm(
    runs: pd.DataFrame,
    layers: pd.DataFrame,
    *,
    sweep: str | None = None,
    variants: Sequence[str] | None = None,
    select_method: str = "mean",
    log_y: bool | None = None,
    points: pd.DataFrame | None = None,
) -> Figure:
    """Per transformer block, the L2 norm of its parameter gradients before clipping vs depth, at the end of
    training (baseline: outsized in the early blocks). Mean over the chosen seeds, their range shaded. ``points``:
    the fit's points of the sweep (default: selected from ``runs`` by ``select_method``). Runs written before
    schema version 2 logged the norms after clipping; the title counts them when it draws any."""
    sweep, shape, profiles = _block_profiles(
        runs, layers, "grad_norm", sweep, variants, select_method, "the block gradient figure", points
    )
    drawn = {i for p in profiles for i in p[8]}
    of_sweep = sweep_runs(runs, sweep)[0]
    of_sweep = of_sweep[of_sweep["run_id"].astype(str).isin(drawn)]
    older = of_sweep.loc[of_sweep["schema_version"] < PRE_CLIP_LAYER_GRADS, "run_id"].astype(str).nunique()
    note = f"\n{older} of {len(drawn)} runs (schema version 1): norms after clipping" if older else ""
    title = "Gradient magnitude per transformer block"
    return _plot_profiles(profiles, shape, sweep, BLOCK_GRAD_LABEL, title, log_y, note)
