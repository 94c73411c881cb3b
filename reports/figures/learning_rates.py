"""Learning-rate figures of a sweep that trained several rates per cell (``attnres fit --lr envelope``): the loss
against the rate per size with each variant's fitted curve and minimum, and the best rate against the parameters
per variant with its fitted power law, extrapolated to the paper's sizes beside the paper's rates.

Each function takes the :class:`analysis.FitReport` and a sweep name and returns a matplotlib Figure; nothing here
reads or writes files. Imports matplotlib only inside the functions; never imports torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.data.envelope import rate_law
from attnres.variants import curve_order
from reports.base.data import MissingData, sweep_fit
from reports.base.paper import TABLE2_LR, TABLE2_NOTE, TABLE2_PARAMS
from reports.base.style import rc_context, variant_color, variant_label, variant_marker

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from analysis import FitReport
    from analysis.data.envelope import Envelopes
    from attnres.variants import Variant


def _envelope(report: FitReport, sweep: str | None) -> tuple[Envelopes, dict[str, Variant]]:
    """The sweep's envelopes, and each of their curves as its name shows it, in the figures' order (the figures draw
    a Block curve of one N per size without an N, as every N's)."""
    sw = sweep_fit(report, sweep)
    if sw.envelope is None or not sw.envelope.cells:
        raise MissingData("no learning-rate envelope (fit with --lr envelope a grid that trained several rates)")
    variants = sw.curve_variants
    curves = curve_order({c.curve for c in sw.envelope.cells}, variants)
    return sw.envelope, {c: variants[c].as_named(c) for c in curves}


def plot_lr_curves(report: FitReport, sweep: str | None = None) -> Figure:
    """One panel per size (and budget): each variant's mean loss at every rate swept (markers), its fitted curve
    over the swept rates (line) and its minimum (a star; hollow where it sits at an edge of the rates)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    envelope, curves = _envelope(report, sweep)
    # one panel per (size, budget); the variants of a size differ in parameters (the depth mixer's), so a panel is
    # named and ordered by the smallest, the baseline's
    smallest: dict[tuple[float, str], float] = {}
    for c in envelope.cells:
        smallest[(c.tokens, c.size)] = min(c.params, smallest.get((c.tokens, c.size), c.params))
    panels = sorted(((t, n, size) for (t, size), n in smallest.items()), key=lambda p: (p[0] / p[1], p[1]))
    cols = min(len(panels), 5)
    rows = math.ceil(len(panels) / cols)
    with rc_context():
        fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 0.6, 2.5 * rows + 0.8), squeeze=False)
        for ax, (tokens, params, size) in zip(axes.flat, panels):
            for curve, named in curves.items():
                cell = next(
                    (c for c in envelope.cells if c.curve == curve and c.size == size and c.tokens == tokens), None
                )
                if cell is None:
                    continue
                color = variant_color(named)
                ax.plot(cell.rates, cell.rate_loss, variant_marker(named), color=color, ms=4, alpha=0.8)
                grid = np.geomspace(cell.rates[0], cell.rates[-1], 60)
                ax.plot(grid, cell.curve_at(grid), "-", color=color, lw=1.2, label=variant_label(named))
                ax.plot(
                    [cell.best_lr],
                    [cell.loss],
                    "*",
                    ms=11,
                    color=color,
                    mfc="none" if cell.edge else color,
                    zorder=5,
                )
            ax.set_xscale("log")
            rates = sorted({r for c in envelope.cells if c.size == size and c.tokens == tokens for r in c.rates})
            ax.set_xticks(rates, [f"{r:.3g}" for r in rates], rotation=45, fontsize=7)
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"{size}, {tokens / params:.2g} tok/param", fontsize=9)
            ax.set_xlabel("learning rate")
        for ax in axes.flat[len(panels) :]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel("validation loss (nats/token)")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False)
        fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def plot_best_lr(report: FitReport, sweep: str | None = None) -> Figure:
    """Each variant's best rate against its non-embedding parameters, with its fitted power law drawn out to the
    paper's sizes, and the paper's Table 2 rates there."""
    import matplotlib.pyplot as plt

    envelope, curves = _envelope(report, sweep)
    with rc_context():
        fig, ax = plt.subplots(figsize=(7.0, 4.6))
        far = np.geomspace(min(c.params for c in envelope.cells) / 1.5, max(TABLE2_PARAMS) * 1.5, 100)
        for curve, named in curves.items():
            cells = [c for c in envelope.cells if c.curve == curve]
            color, marker = variant_color(named), variant_marker(named)
            inside = [c for c in cells if not c.edge]
            edges = [c for c in cells if c.edge]
            ax.plot([c.params for c in inside], [c.best_lr for c in inside], marker, color=color, ms=6)
            if edges:
                ax.plot([c.params for c in edges], [c.best_lr for c in edges], marker, color=color, ms=6, mfc="none")
            law = rate_law(envelope, curve)
            if law is not None:
                ax.plot(
                    far,
                    law.lr_at(far),
                    "--",
                    color=color,
                    lw=1,
                    label=f"{variant_label(named)}: lr* ~ N^{law.exponent:.2f}",
                )
        ax.plot(TABLE2_PARAMS, TABLE2_LR, "kx", ms=8, mew=1.5, label=TABLE2_NOTE)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("non-embedding parameters N")
        ax.set_ylabel("best learning rate (the envelope's minimum)")
        ax.legend(frameon=False)
        fig.tight_layout()
    return fig


def best_lr_table(report: FitReport, sweep: str | None = None) -> pd.DataFrame:
    """Per variant: the fitted exponent of its best rate in N, how many cells sit at an edge, and the rate the law
    gives at each of the paper's sizes, with the paper's own rates in the last row."""
    envelope, curves = _envelope(report, sweep)
    rows = []
    for curve, named in curves.items():
        law = rate_law(envelope, curve)
        if law is None:
            continue
        rows.append(
            {
                "variant": variant_label(named),
                "exponent": f"{law.exponent:.3g}",
                "cells (at an edge)": f"{law.n_cells} ({law.edges})",
                **{f"lr* at {p / 1e6:.0f}M": f"{float(law.lr_at(p)):.3g}" for p in TABLE2_PARAMS},
            }
        )
    if not rows:
        raise MissingData("fewer than two sizes per variant: no power law of the best rate")
    rows.append(
        {
            "variant": "the paper (Table 2)",
            "exponent": "",
            "cells (at an edge)": "",
            **{f"lr* at {p / 1e6:.0f}M": f"{lr:.3g}" for p, lr in zip(TABLE2_PARAMS, TABLE2_LR)},
        }
    )
    return pd.DataFrame(rows)
