"""Training-dynamics figures (figure 3): validation loss vs tokens, and per transformer block the output
magnitude and the parameter-gradient norm vs depth at the end of training.

The variants are compared at one reference shape (:func:`reports.base.data.reference_points`); by default the
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

from analysis.data.select import curve_variants
from attnres.storage.schema import PRE_CLIP_LAYER_GRADS
from attnres.variants import Variant, curve_order
from reports.base.data import (
    MissingData,
    Shape,
    at_one_rate,
    last_step,
    reference_points,
    sweep_points,
    sweep_runs,
    table_rows,
)
from reports.base.style import (
    FIGSIZE,
    compact_ticks,
    rc_context,
    readable_log_ticks,
    variant_color,
    variant_label,
    variant_linestyle,
    variant_marker,
    wrap_to_width,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

BLOCK_OUTPUT_LABEL = "RMS of block output"
BLOCK_GRAD_LABEL = "L2 norm of block parameter gradients (before clipping)"
DEPTH_LABEL = "transformer block (1 = nearest the embedding)"


def _keep(points: pd.DataFrame, variants: Sequence[str] | None) -> Callable[[str], bool]:
    """Which curves of ``points`` a figure shows: those ``variants`` names (a curve or a variant name: ``block``
    keeps every N), by default the main variants (every variant when none of them ran)."""
    of = curve_variants(points)
    if variants is not None:
        wanted = set(variants)
        return lambda curve: curve in wanted or of[curve].name in wanted
    if any(v.is_main for v in of.values()):
        return lambda curve: of[curve].is_main
    return lambda curve: True


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
    """Validation loss (nats/token) vs training tokens for each variant at the reference shape: the mean over the
    seeds at the chosen learning rate as a bold line with the seeds' range as a band, each seed a faint line.
    Left: the whole run (log tokens); right: the second half of training on linear axes, where the variants
    separate. Where the runs logged nothing before their second half (a WSD branch starts at its decay; its trunk's
    steps are the trunk's runs), the two would draw the same data, and the figure has the one panel.

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
    curves = _seed_curves(m, sel, points, runs, available)
    end = max(float(x.max()) for c in curves for x, _ in c.seeds)
    zoomed = any(float(x[x > 0].min()) < 0.5 * end for c in curves for x, _ in c.seeds if (x > 0).any())
    ylabel = "validation loss (nats/token)" if split == "val" else "training loss (nats/token)"
    with rc_context():
        if zoomed:
            fig, (ax, axz) = plt.subplots(
                1, 2, figsize=(10.5, 4.4), gridspec_kw={"width_ratios": [1, 1], "wspace": 0.22}
            )
        else:
            fig, ax = plt.subplots(figsize=(7.0, 4.8))
            axz = None
        zoom_lo, zoom_hi = _draw_loss_curves(ax, axz, curves)
        with_train = _draw_training_loss(ax, train, curves)
        ax.set_xscale("log")
        if with_train:
            ax.set_yscale("log")  # from the first steps' loss down to the end's, and the end still readable
            readable_log_ticks(ax, "y", max_ticks=10)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("loss (nats/token)" if with_train else ylabel)
        part = "whole run" if zoomed else "a WSD branch's decay (its trunk is a run of its own)"
        part = f"{part} (log tokens; thin lines: training loss)" if with_train else part
        ax.set_title(wrap_to_width(part, ax.get_position().width * fig.get_size_inches()[0], 10), fontsize=10)
        compact_ticks(ax, "x", log=True)
        if axz is not None:
            axz.set_xlabel("training tokens")
            axz.set_ylabel(ylabel)
            axz.set_title("second half of training", fontsize=10)
            if zoom_lo:
                lo, hi = min(zoom_lo), max(zoom_hi)
                pad = 0.05 * (hi - lo if hi > lo else max(abs(hi), 1e-3))
                axz.set_ylim(lo - pad, hi + pad)
            compact_ticks(axz, "x", log=False)
        (axz or ax).legend(loc="upper right", fontsize=8)
        what = "Validation loss" if split == "val" else "Training loss (too few validation points)"
        title = f"{what} during training: sweep {sweep}, {shape.text()}\nbold: the mean over seeds, band: their range"
        title = wrap_to_width(title, fig.get_size_inches()[0] - 0.3, 10.5)
        fig.suptitle(title, fontsize=10.5)
        # room above the panels for the figure's title and the panels' titles, as many lines as they wrapped to
        lines = title.count("\n") + 1 + max(a.get_title().count("\n") + 1 for a in fig.axes)
        top = 1 - (0.25 + 0.2 * lines) / fig.get_size_inches()[1]
        fig.subplots_adjust(left=0.07 if zoomed else 0.11, right=0.98, top=top, bottom=0.13)
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


class _SeedCurve:
    """One curve at the reference shape: its variant as its name shows it (its look), its label, and each drawn
    seed's (tokens, loss)."""

    def __init__(self, named: Variant, label: str, run_ids: list[str], seeds: list[tuple[np.ndarray, np.ndarray]]):
        self.named, self.label, self.run_ids, self.seeds = named, label, run_ids, seeds

    def mean_band(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """(tokens, mean, low, high) over the seeds at the tokens they all logged (None: one seed)."""
        if len(self.seeds) < 2:
            return None
        frames = [pd.Series(y, index=x) for x, y in self.seeds]
        both = pd.concat(frames, axis=1, join="inner").sort_index()
        if both.empty:
            return None
        x = both.index.to_numpy(float)
        return x, both.mean(axis=1).to_numpy(float), both.min(axis=1).to_numpy(float), both.max(axis=1).to_numpy(float)


def _seed_curves(
    m: pd.DataFrame, sel: pd.DataFrame, points: pd.DataFrame, runs: pd.DataFrame, available: set[str]
) -> list[_SeedCurve]:
    """Each curve's runs at the reference shape, at one learning rate: a point read from an envelope holds every
    rate's runs, and only the seeds of the swept rate nearest its best rate are one curve's seeds."""
    out, variants = [], curve_variants(points)
    for curve in curve_order(sel["curve"], variants):
        row = sel[sel["curve"] == curve].iloc[0]
        ids, lr = at_one_rate(row, sorted(i for i in row["run_ids"] if i in available), runs)
        at = "" if lr is None else f" at lr {lr:.3g}"
        seeds = []
        for rid in ids:
            d = m[m["run_id"].astype(str) == rid].sort_values("step")
            seeds.append((d["tokens"].to_numpy(float), d["loss"].to_numpy(float)))
        label = variant_label(variants[curve]) + (f" ({len(ids)} seeds{at})" if len(ids) > 1 else at)
        out.append(_SeedCurve(variants[curve].as_named(curve), label, ids, seeds))
    return out


def _draw_loss_curves(ax: Any, axz: Any | None, curves: list[_SeedCurve]) -> tuple[list[float], list[float]]:
    """Each curve's seed mean (bold, labelled) with the seeds' range as a band and each seed faint, on ``ax`` and
    (its second half) on ``axz``; returns the lowest and highest loss of each second half."""
    many = max(len(x) for c in curves for x, _ in c.seeds) > 40
    end = max(float(x.max()) for c in curves for x, _ in c.seeds)
    zoom_lo, zoom_hi = [], []
    for c in curves:
        color, ls = variant_color(c.named), variant_linestyle(c.named)
        band = c.mean_band()
        faint = {"color": color, "ls": ls, "lw": 0.7, "alpha": 0.3}
        for x, y in c.seeds:
            half = x >= 0.5 * end
            if half.any():
                zoom_lo.append(float(y[half].min()))
                zoom_hi.append(float(y[half].max()))
            if band is not None:
                ax.plot(x[x > 0], y[x > 0], **faint)
                if axz is not None:
                    axz.plot(x[half], y[half], **faint)
        if band is None:  # one seed: its own line, labelled
            x, y = c.seeds[0] if c.seeds else (np.array([]), np.array([]))
            bold = {"color": color, "ls": ls, "lw": 1.6, "marker": None if many else variant_marker(c.named), "ms": 3.5}
            ax.plot(x[x > 0], y[x > 0], **bold, label=c.label)
            if axz is not None:
                axz.plot(x[x >= 0.5 * end], y[x >= 0.5 * end], **bold, label=c.label)
            continue
        x, mean, low, high = band
        bold = {"color": color, "ls": ls, "lw": 1.8, "marker": None if many else variant_marker(c.named), "ms": 3.5}
        for target, keep in ((ax, x > 0), (axz, x >= 0.5 * end)):
            if target is None:
                continue
            target.fill_between(x[keep], low[keep], high[keep], color=color, alpha=0.15, lw=0)
            target.plot(x[keep], mean[keep], **bold, label=c.label)
    return zoom_lo, zoom_hi


def _draw_training_loss(ax: Any, train: pd.DataFrame, curves: list[_SeedCurve]) -> bool:
    """The training loss of each drawn run, as thin lines on the whole-run panel from the first logged step;
    returns whether any was drawn."""
    if train.empty:
        return False
    drawn = False
    for c in curves:
        for rid in c.run_ids:
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
                    color=variant_color(c.named),
                    ls=variant_linestyle(c.named),
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
    str | None, Shape, list[tuple[Variant, str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, list[str]]]
]:
    """The reference shape and, per curve there in the figures' order: its variant as its name shows it (its look),
    its label (with N), the blocks, the mean, low and high of ``column`` over its seeds, their count, the last step
    and the runs."""
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
    out, variants = [], curve_variants(points)
    for curve in curve_order(sel["curve"], variants):
        row = sel[sel["curve"] == curve].iloc[0]
        ids, _ = at_one_rate(row, sorted(i for i in row["run_ids"] if i in available), runs)
        d = lay[lay["run_id"].astype(str).isin(ids)]
        table = d.pivot_table(index="layer", columns="run_id", values=column, aggfunc="mean").sort_index()
        values = table.to_numpy(float)
        step = int(d["step"].max())
        out.append(
            (
                variants[curve].as_named(curve),
                variant_label(variants[curve]),
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
        for named, name, x, mean, lo, hi, n_runs, _step, _ids in profiles:
            color = variant_color(named)
            label = name + (f" (mean of {n_runs} seeds)" if n_runs > 1 else "")
            ax.plot(
                x,
                mean,
                color=color,
                ls=variant_linestyle(named),
                marker=variant_marker(named),
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
