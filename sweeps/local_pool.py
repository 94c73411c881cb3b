"""The local launcher: a few worker processes train the runs of a sweep one after another, with one progress bar.

The bar counts optimizer steps over every run this pass trains (so its ETA moves during a long run), and names the
runs in training with their steps; workers report their step about once a second through their pipe.

Each worker is a separate process (multiprocessing, spawn) that imports torch once and trains the runs the
launcher hands it, the largest first, with ``runtime.threads`` = the free cores // workers (at least one) so the workers
do not oversubscribe the CPU (:class:`attnres.runtime.CpuShare`). When their threads fill the cores exactly, each
worker is bound to its own (:mod:`sweeps.worker_devices`).
A run's output goes to ``RUN_DIR/train.log``. Workers die with the launcher (``PR_SET_PDEATHSIG``), so
killing the launcher never leaves an orphan training in the background; the killed run resumes from its
last checkpoint on the next ``sweep run``.

A WSD branch whose trunk is in the same pass waits until its trunk has finished (another run goes first), so that it
starts from the trunk's checkpoint rather than from step 0.

A run another process is training (its claim is held, see :mod:`sweeps.claim`) is set aside and tried
again when it is released: if the other process finished it, it is skipped; if it died, it is resumed. So two
launchers on the same grid and results directory finish everything between them and never train a run twice.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from attnres.config import ConfigError, RunConfig, RuntimeConfig, from_dict, to_dict
from attnres.costs import run_budget
from attnres.runtime import CpuShare, cpu_cores, one_line_warnings, terminal_ok
from attnres.storage.writable import folder_problem
from sweeps.claim import FINAL, RunOutcome, is_locked, read_status, train_claimed

LOG_FILE = "train.log"


def available_cores() -> int:
    return cpu_cores()


def with_runtime(cfg: RunConfig, **runtime: object) -> RunConfig:
    """``cfg`` with runtime settings replaced (the runtime is not part of the run id)."""
    return dataclasses.replace(cfg, runtime=from_dict(RuntimeConfig, {**to_dict(cfg.runtime), **runtime}))


@dataclass(frozen=True)
class SweepSummary:
    """What a launcher pass did: counts and every run's outcome (in grid order)."""

    sweep: str
    results: str
    runs: tuple[RunOutcome, ...]
    skipped_done: int = 0  # finished (done or diverged) before this pass started
    submitted: tuple[str, ...] = field(default_factory=tuple)  # SLURM job ids (SLURM launcher)

    @property
    def total(self) -> int:
        return len(self.runs)

    @property
    def trained(self) -> int:
        return sum(r.trained for r in self.runs)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.runs)

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def diverged(self) -> int:
        return self.count("diverged")

    @property
    def done(self) -> int:
        return self.count("done")

    @property
    def unfinished(self) -> int:
        """Runs neither done, diverged nor failed (interrupted, busy elsewhere, not started)."""
        return sum(r.status not in ("done", "diverged", "failed") for r in self.runs)

    @property
    def statuses(self) -> dict[str, str]:
        return {r.run_id: r.status for r in self.runs}

    @property
    def ok(self) -> bool:
        """Every run finished (done, or diverged: a legitimate, final outcome) and none failed."""
        return self.failed == 0 and self.unfinished == 0

    @property
    def counts(self) -> dict[str, int]:
        return {
            "total": self.total,
            "trained": self.trained,
            "skipped_done": self.skipped_done,
            "done": self.done,
            "failed": self.failed,
            "diverged": self.diverged,
            "unfinished": self.unfinished,
        }

    def line(self) -> str:
        if self.total and self.trained == 0 and self.skipped_done == self.total:
            return (
                f"nothing to train: all {self.total} runs of sweep {self.sweep} are already finished ({self.results})"
            )
        parts = [f"{self.trained} trained", f"{self.skipped_done} already done (skipped)", f"{self.done} done"]
        parts += [
            f"{n} {s}"
            for s, n in (("failed", self.failed), ("diverged", self.diverged), ("unfinished", self.unfinished))
            if n
        ]
        return f"sweep {self.sweep}: {self.total} runs: " + ", ".join(parts)


# ------------------------------------------------------------------------------------------------------------
# worker process
# ------------------------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the launcher dies (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return


STEP_REPORT_S = 1.0  # how often a worker tells the launcher its run's step


def _step_reporter(conn: Connection, index: int):
    """A Lightning callback that sends ``("step", index, step)`` to the launcher at most every STEP_REPORT_S."""
    from lightning.pytorch.callbacks import Callback

    class StepReporter(Callback):
        last = 0.0

        def on_train_batch_end(self, trainer, *args) -> None:
            if time.monotonic() - self.last >= STEP_REPORT_S:
                self.last = time.monotonic()
                conn.send(("step", index, trainer.global_step))

    return StepReporter()


