"""Everything ``attnres fit`` prints and saves, computed once: :func:`fit_results` returns a :class:`FitReport`.

The report package and the CLI both read these numbers instead of recomputing them: the result types are in
:mod:`analysis.fitting.results` (``FitReport.to_dict()`` is exactly what ``fit.json`` holds), the options in
:mod:`analysis.fitting.settings`, the per-variant diagnostics in :mod:`analysis.fitting.diagnostics`, and
``analysis.format_report(report)`` (:mod:`analysis.tables.tables`) is exactly what the CLI prints.
Per sweep (a sweep is one designed study; sweeps are never pooled):

1. points: one per (curve, size, budget) from the finished runs (:mod:`analysis.data.select`; kept in
   :attr:`SweepFit.points`), or the IsoFLOP frontier when a budget has several sizes, chosen and checked
   before any fit (:mod:`analysis.fitting.sweep_points`, :mod:`analysis.fitting.checks`);
2. one power law per curve, the joint fit with a shared exponent, and one bootstrap shared by all of them
   (:func:`analysis.estimates.study.run_study`);
3. per variant: M at every measured budget, M at the largest budget from the curves (shared or separate
   exponents, chosen by the exponent test), the wall-clock multiplier (FLOP/s from :mod:`analysis.data.throughput`),
   the exponent test;
4. the Chinchilla surface per curve where N and D vary independently.

No I/O here beyond loading a results tree (and a sweep's ``throughput.json``) when given a path; no plotting;
never imports torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.base.bootstrap import Estimate
from analysis.base.errors import AnalysisError, FitInputError
from analysis.data.envelope import has_rate_sweeps
from analysis.data.load import Results, load_results, may_belong, sweep_of
from analysis.data.points import PROTOCOLS, choose_points, labelled
from analysis.data.select import curve_variants, select_points
from analysis.data.slices import slices
from analysis.data.stalls import Stall, find_stalls
from analysis.data.throughput import flag_implausible, sweep_folders, sweep_throughput
from analysis.estimates.architecture import ArchitectureGrid, architecture_grid
from analysis.estimates.depth import depth_trend
from analysis.estimates.frontier import FrontierMultiplier, frontier_multipliers
from analysis.estimates.one_shape import ONE_SHAPE, one_shape_comparison
from analysis.estimates.paired import PairedMultiplier, agreement, paired_multiplier
from analysis.estimates.study import Study
from analysis.fitting.checks import check_variant_names, did_you_mean, missing_seeds
from analysis.fitting.curve_fits import curve_result, fit_curves, point_wall_clock
from analysis.fitting.metric import with_metric
from analysis.fitting.results import (
    FitReport,
    OtherProtocol,
    ProtocolCell,
    SweepFit,
    VariantMultiplier,
)
from analysis.fitting.sensitivity import sweep_sensitivity
from analysis.fitting.settings import ALIASES, TRUNK_SUFFIX, TUNING_SUFFIX, FitSettings
from analysis.fitting.sweep_points import (
    PreparedSweep,
    budgets_note,
    collect_warnings,
    curves_under,
    flop_conventions,
    prepare_sweep,
)
from analysis.laws.fit import ChinchillaFit, fit_chinchilla
from analysis.laws.forms import law_params
from attnres.variants import Variant


def _fit_sweep(
    prepared: PreparedSweep, settings: FitSettings, folders: tuple[Path, ...] = (), stalls: tuple[Stall, ...] = ()
) -> SweepFit:
    """Curves, joint fit, multipliers and Chinchilla surfaces of one prepared sweep (the module docstring's
    steps 2-4), with each variant's paired per-size M, its headline without the ``stalls`` and under the other
    tuning protocol; every note on the way goes into the sweep's notes."""
    p, notes = prepared, prepared.notes
    variants = curve_variants(p.points)
    if not p.data:
        return _no_curve_sweep(p, settings, variants, stalls)
    fitted = [d.label for d in p.data]
    throughput, incomparable = sweep_throughput(p.points, folders, notes, p.runs)
    study, joint, multipliers = fit_curves(p.data, settings, p.rows, throughput, notes, variants)
    if incomparable:  # the logged throughputs are the load's as much as the model's: wall-clock M is a point
        multipliers = [point_wall_clock(m) for m in multipliers]
    flag_implausible(multipliers, notes)
    multipliers, protocol_cells = _checks_beside(p, settings, study, multipliers, stalls, variants)
    curves = [curve_result(study, variants[label], label, p.rows[label], settings, notes) for label in fitted]
    chinchilla, at_frontier = {}, []
    if settings.chinchilla and not p.points.empty:
        chinchilla = _chinchilla_fits(p.points, fitted, settings, notes)
        at_frontier = _frontier_multipliers(p.points, chinchilla, settings, notes, variants)
    return SweepFit(
        p.sweep,
        p.conventions,
        p.frontier,
        tuple(curves),
        joint,
        tuple(multipliers),
        chinchilla,
        tuple(notes),
        p.points,
        missing_seeds=p.missing_seeds,
        frontier_multipliers=tuple(at_frontier),
        envelope=p.envelopes,
        stalls=stalls,
        protocol_cells=protocol_cells,
        curve_variants=variants,
    )


