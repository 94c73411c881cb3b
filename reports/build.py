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

A figure whose data are missing is skipped with its reason (:class:`reports.base.data.MissingData`); any other
error in one figure is also recorded as a skip (``strict=True`` raises it instead), so a partial results tree
never stops the report. Output is deterministic: the same results give the same report.md and report.json
byte for byte, and the same PNG/SVG files with the same matplotlib. Never imports torch.

Where the parts live: :class:`reports.base.context.ReportContext` holds one build's inputs and options, and each
section is a function of it (:mod:`reports.sections.provenance`, :mod:`reports.sections.headline`,
:mod:`reports.sections.sweep_section` with :mod:`reports.sections.sweep_fits`, :mod:`reports.sections.sweep_figures` and
:mod:`reports.sections.sweep_tables`, :mod:`reports.sections.paper_section`, :mod:`reports.sections.problems`), joined
in order by :mod:`reports.assembly`; a figure or table is drawn or skipped by :mod:`reports.sections.section`; the words
are in :mod:`reports.base.captions`, the paper's numbers in :mod:`reports.base.paper`, the files are written by
:mod:`reports.document.files` into a folder :mod:`reports.document.folder` swaps in.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from analysis import Results, fit_results, load_results
from analysis.fitting.metric import VAL, with_metric
from reports.assembly import document, report_record
from reports.base.captions import report_title
from reports.base.context import ReportContext
from reports.document.files import (
    FIGURE_FORMATS,
    FIT_JSON,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    document_paths,
    write_documents,
)
from reports.document.folder import build_into, check_report_folder
from reports.sections.headline import Headline, headlines
from reports.sections.records import ReportSummary
from reports.sections.section import Section


def build_report(
    results_dir: str | Path | Results,
    out_dir: str | Path,
    *,
    formats: Sequence[str] = ("png", "svg"),
    pdf: bool = False,
    html: bool = True,
    paper: bool = True,
    strict: bool = False,
    pool: Sequence[str | Path] = (),
    **fit_options: Any,
) -> ReportSummary:
    """Build the report of a results tree into ``out_dir`` (created if needed).

    ``results_dir``: a results directory or an already loaded :class:`analysis.Results`. ``formats``: figure
    formats besides the PNG that is always written (the HTML embeds it); ``pdf=True`` adds PDF. ``html``:
    also write report.html. ``paper``: add the paper's published fits as a reference figure and its values
    as reference lines. ``strict``: raise on an unexpected error in a figure instead of recording it as
    skipped (tests use it). ``pool``: other results trees read with ``results_dir`` (:func:`analysis.load_results`).
    ``fit_options``: passed to :func:`analysis.fit_results` (form, select, baseline,
    level, n_boot, seed, delta, exponent, frontier, compute_unit, sweeps, chinchilla, budget_rtol).
    Raises :class:`analysis.ResultsError` when ``results_dir`` is not a folder, :class:`analysis.OutputError`
    (checked before any work) when ``out_dir`` cannot be written or is a folder of other files (a build replaces
    its folder as a whole: it is made in a temporary sibling and swapped in, :mod:`reports.document.folder`), and
    :class:`analysis.AnalysisError` for bad fit options; nothing about the runs themselves raises.
    """
    # matplotlib only once a report is built (it is slow to import), with the Agg backend before any figure
    import matplotlib

    matplotlib.use("Agg")

    started = time.perf_counter()
    formats = tuple(dict.fromkeys(["png", *[f.lower().lstrip(".") for f in formats], *(["pdf"] if pdf else [])]))
    unknown = [f for f in formats if f not in FIGURE_FORMATS]
    if unknown:
        raise ValueError(f"unknown figure format(s) {unknown}; choose from {', '.join(FIGURE_FORMATS)}")
    out = Path(out_dir)
    results_root = results_dir.root if isinstance(results_dir, Results) else Path(results_dir)
    real_out = check_report_folder(out, results_root if Path(results_root).is_dir() else None)  # before any work
    results = results_dir if isinstance(results_dir, Results) else load_results(results_dir, pool=pool)
    results = with_metric(results, fit_options.get("metric", VAL))  # the loss every table and figure shows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fit's warnings are in its notes, which the report lists
        fit = fit_results(results, **fit_options)

    def build(work: Path) -> tuple[Path, Section, list[Headline], list[Path]]:
        return (work, *_write_report(ReportContext(results, fit, work, formats, html, paper, strict)))

    # built in a temporary sibling and swapped in: the folder is always one whole report (reports/document/folder.py)
    work, made, headline, files = build_into(real_out, build)

    def moved(path: Path) -> Path:
        return out / path.relative_to(work)

    return ReportSummary(
        out_dir=out,
        report_md=out / REPORT_MD,
        report_html=out / REPORT_HTML if html else None,
        report_json=out / REPORT_JSON,
        fit_json=out / FIT_JSON,
        files=tuple(moved(p) for p in files),
        figures=tuple(replace(f, files=tuple(moved(p) for p in f.files)) for f in made.figures),
        skipped=tuple(made.skipped),
        headline=tuple(headline),
        fit=fit,
        results=results,
        seconds=time.perf_counter() - started,
    )


def _write_report(ctx: ReportContext) -> tuple[Section, list[Headline], list[Path]]:
    """Draw and write the whole report into the (new, empty) folder ``ctx.out``: figures, tables, report.md,
    report.html, fit.json, report.json and the list of the files written."""
    headline = headlines(ctx)
    made = document(ctx, headline)
    files = made.files + document_paths(ctx.out, ctx.html)
    write_documents(
        ctx.out,
        made.blocks,
        title=report_title(ctx.results),
        html=ctx.html,
        fit=ctx.fit,
        record=report_record(ctx, made, headline, files),
        files=files,
    )
    return made, headline, files
