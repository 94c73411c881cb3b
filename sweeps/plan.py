"""The plan of a sweep: the table of its runs (sizes, budgets, FLOPs, estimated time) without training anything.

Time estimates are the run's FLOPs (training plus evaluation) divided by a throughput, plus a fixed overhead
per run (:data:`OVERHEAD_S`) and, with the default CPU throughput, per step (:data:`STEP_OVERHEAD_S`: small models
are overhead-bound). The throughput is the ``--flops-per-s`` flag if given; else measured on finished runs of the
sweep in the results directory (``tokens_per_s x flops_per_token``, which already holds the per-step overhead; a
run of the same shape first, else the median over runs on the same kind of device); else a default
(:data:`DEFAULT_FLOPS_PER_S`), fitted to the committed CPU study's runs.

A grid with ``lr: tuned`` planned before ``attnres tune`` ran shows its runs with the learning rate "tuned" (their
run ids are not known until then) and the tuning runs that come first.

With ``runtime.device_memory_gb`` set, every run also gets its estimated peak memory per device (a simulated
training step, :mod:`attnres.training.memory`; this imports torch and takes about a second per model shape), runs
that will not fit are marked ``!``, and the plan names the micro-batch or checkpointing setting that would fit.
Otherwise no torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnres.config import DataConfig
from attnres.costs import run_budget, states_problem
from attnres.data.order import repeat_fraction
from attnres.runtime import available_memory_gib, say
from attnres.training.branches import branch_step
from sweeps.claim import read_status
from sweeps.expansion import expand_runs, make_run, variant_labels
from sweeps.specs import Grid, PlannedRun

DEFAULT_FLOPS_PER_S = {
    # Sustained training FLOP/s of one run by the project's FLOP counter (not peak). CPU: 2 threads of a laptop- or
    # server-class x86 core pair; with STEP_OVERHEAD_S, a least-squares fit of wall_s = a + steps * s + FLOPs / R to
    # the 81 finished runs of studies/cpu_small (d_model 48-112): R = 9.5e10, s = 11.5 ms, a = 3.3 s.
    "cpu": 9.5e10,
    # One GPU: an A100/H100-class device in bf16 at ~30-40 % of its dense peak; multiplied by the GPUs of a run.
    "gpu": 1.5e14,
}


# Fixed cost of a run beyond its FLOPs and steps: model, trainer, data, checkpoints in a warm worker (CPU); plus compile
# and NCCL set-up in a fresh job (GPU). On CPU the fit's intercept (3.3 s) is mostly evaluation, which the step and
# FLOP terms already hold for tiny runs: the smoke grid's 6 runs took 9 s in all on a quiet 2-core machine.
OVERHEAD_S = {"cpu": 0.3, "gpu": 60.0}
# Once per local sweep: the launcher and its workers start and import torch.
SWEEP_OVERHEAD_S = 4.0
# Per optimizer step beyond its FLOPs with the default CPU throughput (Python, the optimizer, logging): see above.
STEP_OVERHEAD_S = {"cpu": 0.0115, "gpu": 0.0}
MEMORY_LINES = 5  # runs named one by one in the plan's memory warning
TO_BE_TUNED = "tuned"  # the lr column of a run whose learning rate `attnres tune` has not chosen yet


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
    to_be_tuned: bool = False  # lr: tuned, not tuned yet (lr and run id are stand-ins)
    epochs: float | None = None  # passes over the training split (None: the data is not prepared yet)
    memory_gib: float | None = None  # estimated peak per device (None: runtime.device_memory_gb is not set)
    memory_problem: str | None = None  # why the run will not fit and what would (None: it fits)
    device: str = "cpu"  # cpu | gpu: the kind of device the estimate is for
    devices: int = 1  # devices the run holds while it trains (nodes x GPUs per node on SLURM)
    repeat: float | None = None  # share of the tokens it reads that it has read before (train.sampler; None: unknown)


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
        if run_file.parent.name.startswith("."):  # a copy being made by reuse: (sweeps/reuse.py)
            continue
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
    grid: Grid,
    results: str | Path | None = None,
    launcher: str = "local",
    flops_per_s: float | None = None,
    flops_file: str | Path | None = None,
) -> list[PlanRow]:
    """One row per run of the grid, in grid order (a grid not tuned yet: its runs with a stand-in lr).
    ``flops_file``: per-device FLOP/s measured (:func:`sweeps.packing.file_rates`), before the results' own."""
    runs = expand_runs(grid, results, untuned_ok=True)
    if launcher == "slurm":
        from sweeps.slurm import slurm_groups

        slurm_groups(runs)  # the batch must split over each run's GPUs
    rates = measured_rates(results, grid.name)
    if flops_file is not None:
        from sweeps.packing import file_rates

        rates = {**rates, **{("file", *k): v for k, v in file_rates(flops_file).items()}}
    return plan_rows(runs, rates, results, launcher, flops_per_s, grid)


