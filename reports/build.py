"""The report builder: a results tree in, every figure and table out, with report.md, report.html and
report.json.

:func:`build_report` loads the results (:func:`analysis.load_results`), fits them once
(:func:`analysis.fit_results`, the same numbers ``attnres fit`` prints), draws every figure the data allow
(one sweep at a time) and writes::

    OUT/report.md       title, provenance, headline, fit and multiplier tables, figures with captions,
                        Table 2 / Table 4 like tables, skipped figures with the reason, runs left out
    OUT/report.html     the same page, self-contained (PNGs embedded as base64)
    OUT/report.json     provenance, headline, figures, skipped, tables and the fit (= fit.json) at full precision
    OUT/fit.json        exactly what ``attnres fit`` writes for the same options
    OUT/figures/<sweep>/<figure>.png|.svg(|.pdf)
    OUT/tables/<sweep>/<table>.csv

A figure whose data are missing is skipped with its reason (:class:`reports.data.MissingData`); any other
error in one figure is also recorded as a skip (``strict=True`` raises it instead), so a partial results tree
never stops the report. Output is deterministic: the same results give the same report.md and report.json
byte for byte, and the same PNG/SVG files with the same matplotlib. Never imports torch.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.tables import NO_INTERVAL, intervals_text, with_interval
from reports.data import MissingData
from reports.document import Block, Bullets, Heading, Image, Paragraph, Table, to_html, to_markdown
from reports.folder import FILES_LIST, REPORT_FORMAT, build_into, check_report_folder
from reports.protocols import comparison_blocks

if TYPE_CHECKING:  # pragma: no cover
    from analysis import Estimate, FitReport, Results, SweepFit
    from reports.regime import Regime

FIGURE_FORMATS = ("png", "svg", "pdf")


@dataclass(frozen=True)
class FigureRecord:
    """A figure written: its name, sweep (None for the paper's reference figure), title, caption, files."""

    name: str
    sweep: str | None
    title: str
    caption: str
    files: tuple[Path, ...]

    def to_dict(self, root: Path) -> dict[str, Any]:
        return {
            "name": self.name,
            "sweep": self.sweep,
            "title": self.title,
            "caption": self.caption,
            "files": [p.relative_to(root).as_posix() for p in self.files],
        }


@dataclass(frozen=True)
class Skipped:
    """A figure or table not drawn, and why."""

    name: str
    sweep: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.name}" + (f" (sweep {self.sweep})" if self.sweep else "") + f": {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sweep": self.sweep, "reason": self.reason}


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
    regime: Regime | None = None  # tokens per parameter, alpha, loss gap behind M (reports.regime)
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
            from analysis.tables import NO_INTERVAL

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
        from analysis.tables import incomplete_text

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
        from analysis.bootstrap import json_number

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


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`build_report` wrote and what it skipped, with the fit it used."""

    out_dir: Path
    report_md: Path
    report_html: Path | None
    report_json: Path
    fit_json: Path
    files: tuple[Path, ...]
    figures: tuple[FigureRecord, ...]
    skipped: tuple[Skipped, ...]
    headline: tuple[Headline, ...]
    fit: FitReport = field(repr=False)
    results: Results = field(repr=False)
    seconds: float = 0.0

    def headline_text(self) -> str:
        """One line per variant and sweep (empty when no multiplier could be computed)."""
        return "\n".join(h.text() for h in self.headline)


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "sweep"


def save_figure(fig: Any, stem: Path, formats: Sequence[str]) -> list[Path]:
    """Write ``fig`` as ``stem.<format>`` for each format, deterministically (no dates or versions in the
    files, fixed SVG ids), each file written atomically; closes the figure."""
    import matplotlib.pyplot as plt

    from attnres.storage.schema import atomic_write_bytes
    from reports.style import DPI, rc_context

    metadata = {
        "png": {"Software": None},
        "svg": {"Date": None, "Creator": None},
        "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
    }
    paths = []
    try:
        with rc_context():
            for fmt in formats:
                buffer = io.BytesIO()
                fig.savefig(buffer, format=fmt, dpi=DPI, metadata=metadata[fmt])
                path = stem.with_suffix(f".{fmt}")
                atomic_write_bytes(path, buffer.getvalue())
                paths.append(path)
    finally:
        plt.close(fig)
    return paths


_CAPTIONS = {
    "scaling_curves": (
        "Scaling curves",
        "Validation loss against training compute on log-log axes: markers are the points the fits use ({points}; "
        "faint hollow markers are the individual runs), lines the fitted power laws per variant, and the lower panel "
        "shows each as a percentage of the baseline's fitted loss, so below 0 % means a lower loss than the baseline "
        "at the same compute; the box gives each variant's multiplier M at its largest budget {with_interval}.",
    ),
    "multiplier": (
        "Effective compute multiplier",
        "The compute the baseline needs to reach a variant's loss, divided by the variant's own compute (M), at each "
        "measured budget {with_interval}, and from the fitted curves (solid: the headline, shared "
        "exponent or separate exponents; dotted: the other); M above the dashed line at 1 means the variant saves "
        "compute, and the thin dotted grey line is the paper's value from its own fits (their data).",
    ),
    "loss_curves": (
        "Loss during training",
        "Loss against training tokens for each variant at one model size (left: the whole run on log tokens; right: "
        "the second half of training on linear axes), one line per seed of the chosen learning rate; lower is better.",
    ),
    "block_output_rms": (
        "Output magnitude per transformer block",
        "RMS (over tokens and channels) of the hidden state each transformer block hands on to the next, against "
        "depth, at the end of training (for the baseline this is the residual stream); the paper reports that the "
        "baseline's grows with depth while AttnRes keeps it bounded.",
    ),
    "block_grad_norm": (
        "Gradient magnitude per transformer block",
        "L2 norm of the gradients of each transformer block's parameters against depth at the end of training; the "
        "paper reports outsized gradients in the baseline's early blocks and a more even profile with AttnRes.",
    ),
    "block_size_ablation": (
        "Block-size ablation",
        "Validation loss against the block size S in sublayers (S = 1 is Full AttnRes, S = L a single block) at one "
        "model size, labelled with the number of blocks N, error bars the range over seeds, and the baseline as the "
        "horizontal line; points below the line beat the baseline.",
    ),
    "depth_attention": (
        "Depth attention",
        "Mean depth-attention weight (over tokens) that each reading sublayer (row) puts on each source (column; emb = "
        "the embedding), pre-attention sublayers left and pre-MLP sublayers right with the LM head's final aggregation "
        "as the last row; each row sums to 1, grey cells are sources a row cannot see{block}.",
    ),
    "lr_curves": (
        "Loss against learning rate",
        "Validation loss against the learning rate at each size: markers are each variant's mean over seeds at every "
        "rate trained, lines the fitted envelope (a parabola in ln rate over the 3 rates around the best) "
        "and stars its minimum, the loss the fits read; a hollow star sits at an end of the swept rates, so the "
        "minimum lies beyond the rates tried.",
    ),
    "best_lr": (
        "Best learning rate against size",
        "Each variant's best learning rate (the envelope's minimum; hollow: at an end of the swept rates) against its "
        "non-embedding parameters, with a power law fitted to them (dashed) drawn out to the paper's sizes, where the "
        "crosses are the paper's Table 2 rates (its tokenizer and recipe: a reference, not a target).",
    ),
    "paper_fits": (
        "The paper's published fits (reference)",
        "The paper's own fits L = A C^-alpha in PFLOP/s-days (their data, tokenizer and FLOP count), drawn apart from "
        "our runs because neither the losses nor the compute are comparable; only the multiplier they imply (1.25 for "
        "Block at C = 5.6) compares with ours.",
    ),
}


# ---------------------------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------------------------


def build_report(
    results_dir: str | Path | Results,
    out_dir: str | Path,
    *,
    formats: Sequence[str] = ("png", "svg"),
    pdf: bool = False,
    html: bool = True,
    paper: bool = True,
    strict: bool = False,
    **fit_options: Any,
) -> ReportSummary:
    """Build the report of a results tree into ``out_dir`` (created if needed).

    ``results_dir``: a results directory or an already loaded :class:`analysis.Results`. ``formats``: figure
    formats besides the PNG that is always written (the HTML embeds it); ``pdf=True`` adds PDF. ``html``:
    also write report.html. ``paper``: add the paper's published fits as a reference figure and its values
    as reference lines. ``strict``: raise on an unexpected error in a figure instead of recording it as
    skipped (tests use it). ``fit_options``: passed to :func:`analysis.fit_results` (form, select, baseline,
    level, n_boot, seed, delta, exponent, frontier, compute_unit, sweeps, chinchilla, budget_rtol).
    Raises :class:`analysis.ResultsError` when ``results_dir`` is not a folder, :class:`analysis.OutputError`
    (checked before any work) when ``out_dir`` cannot be written or is a folder of other files (a build replaces
    its folder as a whole: it is made in a temporary sibling and swapped in, :mod:`reports.folder`), and
    :class:`analysis.AnalysisError` for bad fit options; nothing about the runs themselves raises.
    """
    import matplotlib

    matplotlib.use("Agg")
    from analysis import Results, fit_results, load_results

    started = time.perf_counter()
    formats = tuple(dict.fromkeys(["png", *[f.lower().lstrip(".") for f in formats], *(["pdf"] if pdf else [])]))
    unknown = [f for f in formats if f not in FIGURE_FORMATS]
    if unknown:
        raise ValueError(f"unknown figure format(s) {unknown}; choose from {', '.join(FIGURE_FORMATS)}")
    out = Path(out_dir)
    results_root = results_dir.root if isinstance(results_dir, Results) else Path(results_dir)
    real_out = check_report_folder(out, results_root if Path(results_root).is_dir() else None)  # before any work
    results = results_dir if isinstance(results_dir, Results) else load_results(results_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fit's warnings are in its notes, which the report lists
        fit = fit_results(results, **fit_options)

    def build(work: Path) -> tuple[Path, _Section, list[Headline], list[Path]]:
        return (work, *_write_report(results, fit, work, formats, html, paper, strict))

    # built in a temporary sibling and swapped in: the folder is always one whole report (reports/folder.py)
    work, document, headline, files = build_into(real_out, build)

    def moved(path: Path) -> Path:
        return out / path.relative_to(work)

    return ReportSummary(
        out_dir=out,
        report_md=out / "report.md",
        report_html=out / "report.html" if html else None,
        report_json=out / "report.json",
        fit_json=out / "fit.json",
        files=tuple(moved(p) for p in files),
        figures=tuple(replace(f, files=tuple(moved(p) for p in f.files)) for f in document.figures),
        skipped=tuple(document.skipped),
        headline=tuple(headline),
        fit=fit,
        results=results,
        seconds=time.perf_counter() - started,
    )


def _write_report(
    results: Results,
    fit: FitReport,
    work: Path,
    formats: tuple[str, ...],
    html: bool,
    paper: bool,
    strict: bool,
) -> tuple[_Section, list[Headline], list[Path]]:
    """Draw and write the whole report into the (new, empty) folder ``work``: figures, tables, report.md,
    report.html, fit.json, report.json and the list of the files written."""
    from attnres.storage.schema import atomic_write_bytes

    builder = _Builder(results, fit, work, formats, paper, strict)
    headline = builder.headlines()
    document = builder.document(headline)
    blocks = document.blocks
    md_path, html_path, json_path, fit_path = (
        work / "report.md",
        work / "report.html",
        work / "report.json",
        work / "fit.json",
    )
    atomic_write_bytes(md_path, to_markdown(blocks).encode())
    written = [md_path]
    if html:
        title = f"AttnRes report: {_title_name(results)}"
        atomic_write_bytes(html_path, to_html(blocks, work, title).encode())
        written.append(html_path)
    atomic_write_bytes(fit_path, fit.to_json().encode())
    written.append(fit_path)
    files = document.files + written + [json_path]
    record = builder.to_json(document, headline, files)
    atomic_write_bytes(json_path, (json.dumps(record, indent=2, allow_nan=False) + "\n").encode())
    listing = json.dumps(sorted(p.relative_to(work).as_posix() for p in files)).encode()
    atomic_write_bytes(work / FILES_LIST, listing)
    return document, headline, files


def _title_name(results: Results) -> str:
    return Path(str(results.root)).resolve().name or str(results.root)


def _json_clean(value: Any) -> Any:
    from analysis.bootstrap import json_number

    if isinstance(value, dict):
        return {str(k): _json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_clean(v) for v in value]
    if value is None or value is pd.NA:
        return None
    if isinstance(value, bool):
        return value
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, (int, float)):
        return json_number(value)
    return value


def _fmt_loss(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def _fmt_delta(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.4f}"


def _fmt_count(v: Any) -> str:
    from reports.style import compact_int

    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else compact_int(v)


def _fmt_sci(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def _fmt_int(v: Any) -> str:
    return "" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(int(v))


@dataclass
class _Section:
    """What one part of the report adds: its blocks, the figures and tables it wrote (report.json lists them),
    the files of those, and what it skipped. Parts are made on their own and joined in document order."""

    blocks: list[Block | _FigureTitle] = field(default_factory=list)
    figures: list[FigureRecord] = field(default_factory=list)
    tables: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @classmethod
    def join(cls, parts: Iterable[_Section]) -> _Section:
        out = cls()
        for part in parts:
            out.blocks += part.blocks
            out.figures += part.figures
            out.tables += part.tables
            out.files += part.files
            out.skipped += part.skipped
        return out


@dataclass(frozen=True)
class _FigureTitle:
    """A figure's heading before the document numbers its figures: ``Figure <n>. <label>``."""

    label: str


def _number_figures(blocks: Iterable[Block | _FigureTitle]) -> list[Block]:
    """The blocks with each figure's heading numbered in document order."""
    out: list[Block] = []
    n = 0
    for b in blocks:
        if isinstance(b, _FigureTitle):
            n += 1
            b = Heading(f"Figure {n}. {b.label}", 4)
        out.append(b)
    return out


class _Builder:
    """Draws the figures and tables of every sweep and assembles the document (one build, one instance)."""

    def __init__(
        self, results: Results, fit: FitReport, out: Path, formats: tuple[str, ...], paper: bool, strict: bool
    ):
        self.results, self.fit, self.out, self.formats, self.paper, self.strict = (
            results,
            fit,
            out,
            formats,
            paper,
            strict,
        )
        self.settings = fit.settings
        self.pct = int(round(self.settings.level * 100))
        # "with its 90% interval", or why there is none (--n-boot 0)
        self.with_interval = (
            f"with its {self.pct}% bootstrap interval" if self.settings.n_boot > 0 else "(no interval: --n-boot 0)"
        )
        self.sweeps = [s.sweep for s in fit.sweeps]  # every sweep of the results, or those the fit options chose

    # -- drawing ------------------------------------------------------------------------------------------

    def _attempt(self, name: str, sweep: str | None, make: Callable[[], Any]) -> tuple[Any, list[Skipped]]:
        """``make()``, or None and why it was skipped."""
        try:
            return make(), []
        except MissingData as err:
            return None, [Skipped(name, sweep, str(err))]
        except Exception as err:  # one broken figure must not stop the report
            if self.strict:
                raise
            print(f"attnres report: {name} (sweep {sweep}) failed:\n{traceback.format_exc()}", file=sys.stderr)
            return None, [Skipped(name, sweep, f"failed with {type(err).__name__}: {err}")]

    def figure(
        self,
        name: str,
        sweep: str | None,
        make: Callable[[], Any],
        caption_key: str,
        subject: str | None = None,
        **fmt: Any,
    ) -> _Section:
        """The figure ``make()`` draws, saved and shown with its caption; or the reason it was skipped."""
        fig, skipped = self._attempt(name, sweep, make)
        if fig is None:
            return _Section(skipped=skipped)
        folder = self.out / "figures" / (_safe(sweep) if sweep else "reference")
        paths = save_figure(fig, folder / name, self.formats)
        title, caption = _CAPTIONS[caption_key]
        caption = caption.format(with_interval=self.with_interval, **fmt)
        png = next(p for p in paths if p.suffix == ".png")
        rel = png.relative_to(self.out).as_posix()
        others = tuple(p.relative_to(self.out).as_posix() for p in paths if p.suffix != ".png")
        label = title + (f": {subject}" if subject else "")
        return _Section(
            blocks=[_FigureTitle(label), Image(rel, label, caption, others)],
            figures=[FigureRecord(name, sweep, title, caption, tuple(paths))],
            files=list(paths),
        )

    def table(
        self, name: str, sweep: str, make: Callable[[], pd.DataFrame], show: Callable[[pd.DataFrame], list[Block]]
    ) -> _Section:
        """The table ``make()`` computes, saved as CSV and shown by ``show``; or the reason it was skipped."""
        frame, skipped = self._attempt(name, sweep, make)
        if frame is None:
            return _Section(skipped=skipped)
        from attnres.storage.schema import atomic_write_bytes

        path = self.out / "tables" / _safe(sweep) / f"{name}.csv"
        atomic_write_bytes(path, frame.to_csv(index=False, float_format="%.17g").encode())
        record = {
            "name": name,
            "sweep": sweep,
            "file": path.relative_to(self.out).as_posix(),
            "attrs": dict(frame.attrs),
            "rows": frame.to_dict(orient="records"),
        }
        return _Section(blocks=show(frame), tables=[record], files=[path])

    # -- the document -------------------------------------------------------------------------------------

    def document(self, headline: Sequence[Headline]) -> _Section:
        """The whole report: every section joined, figures numbered, and what was written and skipped."""
        parts = [self.sweep_section(s) for s in self.sweeps]
        if self.paper:
            parts.append(self.paper_section())
        made = _Section.join(parts)
        blocks = [
            Heading(f"AttnRes report: {_title_name(self.results)}", 1),
            *self.provenance(),
            *self.headline_section(headline),
            *made.blocks,
            *self.skipped_section(made.skipped),
            *self.problems_section(),
        ]
        return replace(made, blocks=_number_figures(blocks))

    def paper_section(self) -> _Section:
        figure = self.figure("paper_fits", None, _paper_figure, "paper_fits")
        return _Section.join([_Section([Heading("Reference: the paper's published fits", 2)]), figure])

    def provenance(self) -> list[Block]:
        runs, fit, s = self.results.runs, self.fit, self.settings
        status = runs["status"].astype(str).value_counts().to_dict() if len(runs) else {}
        counts = (
            ", ".join(f"{status.get(k, 0)} {k}" for k in ("done", "running", "failed", "diverged") if status.get(k, 0))
            or "none"
        )
        shas = _value_counts(runs, "git_sha")
        conventions = sorted({c for sw in fit.sweeps for c in sw.flops_convention}) or _unique(runs, "flops_convention")
        devices = _value_counts(runs, "device")
        precision = _value_counts(runs, "precision")
        versions = _value_counts(runs, "versions")
        form = "L = A * C^-alpha (the paper's)" if s.form == "A*C^-alpha" else "L = E + A * C^-alpha"
        select = "mean over seeds at the best learning rate" if s.select == "mean" else "best run"
        items = [
            f"results directory: `{self.results.root}`",
            f"runs read: {len(runs)} ({counts}); runs left out of the fits or with a problem: "
            f"{len(self.fit.problems)} (listed at the end)",
            "sweeps: " + (", ".join(_sweep_name(x) for x in self.results.sweeps) or "none"),
            f"inputs sha256 (of every run.parquet row): `{self.results.inputs_hash}`",
            "git sha of the runs: " + (", ".join(f"`{k}` ({v} runs)" for k, v in shas) or "not recorded"),
            "FLOP convention: " + ("; ".join(conventions) or "unknown"),
            "devices: "
            + (", ".join(f"{k} ({v})" for k, v in devices) or "unknown")
            + "; precision: "
            + (", ".join(f"{k} ({v})" for k, v in precision) or "unknown"),
            "package versions of the runs: " + (", ".join(f"`{k}` ({v})" for k, v in versions) or "not recorded"),
            f"fits: {form}; compute in {_unit_name(s.compute_unit)}; points: {select}; baseline `{s.baseline}`; "
            f"Huber delta {s.delta:g} on log loss; "
            + (
                f"{s.n_boot} bootstrap resamples (seed {s.seed}); {self.pct}% intervals"
                if s.n_boot > 0
                else f"no bootstrap: point estimates only, {NO_INTERVAL}"
            )
            + f"; exponent `{s.exponent}`; IsoFLOP frontier `{s.frontier}`; budgets within "
            f"{s.budget_rtol:g} relative FLOPs are one budget",
            f"made by `attnres report` ({_package_version()}); the same numbers as `attnres fit` with the same "
            "options (fit.json)",
        ]
        return [Heading("Provenance", 2), Bullets(tuple(items))]

    # -- the headline -------------------------------------------------------------------------------------

    def headlines(self) -> list[Headline]:
        """Each variant's multiplier at its largest budget, sweep by sweep, variants in the figures' order."""
        from reports.data import n_blocks_of
        from reports.regime import regime
        from reports.style import curve_order, variant_label

        out = []
        for sw in self.fit.sweeps:
            order = curve_order([m.variant for m in sw.multipliers])
            for m in sorted(sw.multipliers, key=lambda m: order.index(m.variant)):
                out.append(
                    Headline(
                        sw.sweep,
                        m.variant,
                        variant_label(m.variant, n_blocks_of(sw.points, m.variant)),
                        m.compute,
                        _unit_name(self.settings.compute_unit),
                        m.multiplier,
                        self.settings.level,
                        m.exponent,
                        m.n_runs_variant,
                        m.n_runs_baseline,
                        f"{m.baseline_status}/{m.variant_status}/{m.joint_status or '-'}",
                        n_boot=self.settings.n_boot,
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

    def headline_section(self, headline: Sequence[Headline]) -> list[Block]:
        from analysis.tables import incomplete_text

        blocks: list[Block] = [Heading("Headline", 2)]
        if not self.fit.complete:
            blocks += [
                Paragraph(
                    f"**{incomplete_text(len(self.fit.unreadable))}.** Their run.parquet could not be read, so the "
                    "fits are without them and a multiplier below may rest on fewer runs or a smaller largest budget "
                    "than the study has; repair or remove these folders (or rerun them) and build the report again:"
                ),
                Bullets(tuple(f"`{p.path}`: {p.reason}" for p in self.fit.unreadable)),
            ]
        if not headline:
            if not len(self.results.runs):
                text = "No runs were found under the results directory, so there is nothing to fit."
            else:
                text = (
                    "No multiplier could be computed: it needs a fitted baseline curve and a fitted variant curve "
                    "(at least two budgets each) in the same sweep; see the notes of each sweep."
                )
            return blocks + [Paragraph(text)]
        unit = _unit_name(self.settings.compute_unit)
        rows = [
            {
                "sweep": h.sweep,
                "variant": h.label,
                with_interval("M at the largest budget", self.settings): h.multiplier.text(3)
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
                    {"M, other protocol": "-" if h.other_protocol is None else _protocol_text(h.other_protocol)}
                    if any(x.other_protocol is not None for x in headline)
                    else {}
                ),
                "runs (variant/baseline)": f"{h.n_runs_variant}/{h.n_runs_baseline}",
                "fit status (base/var/joint)": h.status,
                **(
                    {"complete": incomplete_text(h.incomplete) if h.incomplete else "yes"}
                    if not self.fit.complete
                    else {}
                ),
            }
            for h in headline
        ]
        blocks.append(
            Paragraph(
                "M is the effective compute multiplier over the baseline: a variant with M = 1.25 reaches at compute "
                f"C the loss the baseline reaches only with 1.25 C (compute in {unit}, each variant paying for its own "
                "depth attention). Shown at each variant's largest measured budget, with "
                f"{intervals_text(self.settings)}."
            )
        )
        blocks.append(Table(pd.DataFrame(rows)))
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
        blocks += self.frontier_blocks()
        compared = comparison_blocks(self.fit, self.results.runs, f"{self.pct}% CI")
        if compared:
            blocks += [Heading("Tuning protocols compared", 3), *compared]
        blocks += self.regime_blocks(headline)
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

    def frontier_blocks(self) -> list[Block]:
        """M between the Chinchilla surfaces' frontiers, for every sweep that has them, at its largest compute."""
        from analysis.frontier import NOT_CALIBRATED, at_largest_compute
        from analysis.settings import COMPUTE_UNITS
        from reports.data import n_blocks_of
        from reports.style import variant_label

        unit = COMPUTE_UNITS[self.settings.compute_unit]
        rows = [
            {
                "sweep": sw.sweep,
                "variant": variant_label(m.variant, n_blocks_of(sw.points, m.variant)),
                with_interval("M at the frontier", self.settings): m.M.text(3),
                f"at C ({_unit_name(self.settings.compute_unit)})": f"{m.compute / unit:.3g}",
                "optimal sizes (variant / baseline)": f"{m.n_opt:.3g} / {m.n_opt_baseline:.3g}",
                "optimum at an edge": m.edge or "-",
            }
            for sw in self.fit.sweeps
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

    def regime_blocks(self, headline: Sequence[Headline]) -> list[Block]:
        """Per sweep with a headline, the regime behind each M (tokens per parameter, alpha, the loss gap) next
        to the paper's, and a sentence comparing the two."""
        from reports.regime import paper_sentence, regime_rows

        blocks: list[Block] = []
        for sweep in dict.fromkeys(h.sweep for h in headline):
            sw = self.fit.sweep(sweep)
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

    def sweep_section(self, sweep: str) -> _Section:
        """A sweep's fits, figures and tables, with the files they wrote and what was skipped."""
        sw = self.fit.sweep(sweep)
        figures = _Section.join(self.sweep_figures(sw))
        if not figures.figures:
            figures.blocks.append(Paragraph("No figure could be drawn for this sweep; see Skipped."))
        return _Section.join(
            [
                _Section([Heading(f"Sweep `{sweep}`", 2), self._sweep_summary(sw), *self.fit_blocks(sw)]),
                _Section([Heading("Figures", 3)]),
                figures,
                *self.sweep_tables(sw),
            ]
        )

    def _sweep_summary(self, sw: SweepFit) -> Paragraph:
        runs = self.results.runs
        sweep_runs = runs[runs["sweep"].astype(str) == sw.sweep]
        n_done = int((sweep_runs["status"] == "done").sum())
        return Paragraph(
            f"{len(sweep_runs)} runs ({n_done} finished); FLOP convention: "
            f"{'; '.join(sw.flops_convention) or 'unknown'}"
            + ("; points are IsoFLOP minima (one compute-optimal point per budget)." if sw.frontier else ".")
        )

    def fit_blocks(self, sw: SweepFit) -> list[Block]:
        """The sweep's fits, multipliers and Chinchilla surfaces (the tables of ``attnres fit``), and its notes."""
        from analysis.tables import (
            MISSING_SEEDS,
            chinchilla_table,
            exponent_texts,
            frontier_table,
            joint_text,
            sensitivity_texts,
        )
        from reports import scaling, tables
        from reports.style import curve_order

        blocks: list[Block] = [Heading("Fits", 3)]
        if sw.missing_seeds:
            blocks += [
                Paragraph(f"**{MISSING_SEEDS[0].upper() + MISSING_SEEDS[1:]}:**"),
                Bullets(tuple(m.text() for m in sw.missing_seeds)),
            ]
        if sw.curves:
            fits = tables.curve_fits(self.fit, sw.sweep)
            blocks += [Paragraph(fits.caption), Table(fits.frame())]
            if sw.joint is not None:
                blocks.append(Paragraph(joint_text(sw.joint).sentence))
        elif sw.chinchilla or sw.frontier_multipliers:
            blocks.append(
                Paragraph(
                    f"The sweep's runs taken together: every (size, budget) point, each curve fitted as one Chinchilla "
                    f"surface in N and D, and M read between the surfaces' compute-optimal frontiers (its power laws "
                    f"in C are fitted per ratio, in the sections `{sw.sweep}@<r>tpp`)."
                )
            )
        else:
            blocks.append(
                Paragraph(
                    "No curve could be fitted in this sweep: a curve needs finished runs at two or more budgets "
                    "(three with E + A C^-alpha); see the notes below."
                )
            )
        if sw.curves and not sw.multipliers:
            blocks.append(Paragraph(f"No multiplier: {scaling.no_multiplier_reason(self.fit, sw)}."))
        if sw.multipliers:
            mult = tables.multipliers(self.fit, sw.sweep)
            budget = tables.budget_multipliers(self.fit, sw.sweep)
            blocks += [Heading("Effective compute multiplier", 3), Paragraph(mult.caption), Table(mult.frame())]
            unreliable = [m for m in sw.multipliers if not m.reliable]
            if unreliable:
                blocks += [
                    Paragraph(
                        f"**Intervals marked UNRELIABLE** (`--resample {self.settings.resample}`; the data cannot "
                        'support a calibrated interval of this kind, docs/analysis.md "Reliability"):'
                    ),
                    Bullets(tuple(f"`{m.variant}`: {m.why}" for m in unreliable)),
                ]
            blocks.append(Bullets(tuple(text.sentence for text in exponent_texts(sw))))
            blocks += [Paragraph(budget.caption), Table(budget.frame())]
            if any(m.gaps for m in sw.multipliers):
                gaps = tables.loss_gaps(self.fit, sw.sweep)
                blocks += [Paragraph(gaps.caption), Table(gaps.frame())]
            blocks += self.robust_blocks(sw)
            sensitivity = tables.sensitivities(self.fit, sw.sweep)
            if sensitivity.rows:
                order = curve_order([m.variant for m in sw.multipliers])
                blocks += [
                    Paragraph(sensitivity.caption),
                    Table(sensitivity.frame()),
                    Bullets(tuple(t.sentence for t in sensitivity_texts(sw, order))),
                ]
        if sw.chinchilla:
            surface = chinchilla_table(sw, self.settings)
            blocks += [Paragraph(surface.caption), Table(surface.frame())]
        if sw.frontier_multipliers:
            at_frontier = frontier_table(sw, self.settings)
            blocks += [Paragraph(at_frontier.caption), Table(at_frontier.frame())]
        if sw.notes:
            blocks += [Paragraph("Notes from the fit:"), Bullets(tuple(sw.notes))]
        return blocks

    def robust_blocks(self, sw: SweepFit) -> list[Block]:
        """Beside the headline: the paired per-size M, the stalled runs and M without them, both tuning protocols
        with the best rates and the paper protocol's cost per cell, and the envelopes' edges."""
        from analysis.robust_tables import (
            envelope_table,
            paired_table,
            protocol_cell_table,
            protocol_table,
            stall_texts,
        )
        from analysis.stalls import has_seeds_to_compare
        from reports.learning_rates import best_lr_table
        from reports.style import curve_order

        order = curve_order([m.variant for m in sw.multipliers])
        blocks: list[Block] = []
        paired = paired_table(sw, self.settings, order)
        if paired.rows:
            blocks += [Heading("Paired per-size M", 4), Paragraph(paired.caption), Table(paired.frame())]
        stalls = stall_texts(sw)
        if stalls:
            blocks += [
                Heading("Stalled runs", 4),
                Paragraph(
                    "Runs whose training loss lagged the other seeds of their cell early in training "
                    '(docs/analysis.md, "Stalled runs"); the fits above keep them, and each headline without them '
                    "follows:"
                ),
                Bullets(tuple(t.sentence for t in stalls)),
            ]
        elif self.settings.stall_margin > 0 and has_seeds_to_compare(sw.points):
            blocks += [
                Heading("Stalled runs", 4),
                Paragraph(
                    f"None flagged: no run's training loss lagged the other seeds of its cell by more than "
                    f'{100 * self.settings.stall_margin:g} % early in training (docs/analysis.md, "Stalled runs").'
                ),
            ]
        protocols = protocol_table(sw, self.settings, order)
        if protocols.rows:
            cells = protocol_cell_table(sw, order)
            blocks += [
                Heading("Tuning protocols from the same runs", 4),
                Paragraph(protocols.caption),
                Table(protocols.frame()),
            ]
            if cells.rows:
                blocks += [Paragraph(cells.caption), Table(cells.frame())]
        envelope = envelope_table(sw)
        if envelope.rows:
            blocks += [Heading("Learning-rate envelopes", 4), Paragraph(envelope.caption), Table(envelope.frame())]
            try:
                best = best_lr_table(self.fit, sw.sweep)
            except MissingData:
                best = None
            if best is not None:
                blocks += [
                    Paragraph(
                        "Each variant's best rate as a power law in its parameters, and the rate that law gives at "
                        "the paper's sizes (an extrapolation over three orders of magnitude: a reference, not a "
                        "prediction):"
                    ),
                    Table(best),
                ]
        return blocks

    def sweep_figures(self, sw: SweepFit) -> list[_Section]:
        """Every figure of the sweep: scaling curves and multiplier, training dynamics, block-size ablation, and
        a depth-attention heatmap per AttnRes curve."""
        from reports import ablation, dynamics, scaling

        sweep, runs, res, points = sw.sweep, self.results.runs, self.results, sw.points
        if sw.frontier:
            point_kind = "IsoFLOP minima per budget"
        else:
            point_kind = (
                "mean over seeds at the best learning rate" if self.settings.select == "mean" else "the best run"
            )
        return [
            self.figure(
                "scaling_curves",
                sweep,
                lambda: scaling.plot_scaling_curves(self.fit, sweep, runs=runs),
                "scaling_curves",
                points=point_kind,
            ),
            self.figure(
                "multiplier",
                sweep,
                lambda: scaling.plot_multiplier(self.fit, sweep, runs=runs, paper_reference=self.paper),
                "multiplier",
            ),
            self.figure(
                "loss_curves",
                sweep,
                lambda: dynamics.plot_loss_curves(runs, res.metrics, sweep=sweep, points=points),
                "loss_curves",
            ),
            self.figure(
                "block_output_rms",
                sweep,
                lambda: dynamics.plot_block_output_rms(runs, res.layers, sweep=sweep, points=points),
                "block_output_rms",
            ),
            self.figure(
                "block_grad_norm",
                sweep,
                lambda: dynamics.plot_block_grad_norm(runs, res.layers, sweep=sweep, points=points),
                "block_grad_norm",
            ),
            self.figure(
                "block_size_ablation",
                sweep,
                lambda: ablation.plot_block_size_ablation(runs, sweep=sweep, points=points),
                "block_size_ablation",
            ),
            *self.depth_attention_figures(sw),
            *self.learning_rate_figures(sw),
        ]

    def learning_rate_figures(self, sw: SweepFit) -> list[_Section]:
        """Loss against rate and best rate against size, for a sweep fitted with learning-rate envelopes."""
        from reports import learning_rates

        if sw.envelope is None:
            return []
        return [
            self.figure("lr_curves", sw.sweep, lambda: learning_rates.plot_lr_curves(self.fit, sw.sweep), "lr_curves"),
            self.figure("best_lr", sw.sweep, lambda: learning_rates.plot_best_lr(self.fit, sw.sweep), "best_lr"),
        ]

    def depth_attention_figures(self, sw: SweepFit) -> list[_Section]:
        """A depth-attention heatmap per Full or Block AttnRes curve of the sweep (skipped when there is none)."""
        from reports import heatmaps
        from reports.data import n_blocks_of
        from reports.style import curve_order, curve_variant, is_attnres, variant_label

        sweep, runs, points = sw.sweep, self.results.runs, sw.points
        curves = [c for c in curve_order(points["curve"].unique() if len(points) else []) if is_attnres(c)]
        if not curves:
            reason = "no finished Full or Block AttnRes runs in this sweep, so no depth-attention weights"
            return [_Section(skipped=[Skipped("depth_attention", sweep, reason)])]
        return [
            self.figure(
                f"depth_attention_{c}",
                sweep,
                lambda c=c: heatmaps.plot_depth_attention(
                    runs, self.results.depth_attn, variant=c, sweep=sweep, points=points
                ),
                "depth_attention",
                subject=variant_label(c, n_blocks_of(points, c)),
                block="; columns are depth blocks and outlined cells the row's own partial block"
                if curve_variant(c).name == "block"
                else "",
            )
            for c in curves
        ]

    def sweep_tables(self, sw: SweepFit) -> list[_Section]:
        """The tables like the paper's Table 2 (loss per model size) and Table 4 (ablations), and the
        learning-rate sensitivity where the sweep ran some size at several learning rates."""
        from reports import tables

        sweep, runs, points, baseline = sw.sweep, self.results.runs, sw.points, self.settings.baseline
        parts = [
            self.table(
                "table2_sizes",
                sweep,
                lambda: tables.size_table(runs, sweep=sweep, baseline=baseline, points=points),
                self._show_size_table,
            )
        ]
        # only where the sweep ran some size at several learning rates (not a "skipped" line for every other sweep)
        if tables.has_lr_sweep(runs, sweep=sweep):
            parts.append(
                self.table("lr_sensitivity", sweep, lambda: tables.lr_table(runs, sweep=sweep), _show_lr_table)
            )
        parts.append(
            self.table(
                "table4_ablations",
                sweep,
                lambda: tables.ablation_table(runs, sweep=sweep, baseline=baseline, points=points),
                _show_ablation_table,
            )
        )
        return parts

    def _show_size_table(self, t2: pd.DataFrame) -> list[Block]:
        chosen = "mean over seeds at the best learning rate" if self.settings.select == "mean" else "best run"
        formats = {
            "params (non-embedding)": _fmt_count,
            "tokens": _fmt_count,
            "training FLOPs": _fmt_sci,
            "lr": _fmt_sci,
        }
        formats.update({c: _fmt_loss for c in t2.attrs.get("loss_columns", [])})
        return [
            Heading("Table: validation loss per model size (like the paper's Table 2)", 3),
            Paragraph(
                f"Validation loss in nats/token ({chosen}; the lowest in each row in bold); params are "
                "non-embedding; FLOPs and lr are the baseline's."
            ),
            Table(t2, formats, tuple(t2.attrs.get("loss_columns", []))),
        ]

    # -- the end ------------------------------------------------------------------------------------------

    def skipped_section(self, skipped: Sequence[Skipped]) -> list[Block]:
        blocks: list[Block] = [Heading("Skipped", 2)]
        if not skipped:
            return blocks + [Paragraph("Nothing was skipped: every figure and table had its data.")]
        return blocks + [Bullets(tuple(str(s) for s in skipped))]

    def problems_section(self) -> list[Block]:
        problems = self.fit.problems  # those of the fitted sweeps (a tuning search's pruned trials are not problems)
        blocks: list[Block] = [Heading("Runs left out or with a problem", 2)]
        if not problems:
            return blocks + [Paragraph("None: every run folder of the fitted sweeps was read and every run finished.")]
        shown = [f"`{p.path}`: {p.reason}" for p in problems[:100]]
        if len(problems) > 100:
            shown.append(f"... and {len(problems) - 100} more (all are in report.json)")
        return blocks + [Bullets(tuple(shown))]

    # -- report.json --------------------------------------------------------------------------------------

    def to_json(self, document: _Section, headline: Sequence[Headline], files: Sequence[Path]) -> dict[str, Any]:
        runs = self.results.runs
        status = runs["status"].astype(str).value_counts().to_dict() if len(runs) else {}
        return _json_clean(
            {
                "format": REPORT_FORMAT,
                "provenance": {
                    "results_dir": str(self.results.root),
                    "inputs_hash": self.results.inputs_hash,
                    "n_runs": int(len(runs)),
                    "status": {k: int(v) for k, v in sorted(status.items())},
                    "n_problems": len(self.fit.problems),
                    "git_shas": dict(_value_counts(runs, "git_sha")),
                    "flops_conventions": sorted({c for sw in self.fit.sweeps for c in sw.flops_convention}),
                    "fit_settings": self.settings.to_dict(),
                    "made_by": _package_version(),
                },
                "headline": [h.to_dict() for h in headline],
                "figures": [f.to_dict(self.out) for f in document.figures],
                "skipped": [s.to_dict() for s in document.skipped],
                "tables": document.tables,
                "problems": [p.to_dict() for p in self.fit.problems],
                "files": sorted(p.relative_to(self.out).as_posix() for p in files),
                "fit": self.fit.to_dict(),
            }
        )


def _protocol_text(other: tuple[str, Estimate]) -> str:
    return f"{other[1].text(3)} ({other[0]})"


def _paper_figure() -> Any:
    from reports.scaling import plot_paper_curves

    return plot_paper_curves()


def _show_lr_table(t_lr: pd.DataFrame) -> list[Block]:
    formats = {"tokens": _fmt_count, "lr": _fmt_sci, "seeds": _fmt_int}
    formats.update({c: _fmt_loss for c in t_lr.attrs.get("loss_columns", [])})
    return [
        Heading("Table: learning-rate sensitivity", 3),
        Paragraph(
            "Validation loss in nats/token (mean over seeds) of every variant at each learning rate the "
            "sweep ran, per model size; the lowest in each row in bold."
        ),
        Table(t_lr, formats, tuple(t_lr.attrs.get("loss_columns", []))),
    ]


def _show_ablation_table(t4: pd.DataFrame) -> list[Block]:
    formats = {
        "params (non-embedding)": _fmt_count,
        "loss": _fmt_loss,
        "Δ loss vs baseline": _fmt_delta,
        "paper Δ (436M, their data)": _fmt_delta,
        "N": _fmt_int,
        "S": _fmt_int,
    }
    return [
        Heading("Table: ablations at one size (like the paper's Table 4)", 3),
        Paragraph(
            f"Every variant at {t4.attrs.get('shape')}: validation loss (nats/token), its difference from the "
            "baseline, and the paper's difference from its baseline in its Table 4 (436M model, their data), where "
            "the paper has the same variant; negative is better."
        ),
        Table(t4, formats),
    ]


def _sweep_name(name: str) -> str:
    from analysis.settings import TRUNK_SUFFIX, TUNING_SUFFIX

    if name.endswith(TUNING_SUFFIX):
        return f"`{name}` (the learning-rate search of `attnres tune`; not fitted, its pruned trials stay unfinished)"
    if name.endswith(TRUNK_SUFFIX):
        return f"`{name}` (the stable trunks of WSD branches; not fitted: their learning rate never decays)"
    return f"`{name}`"


def _value_counts(runs: pd.DataFrame, column: str) -> list[tuple[str, int]]:
    if not len(runs) or column not in runs.columns:
        return []
    values = runs[column].astype(object).where(runs[column].notna(), None)
    counts: dict[str, int] = {}
    for v in values:
        key = "unknown" if v is None or v == "" else str(v)
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _unique(runs: pd.DataFrame, column: str) -> list[str]:
    if not len(runs) or column not in runs.columns:
        return []
    return sorted(runs[column].dropna().astype(str).unique().tolist())


def _unit_name(unit: str) -> str:
    return "PFLOP/s-days" if unit == "pflops_days" else "training FLOPs"


def _package_version() -> str:
    from importlib import metadata

    try:
        return f"attnres-scaling {metadata.version('attnres-scaling')}"
    except metadata.PackageNotFoundError:
        return "attnres-scaling (not installed)"