def _worker(
    conn: Connection, parent: int, slot: int = 0, workers: int = 1, bind: tuple[int, int] | None = None
) -> None:
    """``bind``: (pool size, threads per worker) to bind this worker to its own cores with, None to leave it free."""
    _die_with_parent()
    if os.getppid() != parent:  # the launcher died before we could ask
        os._exit(1)
    from sweeps.worker_devices import pin_worker_cpus, pin_worker_gpus

    pin_worker_gpus(slot, workers)  # its own GPUs, before anything initialises CUDA (nothing where none is visible)
    if bind:
        pin_worker_cpus(slot, *bind)  # before torch starts its threads, so that they inherit the cores
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    one_line_warnings("attnres")  # in the run's train.log
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, cfg, run_dir = task
        callbacks = [_step_reporter(conn, index)]
        outcome = train_claimed(cfg, run_dir, log_file=Path(run_dir) / LOG_FILE, callbacks=callbacks)
        conn.send((index, outcome))


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection
    task: int | None = None
    slot: int = 0  # which share of the GPUs it sees (sweeps.worker_devices); a replacement takes the dead one's


# ------------------------------------------------------------------------------------------------------------
# the launcher
# ------------------------------------------------------------------------------------------------------------


def run_local(
    runs: list[RunConfig],
    results: str | Path,
    workers: int = 1,
    threads: int | None = None,
    progress: bool = True,
    poll_s: float = 1.0,
    log: Callable[[str], None] = print,
    sweep: str | None = None,
    bind_cores: bool = True,
) -> SweepSummary:
    """Train every run that is not finished, with ``workers`` processes; return what happened.

    ``threads``: torch threads per worker (default: the free cores // workers, :class:`attnres.runtime.CpuShare`; a
    busy machine is said in one line). ``bind_cores``: bind each worker to its own cores when the workers' threads
    fill them exactly (:mod:`sweeps.worker_devices`; False: leave the placement to the scheduler, as
    ``benchmarks/bench_load.py`` does to compare). Runs that are done or diverged are skipped; interrupted ones resume
    from their checkpoint; failed ones are tried again.
    """
    from attnres.kernels import cpu as cpu_kernels
    from attnres.training.run import run_dir_for

    results = Path(results)
    sweep = sweep or (runs[0].sweep if runs else "sweep")
    workers = max(1, int(workers))
    share = CpuShare.now()
    chosen, threads = threads is not None, threads or share.threads(workers)
    dirs = [run_dir_for(cfg, results) for cfg in runs]
    outcomes: dict[int, RunOutcome] = {}
    pending: deque[int] = deque()
    start_steps: dict[int, int] = {}  # where each unfinished run starts (a resumed run at its step)
    for i, (cfg, run_dir) in enumerate(zip(runs, dirs)):
        row = read_status(run_dir)
        if row and row["status"] in FINAL:
            outcomes[i] = _finished(cfg, run_dir, row, error=row.get("error"))
        else:
            pending.append(i)
            start_steps[i] = (row or {}).get("step") or 0
    skipped = len(outcomes)
    pending = deque(largest_first(runs, pending))
    if pending and (why := folder_problem(results / sweep)):  # before the workers, not once per run in their logs
        raise ConfigError(f"cannot write the results folder {results / sweep}: {why}; pick another --results")
    if pending and not chosen and (note := share.note(min(workers, len(pending)), threads)):
        log(f"attnres sweep: {note}")
    if pending:
        runs = [with_runtime(cfg, threads=threads, progress_bar=False) for cfg in runs]
        cpu_kernels.build_for(runs[i] for i in pending)  # a fresh cache's one-time build, said here, not in a worker
        launcher = _Launcher(runs, dirs, outcomes, pending, start_steps, log, poll_s)
        launcher.after = _trunks(runs)
        launcher.bind_threads = threads if bind_cores else 0
        launcher.bar = _progress(launcher.total_steps, launcher.steps_done, sweep, progress)
        launcher.run(workers)
    for i, (cfg, run_dir) in enumerate(zip(runs, dirs)):
        if i not in outcomes:
            row = read_status(run_dir) or {}
            outcomes[i] = RunOutcome(
                cfg.run_id, str(run_dir), "running" if row else "queued", False, row.get("step", 0), row.get("val_loss")
            )
    return SweepSummary(sweep, str(results), tuple(outcomes[i] for i in range(len(runs))), skipped_done=skipped)