def _no_curve_sweep(
    p: PreparedSweep, settings: FitSettings, variants: Mapping[str, Variant], stalls: tuple[Stall, ...]
) -> SweepFit:
    """A sweep none of whose curves could be fitted: its one-shape comparison where it has one, else a note."""
    notes, s = p.notes, settings
    one = one_shape_comparison(p.points, p.runs, p.envelopes, s.baseline, s.level, s.n_boot > 0)
    if one is not None:  # one note for the sweep, not one per curve: a single budget is its design
        n_params = law_params(s.form)
        single = {budgets_note(c, 1, n_params) for c in p.points["curve"].astype(str)}
        notes[:] = [n for n in notes if n not in single]
    notes.append("no curve could be fitted" if one is None else f"{ONE_SHAPE}: no law; the comparison is above")
    return SweepFit(
        p.sweep,
        p.conventions,
        p.frontier,
        (),
        None,
        (),
        {},
        tuple(notes),
        p.points,
        missing_seeds=p.missing_seeds,
        envelope=p.envelopes,
        stalls=stalls,
        curve_variants=variants,
        one_shape=one,
    )


def _checks_beside(
    p: PreparedSweep,
    settings: FitSettings,
    study: Study,
    multipliers: list[VariantMultiplier],
    stalls: tuple[Stall, ...],
    variants: Mapping[str, Variant],
) -> tuple[list[VariantMultiplier], tuple[ProtocolCell, ...]]:
    """Each variant's headline with what bears on it: its sensitivity to the analysis choices, the paired per-size
    M and the depth trend, M without the stalled runs and under the other tuning protocol (with every cell under
    both protocols); every note on the way goes into the sweep's notes."""
    notes = p.notes
    found = sweep_sensitivity(p.data, settings, multipliers, lambda other: curves_under(p, other), study.delta)
    multipliers = [replace(m, sensitivity=sens) for m, sens in zip(multipliers, found)]
    multipliers = [replace(m, paired=_paired(study, m.variant, m.multiplier, settings)) for m in multipliers]
    multipliers = [
        replace(
            m,
            depth=depth_trend(study, m.variant, m.paired, settings.level, settings.n_boot > 0, settings.noise_floor),
        )
        for m in multipliers
    ]
    if stalls:
        flagged = {s.run_id for s in stalls}
        kept = p.runs[~p.runs["run_id"].astype(str).isin(flagged)]
        without = _headlines(kept, p.sweep, settings, notes, f"without the {len(flagged)} run(s) flagged as stalled")
        multipliers = [
            replace(m, without_stalls=without[m.variant][0]) if m.variant in without else m for m in multipliers
        ]
    protocol_cells: tuple[ProtocolCell, ...] = ()
    if has_rate_sweeps(labelled(p.runs)):
        other = PROTOCOLS[1 - PROTOCOLS.index(settings.protocol)]
        under = _headlines(p.runs, p.sweep, replace(settings, protocol=other), notes, f"under the {other} protocol")
        multipliers = [
            replace(m, other_protocol=OtherProtocol(other, *under[m.variant][:3], under[m.variant][3]))
            if m.variant in under
            else m
            for m in multipliers
        ]
        protocol_cells = _protocol_cells(p.runs, settings, notes, variants)
    return multipliers, protocol_cells


def _paired(study: Study, label: str, headline: Estimate, settings: FitSettings) -> PairedMultiplier | None:
    found = paired_multiplier(study, label, settings.baseline, settings.level)
    if found is not None and settings.n_boot == 0:  # --n-boot 0 asks for point estimates only, everywhere
        return replace(found, mean=Estimate(found.mean.value, level=settings.level))
    return None if found is None else agreement(found, headline)


