"""Depth-attention heatmaps (figure 5): the mean weight alpha_{i -> l} (over tokens) that each reading sublayer
l puts on each source i, pre-attention and pre-MLP side by side, for one AttnRes variant.

Rows are the queries (sublayer l, 0-based; the pre-MLP panel ends with the final aggregation that feeds the
LM head), columns the sources: for Full AttnRes source i is the output of sublayer i - 1 (0 = the
embedding), for Block AttnRes source n is depth block n (0 = the embedding) and the query's own partial
block is outlined. Empty cells are sources a query cannot see. Values are the ``depth_attn.parquet`` weights
at each run's last logged step, averaged over the chosen seeds of the reference shape
(:mod:`reports.base.data`). Takes DataFrames, returns a matplotlib Figure; never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.data.select import curve_variants
from reports.base.data import (
    MissingData,
    at_one_rate,
    last_step,
    reference_points,
    sweep_points,
    table_rows,
)
from reports.base.style import rc_context, variant_label, wrap_to_width

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

WEIGHT_LABEL = "mean depth-attention weight α (over tokens)"
ANNOTATE_MAX_CELLS = 14  # write the weight into each cell when a panel is at most this many cells wide and tall


def depth_attention_matrices(depth_attn: pd.DataFrame) -> dict[str, tuple[np.ndarray, list[int], np.ndarray]]:
    """Per query kind ("attn", "mlp", "final"): (weights [query, source] with NaN where the source is not
    visible, the query numbers, a boolean mask of partial-block cells), averaged over the runs given."""
    if depth_attn.empty:
        raise MissingData("no depth-attention rows")
    d = depth_attn.assign(source=depth_attn["source"].astype(int), query=depth_attn["query"].astype(int))
    n_src = int(d["source"].max()) + 1
    out = {}
    for kind in ("attn", "mlp", "final"):
        g = d[d["kind"].astype(str) == kind]
        if g.empty:
            continue
        mean = g.groupby(["query", "source"])["weight"].mean()
        queries = sorted(g["query"].unique().tolist())
        mat = np.full((len(queries), n_src), np.nan)
        partial = np.zeros_like(mat, dtype=bool)
        index = {q: k for k, q in enumerate(queries)}
        for (q, s), w in mean.items():
            mat[index[q], s] = w
        for r in g[g["source_kind"].astype(str) == "partial"][["query", "source"]].drop_duplicates().itertuples():
            partial[index[r.query], r.source] = True
        out[kind] = (mat, queries, partial)
    return out


_PANELS = [
    ("attn", "pre-attention (rows: attention sublayers l)"),
    ("mlp", "pre-MLP (rows: MLP sublayers l, then the LM head input)"),
]


def plot_depth_attention(
    runs: pd.DataFrame,
    depth_attn: pd.DataFrame,
    *,
    variant: str = "full",
    sweep: str | None = None,
    run_ids: list[str] | None = None,
    select_method: str = "mean",
    points: pd.DataFrame | None = None,
) -> Figure:
    """Heatmaps of the mean depth-attention weight for one AttnRes curve (``"full"``, ``"block"``,
    ``"block-N4"``): pre-attention queries left, pre-MLP queries (and the final aggregation) right, one
    shared color scale. ``run_ids`` picks the runs; by default the chosen seeds of the reference shape. The title
    names the curve's variant as its points carry it (:func:`analysis.data.select.curve_variants`, Block with its
    N), or as the rows of ``run_ids`` do where the curve has no finished run (a sweep in progress). ``points``: the
    fit's points of the sweep (default: selected from ``runs`` by ``select_method``)."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    da = table_rows(depth_attn, sweep)
    if da.empty:
        raise MissingData("no depth_attn.parquet in the results (no AttnRes runs)")
    available = set(da["run_id"].astype(str).unique())
    run_ids, where = _heatmap_runs(runs, points, available, variant, run_ids)
    d = last_step(da[da["run_id"].astype(str).isin(run_ids)])
    steps = sorted(d["step"].unique().tolist())
    mats = depth_attention_matrices(d)
    is_block = (d["source_kind"].astype(str).isin(["block", "partial"])).any()
    variants = curve_variants(points)
    if variant not in variants:  # explicit run_ids of a curve with no finished run (yet): named from their own rows
        variants = curve_variants(runs[runs["run_id"].astype(str).isin(run_ids)].assign(curve=variant))
    norm, clipped = _color_scale(mats)
    n_rows = max(len(mats.get(k, (None, []))[1]) + (1 if k == "mlp" and "final" in mats else 0) for k, _ in _PANELS)
    n_cols = next(iter(mats.values()))[0].shape[1]
    with rc_context():
        cmap = mpl.colormaps["viridis"].with_extremes(bad="0.93")
        width = min(15.0, max(9.5, 3.2 + 2 * 0.42 * n_cols))
        at = f"step {steps[0]}" if len(steps) == 1 else "last step of each run"
        seeds = f", mean of {len(run_ids)} seeds" if len(run_ids) > 1 else ""
        note = "; outlined: the query's own partial block" if is_block else ""
        name = variant_label(variants[variant])
        # wrapped to the figure's width (a long sweep name and shape ran past both edges), with room for its lines
        heading = f"Depth attention, {name}\nsweep {sweep}, {where}, {at}{seeds}{note}"
        heading = wrap_to_width(heading, width - 0.3, 10.5)
        title_in = 0.45 + 0.2 * heading.count("\n")
        height = min(14.0, 1.45 + title_in + max(2.6, 0.36 * n_rows))
        fig = plt.figure(figsize=(width, height))
        grid = fig.add_gridspec(
            1,
            3,
            width_ratios=[1, 1, 0.035],
            wspace=0.12,
            left=0.07,
            right=0.92,
            top=1 - (title_in + 0.3) / height,
            bottom=0.6 / height,
        )
        axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])]
        cax = fig.add_subplot(grid[0, 2])
        image = None
        for ax, (kind, title) in zip(axes, _PANELS):
            if kind not in mats:
                ax.set_visible(False)
                continue
            image = _draw_panel(ax, kind, title, mats, cmap, norm, is_block)
        if image is not None:
            bar = fig.colorbar(image, cax=cax, extend="max" if clipped else "neither")
            bar.set_label(WEIGHT_LABEL)
        fig.suptitle(heading, fontsize=10.5)
    return fig


