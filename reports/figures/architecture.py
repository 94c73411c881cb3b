"""The architecture-sweep figure (the paper's Fig. 7; analysis/estimates/architecture.py): one heatmap per curve of the
loss over (depth, heads) cells at one parameter count and one compute, each curve's best cell starred, and a heatmap of
each variant's gap to the baseline cell by cell.

Columns are depths (deeper is narrower: d_model / n_layer falls to the right), rows the head counts of a depth in
increasing order. Takes the :class:`analysis.FitReport` and a sweep name and returns a matplotlib Figure; never
imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from attnres.variants import Variant
from reports.base.data import MissingData, sweep_fit
from reports.base.style import rc_context, variant_label

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from analysis import FitReport
    from analysis.estimates.architecture import ArchitectureGrid


def _matrix(grid: ArchitectureGrid, curve: str, depths: list[int], rows: int, field: str) -> np.ndarray:
    out = np.full((rows, len(depths)), np.nan)
    for c in grid.of(curve):
        out[c.row, depths.index(c.n_layer)] = getattr(c, field)
    return out


def plot_architecture(report: FitReport, sweep: str | None = None) -> Figure:
    """The loss heatmap of every curve (shared colour scale; a star on each curve's best cell) and, per variant,
    the heatmap of 100 (ln L_var - ln L_base) (blue where the variant's loss is lower)."""
    import matplotlib.pyplot as plt

    sw = sweep_fit(report, sweep)
    grid = sw.architecture
    if grid is None:
        raise MissingData("not an architecture sweep (cells of several depths and head counts at one size)")
    curves = grid.curves
    names = {c: variant_label(sw.curve_variants[c].as_named(c)) for c in curves}  # N only where the name has it
    others = [c for c in curves if c != grid.baseline]
    depths = sorted({c.n_layer for c in grid.cells})
    rows = len(grid.row_names)
    losses = {curve: _matrix(grid, curve, depths, rows, "loss") for curve in curves}
    gaps = {curve: _matrix(grid, curve, depths, rows, "gap_pct") for curve in others}
    low = min(np.nanmin(m) for m in losses.values())
    high = max(np.nanmax(m) for m in losses.values())
    widths = {n: sorted({c.d_model for c in grid.cells if c.n_layer == n}) for n in depths}
    col_labels = [f"L{n}\nd/L {'~' if len(widths[n]) > 1 else ''}{np.median(widths[n]) / n:.3g}" for n in depths]
    panels = len(curves) + len(others)
    with rc_context():
        fig, axes = plt.subplots(1, panels, figsize=(3.3 * panels + 0.8, 0.55 * rows + 2.6), squeeze=False)
        for ax, curve in zip(axes[0], curves):
            image = ax.imshow(losses[curve], cmap="viridis_r", vmin=low, vmax=high, aspect="auto", origin="lower")
            best = grid.best(curve)
            ax.plot(depths.index(best.n_layer) + 0.32, best.row + 0.28, "*", ms=13, color="white", mec="black", mew=0.8)
            _annotate(ax, losses[curve], "{:.3f}")
            _axes(ax, col_labels, grid.row_names, f"{names[curve]}: loss")
            fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
        for ax, curve in zip(axes[0][len(curves) :], others):
            bound = max(float(np.nanmax(np.abs(gaps[curve]))), 1e-9)
            image = ax.imshow(gaps[curve], cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto", origin="lower")
            _annotate(ax, gaps[curve], "{:+.2f}")
            title = f"{names[curve]} - {names.get(grid.baseline) or variant_label(Variant(grid.baseline))}, %"
            if curve in grid.gap_change:
                gap = grid.gap_change[curve]
                title += f"\nchange L{gap.depths[0]} -> L{gap.depths[1]}: {gap.change.text(3)}"
            _axes(ax, col_labels, grid.row_names, title)
            fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
        params = np.median([c.params for c in grid.cells])
        fig.suptitle(
            f"{sw.sweep}: loss over depth x heads at about {params / 1e3:.0f}k parameters and one compute "
            "(star: each curve's best cell)",
            fontsize=10,
        )
        fig.tight_layout()
    return fig


def _axes(ax, col_labels: list[str], row_labels: tuple[str, ...], title: str) -> None:  # noqa: ANN001 (an Axes)
    ax.set_xticks(range(len(col_labels)), col_labels, fontsize=7)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
    ax.set_xlabel("depth (deeper is narrower)")
    ax.set_title(title, fontsize=9)
    ax.grid(False)


def _annotate(ax, values: np.ndarray, fmt: str) -> None:  # noqa: ANN001 (an Axes)
    for (r, c), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(
                c,
                r,
                fmt.format(v),
                ha="center",
                va="center",
                fontsize=6.5,
                color="black",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.6},
            )
