"""``attnres report RESULTS_DIR --out DIR``: every figure and table of a results tree, with report.md.

``register(subparsers)`` adds the sub-command to the ``attnres`` CLI; heavy imports (matplotlib, pandas,
scipy) happen inside :func:`run`, so ``attnres --help`` stays fast. Also runnable as
``python -m reports.cli report DIR``. Never imports torch.
"""

from __future__ import annotations

import argparse
import sys

from analysis.cli import add_fit_options, add_pool_option, fit_options, run_alone

DEFAULT_OUT = "report"


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``report`` to an argparse sub-parsers object; its ``func`` is :func:`run`."""
    parser = subparsers.add_parser(
        "report",
        help="every figure and table of a results tree, with report.md / report.html",
        description=(
            "Fit every sweep under RESULTS_DIR (the same fits and numbers as `attnres fit`) and write the figures "
            "(scaling curves, multiplier vs compute, training dynamics, block-size ablation, depth-attention heatmaps) "
            "as PNG and SVG, tables like the paper's Tables 2 and 4, report.md, a self-contained report.html and "
            "report.json into --out. A figure whose data are missing is skipped with the reason in the report. See "
            "docs/reports.md."
        ),
    )
    parser.add_argument(
        "results_dir", metavar="RESULTS_DIR", help="results tree: RESULTS_DIR/<sweep>/<run_id>/run.parquet"
    )
    parser.add_argument("--out", default=None, help=f"output folder (default: RESULTS_DIR/{DEFAULT_OUT})")
    parser.add_argument("--pdf", action="store_true", help="also write every figure as PDF")
    parser.add_argument("--no-svg", action="store_true", help="write PNG only (no SVG)")
    parser.add_argument("--no-html", action="store_true", help="do not write report.html")
    parser.add_argument(
        "--no-paper", action="store_true", help="leave out the paper's published fits (reference figure and lines)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="stop on an unexpected error in a figure instead of listing it as skipped"
    )
    add_fit_options(parser.add_argument_group("fit options (as for `attnres fit`)"))
    add_pool_option(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``attnres report``; returns the exit code: 0 written; 1 written but incomplete (some run.parquet could
    not be read: the headline says INCOMPLETE and lists them); 2 bad input (a missing results directory, a bad
    option or variant name, an output folder that cannot be written). Every error is one line on stderr."""
    # here, not at the top: the builder pulls in pandas, scipy and matplotlib, and `attnres --help` stays fast
    from pathlib import Path

    from analysis.base.errors import AnalysisError
    from analysis.tables.tables import incomplete_text
    from reports.build import build_report
    from reports.sections.headline import one_shape_sweeps, one_shape_text

    out = Path(args.out) if args.out else Path(args.results_dir) / DEFAULT_OUT
    try:
        summary = build_report(
            args.results_dir,
            out,
            formats=("png",) if args.no_svg else ("png", "svg"),
            pdf=args.pdf,
            html=not args.no_html,
            paper=not args.no_paper,
            strict=args.strict,
            pool=args.pool,
            **fit_options(args),
        )
    except AnalysisError as err:
        print(f"attnres report: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the disk filled up, a folder changed under the build: the old report is untouched
        where = f" {err.filename!r}" if err.filename else ""
        print(f"attnres report: error: cannot write the report{where}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(
        f"wrote {summary.report_md} ({len(summary.figures)} figures, {len(summary.skipped)} skipped) "
        f"in {summary.seconds:.1f} s"
    )
    if summary.report_html is not None:
        print(f"      {summary.report_html}")
    if summary.headline:
        print("headline (effective compute multiplier over the baseline at the largest budget):")
        several = len({h.sweep for h in summary.headline}) > 1  # e.g. one per training length (analysis.data.slices)
        for h in summary.headline:
            print(f"  {h.sweep}: {h.text()}" if several else f"  {h.text()}")
    elif one_shape := one_shape_sweeps(summary.fit):
        print(f"no multiplier: {one_shape_text(one_shape)} one shape and one budget; its gaps are in report.md")
    else:
        print("no multiplier could be computed (see report.md)")
    for s in summary.skipped:
        print(f"  skipped {s}")
    if not len(summary.results.runs):
        print(f"attnres report: no runs found under {args.results_dir}", file=sys.stderr)
    if not summary.fit.complete:
        print(f"attnres report: {incomplete_text(len(summary.fit.unreadable))}, unreadable:", file=sys.stderr)
        for p in summary.fit.unreadable:
            print(f"  {p}", file=sys.stderr)
        print("attnres report: the report is incomplete (its headline says so; exit code 1)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m reports.cli report RESULTS_DIR``: the same sub-command without the rest of ``attnres``."""
    return run_alone(register, argv)


if __name__ == "__main__":
    sys.exit(main())
