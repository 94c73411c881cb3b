"""Everything ``attnres fit`` prints and saves, computed once: :func:`fit_results` returns a :class:`FitReport`.

The report package and the CLI both read these numbers instead of recomputing them: the result types are in
:mod:`analysis.results` (``FitReport.to_dict()`` is exactly what ``fit.json`` holds), the options in
:mod:`analysis.settings`, the per-variant diagnostics in :mod:`analysis.diagnostics`, and
``analysis.format_report(report)`` (:mod:`analysis.tables`) is exactly what the CLI prints.
Per sweep (a sweep is one designed study; sweeps are never pooled):

1. points: one per (curve, size, budget) from the finished runs (:mod:`analysis.select`; kept in
   :attr:`SweepFit.points`), or the IsoFLOP frontier when a budget has several sizes;
2. one power law per curve, the joint fit with a shared exponent, and one bootstrap shared by all of them
   (:func:`analysis.multiplier.run_study`);
3. per variant: M at every measured budget, M at the largest budget from the curves (shared or separate
   exponents, chosen by the exponent test), the wall-clock multiplier, the exponent test;
4. the Chinchilla surface per curve where N and D vary independently.

No I/O here beyond loading a results tree when given a path; no plotting; never imports torch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.bootstrap import Estimate, estimate
from analysis.checks import MissingSeeds, check_budget_ranges, check_form_budgets, missing_seeds
from analysis.diagnostics import budget_gaps, choose_exponent, exponent_test, lack_of_fit, reliability
from analysis.envelope import Envelopes, has_rate_sweeps
from analysis.errors import AnalysisError, FitInputError
from analysis.fit import (
    OFFSET_POWER,
    ChinchillaFit,
    JointPowerLawFit,
    PowerLawFit,
    fit_chinchilla,
    joint_result,
    law_arrays,
)
from analysis.frontier import FrontierMultiplier, frontier_multipliers
from analysis.load import Problem, Results, load_results
from analysis.local import local_multipliers
from analysis.multiplier import (
    CurveData,
    Study,
    curves_log_multiplier,
    multiplier_estimates,
    points_log_multiplier,
    run_study,
    shared_log_multiplier,
    wall_clock_multiplier,
)
from analysis.paired import PairedMultiplier, agreement, paired_multiplier
from analysis.points import PROTOCOLS, choose_points, labelled
from analysis.results import (
    BudgetMultiplier,
    CurvePoint,
    CurveResult,
    FitReport,
    OtherProtocol,
    ProtocolCell,
    SweepFit,
    VariantMultiplier,
)
from analysis.select import isoflop_frontier, needs_frontier, select_points
from analysis.sensitivity import sweep_sensitivity
from analysis.settings import (
    ALIASES,
    COMPUTE_UNITS,
    DEFAULT_BASELINE,
    TRUNK_SUFFIX,
    TUNING_SUFFIX,
    UNIT_SHORT,
    FitSettings,
)
from analysis.slices import slices
from analysis.stalls import Stall, find_stalls
from analysis.throughput import RATIO_HIGH, RATIO_LOW, implausible, read_side_by_side, side_by_side_by_shape

# ---------------------------------------------------------------------------------------------------------
# Computing a report

# ---------------------------------------------------------------------------------------------------------


def _power_fit(study: Study, label: str, settings: FitSettings) -> PowerLawFit:
    cf, data = study.fits[label], study.data[label]
    law = cf.model.law(cf.theta)
    samples: dict[str, np.ndarray | None] = {"A": None, "alpha": None, "E": None}
    failed = 0
    if study.n_boot > 0:
        ok = study.ok[label]
        failed = int((~ok).sum())
        log_a, alpha, e_value = law_arrays(cf.model, study.theta[label][ok])
        samples = {"A": np.exp(log_a), "alpha": alpha, "E": e_value}
    df = study.df(label)
    return PowerLawFit(
        form=study.form,
        law=law,
        A=estimate(law.A, samples["A"], settings.level, df),
        alpha=estimate(law.alpha, samples["alpha"], settings.level, df),
        E=estimate(law.E, samples["E"], settings.level, df) if study.form == OFFSET_POWER else None,
        status=cf.solution.status,
        message=cf.solution.message,
        objective=cf.solution.objective,
        compute=tuple(float(c) for c in data.compute),
        loss=tuple(float(v) for v in data.loss),
        run_ids=None,
        delta=study.delta,
        level=settings.level,
        n_boot=study.n_boot,
        n_boot_failed=failed,
        seed=settings.seed,
    )


def _collect_warnings(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call fn, re-emit its warnings, and return their texts too (they go into the report's notes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out, [str(w.message) for w in caught]


@dataclass
class _Prepared:
    """A sweep's points, chosen and checked, before any law is fitted (:func:`prepare_sweep`)."""

    sweep: str
    points: pd.DataFrame
    conventions: tuple[str, ...]
    frontier: bool
    data: list[CurveData]
    rows: dict[str, pd.DataFrame]
    notes: list[str]
    missing_seeds: tuple[MissingSeeds, ...]
    runs: pd.DataFrame
    envelopes: Envelopes | None = None


