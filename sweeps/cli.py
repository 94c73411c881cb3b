"""``attnres sweep plan|run|status`` and ``attnres tune``: the sweep commands of the ``attnres`` entry point.

Heavy imports (torch, lightning, optuna, submitit) happen inside the commands, so ``attnres --help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _launcher_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local", help=help)


def _grid_arguments(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    from sweeps.lookup import shipped_grids

    parser.add_argument(
        "grid",
        metavar="GRID",
        nargs="?" if optional else None,
        help=f"a grid YAML file, or the name of a shipped grid ({', '.join(shipped_grids())})"
        + ("; without one, every sweep found under RESULTS" if optional else ""),
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],  # not listed as required when GRID is missing
        metavar="key=value",
        help="settings applied to every run after the grid (e.g. data.corpus=/data/text.txt); "
        "they change run ids like any config change",
    )
    parser.add_argument(
        "--results", default="results", help="results root; runs go to RESULTS/<sweep>/<run_id> (default: ./results)"
    )


def _json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print JSON lines instead of the table: one object per run, the fields of docs/sweeps.md "
        '("Machine-readable plans and statuses")',
    )


def _print_json(grid_name: str | None, rows: list) -> None:
    """One JSON object per run (``dataclasses.asdict`` of a plan row or a run state, with its sweep), one a line."""
    import dataclasses
    import json
    import math
    from pathlib import Path

    for row in rows:
        record = {
            k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in dataclasses.asdict(row).items()
        }
        # a status knows its folder (a trunk's is in <sweep>-trunk); a plan row's variant says "trunk"
        sweep = Path(record["run_dir"]).parent.name if record.get("run_dir") else grid_name
        print(json.dumps({"sweep": sweep, **record}, allow_nan=False, default=str))


def register(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser(
        "sweep",
        help="plan, run (locally or on SLURM) and follow a grid of runs",
        description="A grid (a YAML file, or the name of a shipped one: sweeps/*.yaml, or a committed study's in "
        "studies/<study>/) expands to sizes x budgets x variants x lr x seeds runs. "
        "`plan` shows them without training, `run` trains what is not finished yet (skipping done runs, resuming "
        "interrupted ones), `status` shows where every run stands. See docs/sweeps.md.",
    )
    commands = sweep.add_subparsers(dest="sweep_command", required=True, metavar="COMMAND")
    _register_plan(commands)
    _register_run(commands)
    _register_status(commands)
    _register_throughput(commands)
    _register_tune(sub)


def _register_plan(commands: argparse._SubParsersAction) -> None:
    plan = commands.add_parser(
        "plan", help="the table of runs, with params, tokens, FLOPs and estimated time; trains nothing"
    )
    _grid_arguments(plan)
    _launcher_argument(plan, "estimate for this launcher's devices (default: local)")
    plan.add_argument(
        "--flops-per-s",
        type=float,
        help="assumed training throughput of one run per device, FLOP/s "
        "(default: measured on finished runs in RESULTS if any, else 9.5e10 on CPU, 1.5e14 per GPU)",
    )
    plan.add_argument(
        "--flops-file",
        help="per-device FLOP/s measured: the throughput.json of `attnres sweep throughput` (per size and variant) "
        'or {"flops_per_s": R}; used before the results\' own',
    )
    plan.add_argument(
        "--gpus",
        type=int,
        help="also pack the unfinished runs onto this many devices (a GPU grid: each run holds its slurm nodes x "
        "gpus_per_node) and print the elapsed time, and the runs that strand devices",
    )
    _json_argument(plan)
    plan.set_defaults(func=cmd_plan)


def _register_run(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="train every unfinished run of the grid (locally or as SLURM job arrays)")
    _grid_arguments(run)
    _launcher_argument(run, "local worker processes, or SLURM via submitit (default: local)")
    run.add_argument("--workers", type=int, default=1, help="local: runs trained at the same time (default: 1)")
    run.add_argument(
        "--threads", type=int, help="local: torch threads per worker (default: the free CPU cores // workers)"
    )
    run.add_argument(
        "--no-progress", action="store_true", help="local: one line per finished run instead of a progress bar"
    )
    run.add_argument(
        "--wait", action="store_true", help="slurm: wait until every run is finished (polls run.parquet and squeue)"
    )
    run.add_argument("--poll", type=float, default=30.0, help="slurm --wait: seconds between polls (default: 30)")
    run.add_argument(
        "--timeout", type=float, help="slurm --wait: stop waiting after this many seconds (the jobs go on)"
    )
    run.set_defaults(func=cmd_run)


def _register_status(commands: argparse._SubParsersAction) -> None:
    status = commands.add_parser(
        "status", help="done / running / queued / interrupted / failed / diverged / unreadable for every run"
    )
    _grid_arguments(status, optional=True)
    _json_argument(status)
    status.set_defaults(func=cmd_status)


def _register_throughput(commands: argparse._SubParsersAction) -> None:
    throughput = commands.add_parser(
        "throughput",
        help="every variant's training tokens/s at every size, measured side by side (for wall-clock M)",
        description="Trains every variant of every size a few steps in turn, in one process, and writes the median "
        "tokens/s to RESULTS/<sweep>/throughput.json, which `attnres fit` and `attnres report` use for the "
        "wall-clock multiplier instead of the tokens/s of runs that trained at different times. Run it on the kind "
        "of machine the runs use, with nothing else running. See docs/analysis.md.",
    )
    _grid_arguments(throughput)
    throughput.add_argument("--steps", type=int, default=5, help="steps per variant per round (5)")
    throughput.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is kept (5)")
    throughput.set_defaults(func=cmd_throughput)


def _register_tune(sub: argparse._SubParsersAction) -> None:
    """``attnres tune``: a command of its own beside ``attnres sweep``, with the grid's arguments."""
    tune = sub.add_parser(
        "tune",
        help="Optuna search of the learning rate (and optionally warm-up, beta2) per model size",
        description="For every size of the grid, an Optuna study trains short runs (the grid's tune.budget) with "
        "pruning and writes the best values to RESULTS/<sweep>-tune/tuned.yaml (or the grid's tune.file), where a grid "
        "with `lr: tuned` reads them. Trials train into RESULTS/<sweep>-tune/. See docs/sweeps.md.",
    )
    _grid_arguments(tune)
    tune.add_argument(
        "--variants",
        nargs="+",
        metavar="VARIANT",
        help="variants to tune: baseline, full, block<N>, or 'all' "
        "(default: the grid's tune.variants, usually baseline)",
    )
    tune.add_argument("--sizes", nargs="+", metavar="SIZE", help="only these sizes (names as L<n_layer>-d<d_model>)")
    tune.add_argument("--trials", type=int, help="finished trials per study (default: the grid's tune.trials)")
    tune.add_argument(
        "--storage",
        help="Optuna storage: an RDB URL (postgresql://..., sqlite:///...) or a journal file "
        "(default: RESULTS/<sweep>-tune/optuna.journal)",
    )
    tune.add_argument("--threads", type=int, help="torch threads (default: the free CPU cores; SLURM: the grid's cpus)")
    _launcher_argument(
        tune, "local: tune here; slurm: --workers tuners as a job array sharing the storage (default: local)"
    )
    tune.add_argument("--workers", type=int, default=2, help="SLURM: tuners to submit (default 2)")
    tune.add_argument("--wait", action="store_true", help="SLURM: wait until the tuners have finished")
    tune.add_argument("--poll", type=float, default=10.0, help="SLURM: seconds between checks with --wait")
    tune.set_defaults(func=cmd_tune)


