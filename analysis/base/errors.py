"""The errors ``analysis`` raises: plain-language ``ValueError`` subclasses that name the problem and the fix."""

from __future__ import annotations


class AnalysisError(ValueError):
    """Base class of every error raised on purpose by :mod:`analysis`."""


class FitInputError(AnalysisError):
    """The numbers given to a fit cannot be fitted (too few points, non-positive or missing values)."""


class ResultsError(AnalysisError):
    """A results directory cannot be analysed at all (missing, or holds no run that can be fitted)."""


class OutputError(AnalysisError):
    """An output path cannot be written (a read-only folder, a file in the way, no permission)."""