def _headlines(
    runs: pd.DataFrame, sweep: str, settings: FitSettings, notes: list[str], what: str
) -> dict[str, tuple[Estimate, str, bool, PairedMultiplier | None]]:
    """Each variant's headline M (with its exponent, reliability and paired M) from ``runs`` under ``settings``:
    the sweep fitted again without some runs or under the other protocol; a fit that cannot be made is a note."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the sweep's own fit gave these warnings already
            prepared = prepare_sweep(runs, sweep, settings)
            study, _, found = fit_curves(prepared.data, settings, notes=[], variants=curve_variants(prepared.points))
    except AnalysisError as err:
        notes.append(f"M {what}: not fitted ({err})")
        return {}
    return {
        m.variant: (m.multiplier, m.exponent, m.reliable, _paired(study, m.variant, m.multiplier, settings))
        for m in found
    }


def _protocol_cells(
    runs: pd.DataFrame, settings: FitSettings, notes: list[str], variants: Mapping[str, Variant]
) -> tuple[ProtocolCell, ...]:
    """Every (variant, size, budget) under both protocols (:class:`ProtocolCell`); ``variants``: the sweep's
    curves' variants (:func:`analysis.data.select.curve_variants`), and for a curve the sweep's points lack, its
    variant in the protocols' own points."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tables = {
                protocol: choose_points(
                    runs, select=settings.select, lr=settings.lr, protocol=protocol, baseline=settings.baseline
                )[0]
                for protocol in PROTOCOLS
            }
    except AnalysisError as err:
        notes.append(f"the two tuning protocols are not compared ({err})")
        return ()
    keys = ["curve", "n_layer", "d_model", "tokens"]
    both = tables["per-variant"].merge(tables["paper"], on=keys, suffixes=("", "_paper"))
    variants = {**curve_variants(tables["per-variant"]), **variants}
    cells = []
    for r in both.itertuples():
        if r.curve == settings.baseline:
            continue
        cells.append(
            ProtocolCell(
                str(r.curve),
                variants[str(r.curve)],
                int(r.n_layer),
                int(r.d_model),
                float(r.tokens),
                float(r.lr),
                float(r.loss),
                float(r.lr_paper),
                float(r.loss_paper),
                str(getattr(r, "lr_edge", "") or ""),
            )
        )
    return tuple(cells)


def _frontier_multipliers(
    points: pd.DataFrame,
    chinchilla: Mapping[str, ChinchillaFit],
    settings: FitSettings,
    notes: list[str],
    variants: Mapping[str, Variant],
) -> list[FrontierMultiplier]:
    found, more = frontier_multipliers(points, chinchilla, settings.baseline, settings.level, variants)
    notes += more
    return found


def _architecture_sweep(sweep: str, runs: pd.DataFrame, grid: ArchitectureGrid) -> SweepFit:
    """An architecture sweep's fit: its cells (:mod:`analysis.estimates.architecture`), no curve, no multiplier."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points = select_points(runs)  # per shape, pooling head counts: kept for the runs' provenance only
    note = "an architecture sweep (one parameter count, one compute): no scaling law; its cells are above"
    return SweepFit(
        sweep,
        flop_conventions(runs),
        False,
        (),
        None,
        (),
        {},
        (note,),
        points,
        missing_seeds=(),
        curve_variants=curve_variants(points),
        architecture=grid,
    )


def _surface_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> SweepFit:
    """A sweep fitted once per ratio (:mod:`analysis.data.slices`), taken whole: each curve's (N, D) points as one
    Chinchilla surface, and M between the surfaces' frontiers (:mod:`analysis.estimates.frontier`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its slices gave the points' warnings already
        points = select_points(runs, method=settings.select)
    conventions = flop_conventions(runs)
    notes = [
        "every (size, budget) point of the sweep, each curve fitted as one Chinchilla surface L(N, D); the power "
        f"laws in C are fitted per ratio ({sweep}@<r>tpp)"
    ]
    labels = sorted(points["curve"].unique()) if not points.empty else []
    chinchilla = _chinchilla_fits(points, labels, settings, notes) if labels else {}
    if not chinchilla:
        notes.append("no Chinchilla surface could be fitted")
    variants = curve_variants(points)
    at_frontier = _frontier_multipliers(points, chinchilla, settings, notes, variants)
    return SweepFit(
        sweep,
        conventions,
        False,
        (),
        None,
        (),
        chinchilla,
        tuple(notes),
        points,
        missing_seeds=missing_seeds(points),
        frontier_multipliers=tuple(at_frontier),
        curve_variants=variants,
    )


def _chinchilla_fits(
    points: pd.DataFrame, fitted: list[str], settings: FitSettings, notes: list[str]
) -> dict[str, ChinchillaFit]:
    """The Chinchilla surface of every curve whose N and D vary independently (an IsoFLOP or N x D grid)."""
    out = {}
    for label in fitted:
        g = points[points["curve"] == label]
        log_n, log_d = np.log(g["params"].to_numpy(float)), np.log(g["tokens"].to_numpy(float))
        if len(g) < 8 or np.unique(log_n).size < 3 or np.unique(log_d).size < 3:
            continue
        if abs(np.corrcoef(log_n, log_d)[0, 1]) > 0.99:
            continue  # N and D move together (one size per budget): the surface is not identifiable
        try:
            fit, warned = collect_warnings(
                fit_chinchilla,
                g["params"],
                g["tokens"],
                g["loss"],
                delta=settings.delta,
                level=settings.level,
                n_boot=settings.n_boot,
                seed=settings.seed,
                run_ids=["+".join(ids) for ids in g["run_ids"]],
            )
        except FitInputError as err:
            notes.append(f"{label}: Chinchilla surface not fitted ({err})")
            continue
        notes += warned
        out[label] = fit
    return out


