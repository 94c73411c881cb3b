"""The report in order: the title, the verdict, the headline, each sweep's section (figures first), the paper's
reference, what lies behind the headline, what was skipped, the runs with a problem and the provenance, with the
figures numbered in document order (report.md and report.html
render these blocks); and report.json's record of the same build. Never imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from reports.base.captions import report_title
from reports.base.context import ReportContext
from reports.document.document import Heading
from reports.document.files import json_clean
from reports.document.folder import REPORT_FORMAT
from reports.sections.headline import Headline, behind_headline_section, headline_section, verdict_section
from reports.sections.paper_section import paper_section
from reports.sections.problems import problems_section, skipped_section
from reports.sections.provenance import provenance_record, provenance_section
from reports.sections.section import Section, number_figures
from reports.sections.sweep_section import sweep_section


def document(ctx: ReportContext, headline: Sequence[Headline]) -> Section:
    """The whole report: every section joined, figures numbered, and what was written and skipped."""
    parts = [sweep_section(ctx, s) for s in ctx.sweeps]
    if ctx.paper:
        parts.append(paper_section(ctx))
    made = Section.join(parts)
    # what a reader came for first (the verdict, the headline, each sweep's figures), where it came from last
    blocks = [
        Heading(report_title(ctx.results), 1),
        *verdict_section(ctx, headline),
        *headline_section(ctx, headline),
        *made.blocks,
        *behind_headline_section(ctx, headline),
        *skipped_section(made.skipped),
        *problems_section(ctx),
        *provenance_section(ctx),
    ]
    return replace(made, blocks=number_figures(blocks))


def report_record(
    ctx: ReportContext, made: Section, headline: Sequence[Headline], files: Sequence[Path]
) -> dict[str, Any]:
    """report.json: provenance, headline, figures, skipped, tables, problems, the files written and the fit
    (= fit.json), at full precision."""
    return json_clean(
        {
            "format": REPORT_FORMAT,
            "provenance": provenance_record(ctx),
            "headline": [h.to_dict() for h in headline],
            "figures": [f.to_dict(ctx.out) for f in made.figures],
            "skipped": [s.to_dict() for s in made.skipped],
            "tables": made.tables,
            "problems": [p.to_dict() for p in ctx.fit.problems],
            "files": sorted(p.relative_to(ctx.out).as_posix() for p in files),
            "fit": ctx.fit.to_dict(),
        }
    )