def tuning_plan(
    grid: Grid, results: str | Path | None = None, launcher: str = "local", flops_per_s: float | None = None
) -> list[PlanRow]:
    """The trials ``attnres tune`` trains before a grid with ``lr: tuned`` can run (none once it has run): for
    every size and tuned variant, ``tune.trials`` runs at ``tune.budget`` plus ``tune.finalists`` runs with a
    second seed (pruned trials stop earlier; a widened range adds half as many again, not counted)."""
    if not isinstance(grid.lr, str) or grid.tune.budget is None:
        return []
    if grid.tuned_file(results if results is not None else "results").is_file():
        return []
    runs = []
    for size in grid.sizes:
        known = variant_labels(grid, size)
        for label in [v for v in grid.tune.variants if v == "baseline" or v in known]:
            cfg = make_run(grid, size, label, grid.tune.budget, grid.seeds[0], sweep=grid.tune_sweep)
            runs.append(PlannedRun(cfg, size, label, grid.tune.budget, {}, to_be_tuned=True))
    rows = plan_rows(runs, measured_rates(results, grid.tune_sweep), None, launcher, flops_per_s)
    return [row for row in rows for _ in range(grid.tune.trials + grid.tune.finalists)]  # every trial costs the same


@dataclass(frozen=True)
class DataSummary:
    """What a plan says about a grid's data: its training tokens if it is prepared (else how to prepare it)."""

    corpus: str
    tokenizer: str
    vocab_size: int | None
    train_tokens: int | None
    folder: str | None

    def line(self) -> str:
        if not Path(self.corpus).expanduser().exists() and self.corpus != "builtin" and not self.folder:
            return f"data: {self.corpus} is not on this machine, so its token count and the epochs are unknown here"
        head = f"data: {self.corpus} ({self.tokenizer}, vocabulary {self.vocab_size:,})"
        if self.train_tokens is None:
            return (
                f"{head}: not prepared yet, so its token count and the epochs are unknown; the first run prepares it, "
                f"or run `attnres data prepare {self.corpus} --tokenizer {self.tokenizer} --out DIR` first"
            )
        return f"{head}: {human_count(self.train_tokens)} training tokens ({self.folder})"


def data_summary(cfg: DataConfig) -> DataSummary:
    """The data of a run, counted from its manifest when it is prepared (the built-in corpus is prepared here:
    a second of work); nothing is tokenized for a plan otherwise."""
    from attnres.data.corpus import cached_folder, corpus_folder, data_vocab_size, is_prepared_folder, read_manifest
    from attnres.data.sources import is_glob

    if cfg.corpus == "builtin" and cfg.tokenizer == "bytes":
        folder: Path | None = corpus_folder(cfg)
    elif is_prepared_folder(cfg.corpus):
        folder = Path(cfg.corpus).expanduser()
    elif Path(cfg.corpus).expanduser().exists() or is_glob(cfg.corpus):
        folder = cached_folder(cfg)
    else:
        folder = None
    tokens = None
    if folder is not None and (folder / "manifest.json").is_file():
        manifest = read_manifest(folder)
        tokens = int(manifest["splits"]["train"]["tokens"])
        tokenizer = manifest["tokenizer"]["spec"]
    else:
        folder, tokenizer = None, cfg.tokenizer
    return DataSummary(cfg.corpus, tokenizer, data_vocab_size(cfg), tokens, None if folder is None else str(folder))


