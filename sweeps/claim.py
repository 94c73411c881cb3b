"""Train one run of a sweep safely: claim its folder, skip it if it is finished, train or resume it.

Both launchers (local workers and SLURM array tasks) call :func:`train_claimed`. The claim is an exclusive,
non-blocking ``flock`` on ``RUN_DIR/.claim``, held by the training process for the whole attempt and released
by the kernel when the process ends (even by SIGKILL). With the claim held, the launcher's "is it done?", its
log header and output redirection and "train it" happen under one lock, so a second launcher neither trains the
run nor writes into its log. (``attnres.training.run.train`` alone never trains a run twice either: it re-reads the
status under its own lock, ``.lock``.)

No torch at import (``attnres.training.run`` is imported when a run is trained).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnres.config import RunConfig
from attnres.runtime import say
from attnres.storage import locks, schema

FINAL = ("done", "diverged")  # outcomes a sweep does not train again (a diverged run diverges again)


@dataclass(frozen=True)
class RunOutcome:
    """What happened to one run in one launcher pass."""

    run_id: str
    run_dir: str
    status: str  # done | diverged | failed | running (interrupted) | busy (another process has it)
    trained: bool  # this pass trained (or resumed) it
    step: int = 0
    val_loss: float | None = None
    error: str | None = None


# the run.parquet row, or None (never started, or unreadable); re-exported for the launchers
read_status = schema.read_run_row


def is_locked(run_dir: str | Path) -> bool:
    """Is some process training this run right now (its claim or attnres.training.run's lock is held)?"""
    return any(locks.is_held(Path(run_dir) / name) for name in (locks.CLAIM_FILE, locks.TRAIN_LOCK_FILE))


def claim(run_dir: Path) -> ContextManager[bool]:
    """Hold the run's claim for the block; yields False (and holds nothing) if another process has it."""
    return locks.exclusive(run_dir / locks.CLAIM_FILE)


@contextmanager
def output_to(log_file: Path | None) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``log_file`` for the block."""
    if log_file is None:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def train_claimed(
    cfg: RunConfig, run_dir: str | Path, log_file: Path | None = None, callbacks: Sequence[Any] = ()
) -> RunOutcome:
    """Train ``cfg`` into ``run_dir`` unless it is finished or another process has it; never raises.

    ``log_file``: where this attempt's output goes (appended), e.g. RUN_DIR/train.log for local workers.
    """
    run_dir = Path(run_dir)
    with claim(run_dir) as ours:
        if not ours:
            return RunOutcome(cfg.run_id, str(run_dir), "busy", trained=False)
        row = read_status(run_dir)
        if row and row["status"] in FINAL:
            return RunOutcome(
                cfg.run_id, str(run_dir), row["status"], False, row["step"], row["val_loss"], row.get("error")
            )
        with output_to(log_file):
            if log_file is not None:  # a header per attempt in the appended log
                say(
                    f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()} on {socket.gethostname()}: "
                    f"{cfg.run_id}",
                    sys.stdout,
                )
            try:
                from attnres.training.run import latest_checkpoint, train

                checkpoint = latest_checkpoint(run_dir)
                if checkpoint:
                    say(f"{cfg.run_id}: resuming from {checkpoint}", sys.stdout)
                result = train(cfg, run_dir, progress=False, callbacks=callbacks)
            except Exception as err:  # a failure of this run must not stop the sweep
                traceback.print_exc()
                row = read_status(run_dir)
                return RunOutcome(
                    cfg.run_id,
                    str(run_dir),
                    "failed",
                    True,
                    row["step"] if row else 0,
                    None,
                    f"{type(err).__name__}: {err}",
                )
        if result.status == "busy":  # a plain `attnres train` outside the sweep holds the run
            return RunOutcome(cfg.run_id, str(run_dir), "busy", trained=False)
        row = read_status(run_dir) or {}
        return RunOutcome(
            cfg.run_id, str(run_dir), result.status, result.trained, result.step, result.val_loss, row.get("error")
        )