def _heatmap_runs(
    runs: pd.DataFrame, points: pd.DataFrame, available: set[str], variant: str, run_ids: list[str] | None
) -> tuple[list[str], str]:
    """The runs a heatmap averages (``run_ids``, or the chosen seeds of the reference shape) and where they
    ran (the shape's text)."""
    if run_ids is None:
        shape, sel = reference_points(
            points,
            keep=lambda c: c == variant,
            has_data=lambda ids: any(i in available for i in ids),
            what=f"the depth-attention heatmap of {variant}",
        )
        row = sel.iloc[0]
        ids, lr = at_one_rate(row, sorted(i for i in row["run_ids"] if i in available), runs)
        return ids, shape.text() + ("" if lr is None else f", lr {lr:.3g}")
    missing = [i for i in run_ids if i not in available]
    if missing:
        raise MissingData(f"no depth_attn.parquet for run(s) {missing}")
    r = runs[runs["run_id"].astype(str).isin(run_ids)].iloc[0]
    return run_ids, f"n_layer={int(r['n_layer'])}, d_model={int(r['d_model'])}"


def _color_scale(mats: dict[str, tuple[np.ndarray, list[int], np.ndarray]]) -> tuple[Any, bool]:
    """The heatmaps' color scale from 0 to the largest weight of a row with a choice, and whether some
    weight lies above it."""
    from matplotlib.colors import Normalize

    # a query that sees one source (sublayer 0 sees only the embedding) has weight 1 by construction: scale the
    # colors by the rows with a choice, so the informative cells do not share the bottom of the scale
    informative = [row for m in mats.values() for row in m[0] if np.isfinite(row).sum() >= 2]
    vmax = float(np.nanmax(informative)) if informative else 1.0
    clipped = any(np.nanmax(m[0]) > vmax + 1e-12 for m in mats.values())
    return Normalize(vmin=0.0, vmax=max(vmax, 1e-12)), clipped


def _draw_panel(
    ax: Any,
    kind: str,
    title: str,
    mats: dict[str, tuple[np.ndarray, list[int], np.ndarray]],
    cmap: Any,
    norm: Any,
    is_block: bool,
) -> Any:
    """One panel of the heatmap (``kind`` "attn", or "mlp" with the final aggregation as its last row): the
    weights, outlined partial blocks, the weights written in when the panel is small; returns the image."""
    from matplotlib.patches import Rectangle

    mat, queries, partial = mats[kind]
    labels = [str(q) for q in queries]
    if kind == "mlp" and "final" in mats:
        fmat, _, fpart = mats["final"]
        mat = np.vstack([mat, fmat[:1]])
        partial = np.vstack([partial, fpart[:1]])
        labels.append("final")
    image = ax.imshow(np.ma.masked_invalid(mat), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    if "final" in labels:
        ax.axhline(len(labels) - 1.5, color="white", lw=2.0)
    for r, c in zip(*np.nonzero(partial)):
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="#e0710c", lw=1.6))
    if mat.shape[0] <= ANNOTATE_MAX_CELLS and mat.shape[1] <= ANNOTATE_MAX_CELLS:
        for (r, c), w in np.ndenumerate(mat):
            if np.isfinite(w):
                color = "white" if norm(w) < 0.6 else "black"
                ax.text(c, r, f"{w:.2f}", ha="center", va="center", fontsize=7, color=color)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    step = max(1, mat.shape[1] // 16)
    xt = list(range(0, mat.shape[1], step))
    ax.set_xticks(xt)
    ax.set_xticklabels(["emb" if c == 0 else str(c) for c in xt])
    ax.grid(False)
    ax.set_title(title, fontsize=10)
    if kind == "attn":
        ax.set_ylabel("reading sublayer l (0 = first)")
    if is_block:
        ax.set_xlabel("source n (emb = embedding, n = depth block n)")
    else:
        ax.set_xlabel("source i (emb = embedding, i = output of sublayer i-1)")
    return image
