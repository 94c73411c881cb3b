"""Studies run twice under different tuning protocols, compared side by side.

A study's grid can be run under the paper's protocol (every variant at the baseline's tuned learning rate,
``lr: tuned-baseline``) and under per-variant tuning (``lr: tuned-per-variant``), as two sweeps of one results
folder (``cpu_wsd`` and ``cpu_wsd_pv``). When two or more sweeps have the same parts (the same ``@<r>tpp``
slices, or both whole), the report shows each variant's M per part in one row, a column per sweep, and the
learning rates each sweep trained every (size, variant) at. What protocol a sweep followed is read from its runs,
not from its name: one learning rate per size for every variant is the paper's protocol; a learning rate of its
own per variant is per-variant tuning.

Takes the :class:`analysis.FitReport` and the runs; never reads files; never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from analysis.data.select import curve_labels, curve_variants
from analysis.estimates.frontier import at_largest_compute
from attnres.variants import Variant, curve_order
from reports.document.document import Block, Paragraph, Table

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport

FRONTIER = "frontier"  # a part: M between the Chinchilla surfaces of a sweep's whole (analysis.estimates.frontier)
PART_NAMES = {"": "whole sweep", FRONTIER: "all sizes and budgets, M at the frontier"}


def base_of(sweep: str) -> tuple[str, str]:
    """``("cpu_wsd", "@16tpp")`` from ``cpu_wsd@16tpp``; ``("cpu_small", "")`` for a whole sweep."""
    base, at, part = sweep.partition("@")
    return base, at + part


def curves_of(runs: pd.DataFrame) -> pd.Series:
    """Each run's curve (its variant, or ``block-N<n>`` where Block has several N at one size)."""
    return curve_labels(runs) if len(runs) else pd.Series([], dtype=str)


def protocol_of(runs: pd.DataFrame) -> str:
    """What the runs' learning rates say about how they were chosen."""
    done = runs[runs["status"] == "done"]
    done = done.assign(curve=curves_of(done))
    per_size = done.groupby(["n_layer", "d_model"])["lr"].nunique()
    per_variant = done.groupby(["n_layer", "d_model", "curve"])["lr"].nunique()
    if per_size.empty:
        return "no finished runs"
    if (per_variant > 1).any():
        return "several learning rates per (size, variant): a learning-rate sweep"
    if (per_size == 1).all():
        return "one learning rate per size for every variant (the paper's protocol, or tuned rates that coincide)"
    return "each variant at a learning rate of its own (per-variant tuning)"


def compared_sweeps(fit: FitReport) -> list[str]:
    """The base sweeps that share parts and trained cells (sizes at token counts) with another one: one study
    run twice, in the fit's order (empty: nothing to compare)."""
    parts: dict[str, set[str]] = {}
    cells: dict[str, set[tuple]] = {}
    for sw in fit.sweeps:
        base, part = base_of(sw.sweep)
        if sw.multipliers:
            parts.setdefault(base, set()).add(part)
        if sw.frontier_multipliers:
            parts.setdefault(base, set()).add(FRONTIER)
        if not sw.points.empty:
            cells.setdefault(base, set()).update(map(tuple, sw.points[["n_layer", "d_model", "tokens"]].to_numpy()))
    return [
        b
        for b in parts
        if any(o != b and parts[o] & parts[b] and cells.get(o, set()) & cells.get(b, set()) for o in parts)
    ]


def comparison_blocks(fit: FitReport, runs: pd.DataFrame, level_text: str) -> list[Block]:
    """The M table (a row per part and variant, a column per sweep) and the learning-rate table, with the
    protocol each sweep's runs show; nothing when fewer than two sweeps share their parts."""
    bases = compared_sweeps(fit)
    if len(bases) < 2:
        return []
    cells: dict[tuple[str, str], dict[str, str]] = {}
    variants: dict[str, Variant] = {}  # each curve's variant, as the first sweep that has it carries it
    for sw in fit.sweeps:
        base, part = base_of(sw.sweep)
        if base not in bases:
            continue
        for m in sw.multipliers:
            variants.setdefault(m.variant, m.curve_variant)
            mark = "" if m.reliable else " (unreliable)"
            cells.setdefault((part, m.variant), {})[base] = f"{m.multiplier.text(3)}{mark}"
        for f in at_largest_compute(sw.frontier_multipliers):  # as in the headline
            variants.setdefault(f.variant, f.curve_variant)
            cells.setdefault((FRONTIER, f.variant), {})[base] = f"{f.M.text(3)} (not calibrated)"
    labels = {c: v.title for c, v in variants.items()}
    order = curve_order(list(variants), variants)
    keys = sorted(cells, key=lambda k: (_part_order(k[0]), order.index(k[1])))
    m_rows = [
        {
            "part": PART_NAMES.get(part, part),
            "variant": labels[v],
            **{f"M in {b} [{level_text}]": cells[(part, v)].get(b, "") for b in bases},
        }  # fmt: skip
        for part, v in keys
    ]
    lr_rows = _lr_rows(runs, bases, variants)
    protocols = "; ".join(f"`{b}`: {protocol_of(runs[runs['sweep'] == b])}" for b in bases)
    return [
        Paragraph(
            f"The same study under different learning-rate protocols, read from each sweep's runs ({protocols}). "
            "M of each variant at its largest budget, per part of the study, a column per sweep:"
        ),
        Table(pd.DataFrame(m_rows)),
        Paragraph("The learning rate every (size, variant) was trained at, per sweep:"),
        Table(pd.DataFrame(lr_rows)),
    ]


def _part_order(part: str) -> tuple[float, str]:
    """Whole sweeps first, then slices by their ratio (``@2tpp`` before ``@16tpp``), the frontier last."""
    try:
        return float(part.removeprefix("@").removesuffix("tpp")), part
    except ValueError:
        return (-1.0 if not part else float("inf")), part


def _lr_rows(runs: pd.DataFrame, bases: list[str], variants: dict[str, Variant]) -> list[dict[str, str]]:
    """The learning rate of every (size, curve) per sweep, for the curves with an M (``variants``) and the
    baseline."""
    done = runs[(runs["status"] == "done") & runs["sweep"].isin(bases)]
    done = done.assign(curve=curves_of(done).astype(str))
    shown = {**curve_variants(done), **variants}  # the baseline's variant from the runs, the others' from the fits
    curves = [c for c in curve_order(done["curve"], shown) if c in variants or c == "baseline"]
    rows = []
    for (n_layer, d_model), g in done.groupby(["n_layer", "d_model"]):
        row = {"size": f"L{n_layer}-d{d_model}"}
        for c in curves:
            for b in bases:
                lrs = sorted(g[(g["sweep"] == b) & (g["curve"] == c)]["lr"].unique())
                row[f"{variants[c].title if c in variants else c} in {b}"] = ", ".join(f"{lr:.3g}" for lr in lrs)
        rows.append(row)
    return rows
