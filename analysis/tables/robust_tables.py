"""The tables of the estimators that check a headline against tuning and seed noise, for ``attnres fit`` and the
report alike (:class:`analysis.tables.table_format.FitTable`): the paired per-size multiplier and the stalled runs
beside every headline, and, for a grid that swept learning rates, the envelopes and the two tuning protocols side by
side.

Pure Python; no I/O; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from analysis.tables.table_format import (
    Cell,
    FitTable,
    FitText,
    has_intervals,
    number,
    ordered_multipliers,
    with_interval,
)

if TYPE_CHECKING:  # pragma: no cover
    from analysis.fitting.results import SweepFit
    from analysis.fitting.settings import FitSettings

EDGE_MARK = "EDGE"  # a minimum at an end of the swept rates: the loss is an upper bound of the cell's minimum


def _tokens(tokens: float) -> str:
    return f"{tokens / 1e6:.3g}M" if tokens >= 1e5 else f"{tokens:,.0f}"


def envelope_table(sw: SweepFit) -> FitTable:
    """One row per (curve, size, budget) of ``--lr envelope``: the rates swept, the best rate and the minimum, and
    the edge flag."""
    if sw.envelope is None:
        return FitTable((), ())
    rows = tuple(
        (
            c.curve,
            c.size,
            _tokens(c.tokens),
            f"{c.rates[0]:.3g} .. {c.rates[-1]:.3g} ({len(c.rates)})",
            len(c.seeds),
            f"{c.best_lr:.3g}",
            number(c.loss, 5),
            f"{EDGE_MARK} ({c.edge})" if c.edge else "",
        )
        for c in sw.envelope.cells
    )
    split = any(c.shape == "split" for c in sw.envelope.cells)
    curve = (
        "a split parabola with a level per seed and its own curvature each side of its vertex, over every rate"
        if split
        else "a parabola with a level per seed, over the 3 rates around the cell's best"
    )
    what = (
        f"learning-rate envelope per cell: the minimum of log loss against ln(rate) ({curve}; least squares, "
        "curvature >= 0), within the swept rates"
    )
    hint = (
        f"; {EDGE_MARK}: the minimum lies at that end of the swept rates, so the loss is an upper bound: widen the "
        "grid's lr: past it"
        if sw.envelope.edges
        else ""
    )
    aside = [(c, a) for c in sw.envelope.cells for a in c.set_aside]
    if aside:
        hint += "; set aside (a run far above its cell's fit without it, then fitted again without it): " + "; ".join(
            f"{c.curve} at {c.size}, {_tokens(c.tokens)} tokens, seed {a.seed} at lr {a.lr:.3g} ({a.run_id}): "
            f"{100 * math.expm1(a.excess):+.1f} %, {a.z:.1f} standard errors"
            for c, a in aside
        )
    return FitTable(
        ("curve", "size", "tokens", "rates swept", "seeds", "best lr", "loss at best lr", "edge"),
        rows,
        f"{what}{hint}:",
        f"{what[0].upper()}{what[1:]}{hint}.",
    )


def protocol_table(sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """One row per variant: the headline under both tuning protocols, each with its paired per-size M."""
    ms = [m for m in ordered_multipliers(sw, order) if m.other_protocol is not None]
    if not ms:
        return FitTable((), ())
    own, other = settings.protocol, ms[0].other_protocol.protocol
    header = (
        "variant",
        with_interval("M, per-variant", settings),
        with_interval("paired M, per-variant", settings),
        with_interval("M, paper's", settings),
        with_interval("paired M, paper's", settings),
    )
    rows = []
    for m in ms:
        o = m.other_protocol
        values = {
            own: (_headline(m.multiplier.text(3), m.reliable), _paired_text(m.paired)),
            other: (_headline(o.multiplier.text(3), o.reliable), _paired_text(o.paired)),
        }
        rows.append((m.variant, *values["per-variant"], *values["paper"]))
    what = (
        "both tuning protocols from the same runs: each variant at its own best learning rate (per-variant), and "
        "at the baseline's best rate of the same size and budget (the paper's), with the paired per-size M of each"
    )
    return FitTable(header, tuple(rows), f"{what}:", f"{what[0].upper()}{what[1:]}.")


def protocol_cell_table(sw: SweepFit, order: Sequence[str] | None = None) -> FitTable:
    """One row per (variant, size, budget): its own best rate, the baseline's, and the loss the paper's protocol
    costs it."""
    if not sw.protocol_cells:
        return FitTable((), ())
    rank = {v: i for i, v in enumerate(order or [])}
    cells = sorted(sw.protocol_cells, key=lambda c: (rank.get(c.curve, len(rank)), c.curve, c.tokens, c.n_layer))
    rows = tuple(
        (
            c.curve,
            c.size,
            _tokens(c.tokens),
            f"{c.own_lr:.3g}" + (f" {EDGE_MARK}" if c.edge else ""),
            f"{c.baseline_lr:.3g}",
            f"{c.baseline_lr / c.own_lr:.2g}",
            f"{c.cost_pct:+.2f}",
        )
        for c in cells
    )
    what = (
        "best learning rate per (variant, size, budget), the baseline's, their ratio, and the loss the paper's "
        "protocol (the variant at the baseline's rate) costs the variant, in % of its own best"
    )
    return FitTable(
        ("variant", "size", "tokens", "own best lr", "baseline's best lr", "ratio", "cost of the paper's protocol %"),
        rows,
        f"{what}:",
        f"{what[0].upper()}{what[1:]}.",
    )


def _headline(text: str, reliable: bool) -> str:
    return text if reliable else f"{text} (unreliable)"


def _paired_text(paired) -> str:  # noqa: ANN001 (a PairedMultiplier or None)
    if paired is None:
        return "-"
    return paired.mean.text(3) + ("" if paired.agrees is not False else " DISAGREES")


def paired_table(sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """One row per (variant, size) of the paired per-size M, and per variant its mean with the t-interval and
    whether it agrees with the power-law headline."""
    ms = [m for m in ordered_multipliers(sw, order) if m.paired is not None]
    if not ms:
        return FitTable((), ())
    rows: list[tuple[Cell, ...]] = []
    for m in ms:
        for s in m.paired.sizes:
            gap = f"{100 * s.log_gap:+.2f}"
            rows.append((m.variant, s.budget, gap, s.n_pairs, f"{s.slope:.3g}", number(s.multiplier, 3)))
        verdict = "" if m.paired.agrees is None else ("agrees" if m.paired.agrees else "DISAGREES")
        rows.append((m.variant, "mean (t over sizes)", "", "", "", f"{m.paired.mean.text(3)} {verdict}".rstrip()))
    what = (
        "paired per-size M: at each size ln M = ln(C_base / C_var) + (ln L_base - ln L_var) / s, the losses paired "
        "by seed at the same budget and s the baseline law's local slope; their mean with a t-interval over sizes "
        "(no bootstrap; it disagrees with the headline where the two intervals do not overlap)"
    )
    header = ("variant", "size", "gap ln L_base - ln L_var (%)", "seed pairs", "slope s", "M")
    if has_intervals(settings):
        header = header[:-1] + (with_interval("M", settings),)
    return FitTable(header, tuple(rows), f"{what}:", f"{what[0].upper()}{what[1:]}.")


def stall_texts(sw: SweepFit) -> tuple[FitText, ...]:
    """The runs flagged as stalled, and what each variant's headline becomes without them."""
    if not sw.stalls:
        return ()
    out = [
        FitText(
            f"stalled: {s.run_id} ({s.curve} {s.size}, lr {s.lr:.3g}, seed {s.seed}) lags its cell's other seeds by "
            f"{100 * s.lag:.1f}% early in training",
            f"`{s.run_id}` ({s.curve} {s.size}, lr {s.lr:.3g}, seed {s.seed}) lags its cell's other seeds by "
            f"{100 * s.lag:.1f}% early in training.",
        )
        for s in sw.stalls
    ]
    for m in sw.multipliers:
        if m.without_stalls is not None:
            text = f"M = {m.without_stalls.text(3)} without the flagged runs (with them {m.multiplier.text(3)})"
            out.append(FitText(f"{m.variant}: {text}", f"`{m.variant}`: {text}."))
    return tuple(out)
