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
    "ReportSummary": "reports.records",
    "FigureRecord": "reports.records",
    "Skipped": "reports.records",
    "Headline": "reports.headline",
    "save_figure": "reports.files",
    "MissingData": "reports.data",
    # figures
    "plot_scaling_curves": "reports.scaling",
    "plot_multiplier": "reports.scaling",
    "plot_paper_curves": "reports.scaling",
    "plot_loss_curves": "reports.dynamics",
    "plot_block_output_rms": "reports.dynamics",
    "plot_block_grad_norm": "reports.dynamics",
    "plot_block_size_ablation": "reports.ablation",
    "block_size_points": "reports.ablation",
    "plot_depth_attention": "reports.heatmaps",
    "depth_attention_matrices": "reports.heatmaps",
    # tables
    "fit_table": "reports.tables",
    "multiplier_table": "reports.tables",
    "budget_table": "reports.tables",
    "size_table": "reports.tables",
    "lr_table": "reports.tables",
    "ablation_table": "reports.tables",
    "describe_variant": "reports.tables",
    # looks
    "variant_color": "reports.style",
    "variant_label": "reports.style",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'reports' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
