"""The report's last two sections: what was skipped (each figure or table with its reason), and the runs left
out of the fits or with a problem. Never imports torch."""

from __future__ import annotations

from collections.abc import Sequence

from reports.base.context import ReportContext
from reports.document.document import Block, Bullets, Heading, Paragraph
from reports.sections.records import Skipped

MAX_SHOWN = 100  # problems listed in report.md; report.json has them all


def skipped_section(skipped: Sequence[Skipped]) -> list[Block]:
    blocks: list[Block] = [Heading("Skipped", 2)]
    if not skipped:
        return blocks + [Paragraph("Nothing was skipped: every figure and table had its data.")]
    return blocks + [Bullets(tuple(str(s) for s in skipped))]


def problems_section(ctx: ReportContext) -> list[Block]:
    problems = ctx.fit.problems  # those of the fitted sweeps (a tuning search's pruned trials are not problems)
    blocks: list[Block] = [Heading("Runs left out or with a problem", 2)]
    if not problems:
        return blocks + [Paragraph("None: every run folder of the fitted sweeps was read and every run finished.")]
    shown = [f"`{p.path}`: {p.reason}" for p in problems[:MAX_SHOWN]]
    if len(problems) > MAX_SHOWN:
        shown.append(f"... and {len(problems) - MAX_SHOWN} more (all are in report.json)")
    return blocks + [Bullets(tuple(shown))]
