"""Run a grid: :func:`run_grid` (local workers) and :func:`submit_grid` (SLURM job arrays).

Both expand the whole grid first (so a bad grid fails before anything runs), check the data, and only
train what is not finished: ``done`` and ``diverged`` runs are skipped, interrupted ones resume from their
checkpoints, failed ones are tried again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnres.config import ConfigError
from attnres.storage.writable import folder_problem
from sweeps.claim import RunOutcome
from sweeps.expansion import expand_runs
from sweeps.grid import load_grid
from sweeps.local_pool import SweepSummary, run_local
from sweeps.specs import Grid, PlannedRun


def _grid(grid_or_path: Grid | str | Path, overrides: list[str] | tuple[str, ...], results: str | Path) -> Grid:
    if isinstance(grid_or_path, Grid):
        if overrides:
            raise ConfigError("pass overrides to load_grid, not with an already-loaded Grid")
        return grid_or_path
    return load_grid(grid_or_path, overrides, results)


def check_data(planned: list[PlannedRun]) -> None:
    """A corpus path that does not exist fails the sweep before it starts, not every run one by one."""
    for corpus in sorted({r.cfg.data.corpus for r in planned}):
        if corpus != "builtin" and not Path(corpus).expanduser().exists():
            raise ConfigError(
                f"data.corpus={corpus!r} does not exist; point it at your text (a file or a folder of .txt files)"
            )


def check_slurm_tasks(planned: list[PlannedRun]) -> None:
    """SLURM task variables that every run would fail on (:func:`attnres.runtime.check_slurm`) fail the sweep before
    it starts, not every run one by one."""
    from attnres.runtime import check_slurm

    for runtime in dict.fromkeys(r.cfg.runtime for r in planned):
        check_slurm(runtime)


def check_memory(planned: list[PlannedRun], launcher: str) -> None:
    """Runs whose estimated peak will not fit fail the sweep before it starts, each named with the setting that would
    fit (as `attnres sweep plan` shows them): against runtime.device_memory_gb where it is set, else, for runs on
    this machine's CPU, against the memory it has available (:func:`attnres.training.memory.fit_problem`)."""
    if launcher != "local" and all(r.cfg.runtime.device_memory_gb is None for r in planned):
        return
    from attnres.runtime import uses_gpu
    from attnres.training.memory import fit_problem
    from sweeps.plan import device_of

    problems = []
    for run in planned:
        kind, devices = device_of(run, launcher)
        gpu = kind == "gpu" or (launcher == "local" and uses_gpu(run.cfg.runtime))
        problem = fit_problem(run.cfg, gpu, max(1, devices))
        if problem:
            problems.append(problem)
    if problems:
        more = f"; and {len(problems) - 1} more run(s) (attnres sweep plan shows them all)" if len(problems) > 1 else ""
        raise ConfigError(f"will not fit in memory: {problems[0]}{more}")


def reuse_runs(grid: Grid, planned: list[PlannedRun], results_dir: str | Path, log: Callable[[str], None]) -> None:
    """``reuse:``: copy the runs finished under the grid's other sweeps before anything is trained here."""
    if not grid.reuse:
        return
    from sweeps.reuse import reuse_finished

    copied = reuse_finished([r.cfg for r in planned], results_dir, grid.name, grid.reuse)
    if copied:
        sources = sorted({source for _, source in copied})
        log(f"reuse: copied {len(copied)} finished run(s) with the same run id from {', '.join(sources)}")


def run_grid(
    grid_or_path: Grid | str | Path,
    results_dir: str | Path,
    workers: int = 1,
    progress: bool = True,
    threads: int | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    log: Callable[[str], None] = print,
) -> SweepSummary:
    """Train a grid locally with ``workers`` processes and return the summary (counts and per-run outcomes).

    ``grid_or_path``: a :class:`Grid`, a grid file, or a shipped grid's name (``"smoke"``). ``threads``: torch
    threads per worker (default cores // workers). Safe to call again: finished runs are skipped.
    """
    grid = _grid(grid_or_path, overrides, results_dir)
    planned = expand_runs(grid, results_dir)
    check_slurm_tasks(planned)
    check_data(planned)
    check_memory(planned, "local")
    reuse_runs(grid, planned, results_dir, log)
    return run_local(
        [r.cfg for r in planned],
        results_dir,
        workers=workers,
        threads=threads,
        progress=progress,
        log=log,
        sweep=grid.name,
    )


def submit_grid(
    grid_or_path: Grid | str | Path,
    results_dir: str | Path,
    wait: bool = False,
    poll_s: float = 30.0,
    timeout_s: float | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    log: Callable[[str], None] = print,
) -> SweepSummary:
    """Submit the unfinished runs of a grid to SLURM (skipping runs done, queued or running); optionally wait.

    Without ``wait`` the summary lists the runs' states right after submission.
    """
    from sweeps.slurm import job_alive, submit
    from sweeps.status import sweep_status, wait_for

    grid = _grid(grid_or_path, overrides, results_dir)
    planned = expand_runs(grid, results_dir)
    check_data(planned)
    check_memory(planned, "slurm")
    if why := folder_problem(Path(results_dir) / grid.name):  # before a job is submitted to fail in it
        raise ConfigError(
            f"cannot write the results folder {Path(results_dir) / grid.name}: {why}; pick another --results"
        )
    reuse_runs(grid, planned, results_dir, log)
    states = sweep_status(planned, results_dir)
    # not finished, not being trained, and no live SLURM job for it (pending or requeued)
    todo = [
        r
        for r, s in zip(planned, states)
        if s.state not in ("done", "diverged", "running") and not job_alive(s.job_state)
    ]
    finished = sum(s.state in ("done", "diverged") for s in states)
    if not todo:
        log(
            f"nothing to submit: of {len(planned)} runs, {finished} are finished and {len(planned) - finished} "
            "queued or running"
        )
    submitted = submit(todo, results_dir, grid.name, log=log) if todo else []
    if wait and len(planned) > finished:
        states = wait_for(planned, results_dir, poll_s=poll_s, timeout_s=timeout_s, log=log)
    elif submitted:
        states = sweep_status(planned, results_dir)
        log(f"follow it with: attnres sweep status {grid.path or grid.name} --results {results_dir}")
    sent = {r.run_id for r, _ in submitted}
    outcomes = tuple(
        RunOutcome(s.run_id, s.run_dir, s.state, s.run_id in sent, s.step, s.val_loss, s.detail or None) for s in states
    )
    return SweepSummary(
        grid.name, str(results_dir), outcomes, skipped_done=finished, submitted=tuple(j for _, j in submitted)
    )
