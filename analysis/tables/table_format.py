"""The cells of the fit's tables, shared by :mod:`analysis.tables.tables` and :mod:`analysis.tables.robust_tables`: a
:class:`FitTable` (a header, rows of cells, the CLI's title and the report's caption), a :class:`FitText` (one
statement in its two wordings), and how numbers and intervals are written.

Pure Python; no I/O; never imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analysis.base.bootstrap import Estimate

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from analysis.fitting.results import SweepFit, VariantMultiplier
    from analysis.fitting.settings import FitSettings

Cell = str | int


@dataclass(frozen=True)
class FitTable:
    """A table of the fit: ``header``, ``rows`` of cells, the CLI's ``title`` line and the report's
    ``caption`` (either may be empty)."""

    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    title: str = ""
    caption: str = ""

    def text_lines(self) -> list[str]:
        """The table as ``attnres fit`` prints it: left-aligned columns two spaces apart, a dashed rule under
        the header, no trailing spaces."""
        cells = [[str(c) for c in row] for row in self.rows]
        widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(self.header)]

        def line(texts: Sequence[str]) -> str:
            return "  ".join(t.ljust(w) for t, w in zip(texts, widths)).rstrip()

        return [line(self.header), line(["-" * w for w in widths])] + [line(r) for r in cells]

    def frame(self) -> pd.DataFrame:
        """The table as a DataFrame (the report's; one column per header cell)."""
        import pandas as pd

        return pd.DataFrame([list(r) for r in self.rows], columns=list(self.header))


@dataclass(frozen=True)
class FitText:
    """One statement in its two wordings: ``line`` as ``attnres fit`` prints it, ``sentence`` as the report
    writes it."""

    line: str
    sentence: str


def number(x: float | None, digits: int = 4) -> str:
    """A number in a table: ``digits`` significant digits, ``nan`` / ``inf`` as words."""
    return "nan" if x is None else Estimate(x).text(digits)


NO_INTERVAL = "no interval (--n-boot 0)"
MISSING_SEEDS = "seeds missing at some budgets (other curves ran them there; no point is dropped)"


def has_intervals(settings: FitSettings) -> bool:
    """Whether the fit was bootstrapped at all (``--n-boot 0``: point estimates only, no interval anywhere)."""
    return settings.n_boot > 0


def interval_name(settings: FitSettings) -> str:
    """``90% CI``: the name of the intervals in the tables' headers (empty without a bootstrap)."""
    return f"{int(round(settings.level * 100))}% CI" if has_intervals(settings) else ""


def with_interval(name: str, settings: FitSettings) -> str:
    """A column header: ``M [90% CI]``, or plain ``M`` when there is no bootstrap (``--n-boot 0``)."""
    pct = interval_name(settings)
    return f"{name} [{pct}]" if pct else name


def column_header(name: str, settings: FitSettings, estimates: Iterable[Estimate]) -> str:
    """:func:`with_interval` for a column of ``estimates``, but plain ``name`` where none of them has an interval:
    a wall-clock M from throughputs logged under different loads is a point (docs/analysis.md), and a header
    that names an interval over point cells reads as if they had one."""
    return with_interval(name, settings) if any(e.has_interval for e in estimates) else name


def intervals_text(settings: FitSettings) -> str:
    """How the intervals are described in a sentence: ``90% bootstrap intervals``, or
    :data:`NO_INTERVAL`."""
    return f"{int(round(settings.level * 100))}% bootstrap intervals" if has_intervals(settings) else NO_INTERVAL


def ordered_multipliers(sw: SweepFit, order: Sequence[str] | None) -> list[VariantMultiplier]:
    """A sweep's variants' multipliers, in ``order`` when given (the report's figures' order)."""
    return list(sw.multipliers) if order is None else [sw.multiplier(v) for v in order]
