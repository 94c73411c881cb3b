"""The plan of a sweep: the table of its runs (sizes, budgets, FLOPs, estimated time) without training anything.

Time estimates are the run's FLOPs (training plus evaluation) divided by a throughput, plus a fixed overhead
per run (:data:`OVERHEAD_S`). The throughput is the ``--flops-per-s`` flag if given; else measured on finished
runs of the sweep in the results directory (``tokens_per_s x flops_per_token``; a run of the same shape first,
else the median over runs on the same kind of device); else a documented default (:data:`DEFAULT_FLOPS_PER_S`).
No torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from attnres.costs import run_budget
from sweeps.claim import read_status
from sweeps.grid import Grid, PlannedRun, expand_runs

DEFAULT_FLOPS_PER_S = {
    # Sustained training FLOP/s of one run by the project's FLOP counter (not peak). CPU: 2 cores / 2 threads of
    # a laptop-class x86 core at d_model 64-128 (measured 20-100 GFLOP/s; small models are overhead-bound).
    "cpu": 3e10,
    # One GPU: an A100/H100-class device in bf16 at ~30-40 % of its dense peak; multiplied by the GPUs of a run.
    "gpu": 1.5e14,
}


# Fixed cost of a run beyond its FLOPs: process start, data, checkpoints (CPU); plus compile / NCCL set-up (GPU).
OVERHEAD_S = {"cpu": 3.0, "gpu": 60.0}


@dataclass(frozen=True)
class PlanRow:
    run_id: str
    size: str
    variant: str
    n_blocks: int | None
    lr: float
    seed: int
    params: int
    tokens: int
    steps: int
    flops: float  # training FLOPs (the compute axis)
    est_s: float
    rate_source: str  # default | calibrated | given
    status: str | None  # the run's status in the results directory, if it exists


def eval_flops(run: PlannedRun) -> float:
    """Forward FLOPs of every evaluation of the run (every eval_interval steps and at the end)."""
    cfg = run.cfg
    budget = run_budget(cfg)
    evals = math.ceil(budget.steps / cfg.train.eval_interval)
    return evals * cfg.train.eval_tokens * budget.flops_per_token / 3.0


def device_of(run: PlannedRun, launcher: str) -> tuple[str, int]:
    """(cpu | gpu, number of devices) a run uses under a launcher."""
    if launcher == "slurm":
        gpus = int(run.slurm.get("gpus_per_node") or 0) * int(run.slurm.get("nodes") or 1)
        return ("gpu", gpus) if gpus else ("cpu", 1)
    rt = run.cfg.runtime
    return ("gpu", rt.devices * rt.num_nodes) if rt.accelerator == "gpu" else ("cpu", 1)


def measured_rates(results: str | Path | None, sweep: str) -> dict[tuple, float]:
    """FLOP/s of finished runs in ``RESULTS/<sweep>``: keyed by shape and by device kind ('*', kind)."""
    if results is None:
        return {}
    folder = Path(results) / sweep
    if not folder.is_dir():
        return {}
    shapes: dict[tuple, list[float]] = {}
    for run_file in folder.glob("*/run.parquet"):
        row = read_status(run_file.parent)
        if not row or row["status"] != "done" or not row.get("tokens_per_s"):
            continue
        rate = row["tokens_per_s"] * row["flops_per_token"]
        kind = "cpu" if str(row.get("device") or "cpu") == "cpu" else "gpu"
        shapes.setdefault(
            (kind, row["n_layer"], row["d_model"], row["seq_len"], row["variant"], row["n_blocks"]), []
        ).append(rate)
        shapes.setdefault(("*", kind), []).append(rate)
    return {k: statistics.median(v) for k, v in shapes.items()}


def plan(
    grid: Grid, results: str | Path | None = None, launcher: str = "local", flops_per_s: float | None = None
) -> list[PlanRow]:
    """One row per run of the grid, in grid order."""
    runs = expand_runs(grid, results)
    if launcher == "slurm":
        from sweeps.slurm import slurm_groups

        slurm_groups(runs)  # the batch must split over each run's GPUs
    rates = measured_rates(results, grid.name)
    rows = []
    for run in runs:
        cfg = run.cfg
        budget = run_budget(cfg)
        kind, devices = device_of(run, launcher)
        shape = (
            kind,
            cfg.model.n_layer,
            cfg.model.d_model,
            cfg.model.seq_len,
            cfg.model.residual,
            cfg.model.effective_n_blocks,
        )
        if flops_per_s:
            rate, source = flops_per_s * max(1, devices), "given"
        elif shape in rates:
            rate, source = rates[shape], "calibrated"
        elif ("*", kind) in rates:
            rate, source = rates[("*", kind)], "calibrated"
        else:
            rate, source = DEFAULT_FLOPS_PER_S[kind] * max(1, devices), "default"
        total = budget.flops + eval_flops(run)
        status = None
        if results is not None:
            row = read_status(Path(results) / cfg.sweep / cfg.run_id)
            status = row["status"] if row else None
        rows.append(
            PlanRow(
                cfg.run_id,
                run.size.name,
                run.variant,
                cfg.model.effective_n_blocks if cfg.model.residual == "block" else None,
                cfg.train.lr,
                cfg.train.seed,
                budget.params,
                budget.tokens,
                budget.steps,
                budget.flops,
                total / rate + OVERHEAD_S[kind],
                source,
                status,
            )
        )
    return rows


def human_time(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def human_count(value: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def format_plan(grid: Grid, rows: list[PlanRow], launcher: str = "local", parallel: int = 1) -> str:
    """The plan as a fixed-width table with a totals line."""
    header = ("run_id", "variant", "N", "params", "tokens", "steps", "FLOPs", "lr", "seed", "est. time", "status")
    table = [header]
    for r in rows:
        table.append(
            (
                r.run_id,
                r.variant,
                "-" if r.n_blocks is None else str(r.n_blocks),
                human_count(r.params),
                human_count(r.tokens),
                str(r.steps),
                f"{r.flops:.3g}",
                f"{r.lr:.3g}",
                str(r.seed),
                human_time(r.est_s),
                r.status or "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    total_s = sum(r.est_s for r in rows if r.status not in ("done", "diverged"))
    sources = sorted({r.rate_source for r in rows})
    wall = total_s / max(1, parallel)
    how = "one after another on this machine's CPU" if launcher == "local" else f"up to {parallel} at a time"
    lines.append(
        f"{len(rows)} runs, {sum(r.flops for r in rows):.3g} training FLOPs; estimated {human_time(wall)} of wall time "
        f"for the unfinished runs ({how}; throughput: {'/'.join(sources)}"
        + (
            f", {DEFAULT_FLOPS_PER_S['cpu']:.2g} FLOP/s per CPU run"
            if "default" in sources and launcher == "local"
            else ""
        )
        + "; see --flops-per-s)"
    )
    return "\n".join(lines)


def parallelism(grid: Grid, launcher: str, n_runs: int) -> int:
    if launcher != "slurm":
        return 1  # local workers share one machine's cores: more workers do not make the sum faster
    from sweeps.slurm import resources

    return max(1, min(n_runs, resources(grid.slurm).array_parallelism))