def _conventions(runs: pd.DataFrame) -> tuple[str, ...]:
    """The FLOP conventions of a sweep's finished runs."""
    return tuple(sorted(runs.loc[runs["status"] == "done", "flops_convention"].dropna().astype(str).unique()))


def prepare_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> _Prepared:
    """Step 1 of the module docstring, and the checks of :mod:`analysis.checks`: the points of every curve,
    a :class:`FitInputError` for what no fit can support, and the seeds missing at some budget."""
    notes: list[str] = []
    (points, envelopes), warned = _collect_warnings(
        choose_points,
        runs,
        select=settings.select,
        lr=settings.lr,
        protocol=settings.protocol,
        baseline=settings.baseline,
    )
    notes += warned
    conventions = _conventions(runs)
    if len(conventions) > 1:
        notes.append(
            f"runs use {len(conventions)} different FLOP conventions; compute values are not comparable across them"
        )
    use_frontier = settings.frontier == "on" or (
        settings.frontier == "auto" and needs_frontier(points, settings.budget_rtol)
    )
    curve_points = points
    if use_frontier and not points.empty:
        curve_points, frontier_notes = isoflop_frontier(points, rtol=settings.budget_rtol, delta=settings.delta)
        notes += list(frontier_notes)
    data, rows = _curve_data(curve_points, settings, notes, sweep)
    check_budget_ranges(sweep, data, settings.baseline, UNIT_SHORT[settings.compute_unit], settings.budget_rtol)
    return _Prepared(
        sweep, points, conventions, use_frontier, data, rows, notes, missing_seeds(points), runs, envelopes
    )


def _curves_under(prepared: _Prepared, settings: FitSettings) -> list[CurveData]:
    """The sweep's curves under other settings (for the sensitivity table); its warnings and notes were
    already given once, under the report's own settings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return prepare_sweep(prepared.runs, prepared.sweep, settings).data


def _fit_sweep(
    prepared: _Prepared, settings: FitSettings, folders: tuple[Path, ...] = (), stalls: tuple[Stall, ...] = ()
) -> SweepFit:
    """Curves, joint fit, multipliers and Chinchilla surfaces of one prepared sweep (the module docstring's
    steps 2-4), with each variant's paired per-size M, its headline without the ``stalls`` and under the other
    tuning protocol; every note on the way goes into the sweep's notes."""
    p, notes = prepared, prepared.notes
    if not p.data:
        notes.append("no curve could be fitted")
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
        )
    fitted = [d.label for d in p.data]
    entries, source = read_side_by_side(list(folders))
    if source is not None:
        throughput = side_by_side_by_shape(p.points, entries)
        notes.append(f"wall-clock M from throughput measured side by side ({source.name})")
    else:
        throughput = _throughput_by_shape(p.points)
        notes.append(
            "wall-clock M from the tokens/s each run logged while it trained (at different times, on a machine that "
            "may have been shared); `attnres sweep throughput GRID` measures the variants side by side"
        )
    study, joint, multipliers = fit_curves(p.data, settings, p.rows, throughput, notes)
    for m in multipliers:
        if implausible(m.throughput_ratio):
            notes.append(
                f"{m.variant}: FLOP/s ratio {m.throughput_ratio:.3g} to the baseline is outside "
                f"[{RATIO_LOW:g}, {RATIO_HIGH:g}] (flagged !): its wall-clock M says more about the machine's load "
                "than about the model"
            )
    found = sweep_sensitivity(p.data, settings, multipliers, lambda other: _curves_under(p, other))
    multipliers = [replace(m, sensitivity=sens) for m, sens in zip(multipliers, found)]
    multipliers = [replace(m, paired=_paired(study, m.variant, m.multiplier, settings)) for m in multipliers]
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
        protocol_cells = _protocol_cells(p.runs, settings, notes)
    curves = [_curve_result(study, label, p.rows[label], settings, notes) for label in fitted]
    chinchilla, at_frontier = {}, []
    if settings.chinchilla and not p.points.empty:
        chinchilla = _chinchilla_fits(p.points, fitted, settings, notes)
        at_frontier = _frontier_multipliers(p.points, chinchilla, settings, notes)
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
    )


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
            study, _, found = fit_curves(prepared.data, settings, notes=[])
    except AnalysisError as err:
        notes.append(f"M {what}: not fitted ({err})")
        return {}
    return {
        m.variant: (m.multiplier, m.exponent, m.reliable, _paired(study, m.variant, m.multiplier, settings))
        for m in found
    }


