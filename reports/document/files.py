"""Writing a report's files into the folder a build makes (:mod:`reports.document.folder` makes it and swaps it in):
each figure in its formats, each table as CSV, then report.md, report.html, fit.json, report.json and the list of the
files the build wrote. Every file is written atomically and deterministically (no dates, versions or random ids
in figures; report.json without NaN). Imports matplotlib only inside :func:`save_figure`; never imports torch."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from analysis.base.bootstrap import json_number
from attnres.storage.schema import atomic_write_bytes
from reports.base.style import DPI, rc_context
from reports.document.document import Block, to_html, to_markdown
from reports.document.folder import FILES_LIST

if TYPE_CHECKING:  # pragma: no cover
    from analysis import FitReport

FIGURE_FORMATS = ("png", "svg", "pdf")
REPORT_MD, REPORT_HTML, REPORT_JSON, FIT_JSON = "report.md", "report.html", "report.json", "fit.json"


def safe_name(name: str) -> str:
    """A sweep's name as a folder name (``figures/<sweep>``, ``tables/<sweep>``)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "sweep"


def save_figure(fig: Any, stem: Path, formats: Sequence[str]) -> list[Path]:
    """Write ``fig`` as ``stem.<format>`` for each format, deterministically (no dates or versions in the
    files, fixed SVG ids), each file written atomically; closes the figure."""
    # pyplot only once a figure is saved: it is slow to import, and build_report selects the Agg backend before it
    import matplotlib.pyplot as plt

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


def save_table(frame: pd.DataFrame, path: Path) -> None:
    """Write a table as CSV at full precision."""
    atomic_write_bytes(path, frame.to_csv(index=False, float_format="%.17g").encode())


def json_clean(value: Any) -> Any:
    """``value`` with every key a string and every number a plain JSON number (NaN and infinities as null)."""
    if isinstance(value, dict):
        return {str(k): json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_clean(v) for v in value]
    if value is None or value is pd.NA:
        return None
    if isinstance(value, bool):
        return value
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, (int, float)):
        return json_number(value)
    return value


def document_paths(work: Path, html: bool) -> list[Path]:
    """report.md, report.html (when it is written), fit.json and report.json in ``work``, in the order
    :func:`write_documents` writes them."""
    return [work / REPORT_MD, *([work / REPORT_HTML] if html else []), work / FIT_JSON, work / REPORT_JSON]


def write_documents(
    work: Path,
    blocks: Sequence[Block],
    *,
    title: str,
    html: bool,
    fit: FitReport,
    record: dict[str, Any],
    files: Sequence[Path],
) -> None:
    """Write report.md (and report.html) from ``blocks``, fit.json, report.json (``record``) and the list of
    ``files``, every file the build wrote (:data:`reports.document.folder.FILES_LIST`)."""
    atomic_write_bytes(work / REPORT_MD, to_markdown(blocks).encode())
    if html:
        atomic_write_bytes(work / REPORT_HTML, to_html(blocks, work, title).encode())
    atomic_write_bytes(work / FIT_JSON, fit.to_json().encode())
    atomic_write_bytes(work / REPORT_JSON, (json.dumps(record, indent=2, allow_nan=False) + "\n").encode())
    listing = json.dumps(sorted(p.relative_to(work).as_posix() for p in files)).encode()
    atomic_write_bytes(work / FILES_LIST, listing)