def _tune_on_slurm(grid, args: argparse.Namespace) -> int:
    """Submit the tuners; with --wait, wait for them and report the tuned file."""
    import time

    from attnres.config import ConfigError
    from sweeps.slurm import job_alive, squeue_states
    from sweeps.tune_slurm import submit_tuners
    from sweeps.tuned_values import read_tuned
    from sweeps.tuning import _chosen_sizes

    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    if grid.tune.budget is None:
        raise ConfigError(f"{grid.label}: tune.budget is missing; add e.g. tune: {{budget: {{tokens_per_param: 2}}}}")
    _chosen_sizes(grid, args.sizes)  # an unknown size fails here, not in every job
    options = {"variants": args.variants, "sizes": args.sizes, "trials": args.trials, "storage": args.storage}
    options["threads"] = args.threads
    jobs = submit_tuners(grid, args.results, args.workers, options)
    if not args.wait:
        print(f"the tuners write {grid.tuned_file(args.results)}; follow them with squeue, or run this with --wait")
        return 0
    while True:
        states = squeue_states() or {}
        if not any(job_alive(states.get(j)) for j in jobs):
            break
        time.sleep(args.poll)
    path = grid.tuned_file(args.results)
    if not path.is_file():
        print(f"the tuners finished without writing {path}; their logs are in {path.parent / '.submitit'}")
        return 1
    tuned = read_tuned(path, str(grid.lr), grid.tune_command(args.results))
    pairs = sum(len(v) for v in (tuned.get("sizes") or {}).values())
    print(f"tuned {pairs} (size, variant) pair(s) -> {path}")
    return 0


