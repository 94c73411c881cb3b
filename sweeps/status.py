"""Where every run of a sweep stands: done / running / queued / interrupted / failed / diverged.

Read from the run folders (``run.parquet``, the run's lock) and, for sweeps sent to SLURM, from ``squeue``
(never ``sacct``, which needs slurmdbd):

=============  ==================================================================================================
state          meaning
=============  ==================================================================================================
done           finished its budget
diverged       stopped on a non-finite loss (final: training it again diverges again)
running        a process holds its lock (a local worker or a SLURM task), or its SLURM job is RUNNING
queued         its SLURM job is pending (or requeued), or it has not started yet
interrupted    stopped part way (killed, pre-empted, job ended): the next ``sweep run`` resumes it from its checkpoint
failed         raised an error (in ``run.parquet``'s error column), or its SLURM job ended before training it;
               the next ``sweep run`` tries it again
unreadable     its ``run.parquet`` exists but cannot be read (truncated, another schema version): the next
               ``sweep run`` trains it again
=============  ==================================================================================================

No torch.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnres.storage.schema import RUN_FILE
from attnres.training.checkpoints import checkpoint_state
from attnres.variants import Variant
from sweeps.claim import is_locked, read_status
from sweeps.slurm import PENDING, job_alive, jobs_of, squeue_states
from sweeps.specs import PlannedRun

STATES = ("done", "running", "queued", "interrupted", "failed", "diverged", "unreadable")
LOG_TAIL_BYTES = 4096  # the last lines of train.log: a few "step N/M ..." lines (attnres.training.run_log)
_STEP_LINE = re.compile(rb"^step (\d+)/(\d+) ", re.MULTILINE)


def logged_step(run_dir: Path) -> int | None:
    """The last step a run's ``train.log`` reports (``step 1325/4162  tokens ...``), or None. ``run.parquet`` is
    written at evaluations and checkpoints only, so a long run between them (a WSD trunk, evaluated at its end) read
    step 0 there for its whole life; the log's plain lines (a batch job's, every ``train.log_interval`` steps) say
    where it is. A run on a TTY prints a progress bar instead, and falls back to ``run.parquet``."""
    try:
        with open(run_dir / "train.log", "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    found = _STEP_LINE.findall(tail)
    return int(found[-1][0]) if found else None


@dataclass(frozen=True)
class RunState:
    run_id: str
    size: str
    variant: str
    state: str
    step: int
    max_steps: int | None
    val_loss: float | None
    detail: str
    run_dir: str
    job: str | None = None  # the run's latest SLURM job id
    job_state: str | None = None  # its squeue state (None: not known to squeue, or no squeue)


def run_state(run: PlannedRun, results: str | Path, queue: dict[str, str] | None) -> RunState:
    """The state of one planned run (``queue``: :func:`sweeps.slurm.squeue_states`, or None)."""
    return folder_state(Path(results) / run.cfg.sweep / run.cfg.run_id, run.size.name, run.variant, queue)


def folder_state(run_dir: Path, size: str, variant: str, queue: dict[str, str] | None) -> RunState:
    """The state of the run in ``run_dir`` (which may not exist yet)."""
    row = read_status(run_dir)
    jobs = jobs_of(run_dir)
    job = jobs[-1] if jobs else None
    job_state = queue.get(job) if (queue is not None and job) else None
    step = row["step"] if row else 0
    max_steps = row["max_steps"] if row else None
    if row and row["status"] == "running":  # between two writes of run.parquet: the log knows the step
        step = max(step, logged_step(run_dir) or 0)
    progress = f"step {step}/{max_steps}" if max_steps else ""
    status = row["status"] if row else None
    on_job = f"SLURM job {job} {job_state}" if job_state else ""
    if status in ("done", "diverged"):
        state, detail = status, (row.get("error") or "") if status == "diverged" else ""
    elif is_locked(run_dir) or job_state in ("RUNNING", "COMPLETING"):
        state, detail = "running", ", ".join(x for x in (progress, on_job) if x)
    elif job_state in PENDING or job_alive(job_state):
        state, detail = "queued", on_job
    elif status == "failed":
        state, detail = "failed", row.get("error") or "see the run's log"
    elif status == "running":
        ended = f"SLURM job {job} ended" + (f" ({job_state})" if job_state else "") if job else "stopped"
        state, detail = "interrupted", f"{ended} at {progress}; {_resume_text(run_dir)}"
    elif (run_dir / RUN_FILE).exists():  # a row that cannot be trusted: trained again, so say so
        state, detail = "unreadable", f"{run_dir / RUN_FILE} cannot be read; the next `sweep run` trains it again"
    elif job and queue is not None:  # its job is gone and never wrote a status: it failed before training
        state, detail = "failed", f"SLURM job {job} ended without training it; see {run_dir / 'slurm' / job}.out"
    else:
        state, detail = "queued", "not started"
    return RunState(
        run_dir.name,
        size,
        variant,
        state,
        step,
        max_steps,
        row["val_loss"] if row else None,
        detail,
        str(run_dir),
        job,
        job_state,
    )


def _resume_text(run_dir: Path) -> str:
    """Where the next attempt starts, as the checkpoints say (a damaged one is named, not promised)."""
    usable, damaged = checkpoint_state(run_dir)
    if damaged:
        path, why = damaged[0]
        then = f"resumes from {usable.name}" if usable else "trains it again from step 0"
        return f"its checkpoint {path.name} is damaged ({why}): the next `sweep run` sets it aside and {then}"
    if usable is None:
        return "no checkpoint yet: the next `sweep run` trains it from step 0"
    return f"resumes from {usable.name} on the next `sweep run`"


def sweep_status(planned: list[PlannedRun], results: str | Path) -> list[RunState]:
    """The state of every planned run; squeue is asked once, only if some run was ever submitted to SLURM."""
    queue = None
    if any(jobs_of(Path(results) / r.cfg.sweep / r.cfg.run_id) for r in planned):
        queue = squeue_states()
    return [run_state(r, results, queue) for r in planned]


def _run_folder(path: Path) -> bool:
    """A run folder, not a hidden one (a copy being made by ``reuse:``, sweeps/reuse.py)."""
    return not path.name.startswith(".") and ((path / RUN_FILE).exists() or is_locked(path))


def folder_states(results: str | Path, sweep: str) -> list[RunState]:
    """The states of the run folders that exist under ``RESULTS/<sweep>`` (what is there, without a grid)."""
    states = []
    for run_dir in sorted(p for p in (Path(results) / sweep).glob("*") if _run_folder(p)):
        row = read_status(run_dir) or {}
        size = f"L{row['n_layer']}-d{row['d_model']}" if row else "-"
        variant = Variant(row["variant"], row.get("n_blocks")).label if row else "-"
        states.append(folder_state(run_dir, size, variant, None))
    return states


def sweep_folders(results: str | Path) -> list[str]:
    """The sweeps under ``results``: its folders that hold run folders."""
    return sorted(p.name for p in Path(results).glob("*") if p.is_dir() and any(p.glob(f"*/{RUN_FILE}")))


def results_summary(results: str | Path) -> list[str]:
    """One line per sweep folder under ``results``: its runs by state."""
    return [summary_line(folder_states(results, name), name) for name in sweep_folders(results)]


def summary_line(states: list[RunState], sweep: str) -> str:
    counts = Counter(s.state for s in states)
    return f"sweep {sweep}: {len(states)} runs: " + ", ".join(
        f"{counts[s]} {s}" for s in STATES if counts[s] or s in ("done", "queued")
    )


def format_status(states: list[RunState], sweep: str) -> str:
    if not states:
        return summary_line(states, sweep)
    header = ("run_id", "variant", "state", "step", "val_loss", "detail")
    rows = [header] + [
        (
            s.run_id,
            s.variant,
            s.state,
            f"{s.step}/{s.max_steps}" if s.max_steps else "-",
            f"{s.val_loss:.4f}" if s.val_loss is not None else "-",
            s.detail,
        )
        for s in states
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines + [summary_line(states, sweep)])


def wait_for(
    planned: list[PlannedRun],
    results: str | Path,
    poll_s: float = 30.0,
    timeout_s: float | None = None,
    log: Callable[[str], None] = print,
) -> list[RunState]:
    """Poll until every run is finished (done / diverged / failed) or stranded (its job gone, run unfinished).

    A run counts as stranded only when squeue answered twice in a row without a live job for it, so a
    requeue (which passes through short terminal-looking states) is not mistaken for the end.
    """
    start = time.monotonic()
    gone_before: set[str] = set()
    last = ""
    while True:
        queue = squeue_states()
        states = [run_state(r, results, queue) for r in planned]
        gone_now = {
            s.run_id for s in states if queue is not None and not job_alive(s.job_state) and s.state != "running"
        }
        finished = all(
            s.state in ("done", "diverged")
            or (s.state in ("failed", "interrupted", "queued", "unreadable") and s.run_id in gone_now & gone_before)
            for s in states
        )
        line = summary_line(states, planned[0].cfg.sweep if planned else "sweep")
        if line != last:
            log(line)
            last = line
        if finished:
            return states
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            log(f"stopped waiting after {timeout_s:.0f}s; the jobs go on (see `attnres sweep status`)")
            return states
        gone_before = gone_now
        time.sleep(poll_s)