def largest_first(runs: list[RunConfig], indices: Iterable[int]) -> list[int]:
    """``indices`` of ``runs`` by training FLOPs, largest first (ties in grid order): the longest-processing-time
    order, in which the small runs fill the gaps at the end, where in grid order (smallest first) one worker would
    train the last large run alone while the others idle."""
    return sorted(indices, key=lambda i: -run_budget(runs[i]).flops)


def _trunks(runs: list[RunConfig]) -> dict[int, int]:
    """Each WSD branch's trunk among ``runs``: {branch index: trunk index}."""
    from attnres.training.branches import trunk_of

    where = {(cfg.sweep, cfg.run_id): i for i, cfg in enumerate(runs)}
    out = {}
    for i, cfg in enumerate(runs):
        if cfg.train.trunk_tokens is not None:
            trunk = trunk_of(cfg)
            j = where.get((trunk.sweep, trunk.run_id))
            if j is not None:
                out[i] = j
    return out


def _finished(cfg: RunConfig, run_dir: Path, row: dict, error: str | None = None) -> RunOutcome:
    """The outcome of a run found finished (by this pass or another launcher), read from its run.parquet row."""
    return RunOutcome(cfg.run_id, str(run_dir), row["status"], False, row["step"], row["val_loss"], error)


class _Launcher:
    """The worker pool of one ``run_local`` pass: hands out runs, collects outcomes, replaces dead workers."""

    def __init__(self, runs, dirs, outcomes, pending, start_steps, log, poll_s) -> None:
        self.runs, self.dirs, self.outcomes, self.pending = runs, dirs, outcomes, pending
        self.bar, self.log, self.poll_s = None, log, poll_s
        self.max_steps = {i: run_budget(runs[i]).steps for i in pending}
        self.step = dict(start_steps)
        self.total_steps, self.steps_done = sum(self.max_steps.values()), sum(self.step.values())
        self.deferred: dict[int, float] = {}  # run index -> when it was found busy
        self.after: dict[int, int] = {}  # a branch's index -> its trunk's: handed out once the trunk has an outcome
        self.pool: list[_Worker] = []
        self.ctx = mp.get_context("spawn")
        self.restarts = 0
        self.workers = 1
        self.bind_threads = 0  # threads per worker to bind each to its own cores with (0: not bound)
        self.size = 1  # workers started: the pool binds only when they fill the cores

    def run(self, workers: int) -> None:
        """Train until every run has an outcome. Ctrl-C (KeyboardInterrupt) or SIGTERM
        (:class:`attnres.runtime.Terminated`) stops the workers and goes on up: the command says it in one line, and
        the runs they were training resume from their checkpoints on the next pass."""
        self.workers = workers
        try:
            self.size = min(workers, len(self.pending))
            self.pool = [self.start_worker(slot) for slot in range(self.size)]
            while self.pending or self.deferred or any(w.task is not None for w in self.pool):
                self.hand_out()
                active = [w for w in self.pool if w.task is not None]
                if not active:
                    if self.deferred:
                        time.sleep(self.poll_s)
                    elif self.pending:  # only branches of trunks that are not here: nothing holds them now
                        self.after.clear()
                    continue
                self.collect(active)
        finally:
            _stop(self.pool)
            if self.bar is not None:
                self.bar.close()

    def start_worker(self, slot: int) -> _Worker:
        parent, child = self.ctx.Pipe()
        bind = (self.size, self.bind_threads) if self.bind_threads else None
        process = self.ctx.Process(
            target=_worker,
            args=(child, os.getpid(), slot, self.workers, bind),
            name="attnres-sweep-worker",
            daemon=True,
        )
        process.start()
        child.close()
        return _Worker(process, parent, slot=slot)

    def advance(self, index: int, step: int) -> None:
        """Move the bar to ``index``'s new step (and say which runs train, at which step)."""
        step = min(step, self.max_steps.get(index, step))
        before = self.step.get(index, 0)
        self.step[index] = max(step, before)
        if self.bar is not None and index in self.max_steps:
            self.bar.update(self.step[index] - before)
            active = [f"{self.runs[i].run_id} {self.step[i]}/{self.max_steps[i]}" for i in self.training()]
            self.bar.set_postfix_str(", ".join([_postfix(self.outcomes.values()), *active]), refresh=True)

    def training(self) -> list[int]:
        return [w.task for w in self.pool if w.task is not None]

    def finish(self, index: int, outcome: RunOutcome) -> None:
        self.outcomes[index] = outcome
        if self.bar is not None:
            self.advance(index, self.max_steps.get(index, 0))  # done, diverged or failed: its steps are spent
        else:
            val = f" val_loss {outcome.val_loss:.4f}" if outcome.val_loss is not None else ""
            why = f" ({outcome.error})" if outcome.error and outcome.status == "failed" else ""
            self.log(f"[{len(self.outcomes)}/{len(self.runs)}] {outcome.run_id}: {outcome.status}{val}{why}")

    def hand_out(self) -> None:
        """Give every idle worker a run: fresh runs first, then busy runs whose holder let go."""
        for w in self.pool:
            if w.task is not None:
                continue
            index = self.next_pending()
            if index is None:
                index = _ready(self.deferred, self.dirs, self.poll_s)
            if index is None:
                return
            row = read_status(self.dirs[index])  # another launcher may have finished it meanwhile
            if row and row["status"] in FINAL:
                self.finish(index, _finished(self.runs[index], self.dirs[index], row))
                continue
            try:
                w.conn.send((index, self.runs[index], str(self.dirs[index])))
            except OSError:  # the worker died while idle: replace it, keep the run
                self.pending.appendleft(index)
                self.pool.remove(w)
                self.restarts += 1
                if self.restarts > 3 * self.workers:
                    raise RuntimeError(
                        f"sweep worker processes keep dying (last exit code {w.process.exitcode})"
                    ) from None
                self.pool.append(self.start_worker(w.slot))
                return
            w.task = index

    def next_pending(self) -> int | None:
        """The first pending run that waits for nothing: a branch waits for its trunk while the trunk is pending or
        training here (a trunk another launcher trains, or one that failed, does not hold it)."""
        waiting = set(self.pending) | set(self.training()) | set(self.deferred)
        for index in self.pending:
            if self.after.get(index) not in waiting:
                self.pending.remove(index)
                return index
        return None

    def collect(self, active: list[_Worker]) -> None:
        """Wait up to ``poll_s`` for outcomes; a worker that died fails its run and is replaced if work is left."""
        ready = wait([w.conn for w in active] + [w.process.sentinel for w in active], timeout=self.poll_s)
        for w in active:
            died = False
            if w.conn in ready:
                try:
                    message = w.conn.recv()
                except (EOFError, OSError):  # the worker died (its end of the pipe closed)
                    died = True
                else:
                    if message[0] == "step":
                        self.advance(message[1], message[2])
                        continue
                    index, outcome = message
                    w.task = None
                    if outcome.status == "busy":
                        self.deferred[index] = time.monotonic()
                    else:
                        self.finish(index, outcome)
            elif w.process.sentinel in ready or not w.process.is_alive():
                died = True
            if died:
                self.replace_dead(w)

    def replace_dead(self, w: _Worker) -> None:
        w.process.join(5)
        index = w.task
        row = read_status(self.dirs[index]) or {}
        log_file = self.dirs[index] / LOG_FILE
        self.finish(
            index,
            RunOutcome(
                self.runs[index].run_id,
                str(self.dirs[index]),
                "failed",
                True,
                row.get("step", 0),
                None,
                f"worker process died (exit code {w.process.exitcode}); see {log_file}",
            ),
        )
        self.pool.remove(w)
        w.conn.close()
        if self.pending or self.deferred:
            self.pool.append(self.start_worker(w.slot))