def check_counts(args: argparse.Namespace, *names: str) -> None:
    """Counts given on the command line (--workers, --threads, --trials) must be at least 1: 0 or a negative count
    would otherwise fall back to a default, or be clamped to 1, without a word."""
    from attnres.config import ConfigError

    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"--{name} must be at least 1, got {value}")


def check_given_data(grid, overrides: list[str]) -> None:
    """data.* overrides written on the command line are checked against a prepared folder even at their defaults
    (``data.tokenizer=bytes`` on a BPE folder would otherwise train on its BPE tokens without a word)."""
    from attnres.config import apply_overrides
    from attnres.data.corpus import check_given_settings
    from sweeps.plan import grid_data

    given = apply_overrides({}, list(overrides)).get("data") or {}
    if given:
        for data in grid_data(grid):
            check_given_settings(data, list(given))


def cmd_plan(args: argparse.Namespace) -> int:
    import math

    from attnres.config import ConfigError
    from sweeps.grid import load_grid
    from sweeps.plan import data_summary, format_plan, grid_data, parallelism, plan, tuning_plan

    if args.flops_per_s is not None and not (math.isfinite(args.flops_per_s) and args.flops_per_s > 0):
        raise ConfigError(f"--flops-per-s must be a positive number of FLOP/s (e.g. 3e10), got {args.flops_per_s:g}")
    grid = load_grid(args.grid, args.overrides, args.results)  # expanded once: with its tuned values, if any
    check_given_data(grid, args.overrides)
    launcher = args.launcher
    if args.gpus and launcher == "local" and (grid.slurm or {}).get("gpus_per_node"):
        launcher = "slurm"  # a GPU grid's runs hold the devices of their SLURM resources
    rows = plan(grid, args.results, launcher=launcher, flops_per_s=args.flops_per_s, flops_file=args.flops_file)
    if args.json:
        _print_json(grid.name, rows)
        return 0
    tuning = tuning_plan(grid, args.results, launcher=launcher, flops_per_s=args.flops_per_s)
    print(
        f"sweep {grid.name} ({grid.path or 'grid'}): {len(rows)} runs ({len(grid.sizes)} size(s) x budgets x "
        "variants x lr x "
        f"{len(grid.seeds)} seed(s)) -> {args.results}/{grid.name}/"
    )
    parallel = parallelism(grid, launcher, len(rows))
    data = [data_summary(c) for c in sorted(grid_data(grid), key=str)]
    print(format_plan(grid, rows, launcher=launcher, parallel=parallel, tuning=tuning, data=data, gpus=args.gpus))
    unfinished = any(r.status not in ("done", "diverged", "reuse") for r in rows)
    if launcher == "local" and args.flops_per_s is None and unfinished:
        from attnres.runtime import CpuShare

        share = CpuShare.now()
        if share.busy:
            print(
                f"note: this machine is busy now (load {share.load:.1f} on {share.cores} core(s)): the estimate is for "
                "an idle machine, and runs started now take longer"
            )
    return 0


