"""``attnres fit RESULTS_DIR``: fit every sweep, print the table, save the same numbers to ``fit.json``.

``register(subparsers)`` adds the sub-command to the ``attnres`` CLI; heavy imports (numpy, scipy, pandas)
happen inside :func:`run`, so ``attnres --help`` stays fast. Also runnable as ``python -m analysis.cli fit DIR``
or ``python -m analysis fit DIR``. Never imports torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_OUTPUT = "fit.json"


def add_fit_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The options of :func:`analysis.fit_results`, shared by ``attnres fit`` and ``attnres report``: every field of
    :class:`analysis.fitting.settings.FitSettings` (defaults, choices and help declared there), and ``--sweep``."""
    from analysis.fitting.settings import add_arguments

    add_arguments(parser)
    parser.add_argument("--sweep", action="append", default=None, help="only this sweep (repeatable; default: all)")


def fit_options(args: argparse.Namespace) -> dict:
    """The arguments of :func:`analysis.fit_results` from options added by :func:`add_fit_options`."""
    from analysis.fitting.settings import from_arguments

    return {"settings": from_arguments(args), "sweeps": args.sweep}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``fit`` to an argparse sub-parsers object; its ``func`` is :func:`run`."""
    parser = subparsers.add_parser(
        "fit",
        help="fit scaling laws and the effective compute multiplier (with confidence intervals)",
        description=(
            "Fit a law in compute (--form; by default the paper's L = A * C^-alpha) per variant in every sweep under "
            "RESULTS_DIR, a joint fit with a shared exponent, the effective compute multiplier "
            "M(C) = C_base(L_var(C)) / C of every variant over the baseline at each budget and at the largest, with "
            "bootstrap intervals, the wall-clock multiplier, and the Chinchilla surface where N and D vary "
            "independently. Prints a table and writes the same numbers at full precision to RESULTS_DIR/fit.json. "
            "See docs/analysis.md."
        ),
    )
    parser.add_argument(
        "results_dir", metavar="RESULTS_DIR", help="results tree: RESULTS_DIR/<sweep>/<run_id>/run.parquet"
    )
    add_fit_options(parser)
    parser.add_argument("--out", default=None, help=f"where to write the JSON (default: RESULTS_DIR/{DEFAULT_OUTPUT})")
    add_pool_option(parser)
    parser.set_defaults(func=run)
    return parser


def add_pool_option(parser: argparse.ArgumentParser) -> None:
    """``--pool DIR``: another results tree fitted with RESULTS_DIR (``attnres fit`` and ``attnres report``)."""
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="DIR",
        help="also read the runs of this results tree, as if they lay under RESULTS_DIR (a study carried on in a "
        "folder of its own, under the same sweep name); repeatable",
    )


def no_runs_message(results_dir: str | Path) -> str:
    """The one line for a results folder with no run folder in it, saying what a run folder looks like."""
    where = Path(results_dir).as_posix().rstrip("/") or "."
    return (
        f"no runs found under {where}: a run folder is {where}/<sweep>/<run_id>/ holding run.parquet and "
        "config.yaml, as `attnres train`, `attnres sweep run` and `attnres demo` write them"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``attnres fit``; returns the exit code: 0 ok; 1 nothing could be fitted, or the fit is incomplete
    (some run.parquet could not be read: the output says INCOMPLETE and lists them first); 2 bad input (a
    missing or empty results folder, an unknown variant or sweep name, an output that cannot be written).
    Every error is one line on stderr; nothing is written when there is nothing to fit."""
    from analysis.base.errors import AnalysisError
    from analysis.data.load import load_results
    from analysis.fitting.sweep_fits import fit_results
    from analysis.tables.output import check_output_file
    from analysis.tables.tables import format_report, incomplete_text
    from attnres.storage.schema import atomic_write_bytes

    out = Path(args.out) if args.out else Path(args.results_dir) / DEFAULT_OUTPUT
    try:
        results = load_results(args.results_dir, tables=(), pool=args.pool)
        if results.runs.empty and not results.problems:
            print(f"attnres fit: error: {no_runs_message(args.results_dir)}; nothing was written", file=sys.stderr)
            return 2
        if results.runs.empty:
            print(f"attnres fit {args.results_dir}\n  no run could be read; the run folders found:")
            print("\n".join(f"  {p}" for p in sorted(results.problems, key=lambda p: not p.unreadable)))
            print(
                f"attnres fit: error: none of the {len(results.problems)} run folder(s) under {args.results_dir} "
                "could be read (listed above); nothing was written",
                file=sys.stderr,
            )
            return 1
        check_output_file(out, "fit.json")  # before the fitting, not after it
        report = fit_results(results, **fit_options(args))
    except AnalysisError as err:
        print(f"attnres fit: error: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    try:
        atomic_write_bytes(out, report.to_json().encode())
    except OSError as err:
        print(f"attnres fit: error: cannot write fit.json {str(out)!r}: {err.strerror or err}", file=sys.stderr)
        return 2
    print(f"\nwrote {out}")
    if not report.complete:
        print(
            f"attnres fit: {incomplete_text(len(report.unreadable))}: the fit and its headline are incomplete "
            "(listed at the top; exit code 1)",
            file=sys.stderr,
        )
        return 1
    if not any(sweep.curves or sweep.architecture or sweep.one_shape for sweep in report.sweeps):
        print("attnres fit: no curve could be fitted (see the notes and problems above)", file=sys.stderr)
        return 1
    return 0


def run_alone(register_command: Callable[[argparse._SubParsersAction], Any], argv: list[str] | None) -> int:
    """Run one part's sub-command without the rest of ``attnres`` (so without torch): ``python -m analysis.cli``
    and ``python -m reports.cli``."""
    parser = argparse.ArgumentParser(prog="attnres")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_command(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.cli fit RESULTS_DIR``: the same sub-command without the rest of ``attnres``."""
    return run_alone(register, argv)


if __name__ == "__main__":
    sys.exit(main())
