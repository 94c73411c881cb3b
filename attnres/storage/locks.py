"""Run-folder locks: exclusive ``flock`` files that the kernel releases when their process ends (even by SIGKILL),
so a crashed trainer never leaves a run locked.

``attnres.training.run`` holds ``RUN_DIR/.lock`` while it trains; the sweep launchers hold ``RUN_DIR/.claim`` around
their whole attempt (see :mod:`sweeps.claim`); :mod:`attnres.kernels.cpu` holds one around a build of its kernels,
waiting for it. No torch, no pyarrow: the launchers' status commands use it.

Only global rank 0 of a multi-process (DDP) run takes these locks. Where a launcher starts every rank at once (SLURM
tasks), the other ranks must not start training unless rank 0 does: they would wait at DDP's rendezvous for a rank 0
that returned "busy" or "done", holding their GPUs until the rendezvous times out. So rank 0 writes what it decided to
``RUN_DIR/.rank0`` (:func:`announce`) and the others wait for that (:func:`await_rank_zero`).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

TRAIN_LOCK_FILE = ".lock"  # held by attnres.training.run.train while it trains the run
CLAIM_FILE = ".claim"  # held by a sweep launcher around its whole attempt at the run
RANK_ZERO_FILE = ".rank0"  # "<launch> <status>": what global rank 0 decided in this launch (train, busy, done, ...)
RANK_ZERO_TIMEOUT_S = 900.0  # how long the other ranks wait for it


@contextmanager
def exclusive(path: Path, wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` for the block and yield True, with this process named in the file.

    If another process has it: yield False (holding nothing), or with ``wait``, call ``wait(holder)`` once and
    block until the lock is free, then hold it and yield True.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait is None:
                yield False
                return
            wait(holder(path))
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)


def is_held(path: Path) -> bool:
    """Does some process hold the lock on ``path`` right now?"""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no such file: nobody ever locked it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our shared lock at once
    return False


def holder(path: Path) -> str:
    """Who holds (or last held) the lock on ``path``: "pid N on HOST", or "unknown"."""
    try:
        return path.read_text(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


def launch_key() -> str | None:
    """What names this launch of a multi-task SLURM step, the same on every rank and new on every requeue; None
    when the ranks are not all started by the launcher (one process, or Lightning starting ranks > 0 itself)."""
    env = os.environ
    if int(env.get("SLURM_NTASKS", "1")) <= 1 or "SLURM_JOB_ID" not in env:
        return None
    return "slurm-" + ".".join(env.get(k, "0") for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))


def announce(run_dir: Path, status: str) -> None:
    """Global rank 0: tell the other ranks of this launch whether it trains the run ("train") or not (the status it
    returns). A no-op on the other ranks and outside a multi-task launch."""
    key = launch_key()
    if key is None or os.environ.get("SLURM_PROCID", "0") != "0":
        return
    from attnres.storage.schema import atomic_write_bytes  # pyarrow, which this module otherwise avoids

    atomic_write_bytes(Path(run_dir) / RANK_ZERO_FILE, f"{key} {status}\n".encode())


def await_rank_zero(run_dir: Path, timeout_s: float = RANK_ZERO_TIMEOUT_S, poll_s: float = 0.5) -> str:
    """Ranks > 0: what global rank 0 announced for this launch ("train" when it trains the run); "train" outside a
    multi-task launch, where ranks > 0 exist only because rank 0 started them to train."""
    key = launch_key()
    if key is None:
        return "train"
    path = Path(run_dir) / RANK_ZERO_FILE
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            launch, _, status = path.read_text().strip().partition(" ")
        except OSError:  # not written yet
            launch = status = ""
        if launch == key and status:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{path}: global rank 0 of {key} did not say within {timeout_s:.0f} s whether it trains this run; "
                "its task log says why (it may have failed before deciding)"
            )
        time.sleep(poll_s)