def cmd_throughput(args: argparse.Namespace) -> int:
    from attnres.config import ConfigError
    from sweeps.grid import load_grid
    from sweeps.throughput import measure, write

    if args.steps < 1 or args.rounds < 1:
        raise ConfigError(f"--steps and --rounds must be at least 1, got {args.steps} and {args.rounds}")
    grid = load_grid(args.grid, args.overrides)
    path = write(args.results, grid, measure(grid, steps=args.steps, rounds=args.rounds))
    print(f"wrote {path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from sweeps.grid import load_grid

    check_counts(args, "workers", "threads")
    grid = load_grid(args.grid, args.overrides, args.results)  # loaded and expanded once: the launchers take it
    check_given_data(grid, args.overrides)
    if args.launcher == "slurm":
        from sweeps.launchers import submit_grid

        summary = submit_grid(grid, args.results, wait=args.wait, poll_s=args.poll, timeout_s=args.timeout)
        if args.wait:
            print(summary.line())
            _print_problems(summary)
            return 0 if summary.ok else 1
        return 0
    from sweeps.launchers import run_grid

    summary = run_grid(grid, args.results, workers=args.workers, progress=not args.no_progress, threads=args.threads)
    print(summary.line())
    _print_problems(summary)
    return 0 if summary.ok else 1


def _print_problems(summary) -> None:
    for r in summary.runs:
        if r.status == "failed" or (r.status == "diverged" and r.trained):
            print(f"  {r.status}: {r.run_id}: {r.error or ''} ({r.run_dir})")
    for r in summary.runs:
        if r.status not in ("done", "diverged", "failed"):
            print(f"  {r.status}: {r.run_id} ({r.run_dir})")


def check_results_folder(folder: str | Path, what: str = "the results folder") -> None:
    """A results folder (or a sweep's folder in it) that is a file: `sweep status` read it as a folder with no runs in
    it and showed every run queued."""
    from attnres.config import ConfigError, path_kind

    kind = path_kind(folder)
    if kind not in ("missing", "a folder"):
        raise ConfigError(
            f"{folder} is {kind}, not a folder: {what} holds run folders; move it away, or give another --results"
        )


def cmd_status(args: argparse.Namespace) -> int:
    from sweeps.expansion import expand_runs
    from sweeps.grid import load_grid
    from sweeps.status import folder_states, format_status, results_summary, sweep_folders, sweep_status
    from sweeps.tuned_values import TunedValuesMissing

    check_results_folder(args.results)
    if args.grid is None:
        if args.json:
            for sweep in sweep_folders(args.results):
                _print_json(sweep, folder_states(args.results, sweep))
            return 0
        lines = results_summary(args.results)
        print("\n".join(lines) if lines else f"no runs under {args.results}/ yet; name a grid to see its plan")
        return 0
    grid = load_grid(args.grid, args.overrides, args.results)
    check_results_folder(Path(args.results) / grid.name, "the sweep's folder (RESULTS/<sweep>)")
    try:
        planned = expand_runs(grid, args.results)
    except TunedValuesMissing as err:  # the grid's runs are not known before tuning: show what exists
        if args.json:
            _print_json(grid.name, folder_states(args.results, grid.name))
            return 0
        print(format_status(folder_states(args.results, grid.name), grid.name))
        tuning = folder_states(args.results, grid.tune_sweep)
        if tuning:
            print(format_status(tuning, grid.tune_sweep).splitlines()[-1])
        print(f"note: {err}")
        return 0
    states = sweep_status(planned, args.results)
    if args.json:
        _print_json(grid.name, states)
        return 0
    print(format_status(states, grid.name))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from sweeps.grid import load_grid
    from sweeps.tuning import tune

    check_counts(args, "trials", "threads", "workers")
    grid = load_grid(args.grid, args.overrides)
    if args.launcher == "slurm":
        return _tune_on_slurm(grid, args)
    from sweeps.launchers import check_slurm_tasks

    check_slurm_tasks(list(grid.runs))  # every trial would fail on them
    best = tune(
        grid,
        args.results,
        variants=args.variants,
        sizes=args.sizes,
        trials=args.trials,
        storage=args.storage,
        threads=args.threads,
    )
    print(f"tuned {len(best)} (size, variant) pair(s) -> {grid.tuned_file(args.results)}")
    return 0 if best else 1
