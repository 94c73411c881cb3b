"""``attnres demo``: the main job. A small baseline / Full / Block study on the built-in corpus, end to end.

It trains the grid ``sweeps/demo.yaml`` locally (finished runs are reused, interrupted ones resume), fits the
scaling laws and the effective compute multiplier, writes the report, and ends with where everything is and
the headline multiplier of each variant with its interval. About 4 minutes on 2 quiet CPU cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="train a small baseline / Full / Block study on the built-in corpus, fit it and write the report",
        description="Runs sweeps/demo.yaml locally (reusing finished runs), fits the scaling laws and the effective "
        "compute multiplier, and writes the report. The main job of this project: a few minutes on a laptop CPU.",
    )
    parser.add_argument("--results", default="results", help="results root (default: ./results)")
    parser.add_argument("--out", help="report folder (default: RESULTS/<sweep>-report)")
    parser.add_argument("--grid", default="demo", help="the grid to run (a shipped name or a YAML file)")
    parser.add_argument(
        "--workers",
        type=int,
        help="parallel training processes (default: one per core, at most 4, with one thread each on a busy machine)",
    )
    parser.add_argument("--threads", type=int, help="torch threads per worker (default: the free cores // workers)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from analysis.tables.output import check_output_folder
    from attnres.config import ConfigError
    from attnres.runtime import CpuShare
    from attnres.storage.writable import folder_problem
    from sweeps import expand, load_grid, run_grid
    from sweeps.cli import check_counts

    check_counts(args, "workers", "threads")
    started = time.perf_counter()
    grid = load_grid(args.grid)
    results = Path(args.results)
    out = Path(args.out) if args.out else results / f"{grid.name}-report"
    runs = expand(grid)
    check_output_folder(out, "the report folder")  # both before the training, which takes minutes
    if why := folder_problem(results / grid.name):
        raise ConfigError(f"cannot write the results folder {results / grid.name}: {why}; pick another --results")
    print(f"attnres demo: {len(runs)} runs of grid '{grid.name}' ({grid.description}) -> {results / grid.name}")
    # tiny models: side by side on the cores that are free beats more threads each (attnres.runtime.CpuShare)
    workers = args.workers or CpuShare.now().workers_for(len(runs))
    summary = run_grid(grid, results, workers=workers, threads=args.threads, progress=not args.no_progress)
    if summary.trained == 0:
        print("every run was already finished: nothing trained, reusing them")
    problems = [r for r in summary.runs if r.status not in ("done",)]
    for r in problems:
        print(f"  {r.run_id}: {r.status}" + (f" ({r.error})" if r.error else ""), file=sys.stderr)

    from reports import build_report

    print("fitting scaling laws and writing the report ...")
    report = build_report(results / grid.name, out)
    minutes = (time.perf_counter() - started) / 60
    print(f"\nreport: {report.report_md}" + (f" (and {report.report_html.name})" if report.report_html else ""))
    print(f"fit:    {report.fit_json}")
    print(f"runs:   {results / grid.name} ({summary.done} done of {summary.total}; {minutes:.1f} min)")
    headline = report.headline_text()
    if headline:
        print("\neffective compute multiplier over the baseline at the largest budget (90% CI):")
        print(headline)
        print("\nwhat it says:")
        for h in report.headline:
            print(f"  {h.label}: {h.verdict}")
        print(
            "a demo is too small to judge AttnRes by: studies/cpu_envelope/README.md is a study of 5 sizes, each at "
            "4 or 5 learning rates, 2 budgets and 2 seeds, precise enough to tell M = 1.25 from 1, and "
            "docs/analysis.md says what the interval covers and how far to trust it"
        )
    else:
        print("\nno multiplier could be computed (see the report's 'skipped' section)")
    return 0 if not problems else 1