def fit_results(
    results: Results | str | Path,
    settings: FitSettings | None = None,
    *,
    sweeps: Iterable[str] | None = None,
    **options: Any,
) -> FitReport:
    """Fit every sweep of a results tree: curves, joint fit, multipliers with intervals, Chinchilla surfaces.

    ``results``: a :class:`Results` from :func:`analysis.load_results`, or a results directory. ``settings``: the
    fit's options (:class:`FitSettings`, its defaults those of ``attnres fit``); ``options`` change single fields
    of it (``form="E+A*C^-alpha"``, ``lr="envelope"``, ``n_boot=0`` ...). ``sweeps``: restrict to these sweep
    names (default: every sweep, each fitted on its own, except the learning-rate searches of ``attnres tune``,
    whose sweeps are named ``<sweep>-tune``, and the WSD trunks of a grid with ``branches:``, in
    ``<sweep>-trunk``). The fields are documented in docs/analysis.md.
    """
    options = {ALIASES.get(k, k): v for k, v in options.items()}
    unknown = sorted(set(options) - set(FitSettings.__dataclass_fields__))
    if unknown:
        raise AnalysisError(
            f"unknown fit option(s) {', '.join(unknown)}" + did_you_mean(unknown[0], FitSettings.__dataclass_fields__)
        )
    settings = replace(settings or FitSettings(), **options)  # FitSettings checks every value
    if not isinstance(results, Results):
        results = load_results(results, tables=())
    results = with_metric(results, settings.metric)
    runs = results.runs
    # learning-rate searches (``attnres tune`` writes them to ``<sweep>-tune``) and WSD trunks (``<sweep>-trunk``,
    # whose rate never decays) are not scaling studies
    names = [name for name in results.sweeps if not name.endswith((TUNING_SUFFIX, TRUNK_SUFFIX))]
    if sweeps is not None:
        wanted = list(sweeps)
        missing = [s for s in wanted if s not in results.sweeps]
        if missing:
            raise AnalysisError(
                f"sweep(s) {', '.join(map(repr, missing))} not found in {results.root}"
                + did_you_mean(missing[0], results.sweeps)
                + f"; sweeps found: {', '.join(results.sweeps) or 'none'} (choose with --sweep)"
            )
        names = wanted
    check_variant_names(settings, runs[runs["sweep"].isin(names)], results.root)
    problems = [p for p in results.problems if sweep_of(p) in names or sweep_of(p) not in results.sweeps]
    unreadable = tuple(p for p in problems if p.unreadable)
    # every sweep's points are chosen and checked before the first law is fitted: bad input is one error up front;
    # a sweep with several training lengths per size is fitted once per length (analysis.data.slices)
    sliced = {name: slices(name, runs[runs["sweep"] == name]) for name in names}
    parts = [(name, label, part) for name in names for label, part in sliced[name]]
    # an architecture sweep (one parameter count, one compute) has no law to fit and no frontier to find: its cells
    # are the result, read before any point is chosen (a check meant for a ladder must not stop it)
    grids = [
        architecture_grid(part, settings.baseline, settings.select, settings.level, settings.n_boot > 0)
        for _, _, part in parts
    ]
    prepared = [
        (name, part, prepare_sweep(part, label, settings) if grid is None else label)
        for (name, label, part), grid in zip(parts, grids)
    ]
    fits = []
    for i, ((name, part, p), grid) in enumerate(zip(prepared, grids)):
        belongs = tuple(path.path for path in unreadable if may_belong(path, name, results))
        if grid is None:
            stalls = find_stalls(results.root, labelled(part), runs, margin=settings.stall_margin)
            fitted = _fit_sweep(p, settings, sweep_folders(results.root, part), stalls)
        else:
            fitted = _architecture_sweep(p, part, grid)
        fits.append(replace(fitted, unreadable=belongs))
        last_slice = i + 1 == len(prepared) or prepared[i + 1][0] != name
        if last_slice and len(sliced[name]) > 1 and settings.chinchilla:  # then the whole sweep as one surface
            fits.append(replace(_surface_sweep(runs[runs["sweep"] == name], name, settings), unreadable=belongs))
    fitted = tuple(fits)
    return FitReport(
        results_dir=str(results.root),
        inputs_hash=results.inputs_hash,
        settings=settings,
        sweeps=fitted,
        problems=unreadable + tuple(p for p in problems if not p.unreadable),
        n_runs=len(runs),
        unreadable=unreadable,
        pooled=tuple(str(p) for p in results.pooled),
    )
