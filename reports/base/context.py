"""What every section of one report build reads: :class:`ReportContext`, the results, their fit, the folder the
build writes into and the build's options, frozen. A section is a function of the context (and of the sweep or
the headline it shows); it never keeps state of its own. Never imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reports.base.captions import caption_interval

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport, FitSettings, Results


@dataclass(frozen=True)
class ReportContext:
    """One build's inputs and options (made once by :func:`reports.build.build_report`)."""

    results: Results
    """The results tree, as :func:`analysis.load_results` read it."""
    fit: FitReport
    """Its fit: the same numbers ``attnres fit`` prints with the same options."""
    out: Path
    """The folder the build writes into (a temporary sibling of the report folder, :mod:`reports.document.folder`)."""
    formats: tuple[str, ...]
    """The figure formats, PNG first."""
    html: bool
    """Whether report.html is written."""
    paper: bool
    """Whether the paper's published fits are shown (a reference figure and lines)."""
    strict: bool
    """Whether an unexpected error in a figure or table is raised instead of recorded as skipped."""

    @property
    def settings(self) -> FitSettings:
        return self.fit.settings

    @property
    def pct(self) -> int:
        """The interval's level in percent (90)."""
        return int(round(self.settings.level * 100))

    @property
    def with_interval(self) -> str:
        """``with its 90% bootstrap interval``, or why there is none (--n-boot 0): what the captions say."""
        return caption_interval(self.settings)

    @property
    def sweeps(self) -> list[str]:
        """Every sweep of the results, or those the fit options chose, in the fit's order."""
        return [s.sweep for s in self.fit.sweeps]
