"""The fit's tables, built in one place for the two that show them: the text ``attnres fit`` prints
(:func:`format_report`) and the report's tables and
paragraphs (:mod:`reports.sections.tables`, :mod:`reports.build`).

A :class:`FitTable` is a header, rows of cells (the texts ``attnres fit`` prints; counts stay ints) and the
two captions: ``title``, the line ``attnres fit`` prints above the table, and ``caption``, the report's
sentence before it. A statement outside a table (the joint fit, each variant's choice of exponent) is a
:class:`FitText` with its two wordings. The report lists curves and variants in its figures' order
(``order``) and shows more columns of the multipliers than ``attnres fit`` (``brief=False``).

Pure Python; no I/O; never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from analysis.data.throughput import implausible
from analysis.laws.forms import law_for
from analysis.tables.robust_tables import (
    envelope_table,
    paired_table,
    protocol_cell_table,
    protocol_table,
    stall_texts,
)
from analysis.tables.shape_tables import architecture_table, depth_table, one_shape_table
from analysis.tables.table_format import (
    MISSING_SEEDS,
    NO_INTERVAL,
    Cell,
    FitTable,
    FitText,
    column_header,
    has_intervals,
    intervals_text,
    number,
    ordered_multipliers,
    with_interval,
)
from attnres.variants import curve_order

if TYPE_CHECKING:  # pragma: no cover
    from analysis.fitting.results import FitReport, SweepFit
    from analysis.fitting.settings import FitSettings
    from analysis.laws.fit import JointPowerLawFit

SURFACE = "Chinchilla surface L(N, D) = E + A / N^alpha + B / D^beta"


def curve_table(sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """One row per fitted curve (in ``order`` when given): status, points, runs and the form's parameters (A,
    alpha, and E or beta) with their intervals."""
    names = law_for(settings.form).param_names
    header = ("curve", "status", "points", "runs") + tuple(with_interval(name, settings) for name in names)
    rows = []
    for c in sw.curves if order is None else [sw.curve(label) for label in order]:
        params = c.fit.params
        row: tuple[Cell, ...] = (c.curve, c.fit.status, c.fit.n_points, c.n_runs)
        rows.append(row + tuple(params[name].text() if name in params else "" for name in names))
    caption = (
        f"One power law per curve, fitted by Huber regression in log space; {intervals_text(settings)}; status "
        "`converged`, `hit_bound` (a parameter on its bound) or `not_converged`."
    )
    return FitTable(header, tuple(rows), "", caption)


def joint_text(joint: JointPowerLawFit) -> FitText:
    """The joint fit with one shared exponent: its status and the shared parameters."""
    shared = f"alpha = {joint.alpha.text()}" + (f", E = {joint.E.text()}" if joint.E is not None else "")
    shared += "".join(f", {name} = {est.text()}" for name, est in joint.extra.items())
    return FitText(
        f"joint fit, shared exponent ({joint.status}): {shared}",
        f"Joint fit with one shared exponent ({joint.status}): {shared}.",
    )


def multiplier_table(
    sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None, *, brief: bool = True
) -> FitTable:
    """One row per variant: M at its largest budget (the headline) with its interval, the exponent used and
    the exponent test, the wall-clock multiplier, runs and the fit statuses; ``brief=False`` (the report's)
    adds M from the shared and from the separate exponents, with largest C and M first."""
    multipliers = ordered_multipliers(sw, order)
    diff, m_head = (with_interval(h, settings) for h in ("alpha_var - alpha_base", "M"))
    wall = column_header("wall-clock M", settings, (m.wall_clock for m in multipliers))
    shared, separate = (with_interval(h, settings) for h in ("M, shared exponent", "M, separate exponents"))
    runs, status = "runs (var/base)", "status (base/var/joint)"
    if brief:
        header = ("variant", "exponent", diff, "p", "largest C", m_head, wall, runs, status)
    else:
        header = (
            "variant",
            "largest C",
            m_head,
            "interval",
            "exponent",
            diff,
            "p",
            shared,
            separate,
            wall,
            runs,
            status,
        )
    rows = []
    for m in multipliers:
        cells: dict[str, Cell] = {
            "variant": m.variant,
            "largest C": number(m.compute, 4),
            m_head: m.multiplier.text(),
            "interval": f"{m.interval}, " + ("calibrated" if m.reliable else "UNRELIABLE")
            if has_intervals(settings)
            else "none",
            "exponent": m.exponent,
            diff: m.exponent_test.difference.text(3),
            "p": number(m.exponent_test.p_value, 2) if has_intervals(settings) else "-",  # a bootstrap p-value
            shared: m.multiplier_shared.text() if m.multiplier_shared is not None else "",
            separate: m.multiplier_unshared.text(),
            wall: m.wall_clock.text() + (" !" if implausible(m.throughput_ratio) else ""),
            runs: f"{m.n_runs_variant}/{m.n_runs_baseline}",
            status: f"{m.baseline_status}/{m.variant_status}/{m.joint_status or '-'}",
        }
        rows.append(tuple(cells[h] for h in header))
    base = settings.baseline
    title = f"effective compute multiplier over {base}, M(C) = C_{base}(L_variant(C)) / C:"
    caption = (
        "M(C) = C_base(L_variant(C)) / C at each variant's largest budget: the headline uses the shared-exponent "
        "fit unless the exponent test says the exponents differ; both are shown. Wall-clock M scales M by the "
        "measured FLOP/s ratio of the variant to the baseline at the same model size (side by side where "
        "`attnres sweep throughput` measured it, else the runs' own; ! marks a ratio outside [0.5, 2])."
    )
    return FitTable(header, tuple(rows), title, caption)


def budget_table(sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """One row per (variant, measured budget): compute, loss, runs, M and the wall-clock M with their
    intervals, and the FLOP/s ratio of the variant to the baseline."""
    multipliers = ordered_multipliers(sw, order)
    m_head, local = with_interval("M", settings), with_interval("local M", settings)
    wall = column_header("wall-clock M", settings, (b.wall_clock for m in multipliers for b in m.budgets))
    header = ("variant", "C", "loss", "runs", m_head, local, wall, "FLOP/s ratio")
    rows = tuple(
        (
            m.variant,
            number(b.compute, 4),
            number(b.loss, 5),
            b.n_runs_variant,
            b.multiplier.text(),
            "" if b.local is None else b.local.multiplier.text() + (" (fixed alpha)" if b.local.fixed_exponent else ""),
            b.wall_clock.text() + (" !" if implausible(b.throughput_ratio) else ""),
            number(b.throughput_ratio, 3),
        )
        for m in multipliers
        for b in m.budgets
    )
    return FitTable(
        header,
        rows,
        "M at each measured budget (the baseline fit inverted at the variant's measured loss; local M: against "
        "the baseline's own point there, with the slope of its 3 nearest budgets; seeds resampled):",
        "M at each measured budget: the baseline's fit inverted at the variant's measured loss, and local M, "
        "against the baseline's measured loss at the same budget converted to compute with the log-log slope of "
        "the baseline's 3 budgets nearest in compute (interval from resampling seeds; docs/analysis.md, "
        '"Local M"), which does not inherit the global fit\'s misfit.',
    )


def gap_table(sw: SweepFit, settings: FitSettings, order: Sequence[str] | None = None) -> FitTable:
    """One row per (variant, budget it shares with the baseline): the variant's mean loss minus the
    baseline's, in nats and in %, paired over shared seeds, with a bootstrap interval over seeds."""
    gap, pct = with_interval("loss gap (nats)", settings), with_interval("gap %", settings)
    header = ("variant", "C", "seeds", "paired", gap, pct)
    rows = tuple(
        (m.variant, number(g.compute, 4), g.n_seeds, "yes" if g.paired else "no", g.gap.text(3), g.gap_pct.text(3))
        for m in ordered_multipliers(sw, order)
        for g in m.gaps
    )
    text = "variant's mean loss minus the baseline's at each budget, paired over shared seeds (no fitted law):"
    caption = (
        "The variant's mean loss minus the baseline's at each budget they share, in nats and in % of the "
        "baseline's, paired over the seeds both ran (no fitted law); "
        + (
            "intervals resample seeds, so with 2 seeds they are rough."
            if has_intervals(settings)
            else f"{NO_INTERVAL}."
        )
    )
    return FitTable(header, rows, text, caption)


SENSITIVITY_CAPTION = (
    "M at each variant's largest budget under other analysis choices, one changed at a time from the headline's "
    "(the same exponent, shared or separate, as the headline): point estimates, no bootstrap; a budget left out "
    "is left out of every curve"
)


def sensitivity_table(sw: SweepFit, order: Sequence[str] | None = None) -> FitTable:
    """One row per analysis choice (the headline's first, then each alternative: form, Huber delta, seed
    aggregation, each budget left out), one column per variant: M at its largest budget, point estimates;
    the last row is the range over the alternatives."""
    ms = [m for m in ordered_multipliers(sw, order) if m.sensitivity is not None]
    if not ms:
        return FitTable((), ())
    first = ms[0].sensitivity
    header = ("aspect", "choice", *(m.variant for m in ms))
    rows: list[tuple[Cell, ...]] = [("headline", first.headline, *(number(m.sensitivity.multiplier) for m in ms))]
    for i, r in enumerate(first.rows):
        rows.append((r.aspect, r.choice, *(number(m.sensitivity.rows[i].multiplier) for m in ms)))
    rows.append(
        (
            "range",
            f"over the {len(first.rows)} alternatives",
            *(f"{number(m.sensitivity.low)} to {number(m.sensitivity.high)}" for m in ms),
        )
    )
    title = "M at the largest budget under other analysis choices (point estimates, no bootstrap):"
    return FitTable(header, tuple(rows), title, SENSITIVITY_CAPTION[0].upper() + SENSITIVITY_CAPTION[1:] + ".")


def sensitivity_texts(sw: SweepFit, order: Sequence[str] | None = None) -> tuple[FitText, ...]:
    """Per variant, the choice its headline shows and the range of M across the alternatives, naming the two
    ends."""
    out = []
    for m in ordered_multipliers(sw, order):
        s = m.sensitivity
        if s is None:
            continue
        fitted = [r for r in s.rows if math.isfinite(r.multiplier)]
        if not fitted:
            continue
        lo = min(fitted, key=lambda r: r.multiplier)
        hi = max(fitted, key=lambda r: r.multiplier)
        text = (
            f"headline M = {number(s.multiplier)} ({s.headline}, {s.exponent} exponent); {number(s.low)} to "
            f"{number(s.high)} across the {len(fitted)} alternative choices (lowest: {lo.choice}; highest: {hi.choice})"
        )
        out.append(FitText(f"{m.variant}: {text}", f"`{m.variant}`: {text}."))
    return tuple(out)


def exponent_texts(sw: SweepFit, order: Sequence[str] | None = None) -> tuple[FitText, ...]:
    """Per variant, which exponent its headline multiplier uses and why."""
    return tuple(
        FitText(
            f"{m.variant}: {m.exponent} exponent, {m.exponent_reason}",
            f"`{m.variant}`: {m.exponent} exponent, {m.exponent_reason}",
        )
        for m in ordered_multipliers(sw, order)
    )


def chinchilla_table(sw: SweepFit, settings: FitSettings) -> FitTable:
    """One row per curve with a Chinchilla surface: status, points and the five parameters with intervals."""
    rows = tuple(
        (lab, f.status, f.n_points, f.E.text(), f.A.text(), f.B.text(), f.alpha.text(), f.beta.text())
        for lab, f in sw.chinchilla.items()
    )
    return FitTable(
        ("curve", "status", "points", "E", "A", "B", "alpha", "beta"),
        rows,
        f"{SURFACE}:",
        f"{SURFACE} per curve (N non-embedding parameters, D tokens; {intervals_text(settings)}):",
    )


def frontier_table(sw: SweepFit, settings: FitSettings) -> FitTable:
    """One row per (variant, compute) of M between the Chinchilla surfaces' frontiers, with the optimal sizes."""
    from analysis.estimates.frontier import NOT_CALIBRATED
    from analysis.fitting.settings import COMPUTE_UNITS

    unit = COMPUTE_UNITS[settings.compute_unit]
    rows = tuple(
        (
            m.variant,
            f"{m.compute / unit:.4g}",
            m.M.text(),
            f"{m.n_opt:.3g}",
            f"{m.n_opt_baseline:.3g}",
            m.edge or "-",
        )
        for m in sw.frontier_multipliers
    )
    what = (
        "M at the compute-optimal frontier, C_baseline / C where the baseline's frontier reaches the variant's "
        "frontier loss at C (the frontier: the best of the trained sizes at C on each curve's surface; "
        f"{NOT_CALIBRATED})"
    )
    return FitTable(
        ("variant", "C", "M [CI]", "N* variant", "N* baseline", "optimum at an edge"),
        rows,
        f"{what}:",
        f"{what}; {intervals_text(settings)}:",
    )


# ---------------------------------------------------------------------------------------------------------
# The text of ``attnres fit``
# ---------------------------------------------------------------------------------------------------------


def incomplete_text(n_unreadable: int) -> str:
    """The mark of a fit that lost runs: ``INCOMPLETE: 1 unreadable run(s) left out``."""
    return f"INCOMPLETE: {n_unreadable} unreadable run(s) left out"


def incomplete_lines(report: FitReport) -> list[str]:
    """The block ``attnres fit`` prints first when run.parquet files could not be read (none otherwise): what
    that means for the numbers below, and each unreadable run folder with the reason."""
    if report.complete:
        return []
    return [
        f"  {incomplete_text(len(report.unreadable))}: their run.parquet could not be read, so the fits below are",
        "  without them and a multiplier may rest on fewer runs or a smaller largest budget than the study has;",
        "  repair or remove these folders (or rerun them) and fit again:",
        *(f"    {p}" for p in report.unreadable),
    ]


def format_report(report: FitReport) -> str:
    """Everything ``attnres fit`` prints before ``wrote fit.json``: the unreadable runs when there are any
    (first: they make the fit incomplete), the settings, the other runs left out, and per sweep its tables, the
    joint fit, the choice of exponent and the notes."""
    out = [f"attnres fit {report.results_dir}", *incomplete_lines(report), *_settings_lines(report)]
    others = [p for p in report.problems if not p.unreadable]
    if others:
        out += ["", "runs left out:", *(f"  {p}" for p in others)]
    for sw in report.sweeps:
        out += _sweep_lines(sw, report.settings)
    return "\n".join(out)


def _settings_lines(report: FitReport) -> list[str]:
    from analysis.fitting.settings import UNIT_NAMES

    s = report.settings
    w = s.words()
    return [
        f"  inputs sha256 {report.inputs_hash}; {report.n_runs} run(s) read, {len(report.problems)} problem(s)",
        f"  form {w['form']}; compute in {UNIT_NAMES[s.compute_unit]}",
        f"  points: {w['points']}",
        f"  {w['loss']}; {w['intervals']}",
    ]


def _table_lines(table: FitTable) -> list[str]:
    """A blank line, the table's title (when it has one), the table; indented by two spaces."""
    return ["", *([f"  {table.title}"] if table.title else []), *(f"  {line}" for line in table.text_lines())]


def _robust_lines(sw: SweepFit, settings: FitSettings) -> list[str]:
    """Beside the headline: the paired per-size M, the stalled runs and M without them, the other protocol."""
    out = []
    for table in (paired_table(sw, settings), depth_table(sw, settings), protocol_table(sw, settings)):
        if table.rows:
            out += _table_lines(table)
    stalls = stall_texts(sw)
    if stalls:
        out += ["", *(f"  {t.line}" for t in stalls)]
    return out


def _sweep_lines(sw: SweepFit, settings: FitSettings) -> list[str]:
    out = [
        "",
        f"== sweep {sw.sweep}" + (" (IsoFLOP frontier: one compute-optimal point per budget)" if sw.frontier else ""),
        f"  FLOP convention: {'; '.join(sw.flops_convention) or 'unknown'}",
    ]
    if sw.missing_seeds:
        out += [f"  {MISSING_SEEDS}:", *(f"  - {m.text()}" for m in sw.missing_seeds)]
    if sw.curves:
        out += _table_lines(curve_table(sw, settings))
    if sw.joint is not None:
        out.append(f"  {joint_text(sw.joint).line}")
    if sw.unreadable and not sw.multipliers:
        out.append(f"  {incomplete_text(len(sw.unreadable))} (listed at the top)")
    if sw.multipliers:
        table = multiplier_table(sw, settings)
        if sw.unreadable:  # the headline is marked where it is printed
            table = replace(table, title=f"{incomplete_text(len(sw.unreadable))} (listed at the top); {table.title}")
        lines = _table_lines(table)
        notes = {m.variant: m.why for m in sw.multipliers if not m.reliable}
        if notes:  # a trailing note on the row of each multiplier whose interval the data cannot calibrate
            head = 3 + (1 if table.title else 0)
            lines = lines[:head] + [
                f"{line}  unreliable: {notes[m.variant]}" if m.variant in notes else line
                for line, m in zip(lines[head:], sw.multipliers)
            ]
        out += lines
        out += _robust_lines(sw, settings)
        out += _table_lines(budget_table(sw, settings))
        if any(m.gaps for m in sw.multipliers):
            out += _table_lines(gap_table(sw, settings))
        out += [f"  {text.line}" for text in exponent_texts(sw)]
        sensitivity = sensitivity_table(sw)
        if sensitivity.rows:
            out += _table_lines(sensitivity)
            out += [f"  {text.line}" for text in sensitivity_texts(sw)]
    if sw.architecture is not None:
        out += _table_lines(architecture_table(sw.architecture))
    if sw.one_shape is not None:
        order = curve_order([g.curve for g in sw.one_shape.gaps], sw.curve_variants)
        out += _table_lines(one_shape_table(sw.one_shape, settings, order))
    if sw.envelope is not None:
        out += _table_lines(envelope_table(sw))
    if sw.protocol_cells:
        out += _table_lines(protocol_cell_table(sw))
    if sw.chinchilla:
        out += _table_lines(chinchilla_table(sw, settings))
    if sw.frontier_multipliers:
        out += _table_lines(frontier_table(sw, settings))
    if sw.notes:
        out += ["", "  notes:", *(f"  - {n}" for n in sw.notes)]
    return out
