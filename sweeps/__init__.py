"""Sweeps: grid files a user copies and edits (``sweeps/*.yaml``), and the code that plans, runs and tunes them.

    from sweeps import load_grid, expand, run_grid
    grid = load_grid("smoke")                       # or a path; validated as a whole
    runs = expand(grid)                             # list[RunConfig], stable run ids
    summary = run_grid(grid, "results", workers=1)  # local workers; skips finished runs
    summary.counts, summary.statuses

Also: ``sweeps.plan.plan(grid, results)`` (the plan rows), ``sweeps.status.sweep_status(expand_runs(grid),
results)``, ``sweeps.tuning.tune(grid, results)``.

Modules: grid (the grid file and load_grid), sections (each section's schema and reader), specs (Grid and the
parsed specs, PlannedRun), ladder (sizes, budgets, model_of_size, tokens_for), expansion (the runs of a grid),
branches (WSD trunks and branches), lookup (grids by name), plan (table, time estimate), launchers (run_grid,
submit_grid), local_pool (worker processes), slurm (submitit arrays), requeue (SIGUSR1 -> checkpoint + requeue),
status, tuning (Optuna), tuned_values (the tuned file), claim (claim + train one run), cli. See docs/sweeps.md.
Nothing here imports torch at import time.
"""

from sweeps.claim import RunOutcome
from sweeps.expansion import expand_runs
from sweeps.grid import expand, load_grid
from sweeps.ladder import model_of_size, tokens_for
from sweeps.launchers import run_grid, submit_grid
from sweeps.local_pool import SweepSummary
from sweeps.specs import Grid

__all__ = [
    "Grid",
    "RunOutcome",
    "SweepSummary",
    "expand",
    "expand_runs",
    "load_grid",
    "model_of_size",
    "run_grid",
    "submit_grid",
    "tokens_for",
]