def _protocol_cells(runs: pd.DataFrame, settings: FitSettings, notes: list[str]) -> tuple[ProtocolCell, ...]:
    """Every (variant, size, budget) under both protocols (:class:`ProtocolCell`)."""
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
    cells = []
    for r in both.itertuples():
        if r.curve == settings.baseline:
            continue
        cells.append(
            ProtocolCell(
                str(r.curve),
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
    points: pd.DataFrame, chinchilla: Mapping[str, ChinchillaFit], settings: FitSettings, notes: list[str]
) -> list[FrontierMultiplier]:
    found, more = frontier_multipliers(points, chinchilla, settings.baseline, settings.level)
    notes += more
    return found


def _surface_sweep(runs: pd.DataFrame, sweep: str, settings: FitSettings) -> SweepFit:
    """A sweep fitted once per ratio (:mod:`analysis.slices`), taken whole: each curve's (N, D) points as one
    Chinchilla surface, and M between the surfaces' frontiers (:mod:`analysis.frontier`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its slices gave the points' warnings already
        points = select_points(runs, method=settings.select)
    conventions = _conventions(runs)
    notes = [
        "every (size, budget) point of the sweep, each curve fitted as one Chinchilla surface L(N, D); the power "
        f"laws in C are fitted per ratio ({sweep}@<r>tpp)"
    ]
    labels = sorted(points["curve"].unique()) if not points.empty else []
    chinchilla = _chinchilla_fits(points, labels, settings, notes) if labels else {}
    if not chinchilla:
        notes.append("no Chinchilla surface could be fitted")
    at_frontier = _frontier_multipliers(points, chinchilla, settings, notes)
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
    )


def fit_curves(
    data: list[CurveData],
    settings: FitSettings,
    rows: dict[str, pd.DataFrame] | None = None,
    throughput: dict[tuple[str, int, int], float] | None = None,
    notes: list[str] | None = None,
) -> tuple[Study, JointPowerLawFit | None, list[VariantMultiplier]]:
    """The fits, the shared bootstrap and every variant's multiplier from the curves' data: what
    ``attnres fit`` computes per sweep once its points are chosen (the coverage study calls it on simulated
    points). ``rows`` / ``throughput`` (the curves' point tables, FLOP/s per shape) give the wall-clock
    multipliers; without them those are nan."""
    notes = [] if notes is None else notes
    check_budget_ranges("", data, settings.baseline, UNIT_SHORT[settings.compute_unit], settings.budget_rtol)
    study = run_study(
        data,
        settings.form,
        delta=settings.delta,
        level=settings.level,
        n_boot=settings.n_boot,
        seed=settings.seed,
        joint=len(data) >= 2,
        interval=settings.resample,
    )
    joint = _joint_fit(study, settings)
    multipliers = []
    labels = [d.label for d in data]
    if settings.baseline not in labels:
        notes.append(
            f"no fitted baseline curve {settings.baseline!r}: no multipliers (set the baseline with --baseline)"
        )
    else:
        for label in labels:
            if label != settings.baseline:
                multipliers.append(_variant_multiplier(study, label, settings, rows, throughput or {}, joint, notes))
    return study, joint, multipliers


def _curve_data(
    curve_points: pd.DataFrame, settings: FitSettings, notes: list[str], sweep: str = ""
) -> tuple[list[CurveData], dict[str, pd.DataFrame]]:
    """The data of every curve with enough budgets for the form (baseline first, then by name), and each
    fitted curve's points; a curve with one budget gets a note, one with two under the form with E an error
    (:func:`analysis.checks.check_form_budgets`)."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    labels = sorted(curve_points["curve"].unique().tolist()) if not curve_points.empty else []
    if settings.baseline in labels:
        labels = [settings.baseline] + [lab for lab in labels if lab != settings.baseline]
    n_params = 3 if settings.form == OFFSET_POWER else 2
    data, rows = [], {}
    for label in labels:
        g = curve_points[curve_points["curve"] == label].sort_values("flops", kind="stable")
        distinct = g["flops"].nunique()
        check_form_budgets(sweep, label, distinct, settings.form)
        if distinct < n_params:
            notes.append(f"{label}: not fitted, {distinct} budget(s) for a form with {n_params} parameters")
            continue
        run_losses = [
            np.asarray(r, dtype=float)
            if r is not None and not (isinstance(r, float) and math.isnan(r)) and len(r) >= 2
            else None
            for r in g["run_losses"]
        ]
        data.append(
            CurveData(
                label,
                g["flops"].to_numpy(float) / unit,
                g["loss"].to_numpy(float),
                run_losses,
                g["n_runs"].to_numpy(int),
                settings.select,
                budget_keys=_budget_keys(g),
                # the seeds behind every point of runs, a single one too (the paired M pairs it by seed)
                run_seeds=[
                    np.asarray(r, dtype=int)
                    if isinstance(r, tuple) and (run_losses[i] is not None or len(r) == 1)
                    else None
                    for i, r in enumerate(g["run_seeds"] if "run_seeds" in g else [None] * len(g))
                ],
            )
        )
        rows[label] = g
    return data, rows


def _budget_keys(g: pd.DataFrame) -> list[Any] | None:
    """What names each point's budget across curves: its model shape and tokens (a variant's FLOPs differ
    from the baseline's at the same shape); None (the points' ranks) for IsoFLOP minima, whose shapes vary."""
    if "n_sizes" in g.columns or not {"n_layer", "d_model", "tokens"} <= set(g.columns):
        return None
    keys = [(int(r.n_layer), int(r.d_model), int(round(float(r.tokens)))) for r in g.itertuples()]
    return keys if len(set(keys)) == len(keys) else None


def _curve_result(study: Study, label: str, g: pd.DataFrame, settings: FitSettings, notes: list[str]) -> CurveResult:
    """A fitted curve with its points (``g``: the curve's rows of points); a fit that did not converge gets a
    note."""
    unit = COMPUTE_UNITS[settings.compute_unit]
    pts = tuple(
        CurvePoint(
            float(r.flops) / unit,
            float(r.loss),
            int(r.n_runs),
            tuple(r.run_ids),
            float(r.params),
            float(r.tokens),
            float(r.flops_per_s),
        )
        for r in g.itertuples()
    )
    fit = _power_fit(study, label, settings)
    if fit.status != "converged":
        notes.append(f"{label}: fit status {fit.status} ({fit.message})")
    return CurveResult(label, str(g["variant"].iloc[0]), fit, pts)


def _joint_fit(study: Study, settings: FitSettings) -> JointPowerLawFit | None:
    """The joint fit with a shared exponent, with the study's bootstrap intervals (None without one)."""
    if study.joint is None:
        return None
    draws, failed = None, 0
    if study.n_boot > 0:
        failed = int((~study.joint_ok).sum())
        draws = study.joint_theta[study.joint_ok]
    return joint_result(
        study.joint,
        study.joint_labels,
        settings.form,
        settings.delta,
        settings.level,
        study.n_boot,
        failed,
        settings.seed,
        draws,
        study.df(joint=True),
    )


def _sweep_folders(root: Path, runs: pd.DataFrame) -> tuple[Path, ...]:
    """The folders holding a sweep's run folders (where ``attnres sweep throughput`` writes its file)."""
    if "path" not in runs:
        return ()
    return tuple(sorted({(Path(root) / str(p)).parent for p in runs["path"]}))


def _throughput_by_shape(points: pd.DataFrame) -> dict[tuple[str, int, int], float]:
    """Median measured FLOP/s per (curve, n_layer, d_model) over the points of that shape."""
    out = {}
    for (curve, n_layer, d_model), g in points.groupby(["curve", "n_layer", "d_model"]):
        values = g["flops_per_s"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        out[(str(curve), int(n_layer), int(d_model))] = float(np.median(values)) if values.size else math.nan
    return out


def _variant_multiplier(
    study: Study,
    label: str,
    settings: FitSettings,
    rows: dict[str, pd.DataFrame] | None,
    throughput: dict[tuple[str, int, int], float],
    joint: JointPowerLawFit | None,
    notes: list[str],
) -> VariantMultiplier:
    """Everything about one variant against the baseline (module docstring, step 3)."""
    base = settings.baseline
    level = settings.level
    per_point = points_log_multiplier(study, label, base)
    m_points = multiplier_estimates(per_point, level)
    data = study.data[label]
    c_max = float(data.compute.max())
    unshared = multiplier_estimates(curves_log_multiplier(study, label, base, np.array([c_max])), level)[0]
    shared = None
    if study.joint is not None:
        shared = multiplier_estimates(shared_log_multiplier(study, label, base), level)[0]
    test = exponent_test(study, label, base, level)
    tests = {lab: lack_of_fit(study, lab) for lab in (base, label)}
    reliable, why = reliability(study, label, base, tests)
    exponent, reason = choose_exponent(settings, test, shared is not None, joint, reliable)
    headline = shared if exponent == "shared" else unshared
    data = study.data[label]
    if rows is None:
        ratios = [math.nan] * data.compute.size
    else:
        ratios = _throughput_ratios(label, base, rows[label], throughput, notes)
    n_runs_base = int(study.data[base].n_runs.sum())
    local = local_multipliers(study, label, base, level, study.n_boot, np.random.default_rng([settings.seed, 2]))
    budgets = tuple(
        BudgetMultiplier(
            compute=float(c),
            loss=float(l),
            n_runs_variant=int(n),
            n_runs_baseline=n_runs_base,
            multiplier=m,
            wall_clock=wall_clock_multiplier(m, ratio, 1.0),
            throughput_ratio=ratio,
            local=near,
        )
        for c, l, n, m, ratio, near in zip(data.compute, data.loss, data.n_runs, m_points, ratios, local)
    )
    top_ratio = ratios[int(np.argmax(data.compute))]
    return VariantMultiplier(
        variant=label,
        baseline=base,
        exponent=exponent,
        exponent_reason=reason,
        exponent_test=test,
        compute=c_max,
        multiplier=headline,
        multiplier_shared=shared,
        multiplier_unshared=unshared,
        wall_clock=wall_clock_multiplier(headline, top_ratio, 1.0),
        throughput_ratio=top_ratio,
        budgets=budgets,
        n_runs_variant=int(data.n_runs.sum()),
        n_runs_baseline=n_runs_base,
        n_boot_failed=per_point.failed,
        baseline_status=study.fits[base].solution.status,
        variant_status=study.fits[label].solution.status,
        joint_status=None if joint is None else joint.status,
        interval=study.interval,
        reliable=reliable,
        why=why,
        lack_of_fit=tests,
        gaps=budget_gaps(study, label, base, np.random.default_rng([settings.seed, 1])),
    )


def _throughput_ratios(
    label: str,
    base: str,
    g_var: pd.DataFrame,
    throughput: dict[tuple[str, int, int], float],
    notes: list[str],
) -> list[float]:
    """Per point of the variant (``g_var``), its measured FLOP/s over the baseline's at the same model size
    (nan where either is missing, with a note)."""
    ratios = []
    for r in g_var.itertuples():
        r_var = throughput.get((label, int(r.n_layer), int(r.d_model)), math.nan)
        r_base = throughput.get((base, int(r.n_layer), int(r.d_model)), math.nan)
        ratios.append(r_var / r_base if r_base and math.isfinite(r_base) and math.isfinite(r_var) else math.nan)
    if any(math.isnan(x) for x in ratios):
        notes.append(
            f"{label}: no throughput of the baseline at the same model size for some budgets; "
            "wall-clock multiplier is nan there"
        )
    return ratios


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
            fit, warned = _collect_warnings(
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
            f"unknown fit option(s) {', '.join(unknown)}" + _did_you_mean(unknown[0], FitSettings.__dataclass_fields__)
        )
    settings = replace(settings or FitSettings(), **options)  # FitSettings checks every value
    if not isinstance(results, Results):
        results = load_results(results, tables=())
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
                + _did_you_mean(missing[0], results.sweeps)
                + f"; sweeps found: {', '.join(results.sweeps) or 'none'} (choose with --sweep)"
            )
        names = wanted
    _check_variant_names(settings, runs[runs["sweep"].isin(names)], results.root)
    problems = [p for p in results.problems if _sweep_of(p) in names or _sweep_of(p) not in results.sweeps]
    unreadable = tuple(p for p in problems if p.unreadable)
    # every sweep's points are chosen and checked before the first law is fitted: bad input is one error up front;
    # a sweep with several training lengths per size is fitted once per length (analysis.slices)
    sliced = {name: slices(name, runs[runs["sweep"] == name]) for name in names}
    parts = [(name, label, part) for name in names for label, part in sliced[name]]
    prepared = [(name, part, prepare_sweep(part, label, settings)) for name, label, part in parts]
    fits = []
    for i, (name, part, p) in enumerate(prepared):
        belongs = tuple(path.path for path in unreadable if _may_belong(path, name, results))
        stalls = find_stalls(results.root, labelled(part), runs, margin=settings.stall_margin)
        fitted = _fit_sweep(p, settings, _sweep_folders(results.root, part), stalls)
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
    )


def _may_belong(problem: Problem, sweep: str, results: Results) -> bool:
    """Whether a problem run may belong to ``sweep``: it lies in that sweep's folder, or in no sweep folder of
    the results (the results root is a sweep folder or a run folder itself)."""
    where = _sweep_of(problem)
    return where == sweep or where not in results.sweeps


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'baseline'?)`` when ``name`` is close to one of ``choices``, else ""."""
    import difflib

    hint = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def variant_names(runs: pd.DataFrame) -> list[str]:
    """The variant names a fit option may name in these runs: every ``variant`` and every curve label
    (``<variant>-N<n_blocks>`` where a block-size ablation splits a variant)."""
    from analysis.select import curve_labels

    if runs.empty:
        return []
    return sorted(set(runs["variant"].dropna().astype(str)) | set(curve_labels(runs).astype(str)))


def _check_variant_names(settings: FitSettings, runs: pd.DataFrame, root: Path) -> None:
    """Refuse, before any fitting, a baseline that names no variant of the runs to fit (a typo would otherwise
    give a report without multipliers). An empty tree has nothing to check, and the default name ("baseline")
    is not refused: a tree without baseline runs still gets its curves fitted, with a note."""
    found = variant_names(runs)
    if found and settings.baseline not in found and settings.baseline != DEFAULT_BASELINE:
        raise AnalysisError(
            f"baseline {settings.baseline!r} is not a variant of the runs under {root}"
            + _did_you_mean(settings.baseline, found)
            + f"; variants found: {', '.join(found)} (choose with --baseline)"
        )


def _sweep_of(problem: Problem) -> str:
    """The sweep folder a problem run lies in (problems of sweeps left out of the fits are not reported)."""
    return problem.path.split("/")[0]
