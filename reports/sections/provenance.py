"""The report's provenance: where its numbers come from (the results folder and its hash, the runs' status,
code, devices and package versions, the FLOP convention, the fit options), as report.md's Provenance section and
as report.json's "provenance". Never imports torch."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pandas as pd

from reports.base.captions import sweep_name, unit_name
from reports.base.context import ReportContext
from reports.document.document import Block, Bullets, Heading


def provenance_section(ctx: ReportContext) -> list[Block]:
    """Where the numbers come from: the results, the runs and their code, the FLOP convention, the fit options."""
    runs, fit, s = ctx.results.runs, ctx.fit, ctx.settings
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
    items = [
        f"results directory: `{ctx.results.root}`"
        + "".join(f", pooled with `{other}` (--pool)" for other in ctx.results.pooled),
        f"runs read: {len(runs)} ({counts}); runs left out of the fits or with a problem: "
        f"{len(ctx.fit.problems)} (listed at the end)",
        "sweeps: " + (", ".join(sweep_name(x) for x in ctx.results.sweeps) or "none"),
        f"inputs sha256 (of every run.parquet row): `{ctx.results.inputs_hash}`",
        "git sha of the runs: " + (", ".join(f"`{k}` ({v} runs)" for k, v in shas) or "not recorded"),
        "FLOP convention: " + ("; ".join(conventions) or "unknown"),
        "devices: "
        + (", ".join(f"{k} ({v})" for k, v in devices) or "unknown")
        + "; precision: "
        + (", ".join(f"{k} ({v})" for k, v in precision) or "unknown"),
        "package versions of the runs: " + (", ".join(f"`{k}` ({v})" for k, v in versions) or "not recorded"),
        f"{s.describe()}; compute in {unit_name(s.compute_unit)}; IsoFLOP frontier `{s.frontier}`; budgets "
        f"within {s.budget_rtol:g} relative FLOPs are one budget",
        f"made by `attnres report` ({_package_version()}); the same numbers as `attnres fit` with the same "
        "options (fit.json)",
    ]
    return [Heading("Provenance", 2), Bullets(tuple(items))]


def provenance_record(ctx: ReportContext) -> dict[str, Any]:
    """report.json's provenance: the results, the runs' status and code, the FLOP conventions, the fit options."""
    runs = ctx.results.runs
    status = runs["status"].astype(str).value_counts().to_dict() if len(runs) else {}
    return {
        "results_dir": str(ctx.results.root),
        "inputs_hash": ctx.results.inputs_hash,
        "n_runs": int(len(runs)),
        "status": {k: int(v) for k, v in sorted(status.items())},
        "n_problems": len(ctx.fit.problems),
        "git_shas": dict(_value_counts(runs, "git_sha")),
        "flops_conventions": sorted({c for sw in ctx.fit.sweeps for c in sw.flops_convention}),
        "fit_settings": ctx.settings.to_dict(),
        "made_by": _package_version(),
    }


def _value_counts(runs: pd.DataFrame, column: str) -> list[tuple[str, int]]:
    """How many runs have each value of ``column`` (missing: ``unknown``), the most common first."""
    if not len(runs) or column not in runs.columns:
        return []
    values = runs[column].astype(object).where(runs[column].notna(), None)
    counts: dict[str, int] = {}
    for v in values:
        key = "unknown" if v is None or v == "" else str(v)
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _unique(runs: pd.DataFrame, column: str) -> list[str]:
    """The distinct values of ``column``, sorted."""
    if not len(runs) or column not in runs.columns:
        return []
    return sorted(runs[column].dropna().astype(str).unique().tolist())


def _package_version() -> str:
    """What made the report: this package and its installed version."""
    try:
        return f"attnres-scaling {metadata.version('attnres-scaling')}"
    except metadata.PackageNotFoundError:
        return "attnres-scaling (not installed)"