def _ready(deferred: dict[int, float], dirs: list[Path], poll_s: float) -> int | None:
    """A busy run to try again: one whose claim is free now (finished or abandoned by its holder)."""
    for index, since in list(deferred.items()):
        if time.monotonic() - since >= poll_s and not is_locked(dirs[index]):
            del deferred[index]
            return index
    return None


def _stop(pool: list[_Worker]) -> None:
    for w in pool:
        try:
            if w.task is None:
                w.conn.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    for w in pool:
        if w.task is not None:  # interrupted mid-run: stop it now (it resumes from its checkpoint)
            w.process.terminate()
        w.process.join(max(0.1, deadline - time.monotonic()))
        if w.process.is_alive():
            w.process.kill()
            w.process.join()
        w.conn.close()


def _progress(total: int, initial: int, sweep: str, enabled: bool):
    """The sweep's bar, on a terminal only: redirected to a file, a bar is thousands of carriage-return updates (4,106
    in one demo's log), so a log gets one plain line per finished run instead; so does a terminal that reports 0
    columns, on which tqdm draws nothing (:func:`attnres.runtime.terminal_ok`)."""
    if not enabled or not terminal_ok(sys.stderr):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=f"sweep {sweep}", unit="step", file=sys.stderr, dynamic_ncols=True)


def _postfix(outcomes) -> str:
    outcomes = list(outcomes)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("done", "failed", "diverged")}
    return ", ".join(f"{k} {v}" for k, v in counts.items() if v or k == "done")
