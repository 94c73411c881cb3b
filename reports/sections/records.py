"""What a report build hands back: each figure it wrote (:class:`FigureRecord`), each figure or table it skipped
and why (:class:`Skipped`), and the :class:`ReportSummary` that :func:`reports.build.build_report` returns.
Frozen records; their ``to_dict`` is what report.json lists. Never imports torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport, Results
    from reports.sections.headline import Headline


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
class ReportSummary:
    """What :func:`reports.build.build_report` wrote and what it skipped, with the fit it used."""

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
