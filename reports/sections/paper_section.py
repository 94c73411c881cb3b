"""The report's reference section: the paper's published fits as a figure of their own (their data, tokenizer and
FLOP count, so never on the axes of our runs; numbers from :mod:`reports.base.paper`). Left out with ``--no-paper``.
Never imports torch."""

from __future__ import annotations

from reports.base.context import ReportContext
from reports.document.document import Heading
from reports.figures import scaling
from reports.sections.section import Section, figure


def paper_section(ctx: ReportContext) -> Section:
    drawn = figure(ctx, "paper_fits", None, scaling.plot_paper_curves, "paper_fits")
    return Section.join([Section([Heading("Reference: the paper's published fits", 2)]), drawn])