def grid_data(grid: Grid) -> set[DataConfig]:
    """The data settings of a grid's runs (one, unless sizes or overrides differ; tuned values change none)."""
    return {run.cfg.data for run in grid.runs}


def _reusable(cfg, results: Path, grid: Grid) -> bool:
    """Whether ``sweep run`` would copy this run from one of the grid's ``reuse:`` sweeps (sweeps/reuse.py)."""
    from sweeps.reuse import FINISHED, source_sweep

    if (results / cfg.sweep / cfg.run_id).exists():
        return False  # a folder of its own (a run started here): trained here
    for other in grid.reuse:
        source = source_sweep(cfg.sweep, grid.name, other)
        if source is None:
            return False
        row = read_status(results / source / cfg.run_id)
        if row is not None and row.get("status") in FINISHED:
            return True
    return False


def _rate(run: PlannedRun, kind: str, devices: int, rates: dict, flops_per_s: float | None) -> tuple[float, str]:
    """A run's training FLOP/s and where it comes from: given, measured (a throughput file), calibrated on the
    results' finished runs of its shape (or its kind of device), or the default."""
    cfg = run.cfg
    shape = (
        kind,
        cfg.model.n_layer,
        cfg.model.d_model,
        cfg.model.seq_len,
        cfg.model.variant,  # the results' variant column: an ablation switch is a path of its own speed
        cfg.model.effective_n_blocks,
    )
    measured = ("file", cfg.model.n_layer, cfg.model.d_model, run.variant)
    if flops_per_s:
        return flops_per_s * max(1, devices), "given"
    if measured in rates or ("file", "*") in rates:
        return rates.get(measured, rates.get(("file", "*"))) * max(1, devices), "file"
    if shape in rates:
        return rates[shape], "calibrated"
    if ("*", kind) in rates:
        return rates[("*", kind)], "calibrated"
    return DEFAULT_FLOPS_PER_S[kind] * max(1, devices), "default"


def _memory(cfg: Any, kind: str, devices: int, here: float | None) -> tuple[float | None, str | None]:
    """(peak GiB per device, the problem if it does not fit): estimated where the run's config names its device's
    memory, else the lower bound against this machine's memory (``here``) for a CPU run."""
    memory_gib = memory_problem = None
    if cfg.runtime.device_memory_gb is not None:
        from attnres.training.memory import check_fit, problem_text

        fit = check_fit(cfg, kind == "gpu", max(1, devices), cfg.runtime.device_memory_gb)
        memory_gib, memory_problem = fit.estimate.peak_gib, problem_text(cfg, fit)
    elif here is not None and kind == "cpu":
        memory_problem = states_problem(cfg, here)
    return memory_gib, memory_problem


def _status(run: PlannedRun, results: str | Path | None, grid: Grid | None) -> str | None:
    """The run's status in ``results`` (``reuse`` where a ``reuse:`` sweep has it finished), None where unknown."""
    cfg = run.cfg
    status = None
    if results is not None and not run.to_be_tuned:
        row = read_status(Path(results) / cfg.sweep / cfg.run_id)
        status = row["status"] if row else None
        if row is None and grid is not None and _reusable(cfg, Path(results), grid):
            status = "reuse"
    return status


