"""Figures, tables and the report of an AttnRes results tree: ``attnres report RESULTS_DIR --out DIR``.

One function per figure (each takes DataFrames from :func:`analysis.load_results` or the
:class:`analysis.FitReport`, and returns a matplotlib Figure) and per table (returns a DataFrame); the
builder :func:`build_report` decides file names and formats and writes report.md / report.html /
report.json. Names are resolved lazily, so ``import reports`` is cheap; nothing here imports torch.

    import analysis, reports
    summary = reports.build_report("results/", "report/")         # every figure + report.md
    print(summary.report_md, summary.headline_text())

    results = analysis.load_results("results/")
    fit = analysis.fit_results(results)
    fig = reports.plot_scaling_curves(fit, "scaling", runs=results.runs)
    fig.savefig("scaling.png")

See docs/reports.md for what each figure shows and every choice made.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    # the builder
    "build_report": "reports.build",
    "ReportSummary": "reports.sections.records",
    "FigureRecord": "reports.sections.records",
    "Skipped": "reports.sections.records",
    "Headline": "reports.sections.headline",
    "save_figure": "reports.document.files",
    "MissingData": "reports.base.data",
    # figures
    "plot_scaling_curves": "reports.figures.scaling",
    "plot_multiplier": "reports.figures.scaling",
    "plot_paper_curves": "reports.figures.scaling",
    "plot_loss_curves": "reports.figures.dynamics",
    "plot_block_output_rms": "reports.figures.dynamics",
    "plot_block_grad_norm": "reports.figures.dynamics",
    "plot_block_size_ablation": "reports.figures.ablation",
    "block_size_points": "reports.figures.ablation",
    "plot_depth_attention": "reports.figures.heatmaps",
    "depth_attention_matrices": "reports.figures.heatmaps",
    # tables
    "fit_table": "reports.sections.tables",
    "multiplier_table": "reports.sections.tables",
    "budget_table": "reports.sections.tables",
    "size_table": "reports.sections.tables",
    "lr_table": "reports.sections.tables",
    "ablation_table": "reports.sections.tables",
    "describe_variant": "reports.sections.tables",
    # looks
    "variant_color": "reports.base.style",
    "variant_label": "reports.base.style",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'reports' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
