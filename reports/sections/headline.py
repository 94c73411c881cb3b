"""The headline of a report: each variant's effective compute multiplier M over the baseline at its largest
budget (:class:`Headline`, the number a talk quotes, with what the interval says in plain words) and the
Headline section of report.md that shows them, with what bears on each M. Never imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.base.bootstrap import Estimate, json_number
from analysis.estimates.frontier import NOT_CALIBRATED, at_largest_compute
from analysis.fitting.settings import COMPUTE_UNITS
from analysis.tables.tables import NO_INTERVAL, incomplete_text, intervals_text, with_interval
from reports.base.captions import protocol_text, unit_name
from reports.base.context import ReportContext
from reports.base.paper import PAPER_M
from reports.document.document import Block, Bullets, Heading, Paragraph, Table
from reports.sections.protocols import comparison_blocks
from reports.sections.regime import Regime, paper_sentence, regime, regime_rows

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport


@dataclass(frozen=True)
class Headline:
    """One variant's multiplier over the baseline at its largest budget (the number a talk quotes)."""

    sweep: str
    variant: str
    label: str
    compute: float
    compute_unit: str
    multiplier: Estimate
    level: float
    exponent: str
    n_runs_variant: int
    n_runs_baseline: int
    status: str
    n_boot: int = 1000
    incomplete: int = 0  # unreadable run.parquet files that may belong to this sweep (the fit lost them)
    unreliable: str = ""  # why the interval cannot be trusted (analysis marks it), or empty
    choice: str = ""  # the analysis choices the headline was made with (form, delta, seeds, budgets)
    choice_range: tuple[float, float, int] | None = None  # (low, high, how many) of M under the other choices
    regime: Regime | None = None  # tokens per parameter, alpha, loss gap behind M (reports.sections.regime)
    paired: Estimate | None = None  # the paired per-size M (t-interval over sizes), beside the fitted one
    paired_agrees: bool | None = None
    without_stalls: Estimate | None = None  # M without the runs flagged as stalled (None: none flagged)
    other_protocol: tuple[str, Estimate] | None = None  # (protocol, M) under the other tuning protocol

    @property
    def choices_text(self) -> str:
        """``0.69 to 0.859 under 9 other analysis choices``, or empty."""
        if self.choice_range is None:
            return ""
        low, high, n = self.choice_range
        return f"{low:.3g} to {high:.3g} under {n} other analysis choices"

    @property
    def interval(self) -> str:
        """What the multiplier's brackets are: ``90% CI``, or why there are none."""
        if self.n_boot <= 0:
            return NO_INTERVAL
        if not self.multiplier.has_interval:
            return "no interval: the fit has no spare degrees of freedom"
        return f"{int(round(self.level * 100))}% CI"

    @property
    def verdict(self) -> str:
        """What the interval says, in plain words (the demo's last lines)."""
        m = self.multiplier
        if self.n_boot <= 0 or not m.has_interval:
            return "a point estimate with no interval: it cannot say whether the variant differs from the baseline"
        if self.unreliable:
            return f"too few runs to tell: the interval is marked unreliable ({self.unreliable})"
        if m.contains(1.0):
            return (
                f"too few runs to tell: the interval [{m.low:.3g}, {m.high:.3g}] contains 1 (no difference from "
                "the baseline)"
            )
        if m.high < 1.0:
            return (
                f"worth less than the baseline at this scale: its loss is what the baseline reaches with "
                f"{m.low:.2g}-{m.high:.2g}x the compute (the whole interval is below 1)"
            )
        return (
            f"worth more than the baseline at this scale: it matches the baseline with {m.low:.2g}-{m.high:.2g}x the "
            "compute (the whole interval is above 1)"
        )

    def text(self) -> str:
        mark = f"{incomplete_text(self.incomplete)}: " if self.incomplete else ""
        return (
            mark
            + (
                f"{self.label}: M = {self.multiplier.text(3)} ({self.interval}) at {self.compute:.3g} "
                f"{self.compute_unit}, {self.exponent} exponent, {self.n_runs_variant} vs {self.n_runs_baseline} runs, "
                f"fits {self.status}"
            )
            + (f"; interval unreliable: {self.unreliable}" if self.unreliable else "")
            + (f"; {self.choices_text} (point estimates; the headline: {self.choice})" if self.choice_range else "")
            + (f"; paired per-size M {self.paired.text(3)}" if self.paired is not None else "")
            + (
                f"; without the runs flagged as stalled M = {self.without_stalls.text(3)}"
                if self.without_stalls is not None
                else ""
            )
            + (
                f"; under the {self.other_protocol[0]} protocol M = {self.other_protocol[1].text(3)}"
                if self.other_protocol is not None
                else ""
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep,
            "variant": self.variant,
            "label": self.label,
            "compute": json_number(self.compute),
            "compute_unit": self.compute_unit,
            "multiplier": self.multiplier.to_dict(),
            "level": self.level,
            "n_boot": self.n_boot,
            "complete": not self.incomplete,
            "n_unreadable": self.incomplete,
            "exponent": self.exponent,
            "n_runs_variant": self.n_runs_variant,
            "n_runs_baseline": self.n_runs_baseline,
            "status": self.status,
            "interval_unreliable": self.unreliable or None,
            "regime": None if self.regime is None else self.regime.to_dict(),
            "paired": None if self.paired is None else {**self.paired.to_dict(), "agrees": self.paired_agrees},
            "without_stalls": None if self.without_stalls is None else self.without_stalls.to_dict(),
            "other_protocol": None
            if self.other_protocol is None
            else {"protocol": self.other_protocol[0], "multiplier": self.other_protocol[1].to_dict()},
            "choice": self.choice,
            "other_choices": None
            if self.choice_range is None
            else {
                "low": json_number(self.choice_range[0]),
                "high": json_number(self.choice_range[1]),
                "n": self.choice_range[2],
            },
            "text": self.text(),
        }


def headlines(ctx: ReportContext) -> list[Headline]:
    """Each variant's multiplier at its largest budget, sweep by sweep, variants in the figures' order."""
    out = []
    for sw in ctx.fit.sweeps:
        for m in sorted(sw.multipliers, key=lambda m: (*m.curve_variant.order, m.variant)):
            out.append(
                Headline(
                    sw.sweep,
                    m.variant,
                    m.curve_variant.title,
                    m.compute,
                    unit_name(ctx.settings.compute_unit),
                    m.multiplier,
                    ctx.settings.level,
                    m.exponent,
                    m.n_runs_variant,
                    m.n_runs_baseline,
                    f"{m.baseline_status}/{m.variant_status}/{m.joint_status or '-'}",
                    n_boot=ctx.settings.n_boot,
                    incomplete=len(sw.unreadable),
                    unreliable="" if m.reliable else m.why,
                    choice="" if m.sensitivity is None else m.sensitivity.headline,
                    choice_range=None
                    if m.sensitivity is None or not m.sensitivity.values.size
                    else (m.sensitivity.low, m.sensitivity.high, int(m.sensitivity.values.size)),
                    regime=regime(sw, m),
                    paired=None if m.paired is None else m.paired.mean,
                    paired_agrees=None if m.paired is None else m.paired.agrees,
                    without_stalls=m.without_stalls,
                    other_protocol=None
                    if m.other_protocol is None
                    else (m.other_protocol.protocol, m.other_protocol.multiplier),
                )
            )
    return out


def one_shape_sweeps(fit: FitReport) -> list[str]:
    """The sweeps whose result is a one-shape comparison (no law, no multiplier:
    :mod:`analysis.estimates.one_shape`)."""
    return [sw.sweep for sw in fit.sweeps if sw.one_shape is not None]


def one_shape_text(sweeps: Sequence[str]) -> str:
    """ "sweep `a` is" / "sweeps `a`, `b` are": the one-shape sweeps a headline without a multiplier names."""
    names = ", ".join(f"`{s}`" for s in sweeps)
    return f"sweep {names} is" if len(sweeps) == 1 else f"sweeps {names} are"


def headline_section(ctx: ReportContext, headline: Sequence[Headline]) -> list[Block]:
    """The Headline section: the runs left unread first, then each M with what bears on it (the other analysis
    choices, the paired M, M without stalled runs, the other tuning protocol) and which intervals are unreliable.
    M at the frontier, the protocols compared and the regime follow the sweeps (:func:`behind_headline_section`)."""
    blocks: list[Block] = [Heading("Headline", 2)]
    if not ctx.fit.complete:
        blocks += [
            Paragraph(
                f"**{incomplete_text(len(ctx.fit.unreadable))}.** Their run.parquet could not be read, so the "
                "fits are without them and a multiplier below may rest on fewer runs or a smaller largest budget "
                "than the study has; repair or remove these folders (or rerun them) and build the report again:"
            ),
            Bullets(tuple(f"`{p.path}`: {p.reason}" for p in ctx.fit.unreadable)),
        ]
    if not headline:
        return blocks + [Paragraph(_no_headline_text(ctx))]
    unit = unit_name(ctx.settings.compute_unit)
    blocks.append(
        Paragraph(
            f"M is the effective compute multiplier over the baseline: a variant with M = {PAPER_M} reaches at "
            f"compute C the loss the baseline reaches only with {PAPER_M} C (compute in {unit}, each variant paying "
            "for its own depth attention). Shown at each variant's largest measured budget, with "
            f"{intervals_text(ctx.settings)}."
        )
    )
    blocks.append(Table(pd.DataFrame(_headline_rows(ctx, headline, unit))))
    return blocks + _headline_notes(headline)


def _headline_rows(ctx: ReportContext, headline: Sequence[Headline], unit: str) -> list[dict[str, str]]:
    """The headline table's rows: one per variant, with a column for each kind of check that any row has."""
    return [
        {
            "sweep": h.sweep,
            "variant": h.label,
            with_interval("M at the largest budget", ctx.settings): h.multiplier.text(3)
            + (" (unreliable)" if h.unreliable else ""),
            f"at C ({unit})": f"{h.compute:.3g}",
            "exponent": h.exponent,
            "M under other choices": ""
            if h.choice_range is None
            else f"{h.choice_range[0]:.3g} to {h.choice_range[1]:.3g} ({h.choice_range[2]} choices)",
            **(
                {
                    "paired per-size M": "-"
                    if h.paired is None
                    else h.paired.text(3) + (" (disagrees)" if h.paired_agrees is False else "")
                }
                if any(x.paired is not None for x in headline)
                else {}
            ),
            **(
                {"M without stalled runs": "-" if h.without_stalls is None else h.without_stalls.text(3)}
                if any(x.without_stalls is not None for x in headline)
                else {}
            ),
            **(
                {"M, other protocol": "-" if h.other_protocol is None else protocol_text(h.other_protocol)}
                if any(x.other_protocol is not None for x in headline)
                else {}
            ),
            "runs (variant/baseline)": f"{h.n_runs_variant}/{h.n_runs_baseline}",
            "fit status (base/var/joint)": h.status,
            **({"complete": incomplete_text(h.incomplete) if h.incomplete else "yes"} if not ctx.fit.complete else {}),
        }
        for h in headline
    ]


def _headline_notes(headline: Sequence[Headline]) -> list[Block]:
    """The paragraphs under the headline table: what its check columns mean, and the unreliable intervals."""
    blocks: list[Block] = []
    choices = sorted({h.choice for h in headline if h.choice_range})
    if choices:
        blocks.append(
            Paragraph(
                f'The headline is M under one set of analysis choices ({"; ".join(choices)}); "M under other '
                'choices" is the range of its point estimate when one of them is changed at a time (the other '
                "form, Huber delta, seed aggregation, or one budget left out): each sweep's sensitivity table."
            )
        )
    if any(h.paired is not None or h.without_stalls is not None for h in headline):
        blocks.append(
            Paragraph(
                '"Paired per-size M" reads M at each size from the losses paired by seed at the same budget '
                "and the baseline law's local slope, with a t-interval over sizes (no bootstrap; it says "
                'disagrees where its interval and the fitted one do not overlap); "M without stalled runs" is the '
                "headline fitted again without the runs whose training loss lagged their cell's other seeds early "
                "on (each sweep's section names them)."
            )
        )
    unreliable = [h for h in headline if h.unreliable]
    if unreliable:
        blocks.append(
            Paragraph(
                "**Intervals marked unreliable** (the data cannot support a calibrated interval of this kind; "
                "see docs/analysis.md):"
            )
        )
        blocks.append(Bullets(tuple(f"{h.label} ({h.sweep}): {h.unreliable}" for h in unreliable)))
    return blocks


def verdict_section(ctx: ReportContext, headline: Sequence[Headline]) -> list[Block]:
    """The report's first words: what each variant's headline M says, in the sentence ``attnres demo`` prints
    (:attr:`Headline.verdict`), or why there is no multiplier."""
    blocks: list[Block] = [Heading("Verdict", 2)]
    if not headline:
        return blocks + [Paragraph(_no_headline_text(ctx))]
    blocks.append(
        Paragraph(
            "Each variant's effective compute multiplier M over the baseline at its largest budget "
            f"({intervals_text(ctx.settings)}), in plain words; the tables and figures below say what bears on it."
        )
    )
    items = [f"**{h.label}** (`{h.sweep}`): M = {h.multiplier.text(3)}: {h.verdict}" for h in headline]
    return blocks + [Bullets(tuple(items))]


def _no_headline_text(ctx: ReportContext) -> str:
    if not len(ctx.results.runs):
        return "No runs were found under the results directory, so there is nothing to fit."
    if one_shape := one_shape_sweeps(ctx.fit):
        return (
            f"No multiplier: {one_shape_text(one_shape)} one model shape and one budget, so no scaling law; "
            "the result is each curve's gap to the baseline, in the section's table \"Gaps to the baseline at "
            'one shape".'
        )
    return (
        "No multiplier could be computed: it needs a fitted baseline curve and a fitted variant curve "
        "(at least two budgets each) in the same sweep; see the notes of each sweep."
    )


def behind_headline_section(ctx: ReportContext, headline: Sequence[Headline]) -> list[Block]:
    """After the sweeps: M at the compute-optimal frontier, the tuning protocols compared, and the regime behind
    each M next to the paper's (empty when none applies)."""
    blocks = frontier_blocks(ctx)
    compared = comparison_blocks(ctx.fit, ctx.results.runs, f"{ctx.pct}% CI")
    if compared:
        blocks += [Heading("Tuning protocols compared", 3), *compared]
    blocks += regime_blocks(ctx, headline)
    return [Heading("Behind the headline", 2), *blocks] if blocks else []


def frontier_blocks(ctx: ReportContext) -> list[Block]:
    """M between the Chinchilla surfaces' frontiers, for every sweep that has them, at its largest compute."""
    unit = COMPUTE_UNITS[ctx.settings.compute_unit]
    rows = [
        {
            "sweep": sw.sweep,
            "variant": m.curve_variant.title,
            with_interval("M at the frontier", ctx.settings): m.M.text(3),
            f"at C ({unit_name(ctx.settings.compute_unit)})": f"{m.compute / unit:.3g}",
            "optimal sizes (variant / baseline)": f"{m.n_opt:.3g} / {m.n_opt_baseline:.3g}",
            "optimum at an edge": m.edge or "-",
        }
        for sw in ctx.fit.sweeps
        for m in at_largest_compute(sw.frontier_multipliers)
    ]
    if not rows:
        return []
    return [
        Heading("At the compute-optimal frontier", 3),
        Paragraph(
            "Where N and D vary independently, each curve's points are also fitted as one Chinchilla surface, "
            "and M is read between the surfaces' frontiers (at each C, the best of the trained sizes): the "
            "compute the baseline needs at its best size to reach the variant's loss at its best size, at the "
            f"variant's largest compute ({NOT_CALIBRATED}; each sweep's section has M at smaller computes):"
        ),
        Table(pd.DataFrame(rows)),
    ]


def regime_blocks(ctx: ReportContext, headline: Sequence[Headline]) -> list[Block]:
    """Per sweep with a headline, the regime behind each M (tokens per parameter, alpha, the loss gap) next
    to the paper's, and a sentence comparing the two."""
    blocks: list[Block] = []
    for sweep in dict.fromkeys(h.sweep for h in headline):
        sw = ctx.fit.sweep(sweep)
        mine = [h for h in headline if h.sweep == sweep]
        order, labels = [h.variant for h in mine], {h.variant: h.label for h in mine}
        blocks += [
            Paragraph(
                f"The regime behind each M of `{sweep}`: tokens per (non-embedding) parameter over the variant's "
                "budgets, the fitted exponent behind M, the paired loss gap at the largest budget (variant minus "
                "baseline, no law needed), and the M that gap gives at the paper's exponent:"
            ),
            Table(pd.DataFrame(regime_rows(sw, order, labels))),
            Paragraph(paper_sentence(sw, order)),
        ]
    return blocks


# -- a sweep ------------------------------------------------------------------------------------------