def plan_rows(
    runs: list[PlannedRun],
    rates: dict,
    results: str | Path | None,
    launcher: str,
    flops_per_s: float | None,
    grid: Grid | None = None,
) -> list[PlanRow]:
    """The plan's rows; ``grid``: its ``reuse:`` sweeps, whose finished runs of equal run id are copied, not
    trained (status ``reuse``, no time)."""
    rows = []
    data = {cfg: data_summary(cfg) for cfg in {run.cfg.data for run in runs}}
    shapes = {run.cfg.model for run in runs if run.cfg.runtime.device_memory_gb is not None}
    if len(shapes) > 2:  # a second or more each: say so, rather than seem to hang
        say(f"estimating the memory of {len(shapes)} model shapes (a simulated training step each) ...")
    # this machine's memory, for the runs it would train without runtime.device_memory_gb (the lower bound only:
    # weights, gradients and optimizer state; no torch), as `attnres sweep run` and `attnres train` check it
    here = available_memory_gib() if launcher == "local" else None
    for run in runs:
        cfg = run.cfg
        budget = run_budget(cfg)
        kind, devices = device_of(run, launcher)
        rate, source = _rate(run, kind, devices, rates, flops_per_s)
        # a WSD branch trains only its decay; the steps before it are its trunk's (a row of its own)
        own = budget.steps - branch_step(cfg) if run.role == "branch" else budget.steps
        total = budget.flops * own / budget.steps + eval_flops(run)
        per_step = STEP_OVERHEAD_S[kind] if source == "default" else 0.0
        memory_gib, memory_problem = _memory(cfg, kind, devices, here)
        status = _status(run, results, grid)
        rows.append(
            PlanRow(
                cfg.run_id,
                run.size.name,
                run.variant + (" trunk" if run.role == "trunk" else ""),
                cfg.model.effective_n_blocks if cfg.model.residual == "block" else None,
                cfg.train.lr,
                cfg.train.seed,
                budget.params,
                budget.tokens,
                budget.steps,
                budget.flops,
                total / rate + OVERHEAD_S[kind] + per_step * own,
                source,
                status,
                run.to_be_tuned,
                None if (n := data[cfg.data].train_tokens) is None else budget.tokens / n,
                memory_gib,
                memory_problem,
                kind,
                max(1, devices),
                None
                if n is None
                else repeat_fraction(cfg.train.sampler, budget.steps * cfg.train.batch_size, n, cfg.model.seq_len),
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
    if seconds < 2 * YEAR_S:
        return f"{seconds / 86400:,.1f}d"
    return f"{seconds / YEAR_S:,.0f} years"


YEAR_S = 365.25 * 86400
# What the default throughputs are, said wherever a plan uses one: neither is measured on the machine planned for.
DEFAULT_SOURCE = {
    "cpu": "fitted to the committed CPU study's runs on an idle 2-core machine",
    "gpu": "an A100/H100-class guess, never measured on this project's runs",
}


def throughput_text(rows: list[PlanRow], launcher: str) -> str:
    """The throughput behind the estimates: measured (calibrated), given, or which defaults, with their figures."""
    sources = sorted({r.rate_source for r in rows})
    text = f"throughput: {'/'.join(sources)}"
    kinds = sorted({r.device for r in rows if r.rate_source == "default"})
    if not kinds:
        return text + "; see --flops-per-s"
    figures = {
        "cpu": f"{DEFAULT_FLOPS_PER_S['cpu']:.2g} FLOP/s and {1e3 * STEP_OVERHEAD_S['cpu']:.3g} ms a step per CPU run",
        "gpu": f"{DEFAULT_FLOPS_PER_S['gpu']:.2g} FLOP/s per GPU",
    }
    assumed = "; ".join(f"{figures[k]} ({DEFAULT_SOURCE[k]})" for k in kinds)
    return (
        f"{text}; the defaults are not measured here: {assumed}; once a few runs have finished the plan uses their "
        "speed, or give --flops-per-s"
    )


def human_count(value: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def format_plan(
    grid: Grid,
    rows: list[PlanRow],
    launcher: str = "local",
    parallel: int = 1,
    tuning: list[PlanRow] = (),
    data: list[DataSummary] = (),
    gpus: int | None = None,
) -> str:
    """The plan as a fixed-width table with a totals line (and the tuning that comes first, if any)."""
    memory = any(r.memory_gib is not None for r in rows)
    lines = _table_lines(grid, rows, memory)
    total_s = sum(r.est_s for r in rows if r.status not in ("done", "diverged", "reuse"))
    wall = total_s / max(1, parallel) + (SWEEP_OVERHEAD_S if launcher == "local" and total_s else 0.0)
    on_cpu = all(r.device == "cpu" for r in rows)
    here = "this machine's CPU" if on_cpu else "this machine"
    how = f"one after another on {here}" if launcher == "local" else f"up to {parallel} at a time"
    lines.append(
        f"{len(rows)} runs, {sum(r.flops for r in rows):.3g} training FLOPs; estimated {human_time(wall)} of wall time "
        f"for the unfinished runs ({how}; {throughput_text(rows, launcher)})"
    )
    grid_gpus = int((grid.slurm or {}).get("gpus_per_node") or 0)
    if launcher == "local" and on_cpu and grid_gpus and not gpus:
        lines.append(
            f"note: this grid asks SLURM for {grid_gpus} GPU(s) per node (slurm.gpus_per_node): it is sized for a "
            "cluster, not this CPU; plan it with --launcher slurm or --gpus N"
        )
    if gpus:
        lines.extend(packing_lines(rows, gpus))
    for summary in data or ():
        lines.append(summary.line())
    lines += _warning_lines(grid, rows, memory)
    if tuning:
        tune_s = sum(r.est_s for r in tuning) / max(1, parallel)
        lines.append(
            f"tuning first: {len(tuning)} trial runs ({grid.tune.trials} + {grid.tune.finalists} finalists per size "
            f"and tuned variant, {grid.tune.budget.label}, at most; pruned trials stop early), estimated "
            f"{human_time(tune_s)}"
        )
    return "\n".join(lines)


def _table_lines(grid: Grid, rows: list[PlanRow], memory: bool) -> list[str]:
    """The plan's fixed-width table, one line per run under a header (a memory column where there are
    estimates, a cell column for an architecture grid)."""
    header = (
        "run_id", "variant", "N", "params", "tokens", "epochs", "repeat", "steps", "FLOPs", "lr", "seed", "est. time",
        "status",
    )  # fmt: skip
    if memory:
        header = (*header[:-2], "mem GiB", *header[-2:])
    cells = grid.architecture is not None  # a cell's run id does not show its heads: its own column does
    if cells:
        header = (header[0], "cell", *header[1:])
    table = [header]
    for r in rows:
        mem = () if not memory else (f"{r.memory_gib:.3g}" + ("!" if r.memory_problem else ""),)
        table.append(
            (
                r.run_id.rsplit("-", 1)[0] + "-?" if r.to_be_tuned else r.run_id,
                *((r.size,) if cells else ()),
                r.variant,
                "-" if r.n_blocks is None else str(r.n_blocks),
                human_count(r.params),
                human_count(r.tokens),
                "?" if r.epochs is None else f"{r.epochs:.2g}",
                "?" if r.repeat is None else f"{r.repeat:.0%}",
                str(r.steps),
                f"{r.flops:.3g}",
                TO_BE_TUNED if r.to_be_tuned else f"{r.lr:.3g}",
                str(r.seed),
                *mem,
                human_time(r.est_s),
                r.status or "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]


def _warning_lines(grid: Grid, rows: list[PlanRow], memory: bool) -> list[str]:
    """What the plan warns of: runs that do not fit in memory, runs of more than one epoch, learning rates still
    to be tuned, and the rate sweep's lines."""
    lines: list[str] = []
    if memory:
        lines.extend(memory_lines(rows))
    elif unfit := [r for r in rows if r.memory_problem]:  # this machine's memory, without runtime.device_memory_gb
        lines.append(
            f"warning: {len(unfit)} run(s) will not fit in this machine's memory, and `attnres sweep run` and "
            "`attnres train` refuse them:"
        )
        lines += [f"  {r.memory_problem}" for r in unfit[:MEMORY_LINES]]
        if len(unfit) > MEMORY_LINES:
            lines.append(f"  and {len(unfit) - MEMORY_LINES} more")
    over = [r for r in rows if r.epochs is not None and r.epochs > 1]
    if over:
        lines.append(
            f"warning: {len(over)} run(s) need more than one epoch of the data (up to {max(r.epochs for r in over):.2g}"
            "): their later batches repeat text they have seen; use more data or smaller budgets"
        )
    if any(r.to_be_tuned for r in rows):
        lines.append(
            f"lr {grid.lr}: the learning rates come from `{grid.tune_command('RESULTS')}`, which has not run yet; "
            "the run ids (-?) are known after it"
        )
    return lines + rate_sweep_lines(rows)


def rate_sweep_lines(rows: list[PlanRow]) -> list[str]:
    """For a grid that trains several learning rates per (size, variant, budget): how many, and how to read and
    widen them (the envelope's edge flag)."""
    cells: dict[tuple, set[float]] = {}
    for r in rows:
        if not r.variant.endswith("trunk") and not r.to_be_tuned:
            cells.setdefault((r.variant, r.size, r.tokens), set()).add(r.lr)
    counts = sorted({len(v) for v in cells.values()})
    if not cells or counts[-1] < 2:
        return []
    low, high = min(min(v) for v in cells.values()), max(max(v) for v in cells.values())
    return [
        f"learning rates: {'-'.join(map(str, dict.fromkeys([counts[0], counts[-1]])))} per (size, variant, budget), "
        f"{low:.3g} to {high:.3g}; `attnres fit --lr envelope` reads each cell's loss at its best rate (3 rates at "
        "least) and flags a minimum at an end of the rates (EDGE): add rates past that end to the grid's lr: "
        "(the runs already trained keep their ids)"
    ]


def packing_lines(rows: list[PlanRow], gpus: int) -> list[str]:
    """``--gpus N``: the unfinished runs packed onto N devices (:mod:`sweeps.packing`): elapsed time, utilisation,
    and the runs that strand devices or cannot run at all."""
    from sweeps.packing import Job, pack

    todo = [r for r in rows if r.status not in ("done", "diverged", "reuse")]
    packed = pack([Job(r.run_id, r.devices, r.est_s) for r in todo], gpus)
    sizes = sorted({r.devices for r in todo})
    lines = [
        f"packed onto {gpus} devices ({'/'.join(map(str, sizes)) or '-'} per run): {human_time(packed.elapsed_s)} "
        f"elapsed for the unfinished runs, the longest first as devices free up; {packed.utilisation:.0%} of the "
        f"device time busy (the sum of the runs: {human_time(sum(r.est_s * r.devices for r in todo) / gpus)} "
        "if they packed perfectly)"
    ]
    by_id = {r.run_id: r for r in todo}
    for run_id, idle in packed.stranded.items():
        r = by_id[run_id]
        lines.append(
            f"  strands {idle} device(s): {run_id} ({r.devices} devices, {human_time(r.est_s)}) leaves {idle} free "
            f"that no waiting run fits in"
        )
    for run_id in packed.too_big:
        lines.append(f"  never runs: {run_id} needs {by_id[run_id].devices} devices, more than {gpus}")
    return lines


def memory_lines(rows: list[PlanRow]) -> list[str]:
    """What the mem GiB column means, and every run that will not fit with the setting that would."""
    from attnres.training.memory import HEADROOM

    unfit = [r for r in rows if r.memory_problem]
    lines = [
        f"memory: estimated peak per device of a training step (simulated; docs/training.md); a run fits in "
        f"{HEADROOM:.0%} of runtime.device_memory_gb; {len(unfit)} of {len(rows)} runs do not (!)"
    ]
    return lines + [f"  {r.memory_problem}" for r in unfit]


def parallelism(grid: Grid, launcher: str, n_runs: int) -> int:
    if launcher != "slurm":
        return 1  # local workers share one machine's cores: more workers do not make the sum faster
    from sweeps.slurm import resources

    return max(1, min(n_runs, resources(grid.slurm).array_parallelism))
