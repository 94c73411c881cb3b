"""The report's tables, each a DataFrame: the fits and multipliers of a sweep (made by :mod:`analysis.tables.tables`,
as ``attnres fit`` prints them, in the figures' order; full-precision numbers are in report.json), a table like
the paper's Table 2 (per model size: parameters, tokens, loss per variant) and one like its Table 4 (the
ablation variants at one size).

Takes the :class:`analysis.FitReport` or the runs DataFrame; never reads files; never imports torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from analysis.data.select import curve_labels, curve_variants
from analysis.tables import tables as analysis_tables
from analysis.tables.tables import FitTable, curve_table
from attnres.variants import Variant, curve_order
from reports.base.data import MissingData, Shape, sweep_fit, sweep_points, sweep_runs
from reports.base.paper import PAPER_TABLE4, PAPER_TABLE4_BASELINE, PAPER_TABLE4_BLOCK_SIZE, PAPER_TABLE4_PARAMS
from reports.base.style import compact_int, variant_label

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport, SweepFit
    from analysis.estimates.one_shape import ShapeComparison

PAPER_TABLE4_SIZE = compact_int(PAPER_TABLE4_PARAMS)  # "436M": the paper's model of its Table 4
# the ablation table's column of the paper's differences from its baseline
PAPER_DELTA_COLUMN = f"paper Δ ({PAPER_TABLE4_SIZE}, their data)"
# a one-shape sweep's ablation table (analysis.estimates.one_shape): the gap, its interval and the paper's, points of %
GAP_COLUMNS = ("gap (%)", "gap low", "gap high", "paper gap (%)")


def describe_variant(variant: Variant) -> str:
    """A one-line description of a variant (:attr:`Variant.description`: ``full+sigmoid`` -> "Full AttnRes, sigmoid
    instead of softmax")."""
    return variant.description


def _variant_order(sw: SweepFit) -> list[str]:
    """The sweep's variants with a multiplier, in the figures' variant order."""
    if not sw.multipliers:
        raise MissingData(f"no multiplier in sweep {sw.sweep!r}")
    return curve_order([m.variant for m in sw.multipliers], sw.curve_variants)


def curve_fits(report: FitReport, sweep: str | None = None) -> FitTable:
    """The table of :func:`fit_table` with its caption (:func:`analysis.tables.tables.curve_table`, curves in the
    figures' order)."""
    sw = sweep_fit(report, sweep)
    if not sw.curves:
        raise MissingData(f"no fitted curve in sweep {sw.sweep!r}")
    return curve_table(sw, report.settings, curve_order([c.curve for c in sw.curves], sw.curve_variants))


def multipliers(report: FitReport, sweep: str | None = None) -> FitTable:
    """The table of :func:`multiplier_table` with its caption (every column, variants in the figures' order)."""
    sw = sweep_fit(report, sweep)
    return analysis_tables.multiplier_table(sw, report.settings, _variant_order(sw), brief=False)


def budget_multipliers(report: FitReport, sweep: str | None = None) -> FitTable:
    """The table of :func:`budget_table` with its caption (variants in the figures' order)."""
    sw = sweep_fit(report, sweep)
    return analysis_tables.budget_table(sw, report.settings, _variant_order(sw))


def loss_gaps(report: FitReport, sweep: str | None = None) -> FitTable:
    """The table of :func:`analysis.tables.tables.gap_table` (paired loss gap per budget; variants in the figures'
    order)."""
    sw = sweep_fit(report, sweep)
    return analysis_tables.gap_table(sw, report.settings, _variant_order(sw))


def sensitivities(report: FitReport, sweep: str | None = None) -> FitTable:
    """The table of :func:`analysis.tables.tables.sensitivity_table` (M under other analysis choices; variants in the
    figures' order)."""
    sw = sweep_fit(report, sweep)
    return analysis_tables.sensitivity_table(sw, _variant_order(sw))


def fit_table(report: FitReport, sweep: str | None = None) -> pd.DataFrame:
    """One row per fitted curve: status, points, runs, A, alpha (and E) with their intervals."""
    return curve_fits(report, sweep).frame()


def multiplier_table(report: FitReport, sweep: str | None = None) -> pd.DataFrame:
    """One row per variant: M at its largest budget (the headline) with its interval, the exponent used and
    the exponent test, the wall-clock multiplier, runs, and the fit statuses."""
    return multipliers(report, sweep).frame()


def budget_table(report: FitReport, sweep: str | None = None) -> pd.DataFrame:
    """One row per (variant, measured budget): compute, loss, runs, M and the wall-clock M with intervals."""
    return budget_multipliers(report, sweep).frame()


_SHAPE = ["n_layer", "d_model", "tokens"]  # one model size at one budget


def size_table(
    runs: pd.DataFrame,
    *,
    sweep: str | None = None,
    select_method: str = "mean",
    baseline: str = "baseline",
    points: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Like the paper's Table 2: one row per (n_layer, d_model, tokens) with finished runs; columns n_layer,
    d_model, params (non-embedding), tokens, training FLOPs and lr (the baseline's, else the first variant's),
    seeds (runs behind each loss), then the validation loss (nats/token) of each variant, named as in the
    figures: baseline, Full and Block AttnRes, and any other variant run at more than one size (an ablation
    run at one size only is in :func:`ablation_table`). ``DataFrame.attrs["loss_columns"]`` lists the loss
    columns. ``points``: the fit's points of the sweep (default: selected from ``runs`` by ``select_method``)."""
    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    if points.empty:
        raise MissingData("no finished runs")
    shapes = points.groupby("curve")[_SHAPE].apply(lambda g: len(g.drop_duplicates()))
    variants = curve_variants(points)
    curves = [c for c in curve_order(points["curve"], variants) if variants[c].is_main or shapes.get(c, 0) > 1]
    names = {c: variant_label(variants[c]) for c in curves}
    rows = []
    for (n_layer, d_model, tokens), g in points.groupby(_SHAPE, sort=True):
        g = g[g["curve"].isin(curves)]
        if g.empty:
            continue
        ref = g[g["curve"] == baseline]
        ref = ref.iloc[0] if not ref.empty else g.sort_values("curve").iloc[0]
        n_runs = sorted(set(int(v) for v in g["n_runs"]))
        row = {
            "n_layer": int(n_layer),
            "d_model": int(d_model),
            "params (non-embedding)": float(ref["params"]),
            "tokens": float(tokens),
            "training FLOPs": float(ref["flops"]),
            "lr": float(ref["lr"]),
            "seeds": str(n_runs[0]) if len(n_runs) == 1 else f"{n_runs[0]}-{n_runs[-1]}",
        }
        for c in curves:
            hit = g[g["curve"] == c]
            row[names[c]] = float(hit["loss"].iloc[0]) if not hit.empty else math.nan
        rows.append(row)
    table = (
        pd.DataFrame(rows)
        .sort_values(["training FLOPs", "params (non-embedding)"], kind="stable")
        .reset_index(drop=True)
    )
    table.attrs["loss_columns"] = [names[c] for c in curves]
    table.attrs["sweep"] = sweep
    return table


def _lr_swept_runs(runs: pd.DataFrame, sweep: str | None) -> tuple[pd.DataFrame, str]:
    """The finished runs (with their curve labels) at the sizes that were run at more than one learning rate."""
    runs, sweep = sweep_runs(runs, sweep)
    done = runs[(runs["status"] == "done") & pd.to_numeric(runs["val_loss"], errors="coerce").notna()].copy()
    if done.empty:
        raise MissingData("no finished runs")
    done["curve"] = curve_labels(done)
    done = done[done.groupby(_SHAPE)["lr"].transform("nunique") > 1]
    if done.empty:
        raise MissingData("every model size was run at one learning rate")
    return done, sweep


def has_lr_sweep(runs: pd.DataFrame, *, sweep: str | None = None) -> bool:
    """Whether some model size of a sweep has finished runs at more than one learning rate."""
    try:
        _lr_swept_runs(runs, sweep)
    except MissingData:
        return False
    return True


def lr_table(runs: pd.DataFrame, *, sweep: str | None = None) -> pd.DataFrame:
    """Learning-rate sensitivity: for every model size run at more than one learning rate, one row per
    (size, lr) with the validation loss (nats/token, mean over the finished seeds) of each variant and the
    number of seeds behind it. ``DataFrame.attrs["loss_columns"]`` lists the loss columns."""
    done, sweep = _lr_swept_runs(runs, sweep)
    variants = curve_variants(done)
    curves = curve_order(done["curve"], variants)
    names = {c: variant_label(variants[c]) for c in curves}
    rows = []
    for (n_layer, d_model, tokens, lr), g in done.groupby([*_SHAPE, "lr"], sort=True):
        row = {
            "n_layer": int(n_layer),
            "d_model": int(d_model),
            "tokens": float(tokens),
            "lr": float(lr),
            "seeds": int(g.groupby("curve").size().min()),
        }
        for c in curves:
            hit = g.loc[g["curve"] == c, "val_loss"]
            row[names[c]] = float(hit.mean()) if not hit.empty else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["loss_columns"] = [names[c] for c in curves]
    table.attrs["sweep"] = sweep
    return table


def has_ablations(
    runs: pd.DataFrame, *, sweep: str | None = None, select_method: str = "mean", points: pd.DataFrame | None = None
) -> bool:
    """Whether a sweep holds ablation variants: any name besides baseline / full / block, or a variant with several
    N at one size (a curve that is one N of several: :meth:`Variant.as_named` keeps its N)."""
    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    return bool(len(points)) and any(
        v.name not in ("baseline", "full", "block") or v.as_named(c).n_blocks is not None
        for c, v in curve_variants(points).items()
    )


def ablation_table(
    runs: pd.DataFrame,
    *,
    sweep: str | None = None,
    select_method: str = "mean",
    baseline: str = "baseline",
    points: pd.DataFrame | None = None,
    one_shape: ShapeComparison | None = None,
) -> pd.DataFrame:
    """Like the paper's Table 4: every variant at the size with the most variants (ties: the largest FLOPs),
    one row each: variant, description, N, S, params (non-embedding), validation loss, its difference from
    the baseline, seeds, and the paper's difference from its baseline in its Table 4 (436M model, their data)
    where the paper has the same variant. Raises :class:`MissingData` when the sweep has no ablation.
    ``points``: the fit's points of the sweep (default: selected from ``runs`` by ``select_method``).
    ``one_shape``: the fit's comparison of a one-shape sweep (:mod:`analysis.estimates.one_shape`); with it, each row
    also has its gap to the baseline in points of % with its interval, and the paper's gap in the same units."""
    runs, sweep, points = sweep_points(runs, sweep, select_method, points)
    if points.empty:
        raise MissingData("no finished runs")
    if not has_ablations(runs, sweep=sweep, points=points):
        raise MissingData("no ablation variants (only baseline, Full and Block with a single N)")
    scores = []
    for key, g in points.groupby(["n_layer", "d_model", "tokens"], sort=True):
        scores.append((g["curve"].nunique(), float(g["flops"].max()), key))
    _, _, key = max(scores, key=lambda s: s[:2])
    g = points[(points["n_layer"] == key[0]) & (points["d_model"] == key[1]) & (points["tokens"] == key[2])]
    variants = curve_variants(g)  # at this size: a Block curve of one N per size has its N here
    base = g[g["curve"] == baseline]
    base_loss = float(base["loss"].iloc[0]) if not base.empty else math.nan
    rows = []
    n_sub = 2 * int(key[0])
    for c in curve_order(g["curve"], variants):
        r = g[g["curve"] == c].iloc[0]
        variant, residual = variants[c].name, variants[c].residual
        nb = None if pd.isna(r["n_blocks"]) else int(r["n_blocks"])
        s_value = (
            None
            if nb is None or residual not in ("full", "block")
            else (1 if residual == "full" else math.ceil(n_sub / nb))
        )
        paper = PAPER_TABLE4.get(variant) if (variant != "block" or s_value == PAPER_TABLE4_BLOCK_SIZE) else None
        rows.append(
            {
                "variant": c,
                "description": variants[c].description,
                "N": nb if residual in ("full", "block") else None,
                "S": s_value,
                "params (non-embedding)": float(r["params"]),
                "loss": float(r["loss"]),
                "Δ loss vs baseline": float(r["loss"]) - base_loss if c != baseline else 0.0,
                # an envelope's point holds every rate's runs: count its seeds, not its runs
                "seeds": int(r["n_runs"]) if r["run_seeds"] is None else len(set(r["run_seeds"])),
                PAPER_DELTA_COLUMN: (paper - PAPER_TABLE4_BASELINE)
                if paper is not None
                else (0.0 if c == baseline else math.nan),
            }
        )
    table = pd.DataFrame(rows)
    table["N"] = table["N"].astype("Int64")
    table["S"] = table["S"].astype("Int64")
    if one_shape is not None and one_shape.baseline == baseline:
        table = _with_gaps(table, one_shape)
    table.attrs["shape"] = Shape(int(key[0]), int(key[1]), int(key[2])).text()
    table.attrs["sweep"] = sweep
    return table


def _with_gaps(table: pd.DataFrame, one_shape: ShapeComparison) -> pd.DataFrame:
    """The ablation table with :data:`GAP_COLUMNS`: each row's gap to the baseline, 100 (ln L_base - ln L), with
    its interval from the fit, and the paper's gap in the same units (> 0: lower loss than the baseline)."""
    gaps = {g.curve: g.gap for g in one_shape.gaps}

    def column(part: str) -> list[float]:
        base = 0.0 if part == "value" else math.nan
        return [base if c == one_shape.baseline else getattr(gaps.get(c), part, math.nan) for c in table["variant"]]

    ours, low, high = column("value"), column("low"), column("high")
    paper = [
        math.nan if math.isnan(d) else 100 * (math.log(PAPER_TABLE4_BASELINE) - math.log(PAPER_TABLE4_BASELINE + d))
        for d in table[PAPER_DELTA_COLUMN].astype(float)
    ]
    return table.assign(**dict(zip(GAP_COLUMNS, (ours, low, high, paper))))
